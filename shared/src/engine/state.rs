//! The run state: what a run has done and still waits for ([`RunState`]), its jobs
//! ([`JobRecord`], [`JobState`]), finished visits ([`Outcome`]), joins ([`JoinState`]) and
//! approvals ([`ApprovalState`], [`Decision`]). Serialized as is into the run store and the mirror.

use super::children::{ChildGroup, ChildRun, TreeLink};
use super::siblings::SiblingEvent;
use crate::graph::GraphBundle;
use crate::ids::{Attempt, JobId, NodeId, RunId};
use crate::messages::{AgentConfig, JobStatus, RepoSnapshot, Usage};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Pending,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Pending,
    Done,
    Cancelled,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JobRecord {
    pub node: NodeId,
    pub visit: u32,
    pub attempt: Attempt,
    pub state: JobState,
    pub published_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The fan-out branch the job belongs to.
    #[serde(default)]
    pub branch: Option<u32>,
    /// Advisory and observer jobs may finish after the run did.
    #[serde(default)]
    pub advisory: bool,
    #[serde(default)]
    pub timeout_seconds: u64,
    /// When and where the current attempt started (from the worker's start notice).
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub worker: Option<String>,
    /// The last invocation an incremental job reported progress for (this attempt or an
    /// earlier one: a resumed session goes on counting).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub invocations: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A job is re-issued at most this many times before the run fails.
pub const MAX_ATTEMPTS: Attempt = 3;

/// A finished visit of a node, as the engine and expressions see it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Outcome {
    pub job_id: JobId,
    pub node: NodeId,
    pub visit: u32,
    pub ok: bool,
    pub status: JobStatus,
    pub output: Value,
    /// Fields the harness derived from the output (the node's `derive`).
    #[serde(default)]
    pub derived: Value,
    pub error: Option<String>,
    pub commit: Option<String>,
    pub artifacts: BTreeMap<String, String>,
    pub usage: Usage,
    pub worker: String,
    /// The execution whose result was accepted (its artifacts are the ones `artifacts` names).
    #[serde(default)]
    pub execution: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    /// Seconds the job's container lived (create to remove); 0 for jobs without one.
    #[serde(default)]
    pub container_seconds: f64,
    #[serde(default)]
    pub branch: Option<u32>,
    /// The earlier job whose kept result was reused (the step cache) instead of running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_from: Option<crate::step_cache::CachedFrom>,
    /// The events the job's trusted code recorded (bounded), for the run's event log.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<crate::tracking::JobEvent>,
}

/// Arrivals at a join: a set keyed by arriving node (or fan-out branch), so a redelivered
/// result can never count twice; it fires when the set is complete, exactly once per round.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct JoinState {
    pub arrived: BTreeMap<String, bool>,
    pub expected: usize,
    pub fired: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Decision {
    pub approved: bool,
    pub by: String,
    pub comment: String,
    pub at: DateTime<Utc>,
    /// What the person changed with the approval (checked against the node's `edits` schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edits: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ApprovalState {
    pub requested_at: DateTime<Utc>,
    pub visit: u32,
    pub branch: Option<u32>,
    pub decision: Option<Decision>,
    /// What the node's `show` gave when it was entered (what the person deciding sees).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunState {
    pub run_id: RunId,
    pub graph_name: String,
    pub graph_ref: String,
    pub status: RunStatus,
    pub input: Value,
    /// Values computed at submission by the graph's prepare hook (hashes, paths).
    pub meta: Value,
    pub repo: RepoSnapshot,
    pub agent: AgentConfig,
    pub visits: BTreeMap<NodeId, u32>,
    pub jobs: BTreeMap<JobId, JobRecord>,
    pub history: Vec<Outcome>,
    pub result: Option<Value>,
    pub usage: Usage,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub joins: BTreeMap<NodeId, JoinState>,
    /// Fan-out items by branch id.
    #[serde(default)]
    pub branches: BTreeMap<u32, Value>,
    #[serde(default)]
    pub approvals: BTreeMap<NodeId, ApprovalState>,
    /// People's decisions on items the graph put on hold (`quarantine:`), per item, in order.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub quarantine: BTreeMap<String, Vec<Decision>>,
    /// Failure signatures seen per node, for stuck detection.
    #[serde(default)]
    pub signatures: BTreeMap<NodeId, Vec<String>>,
    /// Where this run sits in a tree of child runs (none: a root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeLink>,
    /// Runs this run may still start below itself (none: a root that has not spawned yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawn_budget: Option<u32>,
    /// The children of each spawn visit, by `<node>.<visit>`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub children: BTreeMap<String, ChildGroup>,
    /// Events sibling runs sent this run, in the order they came.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sibling_events: Vec<SiblingEvent>,
    /// Messages for agent sessions, by the node whose session they are for.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mailboxes: BTreeMap<NodeId, crate::session::Mailbox>,
    /// The run's budget in dollars, when it was given one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::tracking::RunBudget>,
    /// Where the run's notices go (an `http(s)` URL, signed with the coordinator's webhook
    /// secret; the secret is never in the run state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
    /// Jobs held while the run is paused on its budget, published on a raise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<crate::messages::JobSpec>,
    /// The team that owns the run (none: submitted through the open API); only its tokens
    /// see it, and its child runs are the team's too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The id of the commit that wrote this state: the link by which the mirror's deltas
    /// chain (set by the coordinator; the engine never reads it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub commit: String,
}

/// What a new run starts from (everything but its graph and the time).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NewRun {
    pub run_id: RunId,
    /// The key of the graph bundle in object storage.
    pub graph_ref: String,
    pub input: Value,
    /// Values computed at submission by the graph's prepare hook (hashes, paths).
    pub meta: Value,
    pub repo: RepoSnapshot,
    pub agent: AgentConfig,
}

impl RunState {
    pub fn new(new: NewRun, bundle: &GraphBundle, at: DateTime<Utc>) -> Self {
        let NewRun {
            run_id,
            graph_ref,
            input,
            meta,
            repo,
            agent,
        } = new;
        Self {
            run_id,
            graph_name: bundle.graph.name.clone(),
            graph_ref,
            status: RunStatus::Pending,
            input,
            meta,
            repo,
            agent,
            visits: BTreeMap::new(),
            jobs: BTreeMap::new(),
            history: Vec::new(),
            result: None,
            usage: Usage::default(),
            created_at: at,
            updated_at: at,
            finished_at: None,
            joins: BTreeMap::new(),
            branches: BTreeMap::new(),
            approvals: BTreeMap::new(),
            quarantine: BTreeMap::new(),
            signatures: BTreeMap::new(),
            tree: None,
            spawn_budget: None,
            children: BTreeMap::new(),
            sibling_events: Vec::new(),
            mailboxes: BTreeMap::new(),
            budget: None,
            webhook: None,
            held: Vec::new(),
            team: None,
            commit: String::new(),
        }
    }

    /// A child run as its parent's spawn decided it, not started yet.
    pub fn new_child(child: ChildRun, bundle: &GraphBundle, at: DateTime<Utc>) -> Self {
        let ChildRun { run, tree, budget } = child;
        let mut state = Self::new(run, bundle, at);
        state.tree = Some(tree);
        state.spawn_budget = Some(budget);
        state
    }

    pub fn last_outcome(&self, node: &NodeId) -> Option<&Outcome> {
        self.history.iter().rev().find(|o| &o.node == node)
    }

    /// The latest outcome of `node` as seen from `branch`: the branch's own, else the run's.
    pub fn last_outcome_in(&self, node: &NodeId, branch: Option<u32>) -> Option<&Outcome> {
        branch
            .and_then(|b| {
                self.history
                    .iter()
                    .rev()
                    .find(|o| &o.node == node && o.branch == Some(b))
            })
            .or_else(|| {
                self.history
                    .iter()
                    .rev()
                    .find(|o| &o.node == node && (o.branch.is_none() || branch.is_none()))
            })
    }

    pub fn pending_jobs(&self) -> impl Iterator<Item = (&JobId, &JobRecord)> {
        self.jobs
            .iter()
            .filter(|(_, j)| j.state == JobState::Pending)
    }

    /// Approvals a human still has to decide.
    pub fn awaiting_approval(&self) -> Vec<&NodeId> {
        self.approvals
            .iter()
            .filter(|(_, a)| a.decision.is_none())
            .map(|(n, _)| n)
            .collect()
    }
}

impl Outcome {
    /// The outcome of a step the engine takes itself (a join firing, a fan-out, a decision):
    /// no worker, no container, no commit.
    pub(super) fn of_engine(
        run: &RunId,
        node: &NodeId,
        visit: u32,
        ok: bool,
        output: Value,
        at: DateTime<Utc>,
        branch: Option<u32>,
    ) -> Self {
        Outcome {
            job_id: JobId::for_visit(run, node, visit),
            node: node.clone(),
            visit,
            ok,
            status: if ok { JobStatus::Ok } else { JobStatus::Failed },
            output,
            derived: json!({}),
            error: None,
            commit: None,
            artifacts: BTreeMap::new(),
            usage: Usage::default(),
            worker: String::new(),
            execution: String::new(),
            started_at: at,
            finished_at: at,
            container_seconds: 0.0,
            branch,
            cached_from: None,
            events: Vec::new(),
        }
    }
}
