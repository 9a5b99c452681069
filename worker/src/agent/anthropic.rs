//! The built-in agent loop over the Anthropic Messages API.

use super::llm::{
    json_from_text, post_with_retry, LlmError, LlmSettings, SUBMIT, SUBMIT_DESCRIPTION,
};
use super::{validate, AgentJob, AgentOutcome};
use serde_json::{json, Value};
use shared::messages::{LlmConfig, Usage};

const SYSTEM: &str = "You are a coding agent working in a sandboxed repository. Use the tools to \
inspect it. When you are done, call the `submit` tool with your final answer.";

pub async fn run(
    job: AgentJob<'_>,
    cfg: &LlmConfig,
    settings: &LlmSettings,
    http: &reqwest::Client,
    prior: Option<Value>,
) -> AgentOutcome {
    let mut usage = Usage::default();
    let mut messages = continue_from(prior.as_ref(), &job.prompt);
    let outcome = converse(&job, cfg, settings, http, &mut messages, &mut usage).await;
    usage.cost_usd = settings
        .prices
        .cost(&cfg.model, usage.input_tokens, usage.output_tokens);
    let transcript =
        json!({"api": "anthropic", "model": cfg.model, "system": SYSTEM, "messages": messages});
    super::conclude(outcome, usage, transcript)
}

/// The conversation so far (a continued session) plus the new prompt. A trailing assistant turn
/// with tool calls (the earlier `submit`) gets its tool results first, as the API requires.
fn continue_from(prior: Option<&Value>, prompt: &str) -> Vec<Value> {
    let mut messages: Vec<Value> = prior
        .and_then(|p| p.get("messages"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut content = Vec::new();
    if let Some(last) = messages.last().filter(|m| m["role"] == "assistant") {
        for block in last["content"].as_array().cloned().unwrap_or_default() {
            if block["type"] == "tool_use" {
                content.push(json!({"type": "tool_result", "tool_use_id": block["id"],
                    "content": "accepted"}));
            }
        }
    }
    content.push(json!({"type": "text", "text": prompt}));
    if messages.is_empty() {
        return vec![json!({"role": "user", "content": prompt})];
    }
    messages.push(json!({"role": "user", "content": content}));
    messages
}

/// `Ok(Ok(output))` on a valid submit, `Ok(Err(reason))` when no valid answer came.
async fn converse(
    job: &AgentJob<'_>,
    cfg: &LlmConfig,
    settings: &LlmSettings,
    http: &reqwest::Client,
    messages: &mut Vec<Value>,
    usage: &mut Usage,
) -> Result<Result<Value, String>, LlmError> {
    let key = settings
        .anthropic_api_key
        .clone()
        .ok_or(LlmError::NoKey("ANTHROPIC_API_KEY"))?;
    let mut tools: Vec<Value> = job
        .tools
        .definitions()
        .into_iter()
        .map(|d| json!({"name": d.name, "description": d.description, "input_schema": d.schema}))
        .collect();
    tools.push(
        json!({"name": SUBMIT, "description": SUBMIT_DESCRIPTION, "input_schema": job.schema}),
    );
    let url = format!(
        "{}/v1/messages",
        settings.anthropic_base_url.trim_end_matches('/')
    );
    let headers = [
        ("x-api-key", key),
        ("anthropic-version", "2023-06-01".to_string()),
    ];
    let mut last_problem = String::from("the agent never submitted");
    let started = std::time::Instant::now();
    let mut nudged = false;
    for _ in 0..cfg.max_turns {
        if !nudged && job.nudge_after.is_some_and(|n| started.elapsed() >= n) {
            nudged = true;
            if let Some(last) = messages.last_mut().filter(|m| m["role"] == "user") {
                match last["content"].as_array_mut() {
                    Some(blocks) => blocks.push(json!({"type": "text", "text": super::NUDGE})),
                    None => {
                        let text = last["content"].as_str().unwrap_or_default().to_string();
                        last["content"] = json!(format!("{text}\n\n{}", super::NUDGE));
                    }
                }
            }
        }
        let body = json!({
            "model": cfg.model,
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
            "system": SYSTEM,
            "tools": tools,
            "messages": messages,
        });
        let resp = post_with_retry(http, &url, &headers, &body, settings, usage).await?;
        usage.input_tokens += resp
            .pointer("/usage/input_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        usage.output_tokens += resp
            .pointer("/usage/output_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let content = resp
            .get("content")
            .and_then(Value::as_array)
            .cloned()
            .ok_or_else(|| LlmError::Malformed("no `content` array".into()))?;
        messages.push(json!({"role": "assistant", "content": content}));
        let uses: Vec<&Value> = content
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
            .collect();
        if uses.is_empty() {
            let text: String = content
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect();
            if let Some(v) = json_from_text(&text) {
                match validate(job.schema, &v) {
                    Ok(()) => return Ok(Ok(v)),
                    Err(e) => last_problem = e,
                }
            }
            messages.push(json!({"role": "user", "content":
                format!("Call the `submit` tool with your final answer. ({last_problem})")}));
            continue;
        }
        let mut results = Vec::new();
        for u in uses {
            let id = u.get("id").and_then(Value::as_str).unwrap_or_default();
            let name = u.get("name").and_then(Value::as_str).unwrap_or_default();
            let input = u.get("input").cloned().unwrap_or(Value::Null);
            let (text, is_error) = if name == SUBMIT {
                match validate(job.schema, &input) {
                    Ok(()) => return Ok(Ok(input)),
                    Err(e) => {
                        last_problem = e.clone();
                        (e, true)
                    }
                }
            } else {
                match job.tools.call(name, &input).await {
                    Ok(t) => (t, false),
                    Err(e) => (e, true),
                }
            };
            results.push(json!({"type": "tool_result", "tool_use_id": id, "content": text, "is_error": is_error}));
        }
        messages.push(json!({"role": "user", "content": results}));
    }
    Ok(Err(format!(
        "no valid answer within {} turns: {last_problem}",
        cfg.max_turns
    )))
}
