//! PO, the factory's verification and acceptance, run by the harness after TR applied the
//! agent's patch: global verification and the acceptance commands, or, for a work order that
//! names its tests (SWE-bench items), the named tests. For those, the files the test patch
//! touches (as libgit2 parses it) are laid down again from the run's base commit, so nothing
//! the agent did to them survives; the test patch is applied by the harness (one that does not
//! apply is an infrastructure error of the item, never a verdict); the files of the named tests
//! run once with the pinned runner (`verify::observe`: harness-owned configuration, canary,
//! closing line checked against the JUnit report); and each named test is judged from the
//! report (`shared::factory::judge_named`): one that did not run, was skipped or did not pass
//! fails the attempt.

use crate::git::{tree_hash_on_disk, Worktree};
use crate::harness::{excerpt, failed, read_params, run_logged, Artifacts, StepOutcome};
use crate::sandbox::Session;
use crate::verify::{default_timeout, observe, RunPlace, TestRunParams};
use serde::Deserialize;
use serde_json::{json, Value};
use shared::factory::{
    self, judge_named, CmdResult, FailureBrief, NamedJudgement, NamedTests, Stage,
};
use shared::messages::JobStatus;
use shared::testreport::TestRunReport;
use shared::text;
use std::collections::BTreeSet;
use std::time::Duration;

type StepResult = Result<StepOutcome, crate::runner::RunError>;

/// `factory_verify`'s parameters.
#[derive(Deserialize)]
struct FactoryVerifyParams {
    #[serde(default = "default_timeout")]
    command_timeout_seconds: u64,
    #[serde(default)]
    attempt_index: Value,
    #[serde(default)]
    acceptance_commands: Vec<String>,
    /// The work order's named tests (SWE-bench items): then they are the acceptance.
    #[serde(default)]
    tests: Option<NamedTests>,
    /// The run's base commit, which the test patch applies to.
    #[serde(default)]
    base_commit: String,
    /// The work order's own checks (`shared::speccheck`).
    #[serde(default)]
    spec_checks: Option<shared::speccheck::SpecChecks>,
    /// Modules code under test may import beyond the defaults.
    #[serde(default)]
    allow: Vec<String>,
    /// The files the patch touched: the code under test the runner guard judges.
    #[serde(default)]
    code_under_test: Vec<String>,
}

/// PO: global verification (`scripts/verify.sh` or the seed's fallback), then the acceptance
/// commands in order; the first non-zero exit fails the attempt. A work order with named tests
/// (SWE-bench items) is accepted by them instead, without global verification: the named
/// tests are the instance's contract, and `PASS_TO_PASS` stands for regressions.
pub async fn factory_verify(
    params: &Value,
    place: &RunPlace<'_>,
    seed: &str,
    art: &mut Artifacts<'_>,
) -> StepResult {
    let p: FactoryVerifyParams = match read_params(params) {
        Ok(p) => p,
        Err(bad) => return Ok(bad),
    };
    if let Some(tests) = &p.tests {
        return named_acceptance(&p, tests, place, seed, art).await;
    }
    let (wt, session) = (place.wt, place.session);
    let timeout = Duration::from_secs(p.command_timeout_seconds);
    let has_script = wt.dir.join("scripts/verify.sh").is_file();
    let mut output = json!({
        "attempt_index": p.attempt_index,
        "verify": [], "acceptance": [],
    });
    let verify_cmds: Vec<(Result<Vec<String>, String>, String)> =
        factory::verify_commands(has_script)
            .into_iter()
            .map(|argv| {
                let shown = argv.join(" ");
                (Ok(argv), shown)
            })
            .collect();
    let (verify, mut brief) = run_until_failure(
        session,
        &verify_cmds,
        Stage::VerifyFailed,
        "verify",
        timeout,
        art,
    )
    .await?;
    output["verify"] = json!(verify);
    art.put_json("verify_result.json", &output["verify"])
        .await?;
    let mut acceptance = Vec::new();
    if brief.is_none() {
        let inputs = crate::guarded_acceptance::AcceptanceInputs {
            commands: &p.acceptance_commands,
            checks: p.spec_checks.as_ref(),
            allow: &p.allow,
            written: &p.code_under_test,
            seed,
            timeout,
        };
        let run = crate::guarded_acceptance::run_acceptance(place, inputs, art).await?;
        acceptance = run.results;
        brief = run.brief;
        output["guard"] = json!(run.findings);
        if let Some(category) = run.category {
            output["category"] = json!(category);
        }
    }
    output["acceptance"] = json!(acceptance);
    art.put_json("acceptance_result.json", &output["acceptance"])
        .await?;
    match brief {
        Some(b) => {
            art.put_json("failure_brief.json", &json!(b)).await?;
            Ok(failed(output, &b))
        }
        None => match tree_hash_of(wt).await {
            Ok(hash) => {
                output["tree_hash_after"] = json!(hash);
                Ok(StepOutcome {
                    status: JobStatus::Ok,
                    output,
                    error: None,
                })
            }
            Err(e) => Ok(StepOutcome {
                status: JobStatus::Failed,
                output,
                error: Some(e),
            }),
        },
    }
}

/// The longest worktree file the tree hash reads (by length: a sparse file counts whole).
const MAX_TREE_FILE: u64 = 256 << 20;

/// The seed's tree hash of the worktree's files, one file at a time; a file over
/// `MAX_TREE_FILE` fails the step, naming it.
async fn tree_hash_of(wt: &Worktree) -> Result<String, String> {
    wt.blocking(|wt| tree_hash_on_disk(&wt.dir, MAX_TREE_FILE))
        .await
        .map_err(|e| format!("the worktree cannot be hashed: {e}"))
}

/// PO for a work order with named tests: no global verification, the named tests judged.
async fn named_acceptance(
    p: &FactoryVerifyParams,
    tests: &NamedTests,
    place: &RunPlace<'_>,
    seed: &str,
    art: &mut Artifacts<'_>,
) -> StepResult {
    let mut output = json!({"attempt_index": p.attempt_index, "verify": [], "acceptance": []});
    art.put_json("verify_result.json", &output["verify"])
        .await?;
    // The product as the agent left it, before the harness lays the tests down.
    let tree_hash = match tree_hash_of(place.wt).await {
        Ok(hash) => hash,
        Err(e) => {
            return Ok(StepOutcome {
                status: JobStatus::Failed,
                output,
                error: Some(e),
            })
        }
    };
    let accepted = accept_named_tests(
        tests,
        &p.code_under_test,
        &p.base_commit,
        place,
        seed,
        p.command_timeout_seconds,
        art,
    )
    .await?;
    let (run, judgement, brief) = match accepted {
        Acceptance::Infra(why) => {
            tracing::warn!(error = %why, "the named tests could not be set up");
            output["tests_error"] = json!(why);
            return Ok(StepOutcome {
                status: JobStatus::Error,
                output,
                error: Some(why),
            });
        }
        Acceptance::Judged(judged) => {
            let Judged {
                run,
                judgement,
                brief,
            } = *judged;
            if brief
                .as_ref()
                .is_some_and(|b| b.stage == Stage::RunnerTampered)
            {
                output["category"] = json!("runner_tampered");
            }
            (run, judgement, brief)
        }
    };
    output["acceptance"] = json!(run.into_iter().collect::<Vec<_>>());
    output["tests"] = json!({
        "ok": judgement.ok,
        "fail_to_pass": judgement.fail_to_pass,
        "pass_to_pass": judgement.pass_to_pass,
        "reasons": judgement.reasons,
    });
    art.put_json("acceptance_result.json", &output["acceptance"])
        .await?;
    match brief {
        Some(b) => {
            art.put_json("failure_brief.json", &json!(b)).await?;
            Ok(failed(output, &b))
        }
        None => {
            output["tree_hash_after"] = json!(tree_hash);
            Ok(StepOutcome {
                status: JobStatus::Ok,
                output,
                error: None,
            })
        }
    }
}

/// What the named tests gave.
pub enum Acceptance {
    /// The harness could not set the tests up (the test patch, the base commit, the runner):
    /// the item's infrastructure error, not a verdict.
    Infra(String),
    /// The tests ran (or their files are gone) and were judged.
    Judged(Box<Judged>),
}

/// The named tests, judged.
pub struct Judged {
    /// The test run, when there was one.
    pub run: Option<CmdResult>,
    pub judgement: NamedJudgement,
    /// Why the attempt failed, for the next one.
    pub brief: Option<FailureBrief>,
}

/// Runs commands in order until one fails (or cannot be split); the failure becomes a brief of
/// `stage`. Each item is the argv (or the split error) and the command as the user wrote it.
async fn run_until_failure(
    session: &dyn Session,
    commands: &[(Result<Vec<String>, String>, String)],
    stage: Stage,
    label: &str,
    timeout: Duration,
    art: &mut Artifacts<'_>,
) -> Result<(Vec<CmdResult>, Option<FailureBrief>), crate::runner::RunError> {
    let mut results = Vec::new();
    for (i, (argv, shown)) in commands.iter().enumerate() {
        let argv = match argv {
            Ok(a) => a,
            Err(e) => {
                return Ok((
                    results,
                    Some(FailureBrief::new(stage, Some(shown.clone()), None, e)),
                ))
            }
        };
        let r = run_logged(session, argv, timeout, &format!("{label}_{i}"), art).await?;
        if r.exit_code != 0 {
            let brief =
                FailureBrief::new(stage, Some(shown.clone()), Some(r.exit_code), &excerpt(&r));
            results.push(r);
            return Ok((results, Some(brief)));
        }
        results.push(r);
    }
    Ok((results, None))
}

/// A word for a shell-rules command line: kept when plain, else single-quoted.
fn quote(word: &str) -> String {
    let plain = word
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'/' | b'-' | b'+'));
    if plain && !word.is_empty() {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// Lays the test patch's files down from `base_commit` and applies the test patch.
async fn apply_test_patch(
    tests: &NamedTests,
    base_commit: &str,
    place: &RunPlace<'_>,
) -> Result<Vec<String>, String> {
    let patch = tests.test_patch.clone();
    let changes = crate::safe_fs::blocking(move || crate::git::patch_changes(&patch))
        .await
        .map_err(|e| format!("the test patch cannot be read: {e}"))?;
    let touched: BTreeSet<String> = changes
        .iter()
        .flat_map(|c| c.paths())
        .map(str::to_string)
        .collect();
    if touched.is_empty() {
        return Err("the test patch names no file".into());
    }
    let (base, patch) = (base_commit.to_string(), tests.test_patch.clone());
    let laid = touched.clone();
    place
        .wt
        .blocking(move |wt| {
            wt.restore_paths(&base, &|p| laid.contains(p))
                .map_err(|e| format!("cannot lay the test files down from the base commit: {e}"))?;
            wt.apply_patch(&patch)
                .map_err(|e| format!("the test patch does not apply at the base commit: {e}"))
        })
        .await?;
    Ok(touched.into_iter().collect())
}

/// The named tests' files that are regular files of the worktree (never through a link).
async fn present_files(files: Vec<String>, place: &RunPlace<'_>) -> Vec<String> {
    place
        .wt
        .blocking(move |wt| {
            files
                .into_iter()
                .filter(|f| {
                    crate::safe_fs::read_capped(&wt.dir, f, 0)
                        .map(|_| true)
                        .unwrap_or(false)
                })
                .collect()
        })
        .await
}

/// Runs and judges the named tests (see the module's description).
pub async fn accept_named_tests(
    tests: &NamedTests,
    written: &[String],
    base_commit: &str,
    place: &RunPlace<'_>,
    seed: &str,
    timeout_seconds: u64,
    art: &mut Artifacts<'_>,
) -> Result<Acceptance, crate::runner::RunError> {
    if base_commit.is_empty() {
        return Ok(Acceptance::Infra(
            "the run's base commit is unknown: the test patch has nothing to apply to".into(),
        ));
    }
    let patched = match apply_test_patch(tests, base_commit, place).await {
        Ok(p) => p,
        Err(why) => return Ok(Acceptance::Infra(why)),
    };
    tracing::info!(files = patched.len(), "test patch applied");
    let files = present_files(tests.files(), place).await;
    if files.is_empty() {
        let empty = TestRunReport {
            format: "junit".into(),
            cases: Vec::new(),
        };
        let judgement = judge_named(tests, Ok(&empty));
        art.put_json("tests_result.json", &serde_json::json!(judgement))
            .await?;
        let brief = FailureBrief::new(
            Stage::AcceptanceFailed,
            None,
            None,
            &format!(
                "none of the named tests' files exists: {}\n{}",
                tests.files().join(", "),
                judgement.reasons.join("\n")
            ),
        );
        return Ok(Acceptance::Judged(Box::new(Judged {
            run: None,
            judgement,
            brief: Some(brief),
        })));
    }
    let command = std::iter::once("python -m pytest".to_string())
        .chain(files.iter().map(|f| quote(f)))
        .collect::<Vec<_>>()
        .join(" ");
    // Everything else of a test run's parameters at its default: one run, nothing frozen, no
    // skip allowed, expected to pass.
    let params: TestRunParams = match serde_json::from_value(json!({
        "command": command, "language": "python", "expect": "pass",
        "test_paths": files, "timeout_seconds": timeout_seconds,
        "code_under_test": written,
    })) {
        Ok(p) => p,
        Err(e) => return Ok(Acceptance::Infra(format!("the test run's parameters: {e}"))),
    };
    let obs = match observe(place, &params, seed).await {
        Ok(o) => o,
        Err(why) => return Ok(Acceptance::Infra(format!("the tests could not run: {why}"))),
    };
    let stdout_path = art
        .put("logs/acceptance_0.stdout", obs.stdout.clone().into_bytes())
        .await?;
    let stderr_path = art
        .put("logs/acceptance_0.stderr", obs.stderr.clone().into_bytes())
        .await?;
    let run = CmdResult {
        command: shared::factory::split_command(&command).unwrap_or_default(),
        exit_code: obs.exec.exit_code,
        stdout_trunc: text::tail(&obs.stdout, 200, 8000),
        stderr_trunc: text::tail(&obs.stderr, 200, 8000),
        stdout_path,
        stderr_path,
        duration_seconds: obs.exec.duration.as_secs_f64(),
    };
    let judgement = judge_named(tests, obs.report.as_ref().map_err(String::as_str));
    art.put_json("tests_result.json", &serde_json::json!(judgement))
        .await?;
    // Tampering seen by the runner guard is its own verdict, naming what was seen.
    if !obs.tampered.is_empty() {
        let why = format!("the runner was tampered with: {}", obs.tampered.join("; "));
        return Ok(Acceptance::Judged(Box::new(Judged {
            run: Some(run),
            judgement,
            brief: Some(FailureBrief::new(
                Stage::RunnerTampered,
                Some(command.clone()),
                Some(obs.exit_code),
                &why,
            )),
        })));
    }
    let brief = (!judgement.ok).then(|| {
        let mut excerpt = judgement.reasons.join("\n");
        for n in judgement
            .fail_to_pass
            .not_passing
            .iter()
            .chain(&judgement.pass_to_pass.not_passing)
            .take(10)
        {
            excerpt.push_str(&format!(
                "\n{} {}: {}",
                n.id,
                n.outcome,
                text::head(&n.message, 200)
            ));
        }
        excerpt.push_str(&format!("\n{}", text::tail(&obs.stdout, 20, 1000)));
        FailureBrief::new(
            Stage::AcceptanceFailed,
            Some(command.clone()),
            Some(obs.exit_code),
            &excerpt,
        )
    });
    Ok(Acceptance::Judged(Box::new(Judged {
        run: Some(run),
        judgement,
        brief,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_typed_and_a_wrong_type_is_a_clear_error() {
        let p: FactoryVerifyParams =
            read_params(&json!({"acceptance_commands": ["pytest -q"], "attempt_index": 2}))
                .unwrap_or_else(|_| panic!("good parameters"));
        assert_eq!(p.command_timeout_seconds, 600);
        assert_eq!(p.acceptance_commands, vec!["pytest -q".to_string()]);
        assert!(p.tests.is_none() && p.base_commit.is_empty());
        let bad = read_params::<FactoryVerifyParams>(&json!({"acceptance_commands": "pytest"}))
            .err()
            .expect("a string is not a list of commands");
        assert_eq!(bad.status, JobStatus::Error);
        assert!(bad.error.unwrap().starts_with("bad parameters: "));
        // Named tests come whole or not at all: a test patch alone is refused.
        let tests = json!({"tests": {"test_patch": "x"}, "base_commit": "abc"});
        assert!(read_params::<FactoryVerifyParams>(&tests).is_err());
        let tests = json!({"tests": null, "base_commit": "abc"});
        let p: FactoryVerifyParams =
            read_params(&tests).unwrap_or_else(|_| panic!("a work order without tests"));
        assert!(p.tests.is_none());
    }

    #[test]
    fn file_names_are_quoted_for_shell_rules() {
        assert_eq!(quote("toolz/tests/test_x.py"), "toolz/tests/test_x.py");
        for name in ["a b.py", "it's.py", "$(x).py", ""] {
            let line = format!("python -m pytest {}", quote(name));
            let argv = shared::factory::split_command(&line).unwrap();
            assert_eq!(argv.last().map(String::as_str), Some(name), "{line}");
        }
    }
}
