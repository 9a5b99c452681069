//! Runs combined per test, the decision whether a verdict stands, and agents' claims.

use super::*;
use crate::testreport::flaky::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn runs<'a>(reports: &[&'a TestRunReport]) -> Vec<Option<&'a TestRunReport>> {
    reports.iter().map(|r| Some(*r)).collect()
}

fn pass(frozen: Option<&BTreeSet<String>>) -> Expectation<'_> {
    static EMPTY: std::sync::OnceLock<BTreeSet<String>> = std::sync::OnceLock::new();
    Expectation::Pass {
        frozen,
        allowed_skips: EMPTY.get_or_init(BTreeSet::new),
    }
}

#[test]
fn a_test_that_passes_every_other_run_is_flaky_and_decides_nothing() {
    let a = report(&[("t::x", Passed), ("t::flip", Failed)]);
    let b = report(&[("t::x", Passed), ("t::flip", Passed)]);
    let c = combine(&runs(&[&a, &b, &a]));
    assert_eq!(c.runs, 3);
    assert_eq!(c.stable_pass, ["t::x"]);
    assert_eq!(
        c.flaky,
        [FlakyTest {
            id: "t::flip".into(),
            seen: vec![Seen::Failed, Seen::Passed, Seen::Failed]
        }]
    );
    let frozen = set(&["t::x", "t::flip"]);
    assert!(stable_blockers(&c, pass(Some(&frozen))).is_empty());
    assert_eq!(
        decide(&c, &[false, true, false], pass(Some(&frozen))),
        Decision::Flaky
    );
}

#[test]
fn a_stable_failure_is_still_a_failure_when_another_test_is_flaky() {
    let a = report(&[("t::bad", Failed), ("t::flip", Failed)]);
    let b = report(&[("t::bad", Failed), ("t::flip", Passed)]);
    let c = combine(&runs(&[&a, &b, &b]));
    assert_eq!(c.stable_fail, ["t::bad"]);
    assert_eq!(c.flaky_ids(), ["t::flip"]);
    assert_eq!(stable_blockers(&c, pass(None)), ["t::bad: failed"]);
    assert_eq!(
        decide(&c, &[false, false, false], pass(None)),
        Decision::Stands
    );
}

#[test]
fn runs_that_agree_stand_whatever_they_say() {
    let a = report(&[("t::x", Passed), ("t::y", Failed)]);
    let c = combine(&runs(&[&a, &a.clone(), &a.clone()]));
    assert!(c.flaky.is_empty() && !c.unstable_runs);
    assert_eq!(
        decide(&c, &[false, false, false], pass(None)),
        Decision::Stands
    );
    // One run alone is always stable.
    let one = combine(&runs(&[&a]));
    assert!(one.flaky.is_empty());
    assert_eq!(decide(&one, &[false], pass(None)), Decision::Stands);
}

#[test]
fn a_test_that_vanishes_in_a_rerun_is_flaky_not_missing_from_the_frozen_set() {
    let a = report(&[("t::x", Passed), ("t::gone", Failed)]);
    let b = report(&[("t::x", Passed)]);
    let c = combine(&runs(&[&a, &b]));
    assert_eq!(c.flaky[0].id, "t::gone");
    assert_eq!(c.flaky[0].seen, [Seen::Failed, Seen::Missing]);
    let frozen = set(&["t::x", "t::gone"]);
    // It ran once: not a frozen test that never ran.
    assert!(stable_blockers(&c, pass(Some(&frozen))).is_empty());
    assert_eq!(
        decide(&c, &[false, false], pass(Some(&frozen))),
        Decision::Flaky,
        "every run failed, but only on a test that did not fail every time"
    );
}

#[test]
fn a_frozen_test_that_never_ran_and_an_unfrozen_one_that_always_ran_block() {
    let a = report(&[("t::x", Passed), ("t::extra", Passed), ("t::f", Failed)]);
    let b = report(&[("t::x", Passed), ("t::extra", Passed), ("t::f", Passed)]);
    let c = combine(&runs(&[&a, &b]));
    let frozen = set(&["t::x", "t::f", "t::never"]);
    assert_eq!(
        stable_blockers(&c, pass(Some(&frozen))),
        [
            "t::extra: ran outside the frozen set",
            "t::never: never ran"
        ]
    );
    assert_eq!(
        decide(&c, &[false, false], pass(Some(&frozen))),
        Decision::Stands
    );
}

#[test]
fn renamed_tests_are_each_flaky() {
    // A parametrized id with a random part: a different test every run.
    let a = report(&[("t::p[0.1]", Passed)]);
    let b = report(&[("t::p[0.7]", Failed)]);
    let c = combine(&runs(&[&a, &b]));
    assert_eq!(c.flaky_ids(), ["t::p[0.1]", "t::p[0.7]"]);
    assert_eq!(c.flaky[0].seen, [Seen::Passed, Seen::Missing]);
    assert_eq!(c.flaky[1].seen, [Seen::Missing, Seen::Failed]);
    assert_eq!(decide(&c, &[true, false], pass(None)), Decision::Flaky);
}

#[test]
fn an_error_and_a_failure_are_both_not_passing_but_a_skip_is_not_a_pass() {
    let a = report(&[("t::e", Errored), ("t::s", Passed)]);
    let b = report(&[("t::e", Failed), ("t::s", Skipped)]);
    let c = combine(&runs(&[&a, &b]));
    assert_eq!(c.stable_fail, ["t::e"]);
    assert_eq!(c.flaky_ids(), ["t::s"]);
    // A failure and an xpass judge differently against stubs: flaky.
    let x = combine(&runs(&[
        &report(&[("t::x", Failed)]),
        &report(&[("t::x", Xpassed)]),
    ]));
    assert_eq!(x.flaky_ids(), ["t::x"]);
}

#[test]
fn a_test_reported_twice_in_one_run_counts_as_its_worst() {
    // libtest: the same name in two test binaries.
    let a = report(&[("x", Passed), ("x", Failed)]);
    let b = report(&[("x", Failed), ("x", Passed)]);
    let c = combine(&runs(&[&a, &b]));
    assert_eq!(c.stable_fail, ["x"]);
    assert!(c.flaky.is_empty());
}

#[test]
fn a_run_without_a_report_among_runs_with_one_makes_the_runs_unstable() {
    let a = report(&[("t::x", Failed)]);
    let b = report(&[("t::x", Passed)]);
    let c = combine(&[Some(&b), None, Some(&b)]);
    assert!(c.unstable_runs);
    assert_eq!((c.runs, c.reported_runs), (3, 2));
    assert_eq!(c.stable_pass, ["t::x"]);
    assert_eq!(
        decide(&c, &[true, false, true], pass(None)),
        Decision::Flaky
    );
    // A stable failure in the runs with reports still decides.
    let c = combine(&[Some(&a), None, Some(&a)]);
    assert_eq!(
        decide(&c, &[false, false, false], pass(None)),
        Decision::Stands
    );
    // No report at all, every time: stable, the (broken) verdict stands.
    let c = combine(&[None, None]);
    assert!(!c.unstable_runs && c.flaky.is_empty());
    assert_eq!(decide(&c, &[false, false], pass(None)), Decision::Stands);
}

#[test]
fn runs_whose_verdicts_differ_with_the_same_tests_are_flaky() {
    // The exit code changed, not a test: still not decided by chance.
    let a = report(&[("t::x", Passed)]);
    let c = combine(&runs(&[&a, &a]));
    assert_eq!(decide(&c, &[false, true], pass(None)), Decision::Flaky);
}

#[test]
fn when_every_run_passes_a_flickering_test_is_listed_not_held_against_it() {
    let allowed = set(&["t::s"]);
    let expect = Expectation::Pass {
        frozen: None,
        allowed_skips: &allowed,
    };
    let c = combine(&runs(&[
        &report(&[("t::s", Passed)]),
        &report(&[("t::s", Skipped)]),
    ]));
    assert_eq!(c.flaky_ids(), ["t::s"]);
    assert_eq!(decide(&c, &[true, true], expect), Decision::Stands);
    assert_eq!(
        decide(&c, &[true, true], Expectation::Any),
        Decision::Stands
    );
}

#[test]
fn against_stubs_a_test_that_always_passes_decides_and_one_that_sometimes_does_not() {
    let always = combine(&runs(&[
        &report(&[("t::a", Failed), ("t::triv", Passed)]),
        &report(&[("t::a", Failed), ("t::triv", Passed)]),
    ]));
    assert_eq!(
        stable_blockers(&always, Expectation::Fail),
        ["t::triv: passed"]
    );
    assert_eq!(
        decide(&always, &[false, false], Expectation::Fail),
        Decision::Stands
    );
    let sometimes = combine(&runs(&[
        &report(&[("t::a", Failed), ("t::flip", Passed)]),
        &report(&[("t::a", Failed), ("t::flip", Failed)]),
    ]));
    assert_eq!(
        decide(&sometimes, &[false, true], Expectation::Fail),
        Decision::Flaky
    );
    // A collection error every time is the tests' own fault.
    let collect = combine(&runs(&[
        &report(&[("tests.test_x", Errored)]),
        &report(&[("tests.test_x", Errored)]),
    ]));
    assert_eq!(
        stable_blockers(&collect, Expectation::Fail),
        ["tests.test_x: collection error"]
    );
}

#[test]
fn claims_are_compared_with_the_run() {
    let r = report(&[("t::a", Passed), ("t::b", Failed), ("t::c", Errored)]);
    let whole = |w| Claim::Whole(w);
    assert_eq!(
        claim_disagreements(Some(&r), &whole(WholeClaim::Pass)),
        ["t::b failed", "t::c failed"]
    );
    assert_eq!(
        claim_disagreements(Some(&r), &whole(WholeClaim::Fail)),
        ["t::a passed"]
    );
    let per: Claim = serde_json::from_value(serde_json::json!({
        "t::a": "passed", "t::b": "passed", "t::ghost": "passed"
    }))
    .unwrap();
    assert_eq!(
        claim_disagreements(Some(&r), &per),
        [
            "t::b failed (claimed passed)",
            "t::ghost missing (claimed passed)"
        ]
    );
    assert_eq!(
        claim_disagreements(None, &whole(WholeClaim::Pass)),
        ["the run produced no report"]
    );
    let agree = report(&[("t::a", Failed)]);
    assert!(claim_disagreements(Some(&agree), &whole(WholeClaim::Fail)).is_empty());
}

#[test]
fn hostile_claims_are_refused_or_bounded() {
    let parse = |v: serde_json::Value| serde_json::from_value::<Claim>(v);
    assert_eq!(
        parse(serde_json::json!("pass")).unwrap(),
        Claim::Whole(WholeClaim::Pass)
    );
    assert!(parse(serde_json::json!("maybe")).is_err());
    assert!(parse(serde_json::json!({"t::a": "flaky"})).is_err());
    assert!(parse(serde_json::json!(7)).is_err());
    let huge: BTreeMap<String, Seen> = (0..=MAX_CLAIMED_TESTS)
        .map(|i| (format!("t::{i}"), Seen::Passed))
        .collect();
    let e = Claim::PerTest(huge.clone()).check().unwrap_err();
    assert!(e.contains("more than 10000"), "{e}");
    // Disagreements are listed up to ten, then counted.
    let r = report(&[]);
    let claim = Claim::PerTest(huge.into_iter().take(25).collect());
    let d = claim_disagreements(Some(&r), &claim);
    assert_eq!(d.len(), 11);
    assert_eq!(d[10], "and 15 more");
}

fn arb_outcome() -> impl Strategy<Value = CaseOutcome> {
    prop_oneof![
        Just(Passed),
        Just(Failed),
        Just(Errored),
        Just(Skipped),
        Just(Xfailed),
        Just(Xpassed)
    ]
}

proptest! {
    /// Every id of every run lands in exactly one class; a test is flaky exactly when two runs
    /// saw it differently; identical runs never make a flaky verdict.
    #[test]
    fn combining_partitions_the_tests(
        runs_cases in proptest::collection::vec(
            proptest::collection::vec((0u8..6, arb_outcome()), 0..8), 1..5),
    ) {
        let reports: Vec<TestRunReport> = runs_cases
            .iter()
            .map(|cases| {
                let named: Vec<(String, CaseOutcome)> =
                    cases.iter().map(|(i, o)| (format!("t::{i}"), *o)).collect();
                let borrowed: Vec<(&str, CaseOutcome)> =
                    named.iter().map(|(i, o)| (i.as_str(), *o)).collect();
                report(&borrowed)
            })
            .collect();
        let c = combine(&reports.iter().map(Some).collect::<Vec<_>>());
        let all: BTreeSet<String> = reports.iter().flat_map(|r| r.ids()).collect();
        let mut classed: Vec<String> = c.stable_pass.clone();
        classed.extend(c.stable_fail.clone());
        classed.extend(c.stable_other.keys().cloned());
        classed.extend(c.flaky_ids());
        prop_assert_eq!(classed.len(), all.len());
        prop_assert_eq!(classed.into_iter().collect::<BTreeSet<_>>(), all);
        for f in &c.flaky {
            prop_assert!(f.seen.iter().any(|s| *s != f.seen[0]));
            prop_assert_eq!(f.seen.len(), reports.len());
        }
        let same = combine(&[Some(&reports[0]), Some(&reports[0])]);
        prop_assert!(same.flaky.is_empty());
        prop_assert_eq!(decide(&same, &[false, false], pass(None)), Decision::Stands);
        prop_assert_eq!(decide(&c, &vec![true; reports.len()], pass(None)), Decision::Stands);
    }
}
