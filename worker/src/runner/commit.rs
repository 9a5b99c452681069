//! Commit and pack out: the commit convention (`<node>: <subject>` with Session, Node and Cost
//! trailers), the write scope checked on git's own deltas between the job's start and its commit,
//! and the pack of the new commits stored in object storage.

use super::execute::Executed;
use super::{RunError, Runner};
use crate::git::Worktree;
use crate::harness::{Artifacts, StepOutcome};
use serde_json::{json, Value};
use shared::graph::NodeKind;
use shared::messages::{JobSpec, JobStatus, Usage};
use tracing::warn;

impl Runner {
    /// Commits what a passing step left in the worktree, checks the write scope on git's own
    /// deltas, and stores the pack of the new commits. A worktree git refuses to commit or a
    /// scope violation fails the job (its own doing, never retried) and hands nothing on.
    pub(super) async fn commit_out(
        &self,
        spec: &JobSpec,
        wt: &Worktree,
        step: StepOutcome,
        usage: Usage,
        container_seconds: f64,
        art: &mut Artifacts<'_>,
    ) -> Result<Executed, RunError> {
        let message = commit_message(spec, &step.output, &usage);
        let made = match wt.blocking(move |wt| wt.commit_all(&message)).await {
            Ok(made) => made,
            // What the job left in the worktree cannot be committed (a nested
            // repository, a path git refuses): the job's doing, never retried.
            Err(e) if e.is_refused_content() => {
                warn!(job = %spec.job_id, error = %e, "the worktree cannot be committed");
                let refused = StepOutcome {
                    status: JobStatus::Failed,
                    output: json!({"scope_violation": {
                        "violations": [{"path": e.to_string(), "reason": "bad_path"}],
                        "scope": spec.write_scope,
                    }}),
                    error: Some(format!("the worktree cannot be committed: {e}")),
                };
                return Ok(Executed::uncommitted(
                    refused.merged_into(step),
                    usage,
                    container_seconds,
                ));
            }
            Err(e) => return Err(e.into()),
        };
        let id = made.unwrap_or_else(|| wt.head());
        if spec.kind != NodeKind::Git {
            if let Some(refused) = enforce_scope(spec, wt, &id).await? {
                art.put_json("scope_violation.json", &refused.output["scope_violation"])
                    .await?;
                return Ok(Executed::uncommitted(
                    refused.merged_into(step),
                    usage,
                    container_seconds,
                ));
            }
        }
        let mut pack = None;
        if id != wt.base() {
            let commit_id = id.clone();
            let bytes = wt
                .blocking(move |wt| wt.pack_since_base(&commit_id))
                .await?;
            let key = format!("packs/{}.pack", shared::hashing::sha256_hex(&bytes));
            self.blobs.put(&key, bytes).await?;
            pack = Some(key);
        }
        Ok(Executed {
            step,
            usage,
            commit: Some(id),
            pack,
            container_seconds,
        })
    }
}

/// The write scope, checked on git's own deltas between the job's start and its commit. `Some`
/// is the refusal: the commit is not handed on.
async fn enforce_scope(
    spec: &JobSpec,
    wt: &Worktree,
    commit: &str,
) -> Result<Option<StepOutcome>, RunError> {
    let changes = if commit == wt.base() {
        Vec::new()
    } else {
        let commit = commit.to_string();
        wt.blocking(move |wt| wt.changes(&wt.base(), &commit))
            .await?
    };
    let refuse = |violations: Vec<shared::scope::Violation>, error: String| {
        Some(StepOutcome {
            status: JobStatus::Failed,
            output: json!({"scope_violation": {
                "violations": violations,
                "scope": spec.write_scope,
                "changes": changes.len(),
            }}),
            error: Some(error),
        })
    };
    let Some(scope) = &spec.write_scope else {
        if changes.is_empty() {
            return Ok(None);
        }
        return Ok(refuse(
            Vec::new(),
            format!("node `{}` commits without a write scope", spec.node),
        ));
    };
    match shared::scope::check(scope, &changes) {
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => {
            warn!(job = %spec.job_id, violations = v.len(), "write scope violated");
            let error = shared::scope::describe(&v);
            Ok(refuse(v, error))
        }
        Err(e) => Ok(refuse(Vec::new(), e.to_string())),
    }
}

/// The commit convention: `<node>: <subject>`, a summary, and the Session, Node and Cost
/// trailers. The subject is the agent's `commit_msg` when it gives one.
fn commit_message(spec: &JobSpec, output: &Value, usage: &Usage) -> String {
    let subject = output
        .get("commit_msg")
        .and_then(Value::as_str)
        .map(|s| s.lines().next().unwrap_or_default().to_string())
        .unwrap_or_else(|| format!("visit {}", spec.visit));
    let summary = ["summary", "strategy", "design_notes"]
        .iter()
        .find_map(|k| output.get(*k).and_then(Value::as_str))
        .map(|s| format!("{}\n\n", shared::text::head(s, 500)))
        .unwrap_or_default();
    format!(
        "{}: {subject}\n\n{summary}Session: {}\nNode: {}\nCost: ${:.4}\n",
        spec.node, spec.run_id, spec.node, usage.cost_usd
    )
}
