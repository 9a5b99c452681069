//! What goes into the engine ([`Event`]: start, results, deadlines, restores, decisions,
//! cancel) and what comes out ([`Effect`]s for the driver to carry out, [`Applied`] for logs and
//! metrics, the whole [`Transition`]), and the [`Assembler`]s of exit results.

use super::children::{ChildReport, ChildRun};
use super::siblings::SiblingEvent;
use super::state::{RunState, RunStatus};
use crate::ids::{Attempt, JobId, NodeId, RunId};
use crate::messages::{JobResult, JobSpec};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum Event {
    Start {
        at: DateTime<Utc>,
    },
    JobFinished {
        result: Box<JobResult>,
        at: DateTime<Utc>,
    },
    /// The queue gave up on a job (delivery limit reached).
    JobDead {
        job_id: JobId,
        attempt: Attempt,
        reason: String,
        at: DateTime<Utc>,
    },
    /// A worker started a job (its start notice).
    JobStarted {
        job_id: JobId,
        attempt: Attempt,
        worker: String,
        at: DateTime<Utc>,
    },
    /// A started job passed its deadline without a result (a hung or cut-off worker): run it
    /// again as the next attempt; a late result of the old attempt will be stale.
    Reissue {
        job_id: JobId,
        attempt: Attempt,
        /// The start the deadline was counted from (none: the publish, for a job that never
        /// started); a later start (a redelivery) supersedes it.
        started_at: Option<DateTime<Utc>>,
        at: DateTime<Utc>,
    },
    /// The run was restored from its mirror after the run store lost it: every job it still
    /// waits for is issued again as its next attempt (the outbox, deadlines and results that
    /// were lost with the store are redone; a result of an older attempt is stale), and every
    /// child run it still waits for is asked for again.
    Restored {
        at: DateTime<Utc>,
    },
    /// A human decided an approval node.
    Decide {
        node: NodeId,
        approved: bool,
        by: String,
        comment: String,
        at: DateTime<Utc>,
        /// Edits sent with an approval, for a node that takes them (`edits:`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        edits: Option<serde_json::Value>,
    },
    /// A person decided an item the graph put on hold (`quarantine:`).
    Quarantine {
        item: String,
        approved: bool,
        by: String,
        comment: String,
        at: DateTime<Utc>,
    },
    Cancel {
        at: DateTime<Utc>,
    },
    /// A child run this run started ended.
    ChildFinished {
        report: Box<ChildReport>,
        at: DateTime<Utc>,
    },
    /// A child run broadcast an event: relay it to its running siblings.
    SiblingEvent {
        event: Box<SiblingEvent>,
        at: DateTime<Utc>,
    },
    /// A sibling run's event reached this run.
    FromSibling {
        event: Box<SiblingEvent>,
        at: DateTime<Utc>,
    },
    /// A person set the run's budget (a paused run resumes: its held jobs are published).
    Budget {
        limit_usd: f64,
        by: String,
        at: DateTime<Utc>,
    },
    /// An incremental job finished an invocation.
    Progress {
        notice: Box<crate::session::ProgressNotice>,
        at: DateTime<Utc>,
    },
    /// The driver found the run waiting for nothing (`stall::is_stalled`) since its change at
    /// `since`, a grace ago: unless it moved since, it ends `failed` (`run_stalled`).
    Stalled {
        since: DateTime<Utc>,
        at: DateTime<Utc>,
    },
}

impl Event {
    /// The team slot (`quota::slot_of`) the event ends: a result, a dead letter or a
    /// re-issue ends its attempt (a re-issued job takes a new slot as its next attempt).
    pub fn ended_slot(&self) -> Option<String> {
        match self {
            Event::JobFinished { result, .. } => {
                Some(crate::quota::slot_of(&result.job_id, result.attempt))
            }
            Event::JobDead {
                job_id, attempt, ..
            }
            | Event::Reissue {
                job_id, attempt, ..
            } => Some(crate::quota::slot_of(job_id, *attempt)),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    Publish(Box<JobSpec>),
    /// Something the run's webhook hears of (a budget mark, a quarantine, an approval asked
    /// for, the run's end).
    Notify(Box<RunNotice>),
    Finished {
        status: RunStatus,
        result: Value,
    },
    /// A finished run's result changed (an advisory or observer node reported late).
    ResultUpdated {
        result: Value,
    },
    /// Jobs the run no longer needs (it ended): workers running them may stop.
    StopJobs(Vec<JobId>),
    /// Create and start these child runs (a spawn node).
    StartChildren(Vec<ChildRun>),
    /// This child run ended: tell its parent.
    NotifyParent(Box<ChildReport>),
    /// Cancel these child runs (their parent ended, or a sibling failed first).
    CancelRuns(Vec<RunId>),
    /// This child run broadcast an event: its parent relays it to the siblings.
    RelayToSiblings(Box<SiblingEvent>),
    /// Deliver a sibling's event to these runs.
    DeliverToRuns(Vec<RunId>, Box<SiblingEvent>),
    /// Messages for the sessions of running jobs (the control channel).
    Deliver(Vec<crate::session::Delivery>),
    /// Watch a started job: re-issue it if no result came `timeout_seconds` (plus grace) later.
    Watch {
        job_id: JobId,
        attempt: Attempt,
        started_at: DateTime<Utc>,
        timeout_seconds: u64,
    },
}

/// What the event did, for logs, metrics and the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    Changed,
    Duplicate,
    Stale {
        current: Attempt,
    },
    Ignored(&'static str),
    /// A person's request the engine refused (why, for them).
    Refused(String),
}

#[derive(Clone, Debug)]
pub struct Transition {
    pub state: RunState,
    pub effects: Vec<Effect>,
    pub applied: Applied,
}

/// Result assemblers of exit nodes, supplied by the caller's harness modules (pure functions).
pub type Assembler = fn(&RunState, &NodeId, bool, DateTime<Utc>) -> Value;

/// What the run's webhook is told: an event of its log, with a delivery id fixed by the run
/// and the event (so a redelivery is recognisable).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunNotice {
    pub run_id: RunId,
    /// The run's team (none: the open API's): its key signs the notice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The run's webhook.
    pub url: String,
    pub delivery: String,
    pub event: crate::tracking::RunEvent,
}
