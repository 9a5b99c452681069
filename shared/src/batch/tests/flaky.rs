//! Flaky runs in a batch: no verdict, counted apart, their tests listed in every report; a
//! stable failure with a flaky test beside it is still a failure; stored states from before
//! read back.

use super::super::flaky::{flaky_error, ids_from_error, FLAKY_ERROR_PREFIX, FLAKY_VERDICT};
use super::super::state::MAX_ERROR_CHARS;
use super::outcome::{job, run};
use super::*;
use crate::engine::RunStatus;
use crate::messages::JobStatus;
use serde_json::json;

/// A run that ended at a test run: `flaky` says whether its verdict would have depended on
/// the run; `ids` are the tests found flaky.
fn ended_at_tests(flaky: bool, ids: &[&str]) -> crate::engine::RunState {
    let mut validate = job(
        "validate",
        JobStatus::Failed,
        Some("flaky: 1 of 3 runs met the expectation"),
        0.0,
        0,
    );
    validate.output = json!({"flaky": flaky, "flaky_tests": ids, "verdict": "flaky"});
    run(
        RunStatus::Failed,
        Some(json!({"exit": "FlakyTests", "flaky_tests": ids})),
        vec![job("tests", JobStatus::Ok, None, 0.5, 10), validate],
    )
}

#[test]
fn a_run_whose_verdict_hinged_on_a_flaky_test_settles_flaky_not_failed() {
    let o = outcome_of(&ended_at_tests(true, &["t::flip"]));
    assert_eq!(o.verdict.as_deref(), Some(FLAKY_VERDICT));
    assert!(!o.infra_error);
    assert_eq!(
        o.error.as_deref(),
        Some(format!("{FLAKY_ERROR_PREFIX}[\"t::flip\"]").as_str())
    );
    let mut b = batch(&["a", "b", "c"], spec(1, 3));
    for i in 0..3 {
        b.started(i, b.run_id_for(i), t(1));
    }
    b.finished(0, &o, t(2));
    b.finished(1, &outcome(RunStatus::Succeeded, None), t(2));
    b.finished(2, &outcome(RunStatus::Failed, None), t(2));
    assert_eq!(b.items[0].state, ItemState::Flaky);
    assert_eq!(b.items[0].flaky_tests, ["t::flip"]);
    assert_eq!(b.items[0].verdict.as_deref(), Some("FLAKY"));
    assert!(b.items[1].flaky_tests.is_empty());
    let c = b.counts();
    assert_eq!((c.passed, c.failed, c.flaky, c.done()), (1, 1, 1, 3));
    assert!(b.is_finished());

    // The reports: the pass rate leaves it out (no verdict); it is counted and listed.
    let r = json_report(&b);
    assert_eq!(r["counts"]["flaky"], 1);
    assert_eq!(r["pass_rate"]["judged"], 2, "{r}");
    assert_eq!(r["flaky"], json!({"items": 1, "tests": 1}));
    assert_eq!(r["items"][0]["state"], "flaky");
    assert_eq!(r["items"][0]["flaky_tests"], json!(["t::flip"]));
    let x = junit_xml(&b);
    assert!(x.contains("skipped=\"1\""), "{x}");
    assert!(
        x.contains("<skipped type=\"flaky\" message=\"FLAKY: 1 flaky tests, no verdict\">t::flip</skipped>"),
        "{x}"
    );
    assert_eq!(x.matches("<failure").count(), 1, "{x}");
    let h = html_report(&b);
    assert!(h.contains("<th>flaky</th><td class=\"n\">1</td>"), "{h}");
    assert!(
        h.contains("1 flaky items (no verdict), 1 flaky tests listed"),
        "{h}"
    );
    assert!(
        h.contains("<table id=\"flaky\">") && h.contains("t::flip"),
        "{h}"
    );
    assert!(h.contains("pass rate 50.0% (1 / 2 judged)"), "{h}");
}

#[test]
fn a_stable_failure_beside_a_flaky_test_is_a_failure() {
    // The test run failed on a stable test; the flaky one is listed but decided nothing.
    let o = outcome_of(&ended_at_tests(false, &["t::flip"]));
    assert_eq!(o.verdict.as_deref(), Some("FAIL"));
    assert!(!o.error.unwrap_or_default().starts_with(FLAKY_ERROR_PREFIX));
    // A run that succeeded is a pass, whatever flickered on the way.
    let mut ok = ended_at_tests(true, &["t::flip"]);
    ok.status = RunStatus::Succeeded;
    ok.history.pop();
    assert_eq!(outcome_of(&ok).verdict.as_deref(), Some("PASS"));
    // A result that names its own verdict keeps it.
    let mut own = ended_at_tests(true, &["t::flip"]);
    own.result = Some(json!({"verdict": "FAIL"}));
    assert_eq!(outcome_of(&own).verdict.as_deref(), Some("FAIL"));
}

#[test]
fn an_infrastructure_error_is_never_flaky() {
    let mut r = ended_at_tests(true, &["t::flip"]);
    r.history
        .push(job("validate", JobStatus::Error, Some("docker"), 0.0, 0));
    let o = outcome_of(&r);
    assert!(o.infra_error && o.verdict.is_none(), "{o:?}");
}

#[test]
fn without_a_list_in_the_result_the_jobs_outputs_are_read() {
    let mut r = ended_at_tests(true, &["t::b", "t::a"]);
    r.result = Some(json!({"exit": "flaky_tests"}));
    let o = outcome_of(&r);
    assert_eq!(ids_from_error(&o.error.unwrap()), ["t::a", "t::b"]);
}

#[test]
fn hostile_test_ids_round_trip_and_the_list_fits_the_items_error() {
    let ids: Vec<String> = vec![
        "t::q[\"a, b\"]".into(),
        "t::nl[\n]".into(),
        "t::ü[✓]".into(),
        "x".repeat(400),
    ];
    let e = flaky_error(&ids);
    // An id is cut to 300 characters when read from a run; here it is kept whole.
    assert_eq!(ids_from_error(&e), ids);
    let many: Vec<String> = (0..500)
        .map(|i| format!("tests/test_x.py::test_{i}"))
        .collect();
    let e = flaky_error(&many);
    assert!(e.chars().count() <= MAX_ERROR_CHARS, "{}", e.len());
    let back = ids_from_error(&e);
    assert!(back.len() > 50 && back.len() < 500);
    assert_eq!(back[..], many[..back.len()]);
    // The cut an item's error gets leaves it whole.
    assert_eq!(
        ids_from_error(&crate::text::head(&e, MAX_ERROR_CHARS)),
        back
    );
    // Any other error is no list.
    for other in [
        "node validate failed: 2 tests failed",
        "flaky tests, no verdict: [1, 2]",
        "flaky tests, no verdict: [\"a\"",
        "",
    ] {
        assert!(ids_from_error(other).is_empty(), "{other}");
    }
}

#[test]
fn states_stored_before_flaky_items_read_back() {
    let b = batch(&["a"], spec(1, 1));
    let mut v = serde_json::to_value(&b).unwrap();
    // The stored form of a batch without flaky items has no trace of them.
    assert!(v["items"][0].get("flaky_tests").is_none(), "{v}");
    v["items"][0].as_object_mut().unwrap().remove("flaky_tests");
    let back: BatchState = serde_json::from_value(v).unwrap();
    assert_eq!(back, b);
    let counts: BatchCounts = serde_json::from_value(json!({
        "total": 1, "queued": 0, "running": 0, "passed": 1, "failed": 0, "errored": 0,
        "cancelled": 0
    }))
    .unwrap();
    assert_eq!((counts.flaky, counts.done()), (0, 1));
    assert_eq!(
        serde_json::to_value(ItemState::Flaky).unwrap(),
        json!("flaky")
    );
}
