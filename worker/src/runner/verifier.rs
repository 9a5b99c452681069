//! Seed 004's independent verifier (an agent node's `verifier:`): the harness starts what the
//! verifier checks (`setup`, in its container, before the agent; the verifier itself needs no
//! command tool), the verifier may run on a model of its own, and its answer is matched
//! against the feature's steps with the screenshots this job took
//! (`shared::features::check_answer`): an invented, reworded or missing step, or a pass without
//! a screenshot per step, makes the answer invalid, so it never counts as a pass. A standing
//! answer's screenshots are named by the artifacts they resolve to (the evidence settling and
//! quarantine carry).

use super::RunError;
use crate::agent::AgentOutcome;
use crate::harness::{self, Artifacts, StepOutcome};
use crate::sandbox::Session;
use serde_json::{json, Value};
use shared::graph::AgentBody;
use shared::messages::{AgentConfig, JobSpec, JobStatus};
use std::collections::BTreeMap;
use std::time::Duration;

/// The setup's time bound.
const SETUP_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs the node's setup command; `Some` is the job's outcome when it failed.
pub(super) async fn setup(
    node: &AgentBody,
    session: &dyn Session,
    art: &mut Artifacts<'_>,
) -> Result<Option<StepOutcome>, RunError> {
    let Some(command) = node.verifier.as_ref().and_then(|v| v.setup.as_deref()) else {
        return Ok(None);
    };
    let argv = ["sh".to_string(), "-c".into(), command.to_string()];
    let r = harness::run_logged(session, &argv, SETUP_TIMEOUT, "setup", art).await?;
    if r.exit_code == 0 {
        return Ok(None);
    }
    tracing::info!(command, exit_code = r.exit_code, "verifier setup failed");
    Ok(Some(StepOutcome {
        status: JobStatus::Failed,
        output: json!({"setup": r}),
        error: Some(format!(
            "the harness's setup `{command}` failed (exit code {})",
            r.exit_code
        )),
    }))
}

/// The agent configuration with the verifier's own model, when it names one (the built-in
/// loop only: a script or a command agent is kept as it is).
pub(super) fn agent_config(node: &AgentBody, spec: &JobSpec) -> Result<AgentConfig, String> {
    let mut agent = spec.agent.clone();
    let Some(expr) = node.verifier.as_ref().and_then(|v| v.model.as_deref()) else {
        return Ok(agent);
    };
    let model = match shared::expr::eval(expr, &json!({"params": spec.params})) {
        Ok(Value::String(m)) if !m.trim().is_empty() => m,
        Ok(Value::Null) | Ok(Value::String(_)) => return Ok(agent),
        Ok(other) => return Err(format!("verifier.model: `{expr}` gave {other}, not a name")),
        Err(e) => return Err(format!("verifier.model: `{expr}` cannot be read: {e}")),
    };
    match &mut agent {
        AgentConfig::Anthropic(c) | AgentConfig::Openai(c) => c.model = model,
        AgentConfig::Command(c) => c.model = model,
        AgentConfig::Scripted { .. } => {}
    }
    Ok(agent)
}

/// Marks `out` invalid when its steps are not the feature's, one to one, each with the
/// evidence the seed asks for; a standing answer's screenshots are renamed to their artifacts.
pub(super) fn check(
    node: &AgentBody,
    spec: &JobSpec,
    out: &mut AgentOutcome,
    kept: &BTreeMap<String, String>,
) {
    let Some(policy) = &node.verifier else {
        return;
    };
    if out.status != JobStatus::Ok {
        return;
    }
    let steps = match shared::expr::eval(&policy.steps, &json!({"params": spec.params})) {
        Ok(Value::Array(items)) => items
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>(),
        _ => None,
    };
    let Some(steps) = steps else {
        return invalid(
            out,
            format!("verifier.steps: `{}` is not a list of steps", policy.steps),
        );
    };
    let names: Vec<&str> = kept.keys().map(String::as_str).collect();
    match shared::features::check_answer(&steps, &out.output, &names) {
        Ok(evidence) => {
            if let Some(given) = out.output["steps"].as_array_mut() {
                for (step, shot) in given.iter_mut().zip(evidence) {
                    step["screenshot"] = json!(shot);
                }
            }
        }
        Err(e) => invalid(out, format!("the answer does not stand: {e}")),
    }
}

fn invalid(out: &mut AgentOutcome, why: String) {
    tracing::info!(reason = %why, "verifier answer refused");
    out.status = JobStatus::OutputInvalid;
    out.error = Some(why);
}
