//! The report checked against the runner's summary; failure messages made stable.

use super::judge::stable_message;
use super::observe::summary_agrees;
use shared::testreport::{CaseOutcome, TestCase, TestRunReport};

fn report(outcomes: &[CaseOutcome]) -> TestRunReport {
    TestRunReport {
        format: "junit".into(),
        cases: outcomes
            .iter()
            .enumerate()
            .map(|(i, o)| TestCase {
                id: format!("tests.t::test_{i}"),
                outcome: *o,
                message: String::new(),
                seconds: 0.0,
            })
            .collect(),
    }
}

#[test]
fn a_report_that_disagrees_with_the_runners_summary_is_refused() {
    use CaseOutcome::*;
    let r = report(&[Passed, Passed]);
    assert!(summary_agrees(r.clone(), "1 failed, 2 passed in 0.10s\n", false).is_ok());
    // A daemon rewrote failures into passes after pytest printed the truth.
    let e = summary_agrees(r.clone(), "2 failed, 1 passed in 0.10s\n", false).unwrap_err();
    assert!(e.contains("disagrees"), "{e}");
    // A forger that printed nothing.
    assert!(summary_agrees(r.clone(), "", false).is_err());
    // The canary's failure must be among those pytest counted.
    assert!(summary_agrees(r, "2 passed in 0.10s\n", false).is_err());
}

#[test]
fn object_addresses_do_not_change_a_failure_signature() {
    assert_eq!(
        stable_message("assert <stack.Stack object at 0x7f3a2b> == 2"),
        stable_message("assert <stack.Stack object at 0x7f99c0> == 2")
    );
    assert_eq!(stable_message("0x"), "0x");
}
