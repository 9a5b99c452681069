use super::super::dataset::{valid_item_id, MAX_LINE_BYTES};
use super::*;
use crate::proptest_support::{arb_json, arb_text, cases, timed, CASE_LIMIT};
use proptest::prelude::*;
use serde_json::{json, Value};

fn err(jsonl: &str) -> DatasetError {
    parse_dataset(jsonl).unwrap_err()
}

#[test]
fn items_are_read_in_order_skipping_blank_lines_and_carriage_returns() {
    let jsonl = concat!(
        "{\"id\": \"a-1\", \"repo\": \"r\", \"ref\": \"main\", \"input\": {\"x\": 1}}\r\n",
        "\n",
        "   \n",
        "{\"id\": \"B.2_x\", \"repo\": \"r\", \"work_order\": {\"id\": \"wo\"},",
        " \"script\": {\"se\": [{\"output\": {}}]}}\n",
        "{\"id\": \"c\", \"repo\": \"r\", \"input\": null, \"work_order\": {}}\n",
    );
    let items = parse_dataset(jsonl).unwrap();
    let ids: Vec<&str> = items.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["a-1", "B.2_x", "c"]);
    assert_eq!(items[0].git_ref.as_deref(), Some("main"));
    assert_eq!(items[0].input, Some(json!({"x": 1})));
    assert_eq!(items[1].work_order, Some(json!({"id": "wo"})));
    assert_eq!(items[1].script, Some(json!({"se": [{"output": {}}]})));
    assert_eq!(items[2].input, None);
    // Written back, `git_ref` is `ref` and absent fields stay absent.
    let written = serde_json::to_value(&items[0]).unwrap();
    assert_eq!(
        written,
        json!({"id": "a-1", "repo": "r", "ref": "main", "input": {"x": 1}})
    );
}

#[test]
fn each_refusal_names_its_line_and_what_is_wrong() {
    let ok = "{\"id\": \"a\", \"repo\": \"r\"}\n";
    let cases: Vec<(String, DatasetError)> = vec![
        (
            format!("{ok}\n{{\"id\": \"b\", \"repo\": \"r\", \"extra\": 1}}"),
            DatasetError::Malformed {
                line: 3,
                message: String::new(),
            },
        ),
        (
            format!("{ok}{{\"id\": \"a/b\", \"repo\": \"r\"}}"),
            DatasetError::BadId {
                line: 2,
                id: "a/b".into(),
            },
        ),
        (
            "{\"id\": \"\", \"repo\": \"r\"}".into(),
            DatasetError::BadId {
                line: 1,
                id: String::new(),
            },
        ),
        (
            format!("{ok}{ok}"),
            DatasetError::DuplicateId {
                line: 2,
                id: "a".into(),
                first: 1,
            },
        ),
        (
            "{\"id\": \"a\", \"repo\": \"  \"}".into(),
            DatasetError::EmptyRepo { line: 1 },
        ),
        (
            "{\"id\": \"a\", \"repo\": \"r\", \"input\": {}, \"work_order\": {}}".into(),
            DatasetError::InputAndWorkOrder { line: 1 },
        ),
        ("\n \n".into(), DatasetError::Empty),
    ];
    for (jsonl, want) in cases {
        let got = err(&jsonl);
        match (&got, &want) {
            (
                DatasetError::Malformed { line, message },
                DatasetError::Malformed {
                    line: want_line, ..
                },
            ) => {
                assert_eq!(line, want_line);
                assert!(message.contains("unknown field `extra`"), "{message}");
                assert!(message.contains("(column "), "{message}");
                assert!(!message.contains("at line 1"), "{message}");
            }
            _ => assert_eq!(got, want, "{jsonl}"),
        }
        let text = got.to_string();
        assert!(text.starts_with(char::is_lowercase), "{text}");
        if want != DatasetError::Empty {
            assert!(text.starts_with("line "), "{text}");
        }
    }
}

#[test]
fn ids_are_1_to_128_safe_characters() {
    assert!(valid_item_id(&"a".repeat(128)));
    for bad in [
        String::new(),
        "a".repeat(129),
        "a b".into(),
        "a/b".into(),
        "é".into(),
        "<x>".into(),
    ] {
        assert!(!valid_item_id(&bad), "{bad:?}");
    }
    // A long bad id is quoted short.
    let long = format!("{{\"id\": \"{}\", \"repo\": \"r\"}}", "é".repeat(500));
    match err(&long) {
        DatasetError::BadId { id, .. } => assert_eq!(id.chars().count(), 64),
        other => panic!("{other:?}"),
    }
}

#[test]
fn not_json_objects_are_refused() {
    for line in [
        "[1]",
        "null",
        "\"x\"",
        "{",
        "{\"id\": \"a\"}",
        "{\"id\": 1, \"repo\": \"r\"}",
    ] {
        match err(line) {
            DatasetError::Malformed { line: 1, message } => assert!(!message.is_empty()),
            other => panic!("{line}: {other:?}"),
        }
    }
}

#[test]
fn the_item_count_and_line_length_are_bounded() {
    let mut jsonl = String::new();
    for i in 0..MAX_BATCH_ITEMS {
        jsonl.push_str(&format!("{{\"id\":\"i{i}\",\"repo\":\"r\"}}\n"));
    }
    assert_eq!(parse_dataset(&jsonl).unwrap().len(), MAX_BATCH_ITEMS);
    jsonl.push_str("\n{\"id\":\"last\",\"repo\":\"r\"}\n");
    assert_eq!(
        err(&jsonl),
        DatasetError::TooManyItems {
            line: MAX_BATCH_ITEMS + 2
        }
    );

    let padded = |n: usize| format!("{{\"id\":\"a\",\"repo\":\"r\"}}{}", " ".repeat(n));
    let base = padded(0).len();
    assert!(parse_dataset(&padded(MAX_LINE_BYTES - base)).is_ok());
    assert_eq!(
        err(&format!("\n{}", padded(MAX_LINE_BYTES - base + 1))),
        DatasetError::LineTooLong {
            line: 2,
            bytes: MAX_LINE_BYTES + 1
        }
    );
}

fn arb_line() -> impl Strategy<Value = String> {
    let field = prop_oneof![arb_json(), arb_text().prop_map(Value::from)];
    let id = prop_oneof!["[a-c0-9_.-]{0,4}", arb_text()];
    let object = (id, field.clone(), field.clone(), field, any::<u8>()).prop_map(
        |(id, repo, a, b, pick)| {
            let mut o = json!({"id": id, "repo": repo});
            if pick & 1 == 1 {
                o["repo"] = json!("r");
            }
            if pick & 2 == 2 {
                o["input"] = a;
            }
            if pick & 4 == 4 {
                o["work_order"] = b;
            }
            if pick & 8 == 8 {
                o["ref"] = json!("main");
            }
            if pick & 16 == 16 {
                o["other"] = json!(1);
            }
            o.to_string()
        },
    );
    prop_oneof![
        4 => object,
        1 => arb_json().prop_map(|v| v.to_string()),
        1 => arb_text(),
        1 => Just(String::new()),
    ]
}

proptest! {
    #![proptest_config(cases(256))]

    /// Datasets come from whoever submits a batch: any text is read or refused, quickly; what
    /// is read keeps to the rules, and a refusal names a line that exists.
    #[test]
    fn any_dataset_is_read_or_refused(lines in prop::collection::vec(arb_line(), 0..12)) {
        let jsonl = lines.join("\n");
        let (parsed, took) = timed(|| parse_dataset(&jsonl));
        prop_assert!(took < CASE_LIMIT);
        match parsed {
            Ok(items) => {
                prop_assert!(!items.is_empty() && items.len() <= lines.len());
                let mut ids = std::collections::BTreeSet::new();
                for i in &items {
                    prop_assert!(valid_item_id(&i.id));
                    prop_assert!(ids.insert(i.id.clone()));
                    prop_assert!(!i.repo.trim().is_empty());
                    prop_assert!(i.input.is_none() || i.work_order.is_none());
                }
            }
            Err(e) => {
                let text = e.to_string();
                if let Some(rest) = text.strip_prefix("line ") {
                    let n: usize = rest.split(':').next().unwrap().parse().unwrap();
                    prop_assert!(n >= 1 && n <= jsonl.split('\n').count());
                } else {
                    prop_assert_eq!(e, DatasetError::Empty);
                }
            }
        }
    }
}

/// A SWE-bench instance as the published files write it (lists as JSON-encoded strings, extra
/// fields), with the fleet's own `script`.
fn swe_line(id: &str) -> Value {
    json!({
        "instance_id": id, "repo": "pypi/toolz", "base_commit": "0123456789abcdef0123456789abcdef01234567",
        "problem_statement": "accumulate drops a falsy initial value\n\nDetails.",
        "patch": "diff --git a/toolz/itertoolz.py b/toolz/itertoolz.py\n--- a/toolz/itertoolz.py\n+++ b/toolz/itertoolz.py\n@@ -1 +1 @@\n-a\n+b\n",
        "test_patch": "diff --git a/toolz/tests/test_itertoolz.py b/toolz/tests/test_itertoolz.py\n--- a/toolz/tests/test_itertoolz.py\n+++ b/toolz/tests/test_itertoolz.py\n@@ -1 +1,2 @@\n a\n+b\n",
        "FAIL_TO_PASS": "[\"toolz/tests/test_itertoolz.py::test_new[int]\"]",
        "PASS_TO_PASS": "[\"toolz/tests/test_itertoolz.py::test_old\"]",
        "hints_text": "", "version": "1.2.0", "created_at": "2026-01-01T00:00:00+00:00",
        "environment_setup_commit": "0123456789abcdef0123456789abcdef01234567",
        "script": {"se": [{"output": {"unified_diff": "", "summary": "s"}}]},
    })
}

#[test]
fn swe_bench_lines_become_factory_items_read_from_the_mirror() {
    let jsonl = format!(
        "{}\n{{\"id\": \"native\", \"repo\": \"/r\"}}\n",
        swe_line("pypi__toolz-1")
    );
    let items = parse_dataset(&jsonl).unwrap();
    let swe = &items[0];
    assert_eq!(swe.id, "pypi__toolz-1");
    assert_eq!(swe.repo, "pypi/toolz");
    assert!(swe.mirror);
    assert!(!items[1].mirror);
    assert_eq!(
        swe.git_ref.as_deref(),
        Some("0123456789abcdef0123456789abcdef01234567")
    );
    assert!(swe.input.is_none());
    let wo = swe.work_order.as_ref().unwrap();
    assert_eq!(wo["allowed_files"], json!(["toolz/itertoolz.py"]));
    assert_eq!(wo["acceptance_commands"], json!([]));
    assert_eq!(
        wo["tests"]["fail_to_pass"],
        json!(["toolz/tests/test_itertoolz.py::test_new[int]"])
    );
    assert_eq!(swe.script, Some(swe_line("x")["script"].clone()));
    // Written back (a rerun writes its items so), the line reads as the same item.
    let written = serde_json::to_string(swe).unwrap();
    assert_eq!(&parse_dataset(&written).unwrap()[0], swe);
    assert!(!serde_json::to_string(&items[1]).unwrap().contains("mirror"));
}

#[test]
fn a_bad_swe_bench_line_is_refused_naming_its_line_and_field() {
    let ok = swe_line("a");
    let mut bad = swe_line("b");
    bad["FAIL_TO_PASS"] = json!("[\"test_x (tests.Case)\"]");
    let text = err(&format!("{ok}\n{bad}\n")).to_string();
    assert!(
        text.starts_with("line 2: SWE-bench instance \"b\": `FAIL_TO_PASS[0]`:"),
        "{text}"
    );
    assert!(text.contains("not a pytest node id"), "{text}");
    let mut bad = swe_line("c");
    bad["repo"] = json!("/abs/path");
    let text = err(&bad.to_string()).to_string();
    assert!(
        text.contains("`repo`") && text.contains("owner/name"),
        "{text}"
    );
    // Its id is checked like any other.
    assert_eq!(
        err(&swe_line("a b").to_string()),
        DatasetError::BadId {
            line: 1,
            id: "a b".into()
        }
    );
    // A native item may read from the mirror only by `owner/name`.
    assert_eq!(
        err("{\"id\": \"n\", \"repo\": \"/x/y\", \"mirror\": true}"),
        DatasetError::BadMirrorName {
            line: 1,
            repo: "/x/y".into()
        }
    );
}

#[test]
fn items_read_from_the_mirror_need_an_absolute_mirror_directory() {
    use crate::batch::dataset::check_mirror_dir;
    let items = |mirror: bool| {
        let line = if mirror {
            r#"{"id": "a", "repo": "owner/pkg", "mirror": true}"#
        } else {
            r#"{"id": "a", "repo": "/repos/pkg"}"#
        };
        parse_dataset(line).expect("a dataset")
    };
    let err = check_mirror_dir(&items(true), None).unwrap_err();
    assert!(
        err.contains("--mirror-dir") && err.contains("owner/pkg"),
        "{err}"
    );
    let err = check_mirror_dir(&items(true), Some("mirrors")).unwrap_err();
    assert!(err.contains("not an absolute path"), "{err}");
    assert!(check_mirror_dir(&items(true), Some("/srv/mirrors")).is_ok());
    assert!(check_mirror_dir(&items(false), None).is_ok());
}
