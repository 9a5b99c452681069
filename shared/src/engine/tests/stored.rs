//! Stored states: a run state as the previous version wrote it (times as RFC 3339 text with
//! milliseconds and `Z`) still reads, and what this version writes reads back the same.

use super::*;

const AT: &str = "2026-11-22T10:00:00.123Z";
const LATER: &str = "2026-11-22T10:05:30.456Z";

/// A run state of the previous version: every kind of time it records, in its text.
fn old_state() -> Value {
    let usage = Usage::default();
    json!({
        "run_id": "r1", "graph_name": "g", "graph_ref": "graphs/g.json", "status": "running",
        "input": {}, "meta": {},
        "repo": {"url": "/repo", "base_commit": "c0", "packs": []},
        "agent": AgentConfig::default(),
        "visits": {"a": 1, "review": 1},
        "jobs": {
            "r1.a.1": {"node": "a", "visit": 1, "attempt": 1, "state": "done",
                "published_at": AT, "finished_at": LATER, "branch": null, "advisory": false,
                "timeout_seconds": 60, "started_at": AT, "worker": "w1"},
            "r1.b.1": {"node": "b", "visit": 1, "attempt": 1, "state": "pending",
                "published_at": LATER, "finished_at": null},
        },
        "history": [{"job_id": "r1.a.1", "node": "a", "visit": 1, "ok": true, "status": "ok",
            "output": {}, "derived": {}, "error": null, "commit": null, "artifacts": {},
            "usage": usage, "worker": "w1", "execution": "e1-aa",
            "started_at": AT, "finished_at": LATER, "container_seconds": 1.5, "branch": null}],
        "result": null, "usage": usage,
        "created_at": AT, "updated_at": LATER, "finished_at": null,
        "approvals": {"review": {"requested_at": AT, "visit": 1, "branch": null,
            "decision": {"approved": true, "by": "ana", "comment": "ok", "at": LATER}}},
    })
}

fn at(text: &str) -> DateTime<Utc> {
    text.parse().expect("a time")
}

#[test]
fn a_state_of_the_previous_version_reads_with_its_times() {
    let state: RunState = serde_json::from_value(old_state()).expect("the old state reads");
    assert_eq!(state.created_at.timestamp_millis(), 1_795_341_600_123);
    assert_eq!(state.updated_at, at(LATER));
    assert_eq!(state.finished_at, None);
    let a = &state.jobs[&JobId::new("r1.a.1")];
    assert_eq!(
        (a.published_at, a.started_at, a.finished_at),
        (at(AT), Some(at(AT)), Some(at(LATER)))
    );
    let b = &state.jobs[&JobId::new("r1.b.1")];
    assert_eq!((b.started_at, b.finished_at), (None, None));
    let o = &state.history[0];
    assert_eq!((o.started_at, o.finished_at), (at(AT), at(LATER)));
    let review = &state.approvals[&NodeId::new("review")];
    assert_eq!(review.requested_at, at(AT));
    assert_eq!(review.decision.as_ref().map(|d| d.at), Some(at(LATER)));
}

#[test]
fn what_this_version_writes_keeps_the_text_and_reads_back() {
    let state: RunState = serde_json::from_value(old_state()).expect("the old state reads");
    let written = serde_json::to_value(&state).unwrap();
    assert_eq!(written["created_at"], AT);
    assert_eq!(written["jobs"]["r1.a.1"]["started_at"], AT);
    assert_eq!(written["history"][0]["finished_at"], LATER);
    assert_eq!(written["approvals"]["review"]["decision"]["at"], LATER);
    let back: RunState = serde_json::from_value(written).unwrap();
    assert_eq!(back, state);

    // A state the engine made, at a time with and without a fraction.
    let b = bundle(FORK_JOIN);
    let mut run = new_run(&b, 1);
    run.created_at = at(AT);
    let t = step(&b, &run, Event::Start { at: time(7) });
    let text = serde_json::to_string(&t.state).unwrap();
    assert!(
        text.contains(r#""updated_at":"2026-11-22T10:00:07Z""#),
        "{text}"
    );
    let back: RunState = serde_json::from_str(&text).unwrap();
    assert_eq!(back, t.state);
}

#[test]
fn a_state_with_a_time_that_is_not_one_is_refused() {
    let mut state = old_state();
    state["created_at"] = json!("t0");
    assert!(serde_json::from_value::<RunState>(state).is_err());
}
