//! Agent backends: the built-in LLM loop (`chat.rs`, written once over the `ChatApi` trait of
//! `provider.rs`, implemented by `anthropic.rs` for the Messages API and `openai.rs` for
//! OpenAI-compatible chat completions) and the scripted agent. Both act only through the node's
//! tools in the container, and both end in an output that must satisfy the node's schema.

mod anthropic;
mod chat;
pub mod command;
pub mod gateway;
pub mod gateway_policy;
pub mod inbox;
pub mod llm;
mod openai;
mod prices;
mod provider;
pub mod rate;
#[cfg(test)]
mod tests;

use crate::tools::ToolBox;
pub use anthropic::Anthropic;
pub use openai::OpenAi;
pub use provider::{ChatApi, Reply, ToolOutput, ToolResult};
use serde_json::{json, Value};
use shared::messages::{AgentConfig, JobStatus, Usage};
use std::time::Duration;

pub use llm::{LlmSettings, PriceTable};

/// What an agent produced.
pub struct AgentOutcome {
    pub status: JobStatus,
    pub output: Value,
    pub error: Option<String>,
    pub usage: Usage,
    pub transcript: Value,
}

pub use shared::schema::validate;

pub struct AgentJob<'a> {
    pub node: &'a str,
    pub visit: u32,
    /// The job's parameters (a scripted step may answer only some).
    pub params: &'a Value,
    /// When the agent is told to finish, before the job's hard timeout.
    pub nudge_after: Option<Duration>,
    pub prompt: String,
    pub schema: &'a Value,
    pub tools: ToolBox<'a>,
    /// Messages from other sessions, taken at each turn boundary (incremental sessions).
    pub inbox: Option<&'a inbox::Inbox>,
    /// The invocation of an incremental session (a scripted agent plays its step by it).
    pub invocation: Option<u32>,
    /// What the run's budget had left when the job was published (`JobSpec::llm_usd_left`):
    /// each call's `max_tokens` is clamped to what it still pays for.
    pub usd_left: Option<f64>,
}

/// The message a nudged agent receives.
pub const NUDGE: &str = "Time is nearly up for this step. Stop exploring and call `submit` now \
with your best answer.";

/// Runs the agent; `prior` is the transcript of the session it continues, if any.
pub async fn run(
    job: AgentJob<'_>,
    config: &AgentConfig,
    settings: &LlmSettings,
    http: &reqwest::Client,
    prior: Option<Value>,
) -> AgentOutcome {
    match config {
        AgentConfig::Scripted { script } => scripted(job, script, prior).await,
        AgentConfig::Anthropic(c) => chat::run(&Anthropic, job, c, settings, http, prior).await,
        AgentConfig::Openai(c) => chat::run(&OpenAi, job, c, settings, http, prior).await,
        // The runner starts the job's gateway and runs it (`command::run`).
        AgentConfig::Command(_) => AgentOutcome {
            status: JobStatus::Error,
            output: Value::Null,
            error: Some("a command agent runs only with its gateway".into()),
            usage: Usage::default(),
            transcript: Value::Null,
        },
    }
}

/// The scripted agent: acts through the node's tools in the container (writes its files, runs
/// its commands) and returns the step's output, which must satisfy the schema like any other.
async fn scripted(
    job: AgentJob<'_>,
    script: &std::collections::BTreeMap<String, Vec<shared::messages::ScriptStep>>,
    prior: Option<Value>,
) -> AgentOutcome {
    let fail = |status, msg: String, transcript: Vec<Value>| AgentOutcome {
        status,
        output: Value::Null,
        error: Some(msg),
        usage: Usage::default(),
        transcript: Value::Array(transcript),
    };
    let steps: Vec<&shared::messages::ScriptStep> = script
        .get(job.node)
        .into_iter()
        .flatten()
        .filter(|s| s.answers(job.params))
        .collect();
    if steps.is_empty() {
        return fail(
            JobStatus::Error,
            format!(
                "the script has no step for node `{}` with these parameters",
                job.node
            ),
            vec![],
        );
    }
    let nth = job.invocation.unwrap_or(job.visit);
    let step = steps[(nth.saturating_sub(1) as usize).min(steps.len() - 1)];
    let mut transcript = Vec::new();
    match prior {
        // A session continued in increments: one flat conversation.
        Some(Value::Array(earlier)) if job.invocation.is_some() => transcript = earlier,
        Some(prior) => transcript.push(json!({"continued_from": prior})),
        None => {}
    }
    if let Some(inbox) = job.inbox {
        for m in inbox.take() {
            transcript.push(
                json!({"role": "user", "content": m.as_user_text(), "from": m.from, "seq": m.seq}),
            );
        }
    }
    transcript.push(json!({"role": "user", "content": job.prompt}));
    if !step.delay().is_zero() {
        tokio::time::sleep(step.delay()).await;
    }
    for (path, content) in &step.files {
        let input = json!({"path": path, "content": content});
        let result = job.tools.call("write_file", &input).await;
        transcript.push(
            json!({"tool": "write_file", "input": {"path": path}, "ok": result.is_ok(),
            "result": result.clone().unwrap_or_else(|e| e)}),
        );
        if let Err(e) = result {
            return fail(
                JobStatus::Error,
                format!("scripted write of `{path}` failed: {e}"),
                transcript,
            );
        }
    }
    for command in &step.commands {
        let result = job
            .tools
            .call("run_command", &json!({"command": command}))
            .await;
        transcript.push(json!({"tool": "run_command", "input": {"command": command},
            "ok": result.is_ok(), "result": result.clone().unwrap_or_else(|e| e)}));
        if let Err(e) = result {
            return fail(
                JobStatus::Error,
                format!("scripted command failed: {e}"),
                transcript,
            );
        }
    }
    for call in &step.tool_calls {
        let name = call["name"].as_str().unwrap_or_default();
        let result = job.tools.call(name, &call["input"]).await;
        // A refused or failed call is an answer for the agent, as with a model's call.
        transcript.push(
            json!({"tool": name, "input": call["input"], "ok": result.is_ok(),
            "result": result.unwrap_or_else(|e| e)}),
        );
    }
    transcript.push(json!({"role": "assistant", "output": step.output}));
    let (status, error) = match validate(job.schema, &step.output) {
        Ok(()) => (JobStatus::Ok, None),
        Err(e) => (JobStatus::OutputInvalid, Some(e)),
    };
    AgentOutcome {
        status,
        output: step.output.clone(),
        error,
        usage: Usage::default(),
        transcript: Value::Array(transcript),
    }
}
