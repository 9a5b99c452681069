//! `judge_pass`, `judge_fail` and pytest's closing line.

use super::*;

// ----- judge_pass ----------------------------------------------------------------------

#[test]
fn pass_all_green() {
    let r = report(&[("a::x", Passed), ("a::y", Passed)]);
    let j = judge_pass(&r, 0, Some(&set(&["a::x", "a::y"])), &BTreeSet::new());
    assert!(j.ok, "{:?}", j.reasons);
    assert!(j.reasons.is_empty() && j.missing.is_empty() && j.unexpected.is_empty());
    assert!(j.not_passed.is_empty());
    assert_eq!(j.counts.passed, 2);
    // Without a frozen set too.
    assert!(judge_pass(&r, 0, None, &BTreeSet::new()).ok);
}

#[test]
fn pass_missing_frozen_test() {
    let r = report(&[("a::x", Passed)]);
    let j = judge_pass(&r, 0, Some(&set(&["a::x", "a::y"])), &BTreeSet::new());
    assert!(!j.ok);
    assert_eq!(j.missing, ["a::y"]);
    assert_eq!(j.reasons, ["1 of the frozen tests did not run: a::y"]);
}

#[test]
fn pass_extra_test() {
    let r = report(&[("a::x", Passed), ("a::z", Passed)]);
    let j = judge_pass(&r, 0, Some(&set(&["a::x"])), &BTreeSet::new());
    assert!(!j.ok);
    assert_eq!(j.unexpected, ["a::z"]);
    assert_eq!(j.reasons, ["1 test ran outside the frozen set: a::z"]);
}

#[test]
fn pass_zero_tests() {
    let r = report(&[]);
    let j = judge_pass(&r, 0, None, &BTreeSet::new());
    assert!(!j.ok);
    assert_eq!(j.reasons, ["no test executed"]);
    // libtest's `running 0 tests`.
    let r = parse_libtest("running 0 tests\n").unwrap();
    assert!(!judge_pass(&r, 0, None, &BTreeSet::new()).ok);
}

#[test]
fn pass_all_skipped() {
    let r = report(&[("a::x", Skipped), ("a::y", Skipped)]);
    let j = judge_pass(&r, 0, None, &BTreeSet::new());
    assert!(!j.ok);
    assert_eq!(
        j.reasons,
        ["no test executed", "2 tests skipped: a::x, a::y"]
    );
    assert_eq!(j.not_passed, ["a::x", "a::y"]);
    // Even when every skip is allowed, nothing executed.
    let j = judge_pass(&r, 0, None, &set(&["a::x", "a::y"]));
    assert_eq!(j.reasons, ["no test executed"]);
}

#[test]
fn pass_exit_zero_with_a_failed_case() {
    let r = report(&[("a::x", Passed), ("a::y", Failed)]);
    let j = judge_pass(&r, 0, None, &BTreeSet::new());
    assert!(!j.ok);
    assert_eq!(j.reasons, ["1 test failed: a::y"]);
    assert_eq!(j.not_passed, ["a::y"]);
}

#[test]
fn pass_exit_one_with_all_passed() {
    let r = report(&[("a::x", Passed)]);
    let j = judge_pass(&r, 1, None, &BTreeSet::new());
    assert!(!j.ok);
    assert_eq!(j.reasons, ["the test command exited with code 1"]);
    assert!(j.not_passed.is_empty());
}

#[test]
fn pass_allowed_skip() {
    let r = report(&[("a::x", Passed), ("a::slow", Skipped)]);
    let frozen = set(&["a::x", "a::slow"]);
    let j = judge_pass(&r, 0, Some(&frozen), &set(&["a::slow"]));
    assert!(j.ok, "{:?}", j.reasons);
    assert_eq!(j.counts.skipped, 1);
    let j = judge_pass(&r, 0, Some(&frozen), &set(&["a::other"]));
    assert_eq!(j.reasons, ["1 test skipped: a::slow"]);
}

#[test]
fn pass_errored_xfailed_xpassed() {
    let r = report(&[
        ("a::x", Passed),
        ("a::e", Errored),
        ("a::f", Xfailed),
        ("a::p", Xpassed),
    ]);
    let j = judge_pass(&r, 1, None, &set(&["a::f", "a::e"]));
    assert!(!j.ok);
    assert_eq!(
        j.reasons,
        [
            "1 test errored: a::e",
            "1 test xfailed: a::f",
            "1 test xpassed: a::p",
            "the test command exited with code 1",
        ]
    );
    assert_eq!(j.not_passed, ["a::e", "a::f", "a::p"]);
}

#[test]
fn pass_reasons_name_at_most_ten_ids() {
    let ids: Vec<String> = (0..12).map(|i| format!("t::{i:02}")).collect();
    let cases: Vec<(&str, CaseOutcome)> = ids.iter().map(|i| (i.as_str(), Failed)).collect();
    let j = judge_pass(&report(&cases), 1, None, &BTreeSet::new());
    assert_eq!(
            j.reasons[0],
            "12 tests failed: t::00, t::01, t::02, t::03, t::04, t::05, t::06, t::07, t::08, t::09 and 2 more"
        );
    assert_eq!(j.not_passed.len(), 12);
}

#[test]
fn pass_on_real_pytest_output() {
    let r = parse_junit(PYTEST_STACK).unwrap();
    let j = judge_pass(&r, 1, Some(&r.ids()), &BTreeSet::new());
    assert!(!j.ok);
    assert_eq!(j.not_passed.len(), 9);
    assert!(j.missing.is_empty() && j.unexpected.is_empty());
}

// ----- judge_fail ----------------------------------------------------------------------

#[test]
fn fail_all_failing() {
    let r = report(&[("a::x", Failed), ("a::y", Failed), ("a::z", Errored)]);
    let j = judge_fail(&r, 1);
    assert!(j.ok, "{:?}", j.reasons);
    assert!(j.trivial.is_empty());
    assert_eq!(j.counts.executed, 3);
}

#[test]
fn fail_trivial_pass_and_xpass() {
    let r = report(&[("a::x", Failed), ("a::y", Passed), ("a::z", Xpassed)]);
    let j = judge_fail(&r, 1);
    assert!(!j.ok);
    assert_eq!(j.trivial, ["a::y", "a::z"]);
    assert_eq!(j.reasons, ["2 tests passed but must fail: a::y, a::z"]);
}

#[test]
fn fail_zero_tests() {
    let j = judge_fail(&report(&[]), 5);
    assert!(!j.ok);
    assert_eq!(j.reasons, ["no test executed"]);
}

#[test]
fn fail_skipped_and_xfailed() {
    let r = report(&[("a::x", Failed), ("a::s", Skipped), ("a::f", Xfailed)]);
    let j = judge_fail(&r, 1);
    assert!(!j.ok);
    assert_eq!(j.reasons, ["1 test skipped: a::s", "1 test xfailed: a::f"]);
    let j = judge_fail(&report(&[("a::s", Skipped)]), 1);
    assert_eq!(j.reasons, ["no test executed", "1 test skipped: a::s"]);
}

#[test]
fn fail_collection_error() {
    let r = report(&[("a::x", Failed), ("tests.test_x", Errored)]);
    let j = judge_fail(&r, 2);
    assert!(!j.ok);
    assert_eq!(j.reasons, ["1 collection error: tests.test_x"]);
}

#[test]
fn fail_exit_zero() {
    let j = judge_fail(&report(&[("a::x", Failed)]), 0);
    assert!(!j.ok);
    assert_eq!(
        j.reasons,
        ["the test command exited with code 0 although the tests must fail"]
    );
}

#[test]
fn fail_on_real_outputs() {
    // The pytest sample has passing tests, skips and an xfail.
    let r = parse_junit(PYTEST_STACK).unwrap();
    let j = judge_fail(&r, 1);
    assert!(!j.ok);
    assert_eq!(
        j.trivial,
        [
            "tests.test_stack.TestStack::test_in_class",
            "tests.test_stack::test_pass",
            "tests.test_stack::test_push[1]",
            "tests.test_stack::test_push[a b]",
            "tests.test_stack::test_xpass",
            "tests.test_stack::test_xpass_strict",
        ]
    );
    let r = parse_libtest(LIBTEST_HUMAN).unwrap();
    let j = judge_fail(&r, 101);
    assert_eq!(j.trivial, ["tests::panics", "tests::passes"]);
}

#[test]
fn judgements_serialize_snake_case() {
    let r = parse_junit(PYTEST_STACK).unwrap();
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["cases"][6]["outcome"], "xfailed");
    let back: TestRunReport = serde_json::from_value(json).unwrap();
    assert_eq!(back, r);
    let j = serde_json::to_value(judge_fail(&r, 1)).unwrap();
    assert!(j["counts"]["xpassed"].is_number());
    let p = serde_json::to_value(judge_pass(&r, 1, None, &BTreeSet::new())).unwrap();
    assert!(p["not_passed"].is_array());
}

#[test]
fn pytest_closing_lines_are_read() {
    let s = pytest_summary("....\n1 failed, 3 passed in 0.29s\n").unwrap();
    assert_eq!((s["failed"], s["passed"]), (1, 3));
    let s = pytest_summary("===== 2 passed, 1 skipped, 1 xfailed in 1.02s =====\n").unwrap();
    assert_eq!((s["passed"], s["skipped"], s["xfailed"]), (2, 1, 1));
    assert!(pytest_summary("nothing in here\n").is_none());
    assert!(pytest_summary("").is_none());
    // The last closing line wins.
    let s = pytest_summary("5 passed in 1.0s\n1 failed in 0.1s\n").unwrap();
    assert_eq!(s.get("passed"), None);
}
