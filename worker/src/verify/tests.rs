//! The report checked against the runner's summary; failure messages made stable; when a run
//! is rerun.

use super::judge::stable_message;
use super::observe::summary_agrees;
use super::rerun::{met, reasons_to_rerun};
use super::{Observation, TestRunParams};
use crate::sandbox::ExecOutput;
use shared::testreport::{CaseOutcome, TestCase, TestRunReport};
use std::collections::BTreeSet;

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

fn params(expect: &str, claimed: serde_json::Value) -> TestRunParams {
    serde_json::from_value(serde_json::json!({
        "command": "python -m pytest tests", "expect": expect, "claimed": claimed
    }))
    .unwrap()
}

fn observed(report: Result<TestRunReport, String>, exit_code: i64, timed_out: bool) -> Observation {
    Observation {
        tampered: Vec::new(),
        spec: Vec::new(),
        exec: ExecOutput {
            exit_code,
            stdout: Vec::new(),
            stderr: Vec::new(),
            timed_out,
            truncated: false,
            duration: std::time::Duration::from_secs(1),
        },
        timed_out,
        exit_code,
        report,
        stdout: String::new(),
        stderr: String::new(),
    }
}

#[test]
fn only_a_trusted_run_that_disagrees_is_rerun() {
    use CaseOutcome::*;
    let none = BTreeSet::new();
    let p = params("pass", serde_json::Value::Null);
    assert_eq!(p.runs, 3, "three runs in all by default");
    let green = observed(Ok(report(&[Passed, Passed])), 0, false);
    assert!(met(&p, &green, None, &none));
    assert!(
        reasons_to_rerun(&p, &green, true).is_empty(),
        "agreement costs no rerun"
    );
    let red = observed(Ok(report(&[Passed, Failed])), 1, false);
    assert!(!met(&p, &red, None, &none));
    assert_eq!(
        reasons_to_rerun(&p, &red, false),
        ["the run did not meet the expectation (pass)"]
    );
    // A hang is not run again (it would cost its whole timeout), nor is a report refused for
    // its integrity (no canary, a summary that disagrees): those stand as they are.
    let hung = observed(Err("killed".into()), 137, true);
    assert!(reasons_to_rerun(&p, &hung, false).is_empty());
    let forged = observed(Err("no canary".into()), 0, false);
    assert!(!met(&p, &forged, None, &none));
    assert!(reasons_to_rerun(&p, &forged, false).is_empty());
    // No expectation: only the agent's claim can call for a rerun.
    let any = params("any", serde_json::json!({"tests.t::test_1": "passed"}));
    assert!(met(&any, &red, None, &none));
    let why = reasons_to_rerun(&any, &red, true);
    assert_eq!(why.len(), 1);
    assert!(
        why[0].contains("tests.t::test_1 failed (claimed passed)"),
        "{why:?}"
    );
}

#[test]
fn the_claim_of_the_tests_agent_is_compared_with_the_run_on_the_stubs() {
    use CaseOutcome::*;
    let p = params("fail", serde_json::json!("fail"));
    let on_stubs = observed(Ok(report(&[Failed, Passed])), 1, false);
    let why = reasons_to_rerun(&p, &on_stubs, false);
    assert_eq!(why.len(), 2, "{why:?}");
    assert!(why[1].contains("the agent's claim disagrees: tests.t::test_1 passed"));
    assert!(serde_json::from_value::<TestRunParams>(serde_json::json!({
        "command": "pytest", "claimed": "perhaps"
    }))
    .is_err());
}
