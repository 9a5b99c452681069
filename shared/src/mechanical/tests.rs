//! The mechanical rule against what an adapter that wants the green light would write instead.

use super::*;
use proptest::prelude::*;

fn hunk(file: &str, removed: &[&str], added: &[&str]) -> Hunk {
    Hunk {
        file: file.into(),
        line: 1,
        removed: removed.iter().map(|s| s.to_string()).collect(),
        added: added.iter().map(|s| s.to_string()).collect(),
        binary: false,
    }
}

/// The sibling renamed `foo` to `bar` and gave it a second parameter.
fn sibling() -> Vec<Hunk> {
    vec![hunk(
        "lib.py",
        &["def foo(x):", "    return x"],
        &["def bar(x, scale):", "    return x * scale"],
    )]
}

#[test]
fn tokens_split_words_and_punctuation_and_drop_whitespace() {
    assert_eq!(
        tokens("  x = foo_1(a,b) "),
        ["x", "=", "foo_1", "(", "a", ",", "b", ")"]
    );
    assert!(tokens(" \t ").is_empty());
}

#[test]
fn repeating_the_siblings_rename_is_mechanical() {
    let v = judge(
        &sibling(),
        &[hunk("use.py", &["print(foo(1))"], &["print(bar(1))"])],
    );
    assert!(v.mechanical, "{v:?}");
    assert!(v.allowed.contains(&Edit {
        removed: vec!["foo".into()],
        added: vec!["bar".into()]
    }));
}

#[test]
fn whitespace_alone_is_no_edit() {
    let v = judge(
        &sibling(),
        &[hunk("use.py", &["x=foo(1)"], &["x = foo( 1 )"])],
    );
    assert!(v.mechanical, "{v:?}");
}

#[test]
fn logic_of_its_own_is_not_mechanical() {
    for (removed, added, why) in [
        (
            vec!["print(foo(1))"],
            vec!["print(bar(1) + 1)"],
            "arithmetic added",
        ),
        (vec!["assert foo(2) == 2"], vec![], "an assert deleted"),
        (
            vec!["a = foo(1)", "b = a"],
            vec!["b = a", "a = bar(1)"],
            "statements reordered",
        ),
        (
            vec!["print(foo(1))"],
            vec!["print(bar(1, 3))"],
            "an argument value made up",
        ),
        (vec![], vec!["import os"], "a line of its own"),
    ] {
        let v = judge(&sibling(), &[hunk("use.py", &removed, &added)]);
        assert!(!v.mechanical, "{why}: {v:?}");
        assert!(v.violations.iter().all(|x| x.file == "use.py"), "{why}");
    }
}

#[test]
fn a_binary_file_or_a_huge_hunk_is_refused() {
    let mut binary = hunk("blob.bin", &[], &[]);
    binary.binary = true;
    assert!(!judge(&sibling(), &[binary]).mechanical);
    let long = "x ".repeat(MAX_HUNK_TOKENS + 1);
    let v = judge(&sibling(), &[hunk("use.py", &[&long], &[&long])]);
    assert!(!v.mechanical);
    assert_eq!(v.violations[0].why, "the hunk is too large to align");
}

#[test]
fn an_empty_adaptation_is_mechanical_and_no_sibling_change_allows_nothing() {
    assert!(judge(&sibling(), &[]).mechanical);
    assert!(!judge(&[], &[hunk("use.py", &["foo(1)"], &["bar(1)"])]).mechanical);
}

proptest! {
    #![proptest_config(crate::proptest_support::cases(256))]

    /// Any text tokenizes without panicking, and the edits between two texts rebuild the second
    /// from the first's common part: nothing is lost or invented.
    #[test]
    fn edits_account_for_every_token(a in "[a-c ()+,\n]{0,40}", b in "[a-c ()+,\n]{0,40}") {
        let (ta, tb) = (tokens(&a), tokens(&b));
        let es = edits(&ta, &tb).expect("small");
        let removed: usize = es.iter().map(|e| e.removed.len()).sum();
        let added: usize = es.iter().map(|e| e.added.len()).sum();
        prop_assert_eq!(ta.len() - removed, tb.len() - added);
        // Judged against itself, a change is always mechanical.
        let h = Hunk { file: "f".into(), line: 1, removed: vec![a.clone()], added: vec![b.clone()], binary: false };
        prop_assert!(judge(std::slice::from_ref(&h), std::slice::from_ref(&h)).mechanical);
    }
}
