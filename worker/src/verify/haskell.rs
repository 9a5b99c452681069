//! What a Haskell test run needs from the host: the frozen test modules and their `prop_*`
//! bindings, read from the worktree (never through a link, capped) and parsed with
//! tree-sitter (`claims::haskell`), refused when they would change how ghc compiles them
//! (`HASKELL_TEST_FORBIDDEN`: flags, preprocessors, CPP, Template Haskell); and the runner's
//! closing line checked against its lines.

use crate::safe_fs;
use shared::lang::TestModule;
use shared::testreport::{self, CaseOutcome, TestRunReport};
use std::path::Path;

/// A test file above this size is refused.
const SOURCE_CAP: usize = 1 << 20;

/// Haskell sources ghc may compile as modules of a test run.
const SOURCE_EXTENSIONS: &[&str] = &[".hs", ".lhs", ".hs-boot", ".lhs-boot", ".hsig"];

/// At most this many Haskell sources (and bytes of them) in a worktree whose tests run.
const MAX_SOURCES: usize = 10_000;
const MAX_SOURCE_BYTES: u64 = 64 << 20;

/// Every Haskell source of the worktree (any of them may be a module on a source root) is
/// refused when its pragmas would change how ghc compiles it (`HASKELL_TEST_FORBIDDEN`'s
/// pragmas and extensions: `OPTIONS_GHC -F -pgmF` runs a program of the repo's while the
/// harness's runner is built). Read as text, so a source the parser cannot read is checked
/// too; too many sources to check is a refusal.
pub fn refuse_compile_changes(root: &Path) -> Result<(), String> {
    let (files, cut) = safe_fs::regular_files_where(
        root,
        |rel| SOURCE_EXTENSIONS.iter().any(|e| rel.ends_with(e)),
        MAX_SOURCES,
        MAX_SOURCE_BYTES,
    )
    .map_err(|e| format!("cannot read the haskell sources: {e}"))?;
    if cut {
        return Err(format!(
            "more haskell sources than the harness checks ({MAX_SOURCES} files, {} MiB)",
            MAX_SOURCE_BYTES >> 20
        ));
    }
    let rules = crate::claims::haskell::HASKELL_TEST_FORBIDDEN;
    for (rel, bytes) in &files {
        let text = String::from_utf8_lossy(bytes);
        let hit = crate::claims::haskell::pragmas(&text)
            .into_iter()
            .find(|(name, _)| rules.contains(&name.as_str()));
        if let Some((name, line)) = hit {
            return Err(format!(
                "{rel}:{line}: a module of the test run may not use `{name}`: it would change how ghc compiles the tests"
            ));
        }
    }
    Ok(())
}

/// The test modules of the run's test files (plain paths, `.hs`): each file's module name
/// (`Main` without a header) and its top-level properties. A file without properties is kept
/// (it may hold helpers), but a run with no property at all is an error.
pub fn test_modules(root: &Path, test_paths: &[String]) -> Result<Vec<TestModule>, String> {
    if test_paths.is_empty() {
        return Err("a haskell test run needs its test files in `test_paths`".into());
    }
    refuse_compile_changes(root)?;
    let mut out = Vec::new();
    for path in test_paths {
        if path.contains(['*', '?', '[']) || !path.ends_with(".hs") {
            return Err(format!(
                "haskell test paths are `.hs` files, not patterns: `{path}`"
            ));
        }
        let rel = shared::paths::normalize_relative(path).map_err(|e| e.to_string())?;
        let source = safe_fs::read_text_within(root, &rel, SOURCE_CAP)
            .map_err(|e| format!("cannot read the test file {rel}: {e}"))?;
        let rules: Vec<String> = crate::claims::haskell::HASKELL_TEST_FORBIDDEN
            .iter()
            .map(|r| r.to_string())
            .collect();
        let refused = crate::claims::haskell::forbidden(&source, &rules)
            .map_err(|e| format!("{rel}: {e}"))?;
        if let Some(hit) = refused.first() {
            return Err(format!(
                "{rel}:{}: a test module may not use `{}`: it would change how ghc compiles the tests",
                hit.line, hit.name
            ));
        }
        let module =
            crate::claims::haskell::module_name(&source).map_err(|e| format!("{rel}: {e}"))?;
        let properties =
            crate::claims::haskell::properties(&source).map_err(|e| format!("{rel}: {e}"))?;
        out.push(TestModule {
            path: rel,
            module,
            properties,
        });
    }
    if out.iter().all(|m| m.properties.is_empty()) {
        return Err("the test files define no top-level `prop_*` property".into());
    }
    Ok(out)
}

/// The runner's closing line (its own counts, the canary among the failures) must agree with
/// the result lines read: a line printed by code under test adds to the lines, not to the
/// runner's count.
pub fn summary_agrees(
    r: TestRunReport,
    stdout: &str,
    timed_out: bool,
) -> Result<TestRunReport, String> {
    if timed_out {
        return Ok(r);
    }
    let Some((passed, failed)) = testreport::libtest_summary(stdout) else {
        return Err("the runner printed no closing line: its results cannot be trusted".into());
    };
    let c = r.counts();
    let others = r
        .cases
        .iter()
        .filter(|c| !matches!(c.outcome, CaseOutcome::Passed | CaseOutcome::Failed))
        .count();
    // The canary, already taken out of the report, is one of the failures the runner counted.
    if passed == c.passed && failed == c.failed + 1 && others == 0 {
        Ok(r)
    } else {
        Err(format!(
            "the runner's closing line ({passed} passed, {failed} failed) disagrees with its result lines ({} passed, {} failed): lines were printed by something else",
            c.passed, c.failed
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::testreport::TestCase;

    fn report(outcomes: &[CaseOutcome]) -> TestRunReport {
        TestRunReport {
            format: "libtest".into(),
            cases: outcomes
                .iter()
                .enumerate()
                .map(|(i, o)| TestCase {
                    id: format!("Spec::prop_{i}"),
                    outcome: *o,
                    message: String::new(),
                    seconds: 0.0,
                })
                .collect(),
        }
    }

    #[test]
    fn lines_printed_beside_the_runner_are_caught_by_its_closing_line() {
        use CaseOutcome::*;
        let closing = "test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured\n";
        assert!(summary_agrees(report(&[Passed, Failed]), closing, false).is_ok());
        // A forged `ok` line beside the runner's own `FAILED` one.
        let e = summary_agrees(report(&[Passed, Passed, Failed]), closing, false).unwrap_err();
        assert!(e.contains("disagrees"), "{e}");
        assert!(summary_agrees(report(&[Passed]), "", false).is_err());
        assert!(summary_agrees(report(&[Passed]), "", true).is_ok());
    }
}
