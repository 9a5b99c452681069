//! A run that stops moving without ending: running, and waiting for nothing that could move it
//! (no job in flight, no job held for a budget raise, no approval or quarantine decision to
//! make, no child run under way). No event would ever change it again, so the driver, after
//! a grace, sends `Event::Stalled`, and the engine ends the run `failed` with the reason
//! `run_stalled` (an infrastructure error, never a verdict) and the state it was stuck in.

use super::state::{JobState, RunState, RunStatus};
use serde_json::{json, Value};

/// The reason a stalled run ends with.
pub const STALLED_REASON: &str = "run_stalled";

/// What a run waits for before it can move on: its jobs in flight (any job not done, advisory
/// ones included), jobs held for a budget raise, approvals to decide, child runs under way.
/// Empty: nothing.
pub fn waits_for(state: &RunState) -> Vec<String> {
    let mut waits: Vec<String> = state
        .jobs
        .iter()
        .filter(|(_, j)| j.state == JobState::Pending)
        .map(|(id, _)| format!("job {id}"))
        .collect();
    if !state.held.is_empty() {
        waits.push(format!("a budget raise ({} jobs held)", state.held.len()));
    }
    waits.extend(
        state
            .awaiting_approval()
            .into_iter()
            .map(|n| format!("the approval of {n}")),
    );
    for group in state.children.values().filter(|g| !g.settled) {
        waits.extend(
            (group.children.iter())
                .filter(|c| c.status.is_none())
                .map(|c| format!("child run {}", c.run_id)),
        );
    }
    waits
}

/// A running run that waits for nothing: only a person's cancel would ever change it.
pub fn is_stalled(state: &RunState) -> bool {
    state.status == RunStatus::Running && waits_for(state).is_empty()
}

/// The state a stalled run is stuck in, for its result: the visits, its last three
/// outcomes, the joins still waiting for arrivals and when it last changed.
pub fn stuck_state(state: &RunState) -> Value {
    let last: Vec<Value> = (state.history.iter().rev().take(3).rev())
        .map(|o| json!({"node": o.node, "job_id": o.job_id, "ok": o.ok, "status": o.status}))
        .collect();
    let joins: serde_json::Map<String, Value> = (state.joins.iter())
        .filter(|(_, j)| j.arrived.len() < j.expected)
        .map(|(n, j)| {
            let arrived: Vec<&String> = j.arrived.keys().collect();
            (
                n.to_string(),
                json!({"arrived": arrived, "expected": j.expected}),
            )
        })
        .collect();
    json!({
        "visits": state.visits,
        "last_outcomes": last,
        "joins_waiting": joins,
        "since": state.updated_at,
    })
}
