//! The built-in agent loop over the Anthropic Messages API.

use super::llm::{
    count_tokens, json_from_text, post_with_retry, LlmError, LlmSettings, Reply, ToolCall, SUBMIT,
    SUBMIT_DESCRIPTION,
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
        let reply = read_reply(&resp, usage)?;
        messages.push(reply.turn);
        if reply.calls.is_empty() {
            if let Some(v) = json_from_text(&reply.text) {
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
        for call in reply.calls {
            let input = call.input.unwrap_or(Value::Null);
            let (text, is_error) = if call.name == SUBMIT {
                match validate(job.schema, &input) {
                    Ok(()) => return Ok(Ok(input)),
                    Err(e) => {
                        last_problem = e.clone();
                        (e, true)
                    }
                }
            } else {
                match job.tools.call(&call.name, &input).await {
                    Ok(t) => (t, false),
                    Err(e) => (e, true),
                }
            };
            results.push(json!({"type": "tool_result", "tool_use_id": call.id, "content": text, "is_error": is_error}));
        }
        messages.push(json!({"role": "user", "content": results}));
    }
    Ok(Err(format!(
        "no valid answer within {} turns: {last_problem}",
        cfg.max_turns
    )))
}

/// Reads a Messages API response body: counts its tokens into `usage` (also when the rest is
/// malformed), then its content blocks: `tool_use` blocks are the calls, `text` the answer.
fn read_reply(resp: &Value, usage: &mut Usage) -> Result<Reply, LlmError> {
    count_tokens(
        usage,
        resp.pointer("/usage/input_tokens").and_then(Value::as_u64),
        resp.pointer("/usage/output_tokens").and_then(Value::as_u64),
    );
    let content = resp
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .ok_or_else(|| LlmError::Malformed("no `content` array".into()))?;
    let str_of = |b: &Value, key: &str| {
        b.get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let calls = content
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
        .map(|b| ToolCall {
            id: str_of(b, "id"),
            name: str_of(b, "name"),
            input: Ok(b.get("input").cloned().unwrap_or(Value::Null)),
        })
        .collect();
    let text = content
        .iter()
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    Ok(Reply {
        turn: json!({"role": "assistant", "content": content}),
        calls,
        text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::llm::tests::{arb_json, arb_text, cases, timed, CASE_LIMIT};
    use proptest::prelude::*;

    /// A content block: mostly the shapes the API sends, with any field missing or mistyped.
    fn arb_block() -> impl Strategy<Value = Value> {
        let shaped = (
            prop::sample::select(vec!["text", "tool_use", "thinking", "Tool_use"]),
            prop::option::of(prop_oneof![arb_text().prop_map(Value::from), arb_json()]),
            prop::option::of(arb_text()),
            prop::option::of(arb_text()),
            prop::option::of(arb_json()),
        )
            .prop_map(|(ty, text, id, name, input)| {
                let mut b = json!({ "type": ty });
                for (k, v) in [
                    ("text", text),
                    ("id", id.map(Value::from)),
                    ("name", name.map(Value::from)),
                    ("input", input),
                ] {
                    if let Some(v) = v {
                        b[k] = v;
                    }
                }
                b
            });
        prop_oneof![4 => shaped, 1 => arb_json()]
    }

    /// A response body: mostly Messages-shaped, sometimes anything at all.
    fn arb_response() -> impl Strategy<Value = Value> {
        let usage = prop_oneof![
            any::<(u64, u64)>().prop_map(|(i, o)| json!({"input_tokens": i, "output_tokens": o})),
            arb_json(),
        ];
        let shaped = (prop::collection::vec(arb_block(), 0..5), usage)
            .prop_map(|(content, usage)| json!({"content": content, "usage": usage}));
        prop_oneof![3 => shaped, 1 => arb_json()]
    }

    proptest! {
        #![proptest_config(cases(256))]

        #[test]
        fn any_response_body_is_read_without_panicking(
            resp in arb_response(),
            start in any::<(u64, u64)>(),
        ) {
            let mut usage = Usage { input_tokens: start.0, output_tokens: start.1, ..Usage::default() };
            let (reply, took) = timed(|| read_reply(&resp, &mut usage));
            prop_assert!(took < CASE_LIMIT);
            prop_assert!(usage.input_tokens >= start.0 && usage.output_tokens >= start.1);
            let blocks = resp.get("content").and_then(Value::as_array);
            match reply {
                Ok(reply) => {
                    let uses = blocks
                        .into_iter()
                        .flatten()
                        .filter(|b| b["type"] == "tool_use")
                        .count();
                    prop_assert_eq!(reply.calls.len(), uses);
                    prop_assert!(reply.calls.iter().all(|c| c.input.is_ok()));
                    prop_assert_eq!(&reply.turn["role"], "assistant");
                }
                Err(_) => prop_assert!(blocks.is_none()),
            }
        }

        #[test]
        fn any_prior_transcript_is_continued_without_panicking(
            prior in prop_oneof![
                arb_json(),
                prop::collection::vec(arb_json(), 0..4)
                    .prop_map(|m| json!({"messages": m})),
                prop::collection::vec(arb_block(), 0..4).prop_map(|content| {
                    json!({"messages": [{"role": "user", "content": "x"},
                                        {"role": "assistant", "content": content}]})
                }),
            ],
            prompt in arb_text(),
        ) {
            let messages = continue_from(Some(&prior), &prompt);
            prop_assert!(messages.last().is_some_and(|m| m["role"] == "user"));
        }
    }

    #[test]
    fn tool_uses_and_text_are_read_from_the_content() {
        let mut usage = Usage::default();
        let resp = json!({"content": [
            {"type": "text", "text": "let me look"},
            {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a.py"}},
        ], "usage": {"input_tokens": 7, "output_tokens": 3}});
        let reply = read_reply(&resp, &mut usage).unwrap();
        assert_eq!(reply.text, "let me look");
        assert_eq!(reply.calls[0].name, "read_file");
        assert_eq!(reply.calls[0].input, Ok(json!({"path": "a.py"})));
        assert_eq!((usage.input_tokens, usage.output_tokens), (7, 3));
        assert!(read_reply(&json!({"usage": {"input_tokens": 1}}), &mut usage).is_err());
        assert_eq!(
            usage.input_tokens, 8,
            "a malformed reply's tokens still count"
        );
    }
}
