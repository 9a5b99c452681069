//! The graph engine: `apply(graph, state, event) -> (state, effects)`. Pure and deterministic:
//! the driver supplies time in events and carries out the effects (publish jobs, store results).
//!
//! Idempotency lives here: a result for a job that is already done is a duplicate, a result whose
//! attempt is older than the job's current attempt is stale (fencing), and both change nothing.
//!
//! The rooms:
//! - this file: the entry points [`apply`] and [`apply_in_place`] (which event applies, and the
//!   idempotency and fencing checks) and [`EngineError`];
//! - `state.rs`: the run state ([`RunState`], [`JobRecord`], [`JobState`], [`JoinState`],
//!   approvals, [`Outcome`], [`RunStatus`], [`MAX_ATTEMPTS`]);
//! - `events.rs`: what goes in and comes out ([`Event`], [`Effect`], [`Applied`],
//!   [`Transition`], [`Assembler`]);
//! - `context.rs`: the context expressions and templates see, and the part of it a prompt gets;
//! - `step.rs`: the interpreter (`Engine`): entering nodes, routing, results, decisions,
//!   observers, exits and the end of a run;
//! - `fanout.rs`: joins (arrivals, firing) and fan-out into branches;
//! - `children.rs`: child runs (spawn nodes, the tree's links and bounds, their ends);
//! - `siblings.rs`: events between sibling runs (broadcast, relayed by the parent, handled);
//! - `publish.rs`: building and publishing job specs, and re-issuing jobs as their next attempt;
//! - `quarantine.rs`: items a graph puts on hold for people, their decisions, the hold's release.

mod approvals;
mod budget;
mod children;
mod context;
mod events;
mod fanout;
mod publish;
pub mod quarantine;
mod sessions;
mod siblings;
pub mod stall;
mod state;
mod step;

pub use budget::budget_refusal;
pub use children::{child_run_id, ChildGroup, ChildRecord, ChildReport, ChildRun, TreeLink};
pub use events::{Applied, Assembler, Effect, Event, RunNotice, Transition};
pub use siblings::SiblingEvent;
pub use state::{
    ApprovalState, Decision, JobRecord, JobState, JoinState, NewRun, Outcome, RunState, RunStatus,
    MAX_ATTEMPTS,
};

use crate::expr::ExprError;
use crate::graph::GraphBundle;
use crate::ids::{JobId, NodeId};
use serde_json::json;
use step::Engine;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error("node `{0}` is not in the graph")]
    UnknownNode(NodeId),
    #[error("node `{node}`: {source}")]
    Expr {
        node: NodeId,
        #[source]
        source: ExprError,
    },
}

/// Applies an event to a copy of `state`.
pub fn apply(
    bundle: &GraphBundle,
    state: &RunState,
    event: &Event,
    assemble: &dyn Fn(&str) -> Option<Assembler>,
) -> Result<Transition, EngineError> {
    let mut next = state.clone();
    let (effects, applied) = apply_in_place(bundle, &mut next, event, assemble)?;
    Ok(Transition {
        state: next,
        effects,
        applied,
    })
}

/// Applies an event to `state` itself (no copy, for batches). On an error the state may be
/// half-changed: the caller must discard it.
pub fn apply_in_place(
    bundle: &GraphBundle,
    state: &mut RunState,
    event: &Event,
    assemble: &dyn Fn(&str) -> Option<Assembler>,
) -> Result<(Vec<Effect>, Applied), EngineError> {
    let unchanged = |applied| Ok((Vec::new(), applied));
    let at = match event {
        Event::Start { at }
        | Event::JobFinished { at, .. }
        | Event::JobDead { at, .. }
        | Event::JobStarted { at, .. }
        | Event::Reissue { at, .. }
        | Event::Restored { at }
        | Event::Decide { at, .. }
        | Event::Quarantine { at, .. }
        | Event::Cancel { at }
        | Event::ChildFinished { at, .. }
        | Event::SiblingEvent { at, .. }
        | Event::FromSibling { at, .. }
        | Event::Budget { at, .. }
        | Event::Progress { at, .. }
        | Event::Stalled { at, .. } => *at,
    };
    enum Step {
        Start,
        Finished(JobRecord),
        Dead(JobRecord),
        Started(JobRecord),
        Reissue(JobRecord),
        Restored(Vec<(JobId, JobRecord)>, Vec<ChildRun>),
        Decide(ApprovalState),
        Quarantine,
        Cancel,
        Child,
        Relay,
        Receive,
        Progress(JobRecord),
        Budget,
        Stalled,
    }
    let step = match event {
        Event::Start { .. } => {
            if state.status != RunStatus::Pending {
                return unchanged(Applied::Duplicate);
            }
            Step::Start
        }
        Event::JobFinished { result, .. } => {
            let Some(record) = state.jobs.get(&result.job_id) else {
                return unchanged(Applied::Ignored("unknown job"));
            };
            if result.attempt < record.attempt {
                return unchanged(Applied::Stale {
                    current: record.attempt,
                });
            }
            if record.state != JobState::Pending {
                return unchanged(Applied::Duplicate);
            }
            let late_advisory = state.status.is_terminal() && record.advisory;
            if state.status != RunStatus::Running && !late_advisory {
                return unchanged(Applied::Ignored("run is not running"));
            }
            Step::Finished(record.clone())
        }
        Event::JobDead {
            job_id, attempt, ..
        } => {
            let Some(record) = state.jobs.get(job_id) else {
                return unchanged(Applied::Ignored("unknown job"));
            };
            if *attempt < record.attempt {
                return unchanged(Applied::Stale {
                    current: record.attempt,
                });
            }
            if record.state != JobState::Pending || state.status != RunStatus::Running {
                return unchanged(Applied::Duplicate);
            }
            Step::Dead(record.clone())
        }
        Event::JobStarted {
            job_id, attempt, ..
        }
        | Event::Reissue {
            job_id, attempt, ..
        } => {
            let Some(record) = state.jobs.get(job_id) else {
                return unchanged(Applied::Ignored("unknown job"));
            };
            if *attempt < record.attempt {
                return unchanged(Applied::Stale {
                    current: record.attempt,
                });
            }
            let live = state.status == RunStatus::Running
                || (state.status.is_terminal() && record.advisory);
            if record.state != JobState::Pending || !live {
                return unchanged(Applied::Duplicate);
            }
            match event {
                // The same worker announcing twice (a redelivered notice) changes nothing; a
                // different worker took a redelivered job and restarts its clock.
                Event::JobStarted { worker, .. } if record.worker.as_ref() == Some(worker) => {
                    return unchanged(Applied::Duplicate)
                }
                Event::JobStarted { .. } => Step::Started(record.clone()),
                // A deadline counted from the publish (no `started_at`): only a job that never
                // started is re-issued; a start brings its own deadline.
                Event::Reissue {
                    started_at: None, ..
                } if record.started_at.is_some() => {
                    return unchanged(Applied::Ignored(
                        "the job started; its own deadline applies",
                    ))
                }
                Event::Reissue {
                    started_at: Some(started_at),
                    ..
                } if record.started_at != Some(*started_at) => {
                    return unchanged(Applied::Ignored("a later start supersedes this deadline"))
                }
                _ => Step::Reissue(record.clone()),
            }
        }
        Event::Restored { .. } => {
            let live = |r: &JobRecord| {
                state.status == RunStatus::Running || (state.status.is_terminal() && r.advisory)
            };
            let waiting: Vec<(JobId, JobRecord)> = state
                .pending_jobs()
                .filter(|(_, r)| live(r))
                .map(|(id, r)| (id.clone(), r.clone()))
                .collect();
            let children = if state.status == RunStatus::Running {
                state.open_children()
            } else {
                Vec::new()
            };
            if waiting.is_empty() && children.is_empty() {
                return unchanged(Applied::Ignored("no job to re-issue"));
            }
            Step::Restored(waiting, children)
        }
        Event::Decide {
            node,
            approved,
            edits,
            ..
        } => {
            if let Some(why) = approvals::edits_refusal(bundle, node, *approved, edits.as_ref()) {
                return unchanged(Applied::Refused(why));
            }
            let Some(approval) = state
                .approvals
                .get(node)
                .filter(|a| a.decision.is_none())
                .cloned()
            else {
                return unchanged(Applied::Duplicate);
            };
            if state.status != RunStatus::Running {
                return unchanged(Applied::Ignored("run is not running"));
            }
            Step::Decide(approval)
        }
        Event::Quarantine { item, .. } => {
            if let Some(why) = quarantine::refusal(bundle, state, item) {
                return unchanged(Applied::Ignored(why));
            }
            Step::Quarantine
        }
        Event::Cancel { .. } => {
            if state.status.is_terminal() {
                return unchanged(Applied::Duplicate);
            }
            Step::Cancel
        }
        Event::ChildFinished { report, .. } => {
            if state.status != RunStatus::Running {
                return unchanged(Applied::Ignored("run is not running"));
            }
            let waiting = state
                .open_child(&report.node, report.visit, report.index, &report.child)
                .is_some();
            if !waiting {
                return unchanged(Applied::Duplicate);
            }
            Step::Child
        }
        Event::SiblingEvent { event, .. } => {
            if state.status != RunStatus::Running {
                return unchanged(Applied::Ignored("run is not running"));
            }
            let open = state
                .children
                .get(&ChildGroup::key(&event.spawn, event.visit))
                .is_some_and(|g| !g.settled && !g.relayed.contains(&event.id));
            if !open {
                return unchanged(Applied::Duplicate);
            }
            Step::Relay
        }
        Event::Progress { notice, .. } => {
            let Some(record) = state.jobs.get(&notice.job_id) else {
                return unchanged(Applied::Ignored("unknown job"));
            };
            if notice.attempt < record.attempt {
                return unchanged(Applied::Stale {
                    current: record.attempt,
                });
            }
            if state.status != RunStatus::Running || record.state != JobState::Pending {
                return unchanged(Applied::Ignored("the job is not running"));
            }
            if notice.invocation <= record.invocations {
                return unchanged(Applied::Duplicate);
            }
            Step::Progress(record.clone())
        }
        Event::Budget { limit_usd, .. } => {
            if let Some(why) = budget::budget_refusal(state, *limit_usd) {
                return unchanged(Applied::Refused(why));
            }
            Step::Budget
        }
        Event::FromSibling { event, .. } => {
            if state.status != RunStatus::Running {
                return unchanged(Applied::Ignored("run is not running"));
            }
            if state.sibling_events.iter().any(|e| e.id == event.id) {
                return unchanged(Applied::Duplicate);
            }
            Step::Receive
        }
        Event::Stalled { since, .. } => {
            if state.updated_at > *since {
                return unchanged(Applied::Ignored("the run moved since"));
            }
            if !stall::is_stalled(state) {
                return unchanged(Applied::Ignored("the run is not stalled"));
            }
            Step::Stalled
        }
    };
    let mut e = Engine {
        bundle,
        state,
        fx: Vec::new(),
        at,
        assemble,
    };
    match (step, event) {
        (Step::Start, _) => {
            e.state.status = RunStatus::Running;
            let start = bundle.graph.start.clone();
            e.enter(&start, None, None)?;
        }
        (Step::Finished(record), Event::JobFinished { result, .. }) => {
            e.job_finished(result, record)?;
        }
        (Step::Dead(record), Event::JobDead { job_id, reason, .. }) => {
            e.finish_job(job_id);
            let result = json!({
                "reason": "job_dead_lettered",
                "job_id": job_id,
                "node": record.node,
                "detail": reason,
            });
            e.finish(RunStatus::Failed, result);
        }
        (
            Step::Decide(approval),
            Event::Decide {
                node,
                approved,
                by,
                comment,
                edits,
                ..
            },
        ) => {
            e.decide(node, approval, *approved, by, comment, edits.clone())?;
        }
        (Step::Started(record), Event::JobStarted { job_id, worker, .. }) => {
            if let Some(r) = e.state.jobs.get_mut(job_id) {
                r.started_at = Some(at);
                r.worker = Some(worker.clone());
            }
            e.fx.push(Effect::Watch {
                job_id: job_id.clone(),
                attempt: record.attempt,
                started_at: at,
                timeout_seconds: record.timeout_seconds,
            });
        }
        (Step::Reissue(record), Event::Reissue { job_id, .. }) => {
            e.reissue(job_id, record)?;
        }
        (Step::Restored(waiting, children), _) => {
            for (job_id, record) in waiting {
                e.reissue_as_next(&job_id, record)?;
            }
            // Their start messages or their reports may have been lost with the store: ask
            // for each again (a child that exists is not started twice; one that ended
            // reports again, and a report counts once).
            if !children.is_empty() {
                e.fx.push(Effect::StartChildren(children));
            }
        }
        (
            Step::Quarantine,
            Event::Quarantine {
                item,
                approved,
                by,
                comment,
                ..
            },
        ) => {
            let decision = Decision {
                approved: *approved,
                by: by.clone(),
                comment: comment.clone(),
                at,
                edits: None,
            };
            e.quarantine_decision(item, decision)?;
        }
        (Step::Cancel, _) => {
            e.finish(RunStatus::Cancelled, json!({"reason": "cancelled"}));
        }
        (Step::Child, Event::ChildFinished { report, .. }) => {
            e.child_finished(report)?;
        }
        (Step::Relay, Event::SiblingEvent { event, .. }) => e.relay(event),
        (Step::Receive, Event::FromSibling { event, .. }) => e.receive(event)?,
        (Step::Progress(record), Event::Progress { notice, .. }) => {
            e.progress(&record.node, notice)?
        }
        (Step::Budget, Event::Budget { limit_usd, by, .. }) => e.set_budget(*limit_usd, by),
        (Step::Stalled, _) => {
            let result = json!({
                "reason": stall::STALLED_REASON,
                "detail": "the run was running with no job in flight, nothing held, \
                    no decision and no child run to wait for",
                "stuck": stall::stuck_state(e.state),
            });
            e.finish(RunStatus::Failed, result);
        }
        _ => unreachable!("the step matches its event"),
    }
    e.state.updated_at = at;
    Ok((e.fx, Applied::Changed))
}

#[cfg(test)]
mod tests;
