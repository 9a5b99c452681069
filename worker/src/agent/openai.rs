//! The built-in agent loop over OpenAI-compatible chat completions.

use super::llm::{
    json_from_text, post_with_retry, LlmError, LlmSettings, SUBMIT, SUBMIT_DESCRIPTION,
};
use super::{validate, AgentJob, AgentOutcome};
use serde_json::{json, Value};
use shared::messages::{LlmConfig, Usage};

const SYSTEM: &str = "You are a coding agent working in a sandboxed repository. Use the tools to \
inspect it. When you are done, call the `submit` function with your final answer.";

pub async fn run(
    job: AgentJob<'_>,
    cfg: &LlmConfig,
    settings: &LlmSettings,
    http: &reqwest::Client,
    prior: Option<Value>,
) -> AgentOutcome {
    let mut usage = Usage::default();
    let mut messages: Vec<Value> = prior
        .as_ref()
        .and_then(|p| p.get("messages"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_else(|| vec![json!({"role": "system", "content": SYSTEM})]);
    // A continued session: answer the earlier submit call before the new prompt.
    if let Some(last) = messages
        .last()
        .cloned()
        .filter(|m| m["role"] == "assistant")
    {
        for call in last["tool_calls"].as_array().cloned().unwrap_or_default() {
            messages
                .push(json!({"role": "tool", "tool_call_id": call["id"], "content": "accepted"}));
        }
    }
    messages.push(json!({"role": "user", "content": job.prompt}));
    let outcome = converse(&job, cfg, settings, http, &mut messages, &mut usage).await;
    usage.cost_usd = settings
        .prices
        .cost(&cfg.model, usage.input_tokens, usage.output_tokens);
    let transcript = json!({"api": "openai", "model": cfg.model, "messages": messages});
    super::conclude(outcome, usage, transcript)
}

async fn converse(
    job: &AgentJob<'_>,
    cfg: &LlmConfig,
    settings: &LlmSettings,
    http: &reqwest::Client,
    messages: &mut Vec<Value>,
    usage: &mut Usage,
) -> Result<Result<Value, String>, LlmError> {
    let key = settings
        .openai_api_key
        .clone()
        .ok_or(LlmError::NoKey("OPENAI_API_KEY"))?;
    let mut tools: Vec<Value> = job
        .tools
        .definitions()
        .into_iter()
        .map(|d| {
            json!({"type": "function", "function":
            {"name": d.name, "description": d.description, "parameters": d.schema}})
        })
        .collect();
    tools.push(json!({"type": "function", "function":
        {"name": SUBMIT, "description": SUBMIT_DESCRIPTION, "parameters": job.schema}}));
    let url = format!(
        "{}/v1/chat/completions",
        settings.openai_base_url.trim_end_matches('/')
    );
    let headers = [("authorization", format!("Bearer {key}"))];
    let mut last_problem = String::from("the agent never submitted");
    let started = std::time::Instant::now();
    let mut nudged = false;
    for _ in 0..cfg.max_turns {
        if !nudged && job.nudge_after.is_some_and(|n| started.elapsed() >= n) {
            nudged = true;
            messages.push(json!({"role": "user", "content": super::NUDGE}));
        }
        let body = json!({
            "model": cfg.model,
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
            "tools": tools,
            "messages": messages,
        });
        let resp = post_with_retry(http, &url, &headers, &body, settings, usage).await?;
        usage.input_tokens += resp
            .pointer("/usage/prompt_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        usage.output_tokens += resp
            .pointer("/usage/completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let message = resp
            .pointer("/choices/0/message")
            .cloned()
            .ok_or_else(|| LlmError::Malformed("no `choices[0].message`".into()))?;
        messages.push(message.clone());
        let calls = message
            .get("tool_calls")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if calls.is_empty() {
            let text = message
                .get("content")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if let Some(v) = json_from_text(text) {
                match validate(job.schema, &v) {
                    Ok(()) => return Ok(Ok(v)),
                    Err(e) => last_problem = e,
                }
            }
            messages.push(json!({"role": "user", "content":
                format!("Call the `submit` function with your final answer. ({last_problem})")}));
            continue;
        }
        for call in calls {
            let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
            let name = call
                .pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let args = call
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or("{}");
            let (text, _is_error) = match serde_json::from_str::<Value>(args) {
                Err(e) => (format!("arguments are not valid json: {e}"), true),
                Ok(input) if name == SUBMIT => match validate(job.schema, &input) {
                    Ok(()) => return Ok(Ok(input)),
                    Err(e) => {
                        last_problem = e.clone();
                        (e, true)
                    }
                },
                Ok(input) => match job.tools.call(name, &input).await {
                    Ok(t) => (t, false),
                    Err(e) => (format!("error: {e}"), true),
                },
            };
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
        }
    }
    Ok(Err(format!(
        "no valid answer within {} turns: {last_problem}",
        cfg.max_turns
    )))
}
