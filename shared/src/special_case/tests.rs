use super::*;
use serde_json::json;

const TESTS: &str = "from calc import add, multiply\n\n\ndef test_multiply():\n    assert multiply(3, 4) == 12\n    assert multiply(0, 7) == 0\n    assert greet('alice') == 'hello, alice'\n";

fn known() -> BTreeSet<String> {
    literals(TESTS)
}

fn diff(body: &[&str]) -> String {
    let added: Vec<String> = body.iter().map(|l| format!("+{l}")).collect();
    format!(
        "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -5,2 +5,{} @@ def add(a, b):\n def multiply(a, b):\n-    raise NotImplementedError\n{}\n",
        body.len() + 1,
        added.join("\n")
    )
}

fn flagged(body: &[&str]) -> Vec<(usize, String, String)> {
    suspected(&added_lines(&diff(body)), &known())
        .into_iter()
        .map(|s| (s.line, s.literal, s.why))
        .collect()
}

#[test]
fn the_tests_literals_are_read_without_the_common_numbers() {
    let k = known();
    for l in ["3", "4", "12", "7", "\"alice\"", "\"hello, alice\""] {
        assert!(k.contains(l), "{l} in {k:?}");
    }
    assert!(!k.contains("0"), "{k:?}");
    assert_eq!(
        literals("x = -10 + 0x1F - 2.50 * 1_000; y = a-3"),
        ["-10", "31", "2.5", "1000", "3"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    assert!(literals("f(-1, 2, 'a', '')").is_empty());
}

#[test]
fn added_lines_are_numbered_in_the_new_file() {
    let lines = added_lines(&diff(&["    if a == 3:", "        return 12"]));
    assert_eq!(
        lines,
        vec![
            AddedLine {
                path: "calc.py".into(),
                line: 6,
                text: "    if a == 3:".into()
            },
            AddedLine {
                path: "calc.py".into(),
                line: 7,
                text: "        return 12".into()
            },
        ]
    );
    // A removed `--- x` line inside a hunk is no header; `/dev/null` adds nothing.
    let d = "--- a/x.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n--- a\n-b\n";
    assert!(added_lines(d).is_empty());
}

#[test]
fn a_branch_on_the_tests_input_is_flagged() {
    assert_eq!(
        flagged(&["    if (a, b) == (3, 4): return 13"]),
        vec![
            (6, "3".into(), "branch".into()),
            (6, "4".into(), "branch".into())
        ]
    );
    assert_eq!(
        flagged(&[
            "    if a == 3 and b == 4:",
            "        return 12",
            "    return a + b"
        ]),
        vec![
            (6, "3".into(), "branch".into()),
            (6, "4".into(), "branch".into()),
            (7, "12".into(), "return_after_branch".into())
        ]
    );
    assert_eq!(
        flagged(&["    return 'hello, alice' if name == 'alice' else 'hello'"]),
        vec![
            (6, "\"hello, alice\"".into(), "comparison".into()),
            (6, "\"alice\"".into(), "comparison".into())
        ]
    );
}

fn flagged_dict() -> Vec<(usize, String, String)> {
    flagged(&["    return {3: 12, 7: 0}[a]"])
}

#[test]
fn a_dict_keyed_by_the_tests_inputs_is_flagged() {
    assert_eq!(
        flagged_dict(),
        vec![
            (6, "3".into(), "dict_key".into()),
            (6, "7".into(), "dict_key".into())
        ]
    );
}

#[test]
fn honest_code_is_not_flagged() {
    assert!(flagged(&["    return a * b"]).is_empty());
    assert!(flagged(&[
        "    if a < 0:",
        "        return -(abs(a) * b)",
        "    return a * b"
    ])
    .is_empty());
    // A literal the tests show, used as a plain value, is no special case.
    assert!(flagged(&["    width = 12", "    return a * b"]).is_empty());
    assert!(flagged(&["    return xs[3:]"]).is_empty());
}

#[test]
fn examples_given_as_json_give_their_literals() {
    let k = literals_of_json(&json!([{"input": [3, 4], "expected": 12},
        {"call": "multiply(-2, 5) == -10", "note": "x"}]));
    for l in [
        "3",
        "4",
        "12",
        "-10",
        "-2",
        "5",
        "\"multiply(-2, 5) == -10\"",
    ] {
        assert!(k.contains(l), "{l} in {k:?}");
    }
    // One-character strings and the common numbers say nothing.
    assert!(!k.contains("\"x\"") && !k.contains("2"), "{k:?}");
}

#[test]
fn the_acceptance_commands_name_their_tests() {
    let t = test_targets(&[
        "python -m pytest -q -p no:cacheprovider tests/test_calc.py::test_multiply".into(),
        "python -c \"import calc; assert calc.multiply(-2, 5) == -10\"".into(),
        "pytest tests/unit/".into(),
        "echo 'unbalanced".into(),
    ]);
    assert_eq!(t.files, ["tests/test_calc.py".to_string()].into());
    assert_eq!(t.dirs, ["tests/unit".to_string()].into());
    assert_eq!(t.inline.len(), 1);
    assert!(!t.whole_repo);
    assert!(test_targets(&["python -m pytest -q".into()]).whole_repo);
    assert!(is_test_file("a/test_x.py") && is_test_file("x_test.py"));
    assert!(!is_test_file("calc.py"));
}
