//! The interpreter: an [`Engine`] applies one step to the run state, collecting effects. Here:
//! entering a node (visit budgets, approvals), routing, a job's result (derived fields, stuck
//! detection, late advisory reports), observers, decisions, exits and finishing the run. Joins
//! and fan-out are in `fanout.rs`, job specs and re-issues in `publish.rs`.

use super::context::outcome_view;
use super::events::{Assembler, Effect};
use super::fanout::FanOut;
use super::state::{ApprovalState, Decision, JobRecord, JobState, Outcome, RunState, RunStatus};
use super::EngineError;
use crate::expr::{self, ExprError};
use crate::graph::{GraphBundle, Node, NodeBody};
use crate::ids::{JobId, NodeId};
use crate::messages::{JobResult, JobStatus, Usage};
use crate::tracking::EventType;
use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

pub(super) struct Engine<'a> {
    pub(super) bundle: &'a GraphBundle,
    pub(super) state: &'a mut RunState,
    pub(super) fx: Vec<Effect>,
    pub(super) at: DateTime<Utc>,
    pub(super) assemble: &'a dyn Fn(&str) -> Option<Assembler>,
}

impl Engine<'_> {
    pub(super) fn node(&self, id: &NodeId) -> Result<&Node, EngineError> {
        self.bundle
            .graph
            .node(id)
            .ok_or_else(|| EngineError::UnknownNode(id.clone()))
    }

    pub(super) fn expr_err(id: &NodeId) -> impl Fn(ExprError) -> EngineError + '_ {
        move |source| EngineError::Expr {
            node: id.clone(),
            source,
        }
    }

    /// The commit a worktree starts from: the base, or the latest commit among the named nodes.
    pub(super) fn commit_of(
        &self,
        from: &crate::graph::Targets,
        branch: Option<u32>,
    ) -> Option<String> {
        let names = from.nodes();
        if names.iter().any(|n| n.as_str() == "base") && names.len() == 1 {
            return Some(self.state.repo.base_commit.clone());
        }
        if names.iter().any(|n| n.as_str() == "event") && names.len() == 1 {
            // The latest sibling event's commit (its packs were taken in with it).
            return self
                .state
                .sibling_events
                .last()
                .and_then(|e| e.payload["commit"].as_str())
                .map(str::to_string);
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

    pub(super) fn finish_job(&mut self, job: &JobId) {
        if let Some(r) = self.state.jobs.get_mut(job) {
            r.state = JobState::Done;
            r.finished_at = Some(self.at);
        }
    }

    pub(super) fn finish(&mut self, status: RunStatus, result: Value) {
        let mut stopped = Vec::new();
        for (id, job) in self.state.jobs.iter_mut() {
            if job.state == JobState::Pending && !job.advisory {
                job.state = JobState::Cancelled;
                job.finished_at = Some(self.at);
                stopped.push(id.clone());
            }
        }
        if !stopped.is_empty() {
            self.fx.push(Effect::StopJobs(stopped));
        }
        let orphans = self.orphans();
        if !orphans.is_empty() {
            self.fx.push(Effect::CancelRuns(orphans));
        }
        self.state.held.clear();
        self.notify(
            EventType::RunFinished,
            "run",
            json!({"status": status, "reason": result.get("reason")}),
        );
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
        self.state.finished_at = Some(self.at);
        self.fx.push(Effect::Finished { status, result });
        if let Some(report) = self.state.child_report() {
            self.fx.push(Effect::NotifyParent(Box::new(report)));
        }
    }

    pub(super) fn job_finished(
        &mut self,
        result: &JobResult,
        record: JobRecord,
    ) -> Result<(), EngineError> {
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
            execution: result.execution.clone(),
            started_at: result.started_at,
            finished_at: result.finished_at,
            container_seconds: result.container_seconds,
            branch: record.branch,
            cached_from: result.cached_from.clone(),
            events: crate::tracking::events::bounded(result.events.clone()),
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
        if n.agent().is_some_and(|a| a.incremental.is_some()) {
            self.session_ended(&id, &result.output);
        }
        if let Some(pack) = &result.pack {
            if !self.state.repo.packs.contains(pack) {
                self.state.repo.packs.push(pack.clone());
            }
        }
        self.state.usage.add(&result.usage);
        self.state.history.push(outcome.clone());
        self.observe_budget();
        for e in &outcome.events {
            if e.event_type == EventType::Quarantine {
                self.notify(e.event_type, id.as_str(), e.data.clone());
            }
        }

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
        if let Some(name) = n.broadcast.as_deref().filter(|_| outcome.ok) {
            let from = n
                .worktree
                .as_ref()
                .and_then(|w| self.commit_of(&w.from, record.branch));
            self.broadcast(name, &outcome, from);
        }

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

    pub(super) fn start_observers(
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
    pub(super) fn route(
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

    pub(super) fn decide(
        &mut self,
        id: &NodeId,
        approval: ApprovalState,
        approved: bool,
        by: &str,
        comment: &str,
        edits: Option<Value>,
    ) -> Result<(), EngineError> {
        let decision = Decision {
            approved,
            by: by.to_string(),
            comment: comment.to_string(),
            at: self.at,
            edits,
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
            execution: String::new(),
            started_at: approval.requested_at,
            finished_at: self.at,
            container_seconds: 0.0,
            branch: approval.branch,
            cached_from: None,
            events: Vec::new(),
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
    pub(super) fn enter(
        &mut self,
        id: &NodeId,
        branch: Option<u32>,
        from: Option<&NodeId>,
    ) -> Result<(), EngineError> {
        let n = self.node(id)?.clone();
        match &n.body {
            NodeBody::Join { .. } => return self.arrive(id, &n, branch, from),
            NodeBody::Exit { status, result } => {
                return self.exit(id, status, result.as_deref(), branch)
            }
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
        match &n.body {
            NodeBody::Fanout { over, body, join } => {
                self.fan_out(id, FanOut { over, body, join }, visit, branch)
            }
            NodeBody::Spawn(spawn) => self.spawn(id, spawn, visit, branch),
            NodeBody::Approval { show, .. } => {
                // What the person deciding sees; an expression that fails shows its error.
                let shown = show.as_ref().map(|e| {
                    expr::eval(e, &self.state.context_in(branch))
                        .unwrap_or_else(|err| json!({"error": err.to_string()}))
                });
                self.state.approvals.insert(
                    id.clone(),
                    ApprovalState {
                        requested_at: self.at,
                        visit,
                        branch,
                        decision: None,
                        shown: shown.clone(),
                    },
                );
                self.notify(
                    EventType::ApprovalRequested,
                    id.as_str(),
                    json!({"approval": id, "shown": shown}),
                );
                Ok(())
            }
            _ => {
                let ctx = self.state.context_in(branch);
                self.publish(id, &n, visit, branch, from, &ctx)
            }
        }
    }

    pub(super) fn exit(
        &mut self,
        id: &NodeId,
        status: &str,
        assembler: Option<&str>,
        branch: Option<u32>,
    ) -> Result<(), EngineError> {
        let ctx = self.state.context_in(branch);
        let success = expr::eval_bool(status, &ctx).map_err(Self::expr_err(id))?;
        let result = match assembler.and_then(|r| (self.assemble)(r)) {
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
