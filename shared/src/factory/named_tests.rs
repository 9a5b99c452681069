//! Acceptance by named tests (SWE-bench's `FAIL_TO_PASS` and `PASS_TO_PASS`): pytest node ids
//! (`path.py::Class::test[param]`), checked, mapped to the ids of pytest's JUnit report, and
//! judged one by one. A named test passes only if the report shows it passed: one that failed,
//! errored, was skipped, xfailed or xpassed, or does not appear at all (it does not exist, its
//! file is gone, the run broke) does not.

use super::patch_paths::patch_paths;
use crate::paths::normalize_relative;
use crate::scope::{ScopeMatcher, WriteScope};
use crate::testreport::{CaseOutcome, TestRunReport};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// At most this many named tests per work order (both lists together).
pub const MAX_NAMED_TESTS: usize = 10_000;
/// A node id is at most this many characters.
pub const MAX_NODE_ID_CHARS: usize = 1_000;
/// Each list's judgement names at most this many tests that did not pass.
pub const MAX_LISTED: usize = 50;

/// The tests a work order is accepted by, and the patch that brings them: the harness applies
/// `test_patch` after the agent's patch (the agent never sees or writes its files), runs the
/// files of the named tests with the pinned runner, and every test of both lists must pass.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NamedTests {
    /// A unified diff (`git diff` form) adding or changing tests.
    pub test_patch: String,
    /// Tests that fail before the fix and must pass after it (at least one).
    pub fail_to_pass: Vec<String>,
    /// Tests that passed before and must still pass.
    #[serde(default)]
    pub pass_to_pass: Vec<String>,
}

/// Why named tests were refused: the field (`test_patch`, `fail_to_pass[2]`, ...) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedTestsError {
    pub field: String,
    pub message: String,
}

fn refuse(field: impl Into<String>, message: impl Into<String>) -> NamedTestsError {
    NamedTestsError {
        field: field.into(),
        message: message.into(),
    }
}

/// The file of a node id: what comes before its first `::`.
pub fn node_file(id: &str) -> &str {
    id.split("::").next().unwrap_or(id)
}

/// A pytest node id the harness can run: `path.py::name[...]`, the path plain, relative and
/// not starting with `-` (it goes on pytest's command line), no control characters.
pub fn check_node_id(id: &str) -> Result<(), String> {
    if id.chars().count() > MAX_NODE_ID_CHARS {
        return Err(format!("longer than {MAX_NODE_ID_CHARS} characters"));
    }
    if id.chars().any(char::is_control) {
        return Err(format!("`{id}` holds a control character"));
    }
    let Some((file, rest)) = id.split_once("::") else {
        return Err(format!(
            "`{id}` is not a pytest node id (`path/test_x.py::test_name`); only pytest instances are supported"
        ));
    };
    if rest.is_empty() || rest.split("::").any(str::is_empty) {
        return Err(format!("`{id}` has an empty name after `::`"));
    }
    if !file.ends_with(".py") {
        return Err(format!(
            "`{id}`: the test file `{file}` is not a `.py` file"
        ));
    }
    match normalize_relative(file) {
        Ok(n) if n == file && !file.starts_with('-') && !file.contains('\\') => Ok(()),
        _ => Err(format!(
            "`{id}`: the test file `{file}` is not a plain relative path"
        )),
    }
}

/// The id pytest's JUnit report gives a node id (its `mangle_test_address`): the file's path
/// dotted without `.py`, classes joined by `.`, then `::` and the name with its parameters.
/// `a/test_x.py::TestA::test_b[1]` → `a.test_x.TestA::test_b[1]`.
pub fn junit_id(node_id: &str) -> String {
    let (path, bracket, params) = match node_id.find('[') {
        Some(i) => (&node_id[..i], "[", &node_id[i + 1..]),
        None => (node_id, "", ""),
    };
    let mut names: Vec<String> = path.split("::").map(str::to_string).collect();
    names[0] = names[0].replace('/', ".");
    if let Some(stripped) = names[0].strip_suffix(".py") {
        names[0] = stripped.to_string();
    }
    let last = names.pop().unwrap_or_default();
    format!("{}::{last}{bracket}{params}", names.join("."))
}

impl NamedTests {
    /// Every named test, `fail_to_pass` first.
    pub fn all(&self) -> impl Iterator<Item = &String> {
        self.fail_to_pass.iter().chain(&self.pass_to_pass)
    }

    /// The test files to run: the files of the named tests, sorted, once each.
    pub fn files(&self) -> Vec<String> {
        let files: BTreeSet<&str> = self.all().map(|id| node_file(id)).collect();
        files.into_iter().map(str::to_string).collect()
    }

    /// Checks the tests against the work order's write scope (`allowed_files`, globs): a test
    /// patch that parses and names files, at least one `fail_to_pass`, well-formed node ids,
    /// none named twice, at most [`MAX_NAMED_TESTS`]; and the scope covers neither a file of
    /// the test patch nor a file of a named test (the agent could rewrite the test).
    pub fn check(&self, allowed_files: &[String]) -> Result<(), NamedTestsError> {
        if self.test_patch.trim().is_empty() {
            return Err(refuse("test_patch", "is empty"));
        }
        let patched =
            patch_paths(&self.test_patch).map_err(|e| refuse("test_patch", e.to_string()))?;
        if self.fail_to_pass.is_empty() {
            return Err(refuse(
                "fail_to_pass",
                "names no test (at least one must fail before the fix)",
            ));
        }
        let total = self.fail_to_pass.len() + self.pass_to_pass.len();
        if total > MAX_NAMED_TESTS {
            return Err(refuse(
                "pass_to_pass",
                format!("{total} named tests, more than {MAX_NAMED_TESTS}"),
            ));
        }
        let mut seen: BTreeMap<&str, String> = BTreeMap::new();
        for (list, ids) in [
            ("fail_to_pass", &self.fail_to_pass),
            ("pass_to_pass", &self.pass_to_pass),
        ] {
            for (i, id) in ids.iter().enumerate() {
                let field = format!("{list}[{i}]");
                check_node_id(id).map_err(|m| refuse(&field, m))?;
                if let Some(first) = seen.insert(id, field.clone()) {
                    return Err(refuse(field, format!("`{id}` is already named as {first}")));
                }
            }
        }
        let scope = WriteScope {
            globs: allowed_files.to_vec(),
            ..Default::default()
        };
        let matcher =
            ScopeMatcher::new(&scope).map_err(|e| refuse("allowed_files", e.to_string()))?;
        let files = self.files();
        let guarded = patched.iter().chain(&files);
        if let Some(p) = guarded.into_iter().find(|p| matcher.covers(p)) {
            return Err(refuse(
                "allowed_files",
                format!(
                    "the write scope covers `{p}`, a file of the test patch or of a named test: \
                     the agent could change the tests it is judged by"
                ),
            ));
        }
        Ok(())
    }
}

/// How one list of named tests fared.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ListJudgement {
    pub total: usize,
    pub passed: usize,
    /// Up to [`MAX_LISTED`] tests that did not pass, with their outcome.
    pub not_passing: Vec<NotPassing>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NotPassing {
    pub id: String,
    /// `failed`, `errored`, `skipped`, `xfailed`, `xpassed`, or `missing` (not in the report).
    pub outcome: String,
    pub message: String,
}

/// The verdict over the named tests.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NamedJudgement {
    pub ok: bool,
    pub fail_to_pass: ListJudgement,
    pub pass_to_pass: ListJudgement,
    /// Short lowercase sentences, one per list that did not pass (or why the run counts for
    /// nothing).
    pub reasons: Vec<String>,
    /// Every named test's outcome, by node id.
    pub outcomes: BTreeMap<String, String>,
}

fn outcome_name(o: CaseOutcome) -> String {
    serde_json::to_value(o)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "failed".into())
}

/// Judges the named tests on a run's report (`Err`: the run is broken, nothing counts).
pub fn judge_named(tests: &NamedTests, report: Result<&TestRunReport, &str>) -> NamedJudgement {
    let by_id: BTreeMap<&str, (CaseOutcome, &str)> = match report {
        Ok(r) => r
            .cases
            .iter()
            .map(|c| (c.id.as_str(), (c.outcome, c.message.as_str())))
            .collect(),
        Err(_) => BTreeMap::new(),
    };
    let mut outcomes = BTreeMap::new();
    let mut judge = |ids: &[String]| {
        let mut list = ListJudgement {
            total: ids.len(),
            ..Default::default()
        };
        for id in ids {
            let (outcome, message) = match by_id.get(junit_id(id).as_str()) {
                Some((CaseOutcome::Passed, _)) => {
                    list.passed += 1;
                    outcomes.insert(id.clone(), "passed".to_string());
                    continue;
                }
                Some((o, m)) => (outcome_name(*o), crate::text::head(m, 300)),
                None => ("missing".to_string(), "not in the test report".to_string()),
            };
            outcomes.insert(id.clone(), outcome.clone());
            if list.not_passing.len() < MAX_LISTED {
                list.not_passing.push(NotPassing {
                    id: id.clone(),
                    outcome,
                    message,
                });
            }
        }
        list
    };
    let fail_to_pass = judge(&tests.fail_to_pass);
    let pass_to_pass = judge(&tests.pass_to_pass);
    let mut reasons = Vec::new();
    if let Err(why) = report {
        reasons.push(format!("the test run is broken: {why}"));
    }
    for (name, list) in [
        ("FAIL_TO_PASS", &fail_to_pass),
        ("PASS_TO_PASS", &pass_to_pass),
    ] {
        if list.passed < list.total {
            let first: Vec<String> = list
                .not_passing
                .iter()
                .take(5)
                .map(|n| format!("{} ({})", n.id, n.outcome))
                .collect();
            reasons.push(format!(
                "{} of {} {name} tests did not pass: {}{}",
                list.total - list.passed,
                list.total,
                first.join(", "),
                if list.total - list.passed > first.len() {
                    ", ..."
                } else {
                    ""
                }
            ));
        }
    }
    NamedJudgement {
        ok: reasons.is_empty(),
        fail_to_pass,
        pass_to_pass,
        reasons,
        outcomes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testreport::parse_junit;

    const PATCH: &str = "diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n+++ b/tests/test_x.py\n@@ -1 +1,2 @@\n a\n+b\n";

    fn tests() -> NamedTests {
        NamedTests {
            test_patch: PATCH.into(),
            fail_to_pass: vec![
                "tests/test_x.py::test_new[int]".into(),
                "tests/test_x.py::TestA::test_b".into(),
            ],
            pass_to_pass: vec!["tests/test_y.py::test_old".into()],
        }
    }

    #[test]
    fn node_ids_map_to_the_ids_of_pytests_junit_report() {
        assert_eq!(junit_id("t/test_x.py::test_a"), "t.test_x::test_a");
        assert_eq!(
            junit_id("t/test_x.py::TestA::test_b"),
            "t.test_x.TestA::test_b"
        );
        assert_eq!(
            junit_id("t/test_x.py::TestA::Inner::test_b[a::b/c-1]"),
            "t.test_x.TestA.Inner::test_b[a::b/c-1]"
        );
        assert_eq!(junit_id("test_x.py::test_a"), "test_x::test_a");
    }

    #[test]
    fn bad_node_ids_are_refused_with_the_reason() {
        for (id, why) in [
            ("test_x", "not a pytest node id"),
            ("test_thing (module.Class)", "not a pytest node id"),
            ("t/x.txt::a", "not a `.py` file"),
            ("../t.py::a", "not a plain relative path"),
            ("-p.py::a", "not a plain relative path"),
            ("./t.py::a", "not a plain relative path"),
            ("t.py::", "empty name"),
            ("t.py::a\nb", "control character"),
        ] {
            let err = check_node_id(id).unwrap_err();
            assert!(err.contains(why), "{id}: {err}");
        }
        assert!(check_node_id("t/test_x.py::TestA::test_b[1-x]").is_ok());
    }

    #[test]
    fn the_write_scope_may_not_reach_the_tests() {
        let t = tests();
        assert!(t.check(&["src/x.py".into()]).is_ok());
        for globs in [vec!["tests/test_x.py"], vec!["tests/*.py"], vec!["**"]] {
            let globs: Vec<String> = globs.into_iter().map(String::from).collect();
            let err = t.check(&globs).unwrap_err();
            assert_eq!(err.field, "allowed_files", "{globs:?}");
            assert!(err.message.contains("tests/test_"), "{}", err.message);
        }
        // A file of a named test that the test patch does not touch is guarded too.
        let err = t.check(&["tests/test_y.py".into()]).unwrap_err();
        assert!(err.message.contains("tests/test_y.py"));
    }

    #[test]
    fn malformed_named_tests_name_their_field() {
        type Change = Box<dyn Fn(&mut NamedTests)>;
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|t| t.test_patch = " ".into()), "test_patch"),
            (
                Box::new(|t| t.test_patch = "not a patch".into()),
                "test_patch",
            ),
            (Box::new(|t| t.fail_to_pass.clear()), "fail_to_pass"),
            (
                Box::new(|t| t.fail_to_pass[1] = "nope".into()),
                "fail_to_pass[1]",
            ),
            (
                Box::new(|t| t.pass_to_pass.push(t.fail_to_pass[0].clone())),
                "pass_to_pass[1]",
            ),
        ];
        for (change, field) in cases {
            let mut t = tests();
            change(&mut t);
            assert_eq!(t.check(&[]).unwrap_err().field, field);
        }
        let mut t = tests();
        t.pass_to_pass = (0..MAX_NAMED_TESTS)
            .map(|i| format!("t.py::t{i}"))
            .collect();
        assert!(t.check(&[]).unwrap_err().message.contains("more than"));
        assert_eq!(
            tests().files(),
            vec!["tests/test_x.py".to_string(), "tests/test_y.py".to_string()]
        );
    }

    fn report(cases: &str) -> TestRunReport {
        parse_junit(&format!(
            "<testsuites><testsuite>{cases}</testsuite></testsuites>"
        ))
        .unwrap()
    }

    #[test]
    fn every_named_test_must_pass_by_its_own_report_entry() {
        let all_pass = report(
            r#"<testcase classname="tests.test_x" name="test_new[int]"/>
               <testcase classname="tests.test_x.TestA" name="test_b"/>
               <testcase classname="tests.test_y" name="test_old"/>
               <testcase classname="tests.test_y" name="test_unnamed"><failure message="boom"/></testcase>"#,
        );
        let j = judge_named(&tests(), Ok(&all_pass));
        assert!(j.ok, "{j:?}");
        assert_eq!((j.fail_to_pass.passed, j.pass_to_pass.passed), (2, 1));
        assert_eq!(j.outcomes.len(), 3);

        // Skipped, failing and absent tests do not pass; each is named with its outcome.
        let mixed = report(
            r#"<testcase classname="tests.test_x" name="test_new[int]"><skipped message="no"/></testcase>
               <testcase classname="tests.test_y" name="test_old"><failure message="AssertionError: 1 != 2"/></testcase>"#,
        );
        let j = judge_named(&tests(), Ok(&mixed));
        assert!(!j.ok);
        let outcomes: Vec<(&str, &str)> = j
            .fail_to_pass
            .not_passing
            .iter()
            .chain(&j.pass_to_pass.not_passing)
            .map(|n| (n.id.as_str(), n.outcome.as_str()))
            .collect();
        assert_eq!(
            outcomes,
            [
                ("tests/test_x.py::test_new[int]", "skipped"),
                ("tests/test_x.py::TestA::test_b", "missing"),
                ("tests/test_y.py::test_old", "failed"),
            ]
        );
        assert_eq!(j.reasons.len(), 2, "{:?}", j.reasons);
        assert!(j.reasons[0].starts_with("2 of 2 FAIL_TO_PASS tests did not pass"));
        assert!(j.pass_to_pass.not_passing[0].message.contains("1 != 2"));

        // A broken run counts for nothing.
        let j = judge_named(&tests(), Err("no report"));
        assert!(!j.ok);
        assert_eq!(j.reasons[0], "the test run is broken: no report");
        assert_eq!(j.fail_to_pass.passed, 0);
    }
}
