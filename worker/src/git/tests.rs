//! Patches parsed or refused, whatever they say; renames and links as the scope sees them.

use super::patch_changes;
use crate::agent::llm::tests::{arb_text, cases, timed, CASE_LIMIT};
use proptest::prelude::*;
use shared::scope::{check, ChangeKind, ViolationReason, WriteScope};

/// Lines of unified diffs (git's extended headers included), and a path or two to use.
const DIFF_LINES: &[&str] = &[
    "diff --git a/{p} b/{q}",
    "diff --git \"a/{p}\" \"b/{q}\"",
    "diff --git a/{p}",
    "--- a/{p}",
    "+++ b/{q}",
    "--- /dev/null",
    "+++ /dev/null",
    "--- \"a/\\303\\244{p}\"",
    "@@ -1 +1 @@",
    "@@ -0,0 +1,3 @@",
    "@@ -1,2 +1,2 @@ fn x",
    "@@ -4294967295,4294967295 +1 @@",
    "@@ -1,0 +0,0 @@",
    "-old",
    "+new",
    " context",
    "\\ No newline at end of file",
    "new file mode 100644",
    "new file mode 120000",
    "deleted file mode 100755",
    "old mode 100644",
    "new mode 160000",
    "similarity index 90%",
    "dissimilarity index 100%",
    "rename from {p}",
    "rename to {q}",
    "copy from {p}",
    "copy to {q}",
    "index 0000000..1111111 100644",
    "Binary files a/{p} and b/{q} differ",
    "GIT binary patch",
    "literal 5",
    "delta 3",
    "zcmV?d00001",
    "",
];

fn arb_path() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-c][a-c/.]{0,8}",
        1 => arb_text(),
        1 => prop::sample::select(vec![
            "../x", "/etc/passwd", ".git/config", "a b", "tests/t.py", "\"q\\tx\""
        ])
        .prop_map(str::to_string),
    ]
}

/// One file's section: the git header, extended headers, the file lines, a hunk whose
/// counts agree with its lines.
fn arb_section() -> impl Strategy<Value = String> {
    // Extended headers that belong together, and whether the old / new side is /dev/null.
    let headers = prop::sample::select(vec![
        (vec![], false, false),
        (vec!["new file mode 100644"], true, false),
        (vec!["new file mode 120000"], true, false),
        (vec!["new file mode 160000"], true, false),
        (vec!["deleted file mode 100755"], false, true),
        (vec!["old mode 100644", "new mode 100755"], false, false),
        (vec!["old mode 100644", "new mode 120000"], false, false),
        (
            vec!["similarity index 90%", "rename from {p}", "rename to {q}"],
            false,
            false,
        ),
        (
            vec!["similarity index 90%", "copy from {p}", "copy to {q}"],
            false,
            false,
        ),
        (vec!["index 0000000..1111111 100644"], false, false),
    ]);
    let text = "[a-z ]{0,6}";
    (
        arb_path(),
        arb_path(),
        headers,
        prop::collection::vec(text, 0..3),
        prop::collection::vec(text, 0..3),
        prop::collection::vec(text, 0..2),
    )
        .prop_map(|(p, q, (headers, from_null, to_null), old, new, context)| {
            let q = if from_null || to_null || headers.len() == 1 {
                p.clone()
            } else {
                q
            };
            let mut out = vec![format!("diff --git a/{p} b/{q}")];
            out.extend(
                headers
                    .iter()
                    .map(|h| h.replace("{p}", &p).replace("{q}", &q)),
            );
            out.push(if from_null {
                "--- /dev/null".into()
            } else {
                format!("--- a/{p}")
            });
            out.push(if to_null {
                "+++ /dev/null".into()
            } else {
                format!("+++ b/{q}")
            });
            let context = if from_null || to_null {
                vec![]
            } else {
                context
            };
            let old = if from_null { vec![] } else { old };
            let new = if to_null { vec![] } else { new };
            let (o, n) = (old.len() + context.len(), new.len() + context.len());
            out.push(format!("@@ -{},{o} +{},{n} @@", o.min(1), n.min(1)));
            out.extend(context.iter().map(|c| format!(" {c}")));
            out.extend(old.iter().map(|l| format!("-{l}")));
            out.extend(new.iter().map(|l| format!("+{l}")));
            out.join("\n") + "\n"
        })
}

/// A diff: sections of files, sometimes broken by a line of any diff vocabulary or text.
fn arb_diff() -> impl Strategy<Value = String> {
    let odd_line = (prop::sample::select(DIFF_LINES), arb_path(), arb_path())
        .prop_map(|(l, p, q)| l.replace("{p}", &p).replace("{q}", &q));
    let odd_line = prop_oneof![3 => odd_line, 1 => arb_text()];
    (
        prop::collection::vec(arb_section(), 0..4),
        prop::collection::vec((any::<prop::sample::Index>(), odd_line), 0..2),
        any::<bool>(),
    )
        .prop_map(|(sections, odd, newline)| {
            let mut lines: Vec<String> = sections.concat().lines().map(str::to_string).collect();
            for (at, line) in odd {
                let i = at.index(lines.len() + 1);
                lines.insert(i, line);
            }
            let mut diff = lines.join("\n");
            if newline {
                diff.push('\n');
            }
            diff
        })
}

proptest! {
    #![proptest_config(cases(256))]

    /// Diffs are the agent's: libgit2 parses any of them or refuses it, quickly, and every
    /// change it reports names a path.
    #[test]
    fn any_diff_is_parsed_or_refused(diff in arb_diff()) {
        let (changes, took) = timed(|| patch_changes(&diff));
        prop_assert!(took < CASE_LIMIT);
        if let Ok(changes) = changes {
            for c in &changes {
                prop_assert!(!c.paths().is_empty(), "{c:?} from {diff:?}");
            }
        }
    }
}

fn allowed(p: &str) -> WriteScope {
    WriteScope {
        globs: vec![p.into()],
        ..Default::default()
    }
}

#[test]
fn a_rename_onto_the_tests_is_seen_on_both_sides_whatever_the_header_says() {
    let diff = "diff --git a/calc.py b/calc.py\nsimilarity index 50%\nrename from tests/test_calc.py\nrename to tests/test_calc.py\n--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n@@ -1 +1 @@\n-assert add(1, 2) == 3\n+assert True\n";
    match patch_changes(diff) {
        Ok(changes) => {
            let paths: Vec<&str> = changes.iter().flat_map(|c| c.paths()).collect();
            assert!(
                paths.contains(&"tests/test_calc.py"),
                "libgit2 sees {changes:?}"
            );
            let v = check(&allowed("calc.py"), &changes).unwrap();
            assert!(v.iter().any(|v| v.path == "tests/test_calc.py"), "{v:?}");
        }
        // Refusing to parse it is as good: it cannot apply either.
        Err(e) => assert!(e.to_string().contains("patch"), "{e}"),
    }
}

#[test]
fn quoted_paths_are_decoded_before_the_scope_sees_them() {
    let diff = "diff --git \"a/tests/test_calc.py\" \"b/tests/test_calc.py\"\n--- \"a/tests/test_calc.py\"\n+++ \"b/tests/test_calc.py\"\n@@ -1 +1 @@\n-x\n+y\n";
    let changes = patch_changes(diff).unwrap();
    assert_eq!(changes[0].new_path.as_deref(), Some("tests/test_calc.py"));
    assert_eq!(check(&allowed("calc.py"), &changes).unwrap().len(), 1);
}

#[test]
fn a_new_symlink_is_refused_even_in_scope() {
    let diff = "diff --git a/calc.py b/calc.py\nnew file mode 120000\n--- /dev/null\n+++ b/calc.py\n@@ -0,0 +1 @@\n+/proc/self/environ\n\\ No newline at end of file\n";
    let changes = patch_changes(diff).unwrap();
    assert_eq!(changes[0].kind, ChangeKind::Added);
    let v = check(&allowed("calc.py"), &changes).unwrap();
    assert_eq!(v[0].reason, ViolationReason::Symlink);
}
