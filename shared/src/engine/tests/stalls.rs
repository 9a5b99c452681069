//! A run that waits for nothing: found (`stall::is_stalled`), ended `failed` with the reason
//! `run_stalled` and the state it was stuck in, an infrastructure error for its batch; a run
//! that waits for a job, a held job or a decision is left alone, and so is one that moved
//! after the stall was seen.

use super::*;
use crate::engine::stall;

/// The factory run after its start, with its one job marked done by hand: what a lost
/// transition leaves (nothing in flight, nothing to decide, not ended).
fn stalled_run(b: &GraphBundle) -> RunState {
    let t = step(b, &new_run(b, 2), Event::Start { at: time(0) });
    let mut state = t.state;
    for job in state.jobs.values_mut() {
        job.state = JobState::Done;
    }
    state
}

#[test]
fn a_run_waiting_for_nothing_ends_failed_with_the_state_it_is_stuck_in() {
    let b = factory_bundle();
    let state = stalled_run(&b);
    assert!(stall::is_stalled(&state));
    let t = step(
        &b,
        &state,
        Event::Stalled {
            since: state.updated_at,
            at: time(100),
        },
    );
    assert_eq!(t.applied, Applied::Changed);
    assert_eq!(t.state.status, RunStatus::Failed);
    let result = t.state.result.clone().unwrap();
    assert_eq!(result["reason"], "run_stalled");
    assert_eq!(result["stuck"]["visits"], json!(state.visits));
    assert_eq!(result["stuck"]["since"], json!(state.updated_at));
    let outcome = crate::batch::outcome_of(&t.state);
    assert!(outcome.infra_error, "a stall is the fleet's, not a verdict");
    assert_eq!(outcome.verdict, None);
    assert!(!stall::is_stalled(&t.state), "an ended run is not stalled");
}

#[test]
fn a_run_with_something_to_wait_for_is_not_stalled() {
    let b = factory_bundle();
    let started = step(&b, &new_run(&b, 2), Event::Start { at: time(0) });
    assert!(!stall::is_stalled(&started.state), "a job is in flight");
    let left = step(
        &b,
        &started.state,
        Event::Stalled {
            since: started.state.updated_at,
            at: time(100),
        },
    );
    assert_eq!(left.applied, Applied::Ignored("the run is not stalled"));
    assert_eq!(left.state.status, RunStatus::Running);

    let mut held = stalled_run(&b);
    held.held.push(published(&started).clone());
    assert_eq!(
        stall::waits_for(&held),
        vec!["a budget raise (1 jobs held)"]
    );

    let mut deciding = stalled_run(&b);
    deciding.approvals.insert(
        NodeId::new("review"),
        ApprovalState {
            requested_at: time(1),
            visit: 1,
            branch: None,
            decision: None,
            shown: None,
        },
    );
    assert_eq!(stall::waits_for(&deciding), vec!["the approval of review"]);
    assert!(!stall::is_stalled(&deciding));
}

#[test]
fn a_run_that_moved_after_the_stall_was_seen_is_left_alone() {
    let b = factory_bundle();
    let mut state = stalled_run(&b);
    let seen = state.updated_at;
    state.updated_at = time(50);
    let t = step(
        &b,
        &state,
        Event::Stalled {
            since: seen,
            at: time(100),
        },
    );
    assert_eq!(t.applied, Applied::Ignored("the run moved since"));
    assert_eq!(t.state.status, RunStatus::Running);
}
