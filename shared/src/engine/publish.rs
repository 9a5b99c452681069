//! Publishing jobs: a node's job spec (parameters, context files, commands, worktree, write
//! scope, image, the prompt's variables) and its job record; and re-issuing a job as its next
//! attempt (a deadline passed, or the run was restored).

use super::context::{outcome_view, template_context};
use super::events::Effect;
use super::state::{JobRecord, JobState, RunStatus, MAX_ATTEMPTS};
use super::step::Engine;
use super::EngineError;
use crate::expr::{self, ExprError};
use crate::graph::{Node, NodeBody};
use crate::ids::{Attempt, JobId, NodeId};
use crate::messages::{AgentConfig, JobSpec, LlmBudget, WorktreeSpec, WIRE_VERSION};
use crate::session::LoopSpec;
use serde_json::{json, Map, Value};

/// Where a job is published: its node, the visit and branch, the node it came from.
pub(super) struct JobAt<'a> {
    pub id: &'a NodeId,
    pub n: &'a Node,
    pub visit: u32,
    pub branch: Option<u32>,
    pub from: Option<&'a NodeId>,
}

impl Engine<'_> {
    /// Runs a job again as its next attempt, or fails the run when the attempts are used up.
    pub(super) fn reissue(&mut self, job_id: &JobId, record: JobRecord) -> Result<(), EngineError> {
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
    pub(super) fn reissue_as_next(
        &mut self,
        job_id: &JobId,
        record: JobRecord,
    ) -> Result<(), EngineError> {
        debug_assert_eq!(
            self.state.jobs.get(job_id).map(|r| r.attempt),
            Some(record.attempt)
        );
        let n = self.node(&record.node)?.clone();
        let ctx = self.state.context_in(record.branch);
        let at = JobAt {
            id: &record.node,
            n: &n,
            visit: record.visit,
            branch: record.branch,
            from: None,
        };
        self.publish_attempt(at, &ctx, record.attempt + 1)
    }

    pub(super) fn publish(
        &mut self,
        id: &NodeId,
        n: &Node,
        visit: u32,
        branch: Option<u32>,
        from: Option<&NodeId>,
        ctx: &Value,
    ) -> Result<(), EngineError> {
        let at = JobAt {
            id,
            n,
            visit,
            branch,
            from,
        };
        self.publish_attempt(at, ctx, 1)
    }

    pub(super) fn publish_attempt(
        &mut self,
        at: JobAt<'_>,
        ctx: &Value,
        attempt: Attempt,
    ) -> Result<(), EngineError> {
        let JobAt {
            id,
            n,
            visit,
            branch,
            from,
        } = at;
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
        let agent = n.agent();
        let context_files = match agent.and_then(|a| a.context_files.as_ref()) {
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
            .commands()
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
                let git = w.git.as_ref().map(|names| {
                    names
                        .iter()
                        .filter_map(|name| {
                            let one = crate::graph::Targets::One(name.clone());
                            self.commit_of(&one, branch)
                                .map(|commit| (name.to_string(), commit))
                        })
                        .collect()
                });
                Some(WorktreeSpec {
                    commit,
                    run_base: Some(self.state.repo.base_commit.clone()),
                    packs: self.state.repo.packs.clone(),
                    mode: w.mode,
                    commit_out: w.commit,
                    git,
                })
            }
        };
        let write_scope = match &n.writes {
            None => None,
            Some(w) => Some(write_scope(&w.spec(), ctx).map_err(&err)?),
        };
        let continues = agent.and_then(|a| a.continues.as_ref()).and_then(|c| {
            self.state
                .last_outcome_in(c, branch)
                .and_then(|o| o.artifacts.get("transcript.json").cloned())
        });
        let incremental = match agent.and_then(|a| a.incremental.as_ref()) {
            None => None,
            Some(inc) => Some(LoopSpec {
                max_invocations: inc.max_invocations,
                stuck_after: inc.stuck_after,
                checkpoints: inc
                    .checkpoints
                    .iter()
                    .map(|c| {
                        expr::render("checkpoint", &c.command, ctx)
                            .map(|line| (c.name.clone(), line))
                            .map_err(&err)
                    })
                    .collect::<Result<_, _>>()?,
            }),
        };
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
            kind: n.kind(),
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
            vars: if agent.is_some() {
                template_context(self.bundle, n, ctx)
            } else {
                Value::Null
            },
            branch,
            continues,
            nudge_after_seconds: agent.and_then(|a| a.nudge_after_seconds),
            // Jobs that may run long announce their start, so a hung worker can be superseded.
            notify_start: match &n.body {
                NodeBody::Agent(_) | NodeBody::Command { .. } => true,
                NodeBody::Harness { op } => op.announces_start(),
                _ => false,
            },
            write_scope,
            llm_budget: match (&self.state.agent, agent) {
                (AgentConfig::Command(c), Some(_)) => Some(LlmBudget::left(c, &self.state.usage)),
                _ => None,
            },
            llm_usd_left: match (&self.state.agent, &self.state.budget, agent) {
                (
                    AgentConfig::Anthropic(_) | AgentConfig::Openai(_) | AgentConfig::Command(_),
                    Some(b),
                    Some(_),
                ) => Some((b.limit_usd - self.state.usage.cost_usd).max(0.0)),
                _ => None,
            },
            incremental,
            inbox: if agent.is_some_and(|a| a.incremental.is_some()) {
                self.unread(id)
            } else {
                Vec::new()
            },
            team: self.state.team.clone(),
        };
        // A re-issued attempt goes on from the invocations an earlier one reported (its
        // checkpoint), so none of them is taken twice.
        let invocations = self.state.jobs.get(&job_id).map_or(0, |r| r.invocations);
        self.state.jobs.insert(
            job_id,
            JobRecord {
                node: id.clone(),
                visit,
                attempt,
                state: JobState::Pending,
                published_at: self.at,
                finished_at: None,
                branch,
                advisory,
                timeout_seconds: self.bundle.graph.timeout_for(n),
                started_at: None,
                worker: None,
                invocations,
            },
        );
        if self.state.budget.as_ref().is_some_and(|b| b.paused) {
            // Paused on its budget: the job waits in the run state for a raise (a restore
            // re-issuing it replaces the one held).
            self.state.held.retain(|h| h.job_id != spec.job_id);
            self.state.held.push(spec);
        } else {
            self.fx.push(Effect::Publish(Box::new(spec)));
        }
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
