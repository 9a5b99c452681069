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
}

/// A finished visit of a node, as the engine and expressions see it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Outcome {
    pub job_id: JobId,
    pub node: NodeId,
    pub visit: u32,
    pub ok: bool,
    pub status: JobStatus,
    pub output: Value,
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
        }
    }

    pub fn last_outcome(&self, node: &NodeId) -> Option<&Outcome> {
        self.history.iter().rev().find(|o| &o.node == node)
    }

    pub fn pending_jobs(&self) -> impl Iterator<Item = (&JobId, &JobRecord)> {
        self.jobs
            .iter()
            .filter(|(_, j)| j.state == JobState::Pending)
    }

    /// The context expressions and templates see.
    pub fn context(&self) -> Value {
        let mut ctx = Map::new();
        for o in &self.history {
            ctx.insert(o.node.to_string(), outcome_view(o));
        }
        if let Some(last) = self.history.last() {
            ctx.insert("last".into(), outcome_view(last));
        }
        ctx.insert("input".into(), self.input.clone());
        ctx.insert("visits".into(), json!(self.visits));
        ctx.insert(
            "run".into(),
            json!({"id": self.run_id, "meta": self.meta, "base_commit": self.repo.base_commit}),
        );
        Value::Object(ctx)
    }
}

fn outcome_view(o: &Outcome) -> Value {
    json!({
        "ok": o.ok,
        "status": o.status,
        "output": o.output,
        "error": o.error,
        "visit": o.visit,
        "commit": o.commit,
        "artifacts": o.artifacts,
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
    Cancel {
        at: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    Publish(Box<JobSpec>),
    Finished { status: RunStatus, result: Value },
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
pub type Assembler = fn(&RunState, bool, &str) -> Value;

pub fn apply(
    bundle: &GraphBundle,
    state: &RunState,
    event: &Event,
    assemble: &dyn Fn(&str) -> Option<Assembler>,
) -> Result<Transition, EngineError> {
    let mut next = state.clone();
    let mut effects = Vec::new();
    let unchanged = |applied| {
        Ok(Transition {
            state: state.clone(),
            effects: Vec::new(),
            applied,
        })
    };
    match event {
        Event::Start { at } => {
            if state.status != RunStatus::Pending {
                return unchanged(Applied::Duplicate);
            }
            next.status = RunStatus::Running;
            next.updated_at = at.clone();
            enter(
                bundle,
                &mut next,
                &bundle.graph.start,
                at,
                &mut effects,
                assemble,
            )?;
        }
        Event::JobFinished { result, at } => {
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
            if state.status != RunStatus::Running {
                return unchanged(Applied::Ignored("run is not running"));
            }
            let node = record.node.clone();
            let outcome = Outcome {
                job_id: result.job_id.clone(),
                node: node.clone(),
                visit: record.visit,
                ok: result.status == JobStatus::Ok,
                status: result.status,
                output: result.output.clone(),
                error: result.error.clone(),
                commit: result.commit.clone(),
                artifacts: result.artifacts.clone(),
                usage: result.usage,
                worker: result.worker.clone(),
                started_at: result.started_at.clone(),
                finished_at: result.finished_at.clone(),
                container_seconds: result.container_seconds,
            };
            finish_job(&mut next, &result.job_id, at);
            if let Some(pack) = &result.pack {
                if !next.repo.packs.contains(pack) {
                    next.repo.packs.push(pack.clone());
                }
            }
            next.usage.add(&result.usage);
            next.history.push(outcome);
            next.updated_at = at.clone();
            let target = route(bundle, &next, &node)?;
            enter(bundle, &mut next, &target, at, &mut effects, assemble)?;
        }
        Event::JobDead {
            job_id,
            attempt,
            reason,
            at,
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
            finish_job(&mut next, job_id, at);
            let result = json!({
                "reason": "job_dead_lettered",
                "job_id": job_id,
                "node": record.node,
                "detail": reason,
            });
            finish(&mut next, RunStatus::Failed, result, at, &mut effects);
        }
        Event::Cancel { at } => {
            if state.status.is_terminal() {
                return unchanged(Applied::Duplicate);
            }
            for job in next.jobs.values_mut() {
                if job.state == JobState::Pending {
                    job.state = JobState::Cancelled;
                    job.finished_at = Some(at.clone());
                }
            }
            finish(
                &mut next,
                RunStatus::Cancelled,
                json!({"reason": "cancelled"}),
                at,
                &mut effects,
            );
        }
    }
    Ok(Transition {
        state: next,
        effects,
        applied: Applied::Changed,
    })
}

fn finish_job(state: &mut RunState, job: &JobId, at: &str) {
    if let Some(r) = state.jobs.get_mut(job) {
        r.state = JobState::Done;
        r.finished_at = Some(at.to_string());
    }
}

fn finish(state: &mut RunState, status: RunStatus, result: Value, at: &str, fx: &mut Vec<Effect>) {
    state.status = status;
    state.result = Some(result.clone());
    state.finished_at = Some(at.to_string());
    state.updated_at = at.to_string();
    fx.push(Effect::Finished { status, result });
}

fn node<'a>(bundle: &'a GraphBundle, id: &NodeId) -> Result<&'a Node, EngineError> {
    bundle
        .graph
        .node(id)
        .ok_or_else(|| EngineError::UnknownNode(id.clone()))
}

/// The first route whose condition holds (the checker makes the last route unconditional).
fn route(bundle: &GraphBundle, state: &RunState, from: &NodeId) -> Result<NodeId, EngineError> {
    let n = node(bundle, from)?;
    let ctx = state.context();
    for r in &n.routes {
        let take = match &r.when {
            None => true,
            Some(cond) => expr::eval_bool(cond, &ctx).map_err(|source| EngineError::Expr {
                node: from.clone(),
                source,
            })?,
        };
        if take {
            return Ok(r.to.clone());
        }
    }
    Err(EngineError::UnknownNode(from.clone()))
}

fn enter(
    bundle: &GraphBundle,
    state: &mut RunState,
    id: &NodeId,
    at: &str,
    fx: &mut Vec<Effect>,
    assemble: &dyn Fn(&str) -> Option<Assembler>,
) -> Result<(), EngineError> {
    let n = node(bundle, id)?;
    let visit = state.visits.get(id).copied().unwrap_or(0) + 1;
    if let Some(max) = n.max_visits {
        if visit > max {
            let result = json!({"reason": "budget_exhausted", "node": id, "max_visits": max});
            finish(state, RunStatus::Failed, result, at, fx);
            return Ok(());
        }
    }
    state.visits.insert(id.clone(), visit);
    let ctx = state.context();
    let wrap = |source| EngineError::Expr {
        node: id.clone(),
        source,
    };

    if n.kind == NodeKind::Exit {
        let cond = n.status.as_deref().unwrap_or("false");
        let success = expr::eval_bool(cond, &ctx).map_err(wrap)?;
        let result = match n.result.as_deref().and_then(assemble) {
            Some(f) => f(state, success, at),
            None => generic_result(state, success),
        };
        let status = if success {
            RunStatus::Succeeded
        } else {
            RunStatus::Failed
        };
        finish(state, status, result, at, fx);
        return Ok(());
    }

    let mut params = Map::new();
    for (name, e) in &n.with {
        params.insert(name.clone(), expr::eval(e, &ctx).map_err(wrap)?);
    }
    let context_files = match &n.context_files {
        None => Vec::new(),
        Some(e) => match expr::eval(e, &ctx).map_err(wrap)? {
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
        .map(|c| expr::render("command", c, &ctx).map_err(wrap))
        .collect::<Result<Vec<_>, _>>()?;
    let worktree = match &n.worktree {
        None => None,
        Some(w) => {
            let commit = if w.from == "base" {
                Some(state.repo.base_commit.clone())
            } else {
                state
                    .last_outcome(&NodeId::new(w.from.clone()))
                    .and_then(|o| o.commit.clone())
            };
            let Some(commit) = commit else {
                let result = json!({"reason": "missing_commit", "node": id, "from": w.from});
                finish(state, RunStatus::Failed, result, at, fx);
                return Ok(());
            };
            Some(WorktreeSpec {
                commit,
                packs: state.repo.packs.clone(),
                mode: w.mode,
                commit_out: w.commit,
            })
        }
    };
    let folder = match &n.artifacts {
        Some(t) => expr::render("artifacts", t, &ctx).map_err(wrap)?,
        None => format!("{id}_{visit}"),
    };
    let job_id = JobId::for_visit(&state.run_id, id, visit);
    let spec = JobSpec {
        v: WIRE_VERSION,
        job_id: job_id.clone(),
        run_id: state.run_id.clone(),
        node: id.clone(),
        visit,
        attempt: 1,
        kind: n.kind,
        graph_ref: state.graph_ref.clone(),
        image: bundle.graph.image_for(n),
        timeout_seconds: bundle.graph.timeout_for(n),
        params: Value::Object(params),
        context_files,
        commands,
        worktree,
        artifact_prefix: format!("runs/{}/{}/", state.run_id, folder.trim_matches('/')),
        agent: state.agent.clone(),
        vars: ctx,
    };
    state.jobs.insert(
        job_id,
        JobRecord {
            node: id.clone(),
            visit,
            attempt: 1,
            state: JobState::Pending,
            published_at: at.to_string(),
            finished_at: None,
        },
    );
    fx.push(Effect::Publish(Box::new(spec)));
    Ok(())
}

fn generic_result(state: &RunState, success: bool) -> Value {
    let mut outputs = Map::new();
    for o in &state.history {
        outputs.insert(o.node.to_string(), o.output.clone());
    }
    json!({
        "success": success,
        "outputs": outputs,
        "usage": state.usage,
    })
}

#[cfg(test)]
mod tests;
