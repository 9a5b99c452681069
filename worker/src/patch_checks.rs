//! TR's checks on a patch beyond its scope (the factory): the policy for code written by agents
//! (`claims::policy`) on every Python file the patch touches, and the special-casing signals
//! (`shared::special_case`) of the lines it adds. A repository's own code may use more than
//! the policy allows: a refusal counts only when the same (rule, name) does not already occur
//! in the file at the base. Runs on the blocking pool (file reads, parsing).

use crate::claims::policy::{self, Allowances, Forbidden};
use crate::git::Worktree;
use crate::safe_fs;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use shared::factory::{FailureBrief, Stage};
use shared::special_case::{self, SuspectedSpecialCase};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Bytes of one source read, at most.
const MAX_SOURCE: usize = 1 << 20;
/// Test files read for their literals, at most, and their bytes.
const MAX_TEST_FILES: usize = 200;
const MAX_TEST_BYTES: u64 = 8 << 20;

/// The work order's parts the checks read (the `tr` node's `with`).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PatchCheckParams {
    /// Names the policy allows beyond its defaults (the work order's `policy_allow`).
    #[serde(default)]
    pub policy_allow: Option<Vec<String>>,
    #[serde(default)]
    pub acceptance_commands: Option<Vec<String>>,
    /// The work order's examples, any JSON (their numbers and strings are literals).
    #[serde(default)]
    pub examples: Value,
    /// A SWE-bench item's named tests: the lines its `test_patch` adds are tests too.
    #[serde(default)]
    pub tests: Value,
}

/// The literals of the lines a SWE-bench item's test patch adds (`tests.test_patch`).
fn test_patch_literals(tests: &Value) -> BTreeSet<String> {
    let patch = tests["test_patch"].as_str().unwrap_or_default();
    special_case::added_lines(patch)
        .iter()
        .flat_map(|l| special_case::literals(&l.text))
        .collect()
}

/// A refusal in a file the patch touches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PatchRefusal {
    pub path: String,
    pub name: String,
    pub rule: String,
    pub line: usize,
}

/// What the worktree held before the patch: the touched Python files' refusals at the base
/// (`None`: the file did not parse there) and the literals of the tests and examples.
pub struct Before {
    base: BTreeMap<String, Option<BTreeSet<(String, String)>>>,
    known: BTreeSet<String>,
    allowances: Allowances,
}

/// What the checks found after the patch applied.
#[derive(Debug, Default)]
pub struct Checked {
    pub refusals: Vec<PatchRefusal>,
    pub suspected: Vec<SuspectedSpecialCase>,
}

fn python_paths(touched: &[String]) -> impl Iterator<Item = &String> {
    touched.iter().filter(|p| p.ends_with(".py"))
}

/// Reads the base: call before the patch applies, on the worktree at the base commit.
pub fn before(root: &Path, touched: &[String], p: &PatchCheckParams) -> Before {
    let dirs: Vec<String> = python_paths(touched)
        .filter_map(|t| t.rsplit_once('/').map(|(d, _)| d.to_string()))
        .collect();
    let allowances = Allowances {
        allow: p.policy_allow.clone().unwrap_or_default(),
        local_modules: policy::local_modules(root, &dirs),
    };
    let base = python_paths(touched)
        .map(|path| {
            let kinds = match safe_fs::read_text_within(root, path, MAX_SOURCE) {
                Ok(src) => policy::python_refusals(&src, &allowances)
                    .ok()
                    .map(|found| policy::refusal_kinds(&found)),
                // A new file: nothing tolerated.
                Err(_) => Some(BTreeSet::new()),
            };
            (path.clone(), kinds)
        })
        .collect();
    Before {
        base,
        known: test_literals(root, p),
        allowances,
    }
}

/// The literals of the tests the acceptance commands run (read at the base, before the patch
/// could change them), of their inline code, and of the work order's examples.
fn test_literals(root: &Path, p: &PatchCheckParams) -> BTreeSet<String> {
    let commands = p.acceptance_commands.clone().unwrap_or_default();
    let targets = special_case::test_targets(&commands);
    let mut known = special_case::literals_of_json(&p.examples);
    known.extend(test_patch_literals(&p.tests));
    for code in &targets.inline {
        known.extend(special_case::literals(code));
    }
    let keep = |path: &str| {
        targets.files.contains(path)
            || (special_case::is_test_file(path)
                && (targets.whole_repo
                    || targets
                        .dirs
                        .iter()
                        .any(|d| path.starts_with(&format!("{d}/")))))
    };
    if let Ok((files, _cut)) =
        safe_fs::regular_files_where(root, keep, MAX_TEST_FILES, MAX_TEST_BYTES)
    {
        for (_, bytes) in files {
            known.extend(special_case::literals(&String::from_utf8_lossy(&bytes)));
        }
    }
    known
}

/// Checks the patched worktree: refusals the base did not have, and the special-casing
/// signals of the lines `diff` adds.
pub fn after(root: &Path, before: &Before, diff: &str) -> Checked {
    let mut refusals = Vec::new();
    for (path, base) in &before.base {
        let src = match safe_fs::read_text_within(root, path, MAX_SOURCE) {
            Ok(s) => s,
            Err(_) => continue, // deleted by the patch
        };
        let found: Vec<Forbidden> = match policy::python_refusals(&src, &before.allowances) {
            Ok(f) => f,
            // Code the policy cannot read is code it cannot clear, unless the base was so too.
            Err(e) if base.is_some() => vec![Forbidden {
                name: e,
                rule: "unparsable".into(),
                line: 0,
            }],
            Err(_) => continue,
        };
        let tolerated = base.clone().unwrap_or_default();
        refusals.extend(
            found
                .into_iter()
                .filter(|f| !tolerated.contains(&(f.rule.clone(), f.name.clone())))
                .map(|f| PatchRefusal {
                    path: path.clone(),
                    name: f.name,
                    rule: f.rule,
                    line: f.line,
                }),
        );
    }
    let added = special_case::added_lines(diff);
    Checked {
        refusals,
        suspected: special_case::suspected(&added, &before.known),
    }
}

/// Refusals a brief shows (the brief's excerpt is bounded).
const SHOWN: usize = 12;

/// Reads the base on the blocking pool (see [`before`]).
pub async fn read_base(wt: &Worktree, touched: Vec<String>, p: PatchCheckParams) -> Before {
    wt.blocking(move |wt| before(&wt.dir, &touched, &p)).await
}

/// After the patch applied: the signals go into `output` (`suspected_special_case`, never a
/// failure by themselves); refusals too (`policy_refused`), with the brief that fails TR.
pub async fn judge(
    wt: &Worktree,
    base: Before,
    diff: String,
    output: &mut Value,
) -> Option<FailureBrief> {
    let checked = wt.blocking(move |wt| after(&wt.dir, &base, &diff)).await;
    output["suspected_special_case"] = json!(checked.suspected);
    if checked.refusals.is_empty() {
        return None;
    }
    let first = &checked.refusals[0];
    tracing::info!(
        refusals = checked.refusals.len(),
        path = %first.path,
        line = first.line,
        rule = %first.rule,
        name = %first.name,
        "the patch is refused by the policy"
    );
    output["policy_refused"] = json!(checked.refusals);
    Some(FailureBrief::new(
        Stage::PolicyRefused,
        None,
        None,
        &describe(&checked.refusals),
    ))
}

/// The FailureBrief's excerpt for refusals: file, line, rule and name of each (the first few).
pub fn describe(refusals: &[PatchRefusal]) -> String {
    let mut lines: Vec<String> = refusals
        .iter()
        .take(SHOWN)
        .map(|r| format!("{}:{}: {} `{}`", r.path, r.line, r.rule, r.name))
        .collect();
    if refusals.len() > SHOWN {
        lines.push(format!("... and {} more", refusals.len() - SHOWN));
    }
    format!(
        "the patch uses what code written by agents may not (allowed: the pure standard \
         library, the project's own modules, literal attribute names; the work order's \
         `policy_allow` widens it):\n{}",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_the_base_already_had_is_tolerated_and_a_new_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("calc.py"), "import os\n\nHOME = os.environ\n").unwrap();
        std::fs::create_dir(root.join("tests")).unwrap();
        std::fs::write(
            root.join("tests/test_calc.py"),
            "def test_m():\n    assert multiply(3, 4) == 12\n",
        )
        .unwrap();
        let params = PatchCheckParams {
            acceptance_commands: Some(vec!["python -m pytest -q tests/test_calc.py".into()]),
            ..Default::default()
        };
        let b = before(root, &["calc.py".into()], &params);
        assert!(b.known.contains("12"), "{:?}", b.known);
        std::fs::write(
            root.join("calc.py"),
            "import os\nimport operator\n\nHOME = os.environ\n\n\ndef multiply(a, b):\n    if (a, b) == (3, 4):\n        return 12\n    return operator.attrgetter('x')(a)\n",
        )
        .unwrap();
        let diff = "--- a/calc.py\n+++ b/calc.py\n@@ -1,3 +1,10 @@\n import os\n+import operator\n \n HOME = os.environ\n+\n+\n+def multiply(a, b):\n+    if (a, b) == (3, 4):\n+        return 12\n+    return operator.attrgetter('x')(a)\n";
        let checked = after(root, &b, diff);
        assert_eq!(
            checked.refusals,
            vec![PatchRefusal {
                path: "calc.py".into(),
                name: "operator.attrgetter".into(),
                rule: "name_not_allowed".into(),
                line: 10
            }]
        );
        let lines: Vec<(usize, &str)> = checked
            .suspected
            .iter()
            .map(|s| (s.line, s.literal.as_str()))
            .collect();
        assert_eq!(lines, vec![(8, "3"), (8, "4"), (9, "12")]);
        assert!(describe(&checked.refusals).contains("calc.py:10: name_not_allowed"));
    }

    #[test]
    fn a_swe_test_patchs_added_lines_give_literals_and_its_context_does_not() {
        let tests = json!({"test_patch": "--- a/t/test_x.py\n+++ b/t/test_x.py\n@@ -1,2 +1,3 @@\n assert f(17) == 99\n+assert f(41) == 'forty-one'\n x = 1\n"});
        let known = test_patch_literals(&tests);
        assert!(
            known.contains("41") && known.iter().any(|k| k.contains("forty-one")),
            "{known:?}"
        );
        assert!(!known.contains("17"), "{known:?}");
        assert!(test_patch_literals(&Value::Null).is_empty());
    }
}
