//! The graph engine: `apply(graph, state, event) -> (state, effects)`. Pure and deterministic:
//! the driver supplies time in events and carries out the effects (publish jobs, store results).
//!
//! Idempotency lives here: a result for a job that is already done is a duplicate, a result whose
//! attempt is older than the job's current attempt is stale (fencing), and both change nothing.

use crate::expr::{self, ExprError};
use crate::graph::{GraphBundle, Node, NodeKind};
use crate::ids::{Attempt, JobId, NodeId, RunId};
use crate::messages::{
    AgentConfig, JobResult, JobSpec, JobStatus, RepoSnapshot, Usage, WorktreeSpec, WIRE_VERSION,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
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

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
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

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
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
    pub published_at: String,
    pub finished_at: Option<String>,
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
    pub started_at: Option<String>,
    #[serde(default)]
    pub worker: Option<String>,
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
    pub started_at: String,
    pub finished_at: String,
    /// Seconds the job's container lived (create to remove); 0 for jobs without one.
    #[serde(default)]
    pub container_seconds: f64,
    #[serde(default)]
    pub branch: Option<u32>,
}

/// Arrivals at a join: a set keyed by arriving node (or fan-out branch), so a redelivered
/// result can never count twice; it fires when the set is complete, exactly once per round.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct JoinState {
    pub arrived: BTreeMap<String, bool>,
    pub expected: usize,
    pub fired: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Decision {
    pub approved: bool,
    pub by: String,
    pub comment: String,
    pub at: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ApprovalState {
    pub requested_at: String,
    pub visit: u32,
    pub branch: Option<u32>,
    pub decision: Option<Decision>,
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
    pub created_at: String,
    pub updated_at: String,
    pub finished_at: Option<String>,
    #[serde(default)]
    pub joins: BTreeMap<NodeId, JoinState>,
    /// Fan-out items by branch id.
    #[serde(default)]
    pub branches: BTreeMap<u32, Value>,
    #[serde(default)]
    pub approvals: BTreeMap<NodeId, ApprovalState>,
    /// Failure signatures seen per node, for stuck detection.
    #[serde(default)]
    pub signatures: BTreeMap<NodeId, Vec<String>>,
}

impl RunState {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        run_id: RunId,
        bundle: &GraphBundle,
        graph_ref: String,
        input: Value,
        meta: Value,
        repo: RepoSnapshot,
        agent: AgentConfig,
        at: &str,
    ) -> Self {
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
            created_at: at.to_string(),
            updated_at: at.to_string(),
            finished_at: None,
            joins: BTreeMap::new(),
            branches: BTreeMap::new(),
            approvals: BTreeMap::new(),
            signatures: BTreeMap::new(),
        }
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

    /// The context expressions and templates see.
    pub fn context(&self) -> Value {
        self.context_in(None)
    }

    /// The context as seen from a fan-out branch: its item, and its own outcomes first.
    pub fn context_in(&self, branch: Option<u32>) -> Value {
        let mut ctx = Map::new();
        for o in self.history.iter().filter(|o| o.branch.is_none()) {
            ctx.insert(o.node.to_string(), outcome_view(o));
        }
        if let Some(b) = branch {
            for o in self.history.iter().filter(|o| o.branch == Some(b)) {
                ctx.insert(o.node.to_string(), outcome_view(o));
            }
            ctx.insert("branch".into(), json!(b));
            ctx.insert(
                "item".into(),
                self.branches.get(&b).cloned().unwrap_or(Value::Null),
            );
        }
        let last = match branch {
            Some(b) => self
                .history
                .iter()
                .rev()
                .find(|o| o.branch == Some(b))
                .or(self.history.last()),
            None => self.history.last(),
        };
        if let Some(last) = last {
            ctx.insert("last".into(), outcome_view(last));
        }
        let mut all: Map<String, Value> = Map::new();
        for o in self
            .history
            .iter()
            .filter(|o| o.branch.is_none() || o.branch == branch)
        {
            if let Value::Array(list) = all
                .entry(o.node.to_string())
                .or_insert_with(|| Value::Array(Vec::new()))
            {
                list.push(json!({"ok": o.ok, "status": o.status, "output": o.output,
                    "derived": o.derived, "visit": o.visit}));
            }
        }
        ctx.insert("all".into(), Value::Object(all));
        ctx.insert("input".into(), self.input.clone());
        ctx.insert("visits".into(), json!(self.visits));
        ctx.insert(
            "approvals".into(),
            json!(self
                .approvals
                .iter()
                .map(|(n, a)| (n.to_string(), json!(a.decision)))
                .collect::<Map<_, _>>()),
        );
        ctx.insert(
            "run".into(),
            json!({"id": self.run_id, "meta": self.meta, "base_commit": self.repo.base_commit,
                   "usage": self.usage}),
        );
        Value::Object(ctx)
    }
}

impl Outcome {
    /// The outcome of a step the engine takes itself (a join firing, a fan-out, a decision):
    /// no worker, no container, no commit.
    fn of_engine(
        run: &RunId,
        node: &NodeId,
        visit: u32,
        ok: bool,
        output: Value,
        at: &str,
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
            started_at: at.to_string(),
            finished_at: at.to_string(),
            container_seconds: 0.0,
            branch,
        }
    }
}

fn outcome_view(o: &Outcome) -> Value {
    json!({
        "node": o.node,
        "ok": o.ok,
        "status": o.status,
        "output": o.output,
        "derived": o.derived,
        "error": o.error,
        "visit": o.visit,
        "commit": o.commit,
        "artifacts": o.artifacts,
        "usage": o.usage,
    })
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum Event {
    Start {
        at: String,
    },
    JobFinished {
        result: Box<JobResult>,
        at: String,
    },
    /// The queue gave up on a job (delivery limit reached).
    JobDead {
        job_id: JobId,
        attempt: Attempt,
        reason: String,
        at: String,
    },
    /// A worker started a job (its start notice).
    JobStarted {
        job_id: JobId,
        attempt: Attempt,
        worker: String,
        at: String,
    },
    /// A started job passed its deadline without a result (a hung or cut-off worker): run it
    /// again as the next attempt; a late result of the old attempt will be stale.
    Reissue {
        job_id: JobId,
        attempt: Attempt,
        /// The start the deadline was counted from; a later start (a redelivery) supersedes it.
        started_at: String,
        at: String,
    },
    /// The run was restored from its mirror after the run store lost it: every job it still
    /// waits for is issued again as its next attempt (the outbox, deadlines and results that
    /// were lost with the store are redone; a result of an older attempt is stale).
    Restored {
        at: String,
    },
    /// A human decided an approval node.
    Decide {
        node: NodeId,
        approved: bool,
        by: String,
        comment: String,
        at: String,
    },
    Cancel {
        at: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    Publish(Box<JobSpec>),
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
    /// Watch a started job: re-issue it if no result came `timeout_seconds` (plus grace) later.
    Watch {
        job_id: JobId,
        attempt: Attempt,
        started_at: String,
        timeout_seconds: u64,
    },
}

/// What the event did, for logs, metrics and the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    Changed,
    Duplicate,
    Stale { current: Attempt },
    Ignored(&'static str),
}

#[derive(Clone, Debug)]
pub struct Transition {
    pub state: RunState,
    pub effects: Vec<Effect>,
    pub applied: Applied,
}

/// Result assemblers of exit nodes, supplied by the caller's harness modules (pure functions).
pub type Assembler = fn(&RunState, &NodeId, bool, &str) -> Value;

struct Engine<'a> {
    bundle: &'a GraphBundle,
    state: &'a mut RunState,
    fx: Vec<Effect>,
    at: &'a str,
    assemble: &'a dyn Fn(&str) -> Option<Assembler>,
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
        | Event::Cancel { at } => at.as_str(),
    };
    enum Step {
        Start,
        Finished(JobRecord),
        Dead(JobRecord),
        Started(JobRecord),
        Reissue(JobRecord),
        Restored(Vec<(JobId, JobRecord)>),
        Decide(ApprovalState),
        Cancel,
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
                // A deadline counted from the publish (empty `started_at`): only a job that
                // never started is re-issued; a start brings its own deadline.
                Event::Reissue { started_at, .. }
                    if started_at.is_empty() && record.started_at.is_some() =>
                {
                    return unchanged(Applied::Ignored(
                        "the job started; its own deadline applies",
                    ))
                }
                Event::Reissue { started_at, .. }
                    if !started_at.is_empty() && record.started_at.as_ref() != Some(started_at) =>
                {
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
            if waiting.is_empty() {
                return unchanged(Applied::Ignored("no job to re-issue"));
            }
            Step::Restored(waiting)
        }
        Event::Decide { node, .. } => {
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
        Event::Cancel { .. } => {
            if state.status.is_terminal() {
                return unchanged(Applied::Duplicate);
            }
            Step::Cancel
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
                ..
            },
        ) => {
            e.decide(node, approval, *approved, by, comment)?;
        }
        (Step::Started(record), Event::JobStarted { job_id, worker, .. }) => {
            if let Some(r) = e.state.jobs.get_mut(job_id) {
                r.started_at = Some(at.to_string());
                r.worker = Some(worker.clone());
            }
            e.fx.push(Effect::Watch {
                job_id: job_id.clone(),
                attempt: record.attempt,
                started_at: at.to_string(),
                timeout_seconds: record.timeout_seconds,
            });
        }
        (Step::Reissue(record), Event::Reissue { job_id, .. }) => {
            e.reissue(job_id, record)?;
        }
        (Step::Restored(waiting), _) => {
            for (job_id, record) in waiting {
                e.reissue_as_next(&job_id, record)?;
            }
        }
        (Step::Cancel, _) => {
            e.finish(RunStatus::Cancelled, json!({"reason": "cancelled"}));
        }
        _ => unreachable!("the step matches its event"),
    }
    e.state.updated_at = at.to_string();
    Ok((e.fx, Applied::Changed))
}

impl Engine<'_> {
    fn node(&self, id: &NodeId) -> Result<&Node, EngineError> {
        self.bundle
            .graph
            .node(id)
            .ok_or_else(|| EngineError::UnknownNode(id.clone()))
    }

    fn expr_err(id: &NodeId) -> impl Fn(ExprError) -> EngineError + '_ {
        move |source| EngineError::Expr {
            node: id.clone(),
            source,
        }
    }

    /// The commit a worktree starts from: the base, or the latest commit among the named nodes.
    fn commit_of(&self, from: &crate::graph::Targets, branch: Option<u32>) -> Option<String> {
        let names = from.nodes();
        if names.iter().any(|n| n.as_str() == "base") && names.len() == 1 {
            return Some(self.state.repo.base_commit.clone());
        }
        let latest = self
            .state
            .history
            .iter()
            .rev()
            .filter(|o| branch.is_none() || o.branch.is_none() || o.branch == branch)
            .find(|o| names.contains(&&o.node) && o.commit.is_some());
        match latest {
            Some(o) => o.commit.clone(),
            None if names.iter().any(|n| n.as_str() == "base") => {
                Some(self.state.repo.base_commit.clone())
            }
            None => None,
        }
    }

    fn finish_job(&mut self, job: &JobId) {
        if let Some(r) = self.state.jobs.get_mut(job) {
            r.state = JobState::Done;
            r.finished_at = Some(self.at.to_string());
        }
    }

    fn finish(&mut self, status: RunStatus, result: Value) {
        let mut stopped = Vec::new();
        for (id, job) in self.state.jobs.iter_mut() {
            if job.state == JobState::Pending && !job.advisory {
                job.state = JobState::Cancelled;
                job.finished_at = Some(self.at.to_string());
                stopped.push(id.clone());
            }
        }
        if !stopped.is_empty() {
            self.fx.push(Effect::StopJobs(stopped));
        }
        let mut result = result;
        let waiting: Vec<String> = self
            .state
            .pending_jobs()
            .map(|(_, j)| j.node.to_string())
            .collect();
        if !waiting.is_empty() && result.is_object() {
            result["advisory_pending"] = json!(waiting);
        }
        self.state.status = status;
        self.state.result = Some(result.clone());
        self.state.finished_at = Some(self.at.to_string());
        self.fx.push(Effect::Finished { status, result });
    }

    fn job_finished(&mut self, result: &JobResult, record: JobRecord) -> Result<(), EngineError> {
        let id = record.node.clone();
        let n = self.node(&id)?.clone();
        let mut outcome = Outcome {
            job_id: result.job_id.clone(),
            node: id.clone(),
            visit: record.visit,
            ok: result.status == JobStatus::Ok,
            status: result.status,
            output: result.output.clone(),
            derived: json!({}),
            error: result.error.clone(),
            commit: result.commit.clone(),
            artifacts: result.artifacts.clone(),
            usage: result.usage,
            worker: result.worker.clone(),
            started_at: result.started_at.clone(),
            finished_at: result.finished_at.clone(),
            container_seconds: result.container_seconds,
            branch: record.branch,
        };
        if !n.derive.is_empty() {
            let mut ctx = self.state.context_in(record.branch);
            ctx[id.as_str()] = outcome_view(&outcome);
            ctx["output"] = outcome.output.clone();
            let mut derived = Map::new();
            for (name, e) in &n.derive {
                let v = expr::eval(e, &ctx).map_err(Self::expr_err(&id))?;
                ctx[id.as_str()]["derived"][name.as_str()] = v.clone();
                derived.insert(name.clone(), v);
            }
            outcome.derived = Value::Object(derived);
        }
        self.finish_job(&result.job_id);
        if let Some(pack) = &result.pack {
            if !self.state.repo.packs.contains(pack) {
                self.state.repo.packs.push(pack.clone());
            }
        }
        self.state.usage.add(&result.usage);
        self.state.history.push(outcome.clone());

        if self.state.status.is_terminal() {
            // A late advisory or observer report: attach it to the result.
            let key = if n.observes.is_empty() {
                "advisory"
            } else {
                "observers"
            };
            if let Some(res) = self.state.result.as_mut().filter(|r| r.is_object()) {
                res[key][id.as_str()] = json!({"output": outcome.output, "derived": outcome.derived,
                    "status": outcome.status});
                let still: Vec<String> = self
                    .state
                    .jobs
                    .values()
                    .filter(|j| j.state == JobState::Pending)
                    .map(|j| j.node.to_string())
                    .collect();
                res["advisory_pending"] = json!(still);
                let updated = res.clone();
                self.fx.push(Effect::ResultUpdated { result: updated });
            }
            return Ok(());
        }
        if !n.observes.is_empty() || (n.advisory && n.routes.is_empty()) {
            return Ok(());
        }
        self.start_observers(&id, record.branch)?;

        // Stuck detection before routing.
        if let Some(stuck) = &n.stuck {
            let ctx = self.state.context_in(record.branch);
            let sig = expr::eval(&stuck.signature, &ctx).map_err(Self::expr_err(&id))?;
            // A list is one signature per failing test: the same test failing the same way
            // `times` times is stuck even while other failures change.
            let mut sigs: Vec<String> = match sig {
                Value::Null => Vec::new(),
                Value::Array(items) => items.iter().map(Value::to_string).collect(),
                other => vec![other.to_string()],
            };
            sigs.sort();
            sigs.dedup();
            let seen = self.state.signatures.entry(id.clone()).or_default();
            seen.extend(sigs.iter().cloned());
            let stuck_now = sigs
                .iter()
                .any(|sig| seen.iter().filter(|s| *s == sig).count() >= stuck.times as usize);
            if stuck_now {
                return self.enter(&stuck.to, record.branch, Some(&id));
            }
        }
        let targets = self.route(&n, &id, record.branch)?;
        for t in targets {
            if self.state.status.is_terminal() {
                break;
            }
            self.enter(&t, record.branch, Some(&id))?;
        }
        Ok(())
    }

    fn start_observers(
        &mut self,
        observed: &NodeId,
        branch: Option<u32>,
    ) -> Result<(), EngineError> {
        let watchers: Vec<NodeId> = self
            .bundle
            .graph
            .nodes
            .iter()
            .filter(|(_, n)| n.observes.contains(observed))
            .map(|(id, _)| id.clone())
            .collect();
        for w in watchers {
            self.enter(&w, branch, Some(observed))?;
        }
        Ok(())
    }

    /// The targets of the first route whose condition holds (the checker makes the last route
    /// unconditional). The context is only built when a condition needs it.
    fn route(
        &self,
        n: &Node,
        from: &NodeId,
        branch: Option<u32>,
    ) -> Result<Vec<NodeId>, EngineError> {
        let mut ctx = None;
        for r in &n.routes {
            let take = match &r.when {
                None => true,
                Some(cond) => {
                    let c = ctx.get_or_insert_with(|| self.state.context_in(branch));
                    expr::eval_bool(cond, c).map_err(Self::expr_err(from))?
                }
            };
            if take {
                return Ok(r.to.nodes().into_iter().cloned().collect());
            }
        }
        Ok(Vec::new())
    }

    fn decide(
        &mut self,
        id: &NodeId,
        approval: ApprovalState,
        approved: bool,
        by: &str,
        comment: &str,
    ) -> Result<(), EngineError> {
        let decision = Decision {
            approved,
            by: by.to_string(),
            comment: comment.to_string(),
            at: self.at.to_string(),
        };
        if let Some(a) = self.state.approvals.get_mut(id) {
            a.decision = Some(decision.clone());
        }
        let outcome = Outcome {
            job_id: JobId::for_visit(&self.state.run_id, id, approval.visit),
            node: id.clone(),
            visit: approval.visit,
            ok: approved,
            status: if approved {
                JobStatus::Ok
            } else {
                JobStatus::Failed
            },
            output: json!(decision),
            derived: json!({}),
            error: (!approved).then(|| format!("rejected by {by}: {comment}")),
            commit: None,
            artifacts: BTreeMap::new(),
            usage: Usage::default(),
            worker: String::new(),
            started_at: approval.requested_at.clone(),
            finished_at: self.at.to_string(),
            container_seconds: 0.0,
            branch: approval.branch,
        };
        self.state.history.push(outcome);
        let n = self.node(id)?.clone();
        for t in self.route(&n, id, approval.branch)? {
            if self.state.status.is_terminal() {
                break;
            }
            self.enter(&t, approval.branch, Some(id))?;
        }
        Ok(())
    }

    /// Control arrives at `id` (from `from`, in `branch`).
    fn enter(
        &mut self,
        id: &NodeId,
        branch: Option<u32>,
        from: Option<&NodeId>,
    ) -> Result<(), EngineError> {
        let n = self.node(id)?.clone();
        match n.kind {
            NodeKind::Join => return self.arrive(id, &n, branch, from),
            NodeKind::Exit => return self.exit(id, &n, branch),
            _ => {}
        }
        let visit = self.state.visits.get(id).copied().unwrap_or(0) + 1;
        if let Some(max) = n.max_visits {
            if visit > max {
                if let Some(exit) = &n.budget_exit {
                    return self.enter(exit, branch, Some(id));
                }
                let result = json!({"reason": "budget_exhausted", "node": id, "max_visits": max});
                self.finish(RunStatus::Failed, result);
                return Ok(());
            }
        }
        self.state.visits.insert(id.clone(), visit);
        match n.kind {
            NodeKind::Fanout => self.fan_out(id, &n, visit, branch),
            NodeKind::Approval => {
                self.state.approvals.insert(
                    id.clone(),
                    ApprovalState {
                        requested_at: self.at.to_string(),
                        visit,
                        branch,
                        decision: None,
                    },
                );
                Ok(())
            }
            _ => {
                let ctx = self.state.context_in(branch);
                self.publish(id, &n, visit, branch, from, &ctx)
            }
        }
    }

    fn exit(&mut self, id: &NodeId, n: &Node, branch: Option<u32>) -> Result<(), EngineError> {
        let ctx = self.state.context_in(branch);
        let cond = n.status.as_deref().unwrap_or("false");
        let success = expr::eval_bool(cond, &ctx).map_err(Self::expr_err(id))?;
        let result = match n.result.as_deref().and_then(|r| (self.assemble)(r)) {
            Some(f) => f(self.state, id, success, self.at),
            None => generic_result(self.state, id, success),
        };
        let status = if success {
            RunStatus::Succeeded
        } else {
            RunStatus::Failed
        };
        self.finish(status, result);
        Ok(())
    }

    fn arrive(
        &mut self,
        id: &NodeId,
        n: &Node,
        branch: Option<u32>,
        from: Option<&NodeId>,
    ) -> Result<(), EngineError> {
        let is_static = !n.wait_for.is_empty();
        let key = match (is_static, branch) {
            (false, Some(b)) => b.to_string(),
            _ => from.map(|f| f.to_string()).unwrap_or_default(),
        };
        let ok = from
            .and_then(|f| self.state.last_outcome_in(f, branch))
            .map(|o| o.ok)
            .unwrap_or(true);
        let expected = if is_static { n.wait_for.len() } else { 0 };
        let join = self.state.joins.entry(id.clone()).or_default();
        if is_static {
            join.expected = expected;
        }
        join.arrived.insert(key, ok);
        if join.arrived.len() < join.expected {
            return Ok(());
        }
        self.fire(id, n)
    }

    /// The join is complete: record its outcome (every arrival's output), reset, route on.
    fn fire(&mut self, id: &NodeId, n: &Node) -> Result<(), EngineError> {
        let join = self.state.joins.entry(id.clone()).or_default();
        let arrived = std::mem::take(&mut join.arrived);
        join.fired += 1;
        let visit = self.state.visits.get(id).copied().unwrap_or(0) + 1;
        self.state.visits.insert(id.clone(), visit);
        let mut outputs = Map::new();
        for key in arrived.keys() {
            let o = match key.parse::<u32>() {
                Ok(b) => self
                    .state
                    .history
                    .iter()
                    .rev()
                    .find(|o| o.branch == Some(b)),
                Err(_) => self.state.last_outcome(&NodeId::new(key.clone())),
            };
            outputs.insert(
                key.clone(),
                o.map(|o| o.output.clone()).unwrap_or(Value::Null),
            );
        }
        let all_ok = arrived.values().all(|ok| *ok);
        let output = json!({"arrivals": outputs, "count": arrived.len()});
        let outcome =
            Outcome::of_engine(&self.state.run_id, id, visit, all_ok, output, self.at, None);
        self.state.history.push(outcome);
        for t in self.route(n, id, None)? {
            if self.state.status.is_terminal() {
                break;
            }
            self.enter(&t, None, Some(id))?;
        }
        Ok(())
    }

    fn fan_out(
        &mut self,
        id: &NodeId,
        n: &Node,
        visit: u32,
        branch: Option<u32>,
    ) -> Result<(), EngineError> {
        let ctx = self.state.context_in(branch);
        let over = n.over.as_deref().unwrap_or("[]");
        let items = match expr::eval(over, &ctx).map_err(Self::expr_err(id))? {
            Value::Array(items) => items,
            Value::Null => Vec::new(),
            other => vec![other],
        };
        if items.len() > crate::limits::MAX_FANOUT {
            let result = json!({"reason": "fanout_too_wide", "node": id, "items": items.len(),
                "limit": crate::limits::MAX_FANOUT});
            self.finish(RunStatus::Failed, result);
            return Ok(());
        }
        let body = n.body.clone().expect("checked: a fan-out has a body");
        let join_id = n.join.clone().expect("checked: a fan-out has a join");
        let join = self.state.joins.entry(join_id.clone()).or_default();
        join.arrived.clear();
        join.expected = items.len();
        let output = json!({"count": items.len()});
        let outcome =
            Outcome::of_engine(&self.state.run_id, id, visit, true, output, self.at, branch);
        self.state.history.push(outcome);
        if items.is_empty() {
            let jn = self.node(&join_id)?.clone();
            return self.fire(&join_id, &jn);
        }
        let body_node = self.node(&body)?.clone();
        let first = self
            .state
            .branches
            .keys()
            .next_back()
            .map(|b| b + 1)
            .unwrap_or(1);
        let mut base = self.state.context();
        for (i, item) in items.into_iter().enumerate() {
            let b = first + i as u32;
            self.state.branches.insert(b, item.clone());
            if body_node.kind == NodeKind::Agent
                || body_node.kind == NodeKind::Command
                || body_node.kind == NodeKind::Harness
                || body_node.kind == NodeKind::Git
            {
                // The common case, without rebuilding the context per branch.
                let v = self.state.visits.get(&body).copied().unwrap_or(0) + 1;
                if body_node.max_visits.is_some_and(|m| v > m) {
                    self.enter(&body, Some(b), Some(id))?;
                    continue;
                }
                self.state.visits.insert(body.clone(), v);
                base["branch"] = json!(b);
                base["item"] = item;
                self.publish(&body, &body_node, v, Some(b), Some(id), &base)?;
            } else {
                self.enter(&body, Some(b), Some(id))?;
            }
        }
        Ok(())
    }

    /// Runs a job again as its next attempt, or fails the run when the attempts are used up.
    fn reissue(&mut self, job_id: &JobId, record: JobRecord) -> Result<(), EngineError> {
        if record.attempt >= MAX_ATTEMPTS {
            self.finish_job(job_id);
            let result = json!({"reason": "job_never_finished", "job_id": job_id,
                "node": record.node, "attempts": record.attempt});
            self.finish(RunStatus::Failed, result);
            return Ok(());
        }
        self.reissue_as_next(job_id, record)
    }

    /// Publishes `record`'s job again as its next attempt (no attempt limit: a restore is not
    /// the job's fault).
    fn reissue_as_next(&mut self, job_id: &JobId, record: JobRecord) -> Result<(), EngineError> {
        debug_assert_eq!(
            self.state.jobs.get(job_id).map(|r| r.attempt),
            Some(record.attempt)
        );
        let n = self.node(&record.node)?.clone();
        let ctx = self.state.context_in(record.branch);
        self.publish_attempt(
            &record.node,
            &n,
            record.visit,
            record.branch,
            None,
            &ctx,
            record.attempt + 1,
        )
    }

    fn publish(
        &mut self,
        id: &NodeId,
        n: &Node,
        visit: u32,
        branch: Option<u32>,
        from: Option<&NodeId>,
        ctx: &Value,
    ) -> Result<(), EngineError> {
        self.publish_attempt(id, n, visit, branch, from, ctx, 1)
    }

    #[allow(clippy::too_many_arguments)]
    fn publish_attempt(
        &mut self,
        id: &NodeId,
        n: &Node,
        visit: u32,
        branch: Option<u32>,
        from: Option<&NodeId>,
        ctx: &Value,
        attempt: Attempt,
    ) -> Result<(), EngineError> {
        let err = Self::expr_err(id);
        let mut params = Map::new();
        for (name, e) in &n.with {
            params.insert(name.clone(), expr::eval(e, ctx).map_err(&err)?);
        }
        if !n.observes.is_empty() {
            if let Some(observed) = from.and_then(|f| self.state.last_outcome_in(f, branch)) {
                params.insert("observed".into(), outcome_view(observed));
            }
        }
        let context_files = match &n.context_files {
            None => Vec::new(),
            Some(e) => match expr::eval(e, ctx).map_err(&err)? {
                Value::Array(items) => items
                    .into_iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect(),
                _ => Vec::new(),
            },
        };
        let commands = n
            .commands
            .iter()
            .map(|c| expr::render("command", c, ctx).map_err(&err))
            .collect::<Result<Vec<_>, _>>()?;
        let worktree = match &n.worktree {
            None => None,
            Some(w) => {
                let commit = self.commit_of(&w.from, branch);
                let Some(commit) = commit else {
                    let result =
                        json!({"reason": "missing_commit", "node": id, "from": w.from.to_string()});
                    self.finish(RunStatus::Failed, result);
                    return Ok(());
                };
                Some(WorktreeSpec {
                    commit,
                    run_base: Some(self.state.repo.base_commit.clone()),
                    packs: self.state.repo.packs.clone(),
                    mode: w.mode,
                    commit_out: w.commit,
                })
            }
        };
        let write_scope = match &n.writes {
            None => None,
            Some(w) => Some(write_scope(&w.spec(), ctx).map_err(&err)?),
        };
        let continues = n.continues.as_ref().and_then(|c| {
            self.state
                .last_outcome_in(c, branch)
                .and_then(|o| o.artifacts.get("transcript.json").cloned())
        });
        let folder = match &n.artifacts {
            Some(t) => expr::render("artifacts", t, ctx).map_err(&err)?,
            None => format!("{id}_{visit}"),
        };
        let job_id = JobId::for_visit(&self.state.run_id, id, visit);
        let advisory = n.advisory || !n.observes.is_empty();
        let spec = JobSpec {
            v: WIRE_VERSION,
            job_id: job_id.clone(),
            run_id: self.state.run_id.clone(),
            node: id.clone(),
            visit,
            attempt,
            kind: n.kind,
            graph_ref: self.state.graph_ref.clone(),
            image: match self.bundle.graph.image_for(n) {
                Some(i) if i.contains("{{") => Some(expr::render("image", &i, ctx).map_err(&err)?),
                other => other,
            },
            timeout_seconds: self.bundle.graph.timeout_for(n),
            params: Value::Object(params),
            context_files,
            commands,
            worktree,
            artifact_prefix: format!("runs/{}/{}/", self.state.run_id, folder.trim_matches('/')),
            agent: self.state.agent.clone(),
            // Only prompts need the context, and only the parts their template reads.
            vars: if n.kind == NodeKind::Agent {
                template_context(self.bundle, n, ctx)
            } else {
                Value::Null
            },
            branch,
            continues,
            nudge_after_seconds: n.nudge_after_seconds,
            // Jobs that may run long announce their start, so a hung worker can be superseded.
            notify_start: matches!(n.kind, NodeKind::Agent | NodeKind::Command)
                || (n.kind == NodeKind::Harness
                    && !matches!(n.op.as_deref(), Some("noop" | "apply_patch"))),
            write_scope,
        };
        self.state.jobs.insert(
            job_id,
            JobRecord {
                node: id.clone(),
                visit,
                attempt,
                state: JobState::Pending,
                published_at: self.at.to_string(),
                finished_at: None,
                branch,
                advisory,
                timeout_seconds: self.bundle.graph.timeout_for(n),
                started_at: None,
                worker: None,
            },
        );
        self.fx.push(Effect::Publish(Box::new(spec)));
        Ok(())
    }
}

/// A node's `writes`, evaluated: each expression gives one glob or a list of globs.
fn write_scope(
    w: &crate::graph::WritesSpec,
    ctx: &Value,
) -> Result<crate::scope::WriteScope, ExprError> {
    let mut globs = Vec::new();
    for e in &w.paths {
        match expr::eval(e, ctx)? {
            Value::String(s) => globs.push(s),
            Value::Array(items) => globs.extend(
                items
                    .into_iter()
                    .filter_map(|v| v.as_str().map(str::to_string)),
            ),
            _ => {}
        }
    }
    Ok(crate::scope::WriteScope {
        globs,
        symlinks: w.symlinks,
        submodules: w.submodules,
        mode_changes: w.mode_changes,
    })
}

/// The part of the context an agent's template reads (its top-level variables): a prompt never
/// carries what its template does not show, e.g. a sibling branch's outputs.
fn template_context(bundle: &GraphBundle, n: &Node, ctx: &Value) -> Value {
    let Some(text) = n.template.as_deref().and_then(|t| bundle.file(t)) else {
        return Value::Null;
    };
    let Ok(vars) = expr::template_variables("template", text) else {
        return ctx.clone();
    };
    let mut out = Map::new();
    for v in vars {
        if let Some(value) = ctx.get(&v) {
            out.insert(v, value.clone());
        }
    }
    Value::Object(out)
}

fn generic_result(state: &RunState, exit: &NodeId, success: bool) -> Value {
    let mut outputs = Map::new();
    for o in state.history.iter().filter(|o| o.branch.is_none()) {
        outputs.insert(
            o.node.to_string(),
            json!({"output": o.output, "derived": o.derived, "ok": o.ok}),
        );
    }
    json!({
        "exit": exit,
        "success": success,
        "outputs": outputs,
        "usage": state.usage,
    })
}

#[cfg(test)]
mod tests;
