//! SWE-bench instances: a line of a SWE-bench-style dataset (`instance_id`, `repo`,
//! `base_commit`, `problem_statement`, `test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS`; the two
//! lists as JSON lists or as JSON-encoded strings, as the published files give them) turned
//! into a factory work order. Other SWE-bench fields (`hints_text`, `version`, `created_at`,
//! `environment_setup_commit`, ...) are tolerated and unused; `patch` (the gold patch) gives
//! the write scope unless the line has `allowed_files`.
//!
//! The work order: intent from `problem_statement`, the title its first line; acceptance is the
//! named tests ([`NamedTests`]): the harness applies `test_patch` after the agent's patch and
//! judges every test of both lists from the runner's report; there are no acceptance commands.
//! The agent's write scope is `allowed_files` when given, else every file the gold `patch`
//! touches, else the item is refused; it may cover no file of the test patch and no file of a
//! named test. `repo` is `owner/name`, a repository in the batch's mirror directory
//! (`<dir>/owner__name`), checked out at `base_commit` (a full commit id).

use super::named_tests::NamedTests;
use super::patch_paths::patch_files;
use super::work_order::{WorkOrder, MAX_CONTEXT_FILES};
use serde_json::Value;
use thiserror::Error;

/// The title is the problem statement's first line, cut to this many characters.
const TITLE_CHARS: usize = 100;

/// Characters a derived write-scope entry may not hold (they would read as a glob).
const GLOB_CHARS: &[char] = &['*', '?', '[', ']', '{', '}', '\\', '!'];

/// What a SWE-bench line becomes: a dataset item's parts.
#[derive(Clone, Debug, PartialEq)]
pub struct SweItem {
    pub id: String,
    /// `owner/name`, in the batch's mirror directory.
    pub repo: String,
    /// A full commit id, lowercase.
    pub base_commit: String,
    pub work_order: WorkOrder,
    /// The fleet's own field: a scripted agent for this item.
    pub script: Option<Value>,
}

/// Why a SWE-bench line was refused: the field (as the line names it) and why.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("`{field}`: {message}")]
pub struct SweError {
    pub field: String,
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> SweError {
    SweError {
        field: field.into(),
        message: message.into(),
    }
}

/// Whether a line is in SWE-bench's form (it has `instance_id`).
pub fn is_swe_line(line: &Value) -> bool {
    line.get("instance_id").is_some()
}

/// `owner/name`: two parts of 1 to 100 of `[A-Za-z0-9_.-]`, neither `.` nor `..`.
pub fn valid_mirror_name(repo: &str) -> bool {
    let parts: Vec<&str> = repo.split('/').collect();
    parts.len() == 2
        && parts.iter().all(|p| {
            (1..=100).contains(&p.len())
                && *p != "."
                && *p != ".."
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        })
}

/// The folder of `owner/name` in a mirror directory: `owner__name`, as SWE-bench names it.
pub fn mirror_folder(repo: &str) -> String {
    repo.replace('/', "__")
}

fn string<'a>(line: &'a Value, field: &str) -> Result<&'a str, SweError> {
    match line.get(field) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s),
        Some(Value::String(_)) => Err(err(field, "is empty")),
        Some(other) => Err(err(field, format!("is {}, not a string", kind(other)))),
        None => Err(err(field, "is missing")),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A list of strings, given as a JSON list or as a string holding one (SWE-bench's files).
fn string_list(line: &Value, field: &str) -> Result<Vec<String>, SweError> {
    let value = line.get(field).ok_or_else(|| err(field, "is missing"))?;
    let decoded;
    let list = match value {
        Value::Array(items) => items,
        Value::String(text) => {
            decoded = serde_json::from_str::<Value>(text).map_err(|e| {
                err(
                    field,
                    format!("is a string that is not a JSON list of test ids: {e}"),
                )
            })?;
            decoded
                .as_array()
                .ok_or_else(|| err(field, "is a string that is not a JSON list of test ids"))?
        }
        other => {
            return Err(err(
                field,
                format!("is {}, not a list of test ids", kind(other)),
            ))
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) => Ok(s.clone()),
            other => Err(err(
                format!("{field}[{i}]"),
                format!("is {}, not a test id", kind(other)),
            )),
        })
        .collect()
}

/// Reads a SWE-bench line (see the module's description); refused naming the field.
pub fn swe_item(line: &Value) -> Result<SweItem, SweError> {
    if !line.is_object() {
        return Err(err("instance_id", "the line is not a JSON object"));
    }
    let id = string(line, "instance_id")?.to_string();
    let repo = string(line, "repo")?;
    if !valid_mirror_name(repo) {
        return Err(err(
            "repo",
            format!("`{repo}` is not `owner/name` (two parts of `[A-Za-z0-9_.-]`)"),
        ));
    }
    let base_commit = string(line, "base_commit")?.to_ascii_lowercase();
    if !matches!(base_commit.len(), 40 | 64) || !base_commit.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(err(
            "base_commit",
            format!("`{base_commit}` is not a full commit id (40 hex digits)"),
        ));
    }
    let problem = string(line, "problem_statement")?;
    let test_patch = string(line, "test_patch")?.to_string();
    let tests = NamedTests {
        test_patch,
        fail_to_pass: string_list(line, "FAIL_TO_PASS")?,
        pass_to_pass: string_list(line, "PASS_TO_PASS")?,
    };
    let (allowed_files, context_files) = write_scope(line)?;
    tests.check(&allowed_files).map_err(|e| {
        let field = e
            .field
            .replace("fail_to_pass", "FAIL_TO_PASS")
            .replace("pass_to_pass", "PASS_TO_PASS");
        err(field, e.message)
    })?;
    let first_line = problem
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or(&id);
    let title: String = first_line.chars().take(TITLE_CHARS).collect();
    let work_order = WorkOrder {
        id: id.clone(),
        title,
        intent: problem.to_string(),
        allowed_files,
        forbidden: vec![
            "the tests: the harness applies the instance's test patch after your patch and runs the tests it names".into(),
        ],
        acceptance_commands: Vec::new(),
        context_files,
        notes: None,
        tests: Some(tests),
        checks: None,
        policy_allow: None,
        examples: None,
    };
    work_order
        .validate()
        .map_err(|e| err("work_order", e.to_string()))?;
    let script = match line.get("script") {
        None | Some(Value::Null) => None,
        Some(s) => Some(s.clone()),
    };
    Ok(SweItem {
        id,
        repo: repo.to_string(),
        base_commit,
        work_order,
        script,
    })
}

/// The agent's write scope and its context files: `allowed_files` as given (globs), or every
/// path the gold `patch` touches; the context is the scope's plain paths that exist before
/// the patch (the gold patch's files it modifies, not those it adds), at most ten.
fn write_scope(line: &Value) -> Result<(Vec<String>, Vec<String>), SweError> {
    if let Some(given) = line.get("allowed_files") {
        let Value::Array(items) = given else {
            return Err(err(
                "allowed_files",
                format!("is {}, not a list of paths", kind(given)),
            ));
        };
        let mut allowed = Vec::new();
        for (i, v) in items.iter().enumerate() {
            match v {
                Value::String(s) if !s.trim().is_empty() => allowed.push(s.clone()),
                other => {
                    return Err(err(
                        format!("allowed_files[{i}]"),
                        format!("is {}, not a path", kind(other)),
                    ))
                }
            }
        }
        if allowed.is_empty() {
            return Err(err(
                "allowed_files",
                "is empty: the agent could change nothing",
            ));
        }
        let context = allowed
            .iter()
            .filter(|p| !p.contains(GLOB_CHARS))
            .take(MAX_CONTEXT_FILES)
            .cloned()
            .collect();
        return Ok((allowed, context));
    }
    let patch = match line.get("patch") {
        Some(Value::String(p)) if !p.trim().is_empty() => p,
        Some(Value::String(_)) | None | Some(Value::Null) => return Err(err(
            "allowed_files",
            "no write scope: give `allowed_files` or the gold `patch` (its files are the scope)",
        )),
        Some(other) => return Err(err("patch", format!("is {}, not a patch", kind(other)))),
    };
    let files = patch_files(patch).map_err(|e| err("patch", e.to_string()))?;
    let mut allowed: Vec<String> = Vec::new();
    let mut context: Vec<String> = Vec::new();
    for f in &files {
        for p in f.paths() {
            if p.contains(GLOB_CHARS) {
                return Err(err(
                    "patch",
                    format!("touches `{p}`, which would read as a glob in the write scope: give `allowed_files`"),
                ));
            }
            if !allowed.iter().any(|a| a == p) {
                allowed.push(p.to_string());
            }
        }
        if let Some(old) = f.old_path.as_deref() {
            if context.len() < MAX_CONTEXT_FILES && !context.iter().any(|c| c == old) {
                context.push(old.to_string());
            }
        }
    }
    Ok((allowed, context))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const GOLD: &str = "diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n@@ -1 +1 @@\n-bug\n+fix\ndiff --git a/pkg/new.py b/pkg/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1 @@\n+x\n";
    const TESTS: &str = "diff --git a/tests/test_core.py b/tests/test_core.py\n--- a/tests/test_core.py\n+++ b/tests/test_core.py\n@@ -1 +1,2 @@\n a\n+b\n";

    fn line() -> Value {
        json!({
            "instance_id": "owner__pkg-12", "repo": "owner/pkg",
            "base_commit": "A".repeat(40),
            "problem_statement": "\n  core() is wrong\n\nMore words.",
            "patch": GOLD, "test_patch": TESTS,
            "FAIL_TO_PASS": "[\"tests/test_core.py::test_fixed\"]",
            "PASS_TO_PASS": ["tests/test_core.py::TestOld::test_kept"],
            "hints_text": "", "version": "1.0", "created_at": "2024-01-01T00:00:00Z",
            "environment_setup_commit": "b".repeat(40), "difficulty": "<15 min fix",
        })
    }

    #[test]
    fn a_published_instance_becomes_a_work_order_judged_by_its_tests() {
        let item = swe_item(&line()).unwrap();
        assert_eq!(item.id, "owner__pkg-12");
        assert_eq!(item.repo, "owner/pkg");
        assert_eq!(item.base_commit, "a".repeat(40));
        let wo = &item.work_order;
        assert_eq!(wo.title, "core() is wrong");
        assert!(wo.intent.contains("More words."));
        assert_eq!(wo.allowed_files, ["pkg/core.py", "pkg/new.py"]);
        // The context is what exists before the patch.
        assert_eq!(wo.context_files, ["pkg/core.py"]);
        assert!(wo.acceptance_commands.is_empty());
        let tests = wo.tests.as_ref().unwrap();
        assert_eq!(tests.fail_to_pass, ["tests/test_core.py::test_fixed"]);
        assert_eq!(
            tests.pass_to_pass,
            ["tests/test_core.py::TestOld::test_kept"]
        );
        assert_eq!(tests.test_patch, TESTS);
        assert!(item.script.is_none());
        // It round-trips as a work order the factory reads.
        let value = serde_json::to_value(wo).unwrap();
        assert_eq!(&WorkOrder::from_value(&value).unwrap(), wo);
        assert_eq!(mirror_folder(&item.repo), "owner__pkg");
    }

    #[test]
    fn allowed_files_given_on_the_line_are_the_scope() {
        let mut l = line();
        l["allowed_files"] = json!(["pkg/**", "docs/x.md"]);
        l.as_object_mut().unwrap().remove("patch");
        let item = swe_item(&l).unwrap();
        assert_eq!(item.work_order.allowed_files, ["pkg/**", "docs/x.md"]);
        assert_eq!(item.work_order.context_files, ["docs/x.md"]);
    }

    #[test]
    fn refusals_name_the_field() {
        let cases: Vec<(&str, Value, &str)> = vec![
            (
                "repo",
                json!("https://github.com/owner/pkg"),
                "not `owner/name`",
            ),
            ("repo", json!("owner/../x"), "not `owner/name`"),
            ("repo", json!(7), "a number, not a string"),
            ("base_commit", json!("main"), "not a full commit id"),
            ("problem_statement", json!("  "), "is empty"),
            ("test_patch", json!("no headers"), "names no file"),
            ("FAIL_TO_PASS", json!("[\"a\""), "not a JSON list"),
            ("FAIL_TO_PASS", json!([]), "names no test"),
            ("FAIL_TO_PASS", json!({"a": 1}), "not a list of test ids"),
            ("PASS_TO_PASS", json!([1]), "not a test id"),
            (
                "PASS_TO_PASS",
                json!(["test_kept (tests.Old)"]),
                "not a pytest node id",
            ),
            (
                "patch",
                json!("diff --git a/../x b/../x\n"),
                "not a plain relative path",
            ),
            (
                "allowed_files",
                json!(["tests/**"]),
                "could change the tests",
            ),
            ("allowed_files", json!([]), "is empty"),
            ("allowed_files", json!("pkg/core.py"), "not a list of paths"),
        ];
        for (field, value, why) in cases {
            let mut l = line();
            l[field] = value.clone();
            let e = swe_item(&l).unwrap_err();
            assert!(e.field.starts_with(field), "{field}={value}: {e}");
            assert!(e.message.contains(why), "{field}={value}: {e}");
        }
        for field in [
            "instance_id",
            "repo",
            "base_commit",
            "test_patch",
            "PASS_TO_PASS",
        ] {
            let mut l = line();
            l.as_object_mut().unwrap().remove(field);
            assert_eq!(
                swe_item(&l).unwrap_err(),
                err(field, "is missing"),
                "{field}"
            );
        }
        // No scope at all.
        let mut l = line();
        l.as_object_mut().unwrap().remove("patch");
        let e = swe_item(&l).unwrap_err();
        assert!(e.message.contains("no write scope"), "{e}");
        // A gold patch that also edits the test patch's file.
        let mut l = line();
        l["patch"] = json!(format!("{GOLD}{TESTS}"));
        let e = swe_item(&l).unwrap_err();
        assert_eq!(e.field, "allowed_files", "{e}");
        assert!(e.message.contains("tests/test_core.py"), "{e}");
    }

    proptest::proptest! {
        #![proptest_config(crate::schema::tests::cases(256))]

        /// Lines come from datasets: any value in any field is read or refused, quickly.
        #[test]
        fn any_line_is_read_or_refused(
            field in proptest::sample::select(vec!["instance_id", "repo", "base_commit",
                "problem_statement", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS",
                "allowed_files", "script"]),
            value in crate::schema::tests::arb_json(),
        ) {
            let mut l = line();
            l[field] = value;
            let (result, took) = crate::schema::tests::timed(|| swe_item(&l));
            proptest::prop_assert!(took < crate::schema::tests::CASE_LIMIT);
            if let Ok(item) = result {
                proptest::prop_assert!(item.work_order.validate().is_ok());
                proptest::prop_assert!(valid_mirror_name(&item.repo));
            }
        }
    }
}
