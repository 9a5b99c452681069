//! Agent backends: the built-in LLM loop (Anthropic Messages, OpenAI-compatible chat
//! completions) and the scripted agent. Both act only through the node's tools in the container,
//! and both end in an output that must satisfy the node's schema.

mod anthropic;
pub mod llm;
mod openai;

use crate::tools::ToolBox;
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
    pub prompt: String,
    pub schema: &'a Value,
    pub tools: ToolBox<'a>,
}

pub async fn run(
    job: AgentJob<'_>,
    config: &AgentConfig,
    settings: &LlmSettings,
    http: &reqwest::Client,
) -> AgentOutcome {
    match config {
        AgentConfig::Scripted { script } => scripted(job, script).await,
        AgentConfig::Anthropic(c) => anthropic::run(job, c, settings, http).await,
        AgentConfig::Openai(c) => openai::run(job, c, settings, http).await,
    }
}

/// The scripted agent: writes the step's files through the container and returns its output.
async fn scripted(
    job: AgentJob<'_>,
    script: &std::collections::BTreeMap<String, Vec<shared::messages::ScriptStep>>,
) -> AgentOutcome {
    let fail = |status, msg: String| AgentOutcome {
        status,
        output: Value::Null,
        error: Some(msg),
        usage: Usage::default(),
        transcript: json!([]),
    };
    let Some(steps) = script.get(job.node).filter(|s| !s.is_empty()) else {
        return fail(
            JobStatus::Error,
            format!("the script has no step for node `{}`", job.node),
        );
    };
    let step = &steps[(job.visit as usize - 1).min(steps.len() - 1)];
    if step.delay_seconds > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(step.delay_seconds)).await;
    }
    let mut transcript = vec![json!({"role": "user", "content": job.prompt})];
    for (path, content) in &step.files {
        let input = json!({"path": path, "content": content});
        let result = match shared::paths::normalize_relative(path) {
            Ok(p) => job
                .tools
                .write(&p, content.as_bytes().to_vec())
                .await
                .map(|_| format!("wrote {p}")),
            Err(e) => Err(e.to_string()),
        };
        transcript
            .push(json!({"tool": "write_file", "input": input, "result": format!("{result:?}")}));
        if let Err(e) = result {
            return fail(
                JobStatus::Error,
                format!("scripted write of `{path}` failed: {e}"),
            );
        }
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
