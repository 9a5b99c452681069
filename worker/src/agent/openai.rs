//! The built-in agent loop over OpenAI-compatible chat completions.

use super::llm::{
    count_tokens, json_from_text, post_with_retry, LlmError, LlmSettings, Reply, ToolCall, SUBMIT,
    SUBMIT_DESCRIPTION,
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
                format!("Call the `submit` function with your final answer. ({last_problem})")}));
            continue;
        }
        for call in reply.calls {
            let id = call.id;
            let (text, _is_error) = match call.input {
                Err(e) => (e, true),
                Ok(input) if call.name == SUBMIT => match validate(job.schema, &input) {
                    Ok(()) => return Ok(Ok(input)),
                    Err(e) => {
                        last_problem = e.clone();
                        (e, true)
                    }
                },
                Ok(input) => match job.tools.call(&call.name, &input).await {
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

/// Reads a chat-completions response body: counts its tokens into `usage` (also when the rest
/// is malformed), then `choices[0].message`: its `tool_calls` (arguments are a JSON string) or
/// its text `content`.
fn read_reply(resp: &Value, usage: &mut Usage) -> Result<Reply, LlmError> {
    count_tokens(
        usage,
        resp.pointer("/usage/prompt_tokens").and_then(Value::as_u64),
        resp.pointer("/usage/completion_tokens")
            .and_then(Value::as_u64),
    );
    let message = resp
        .pointer("/choices/0/message")
        .cloned()
        .ok_or_else(|| LlmError::Malformed("no `choices[0].message`".into()))?;
    let str_at = |v: &Value, pointer: &str| {
        v.pointer(pointer)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|call| ToolCall {
            id: str_at(call, "/id").unwrap_or_default(),
            name: str_at(call, "/function/name").unwrap_or_default(),
            input: serde_json::from_str::<Value>(
                call.pointer("/function/arguments")
                    .and_then(Value::as_str)
                    .unwrap_or("{}"),
            )
            .map_err(|e| format!("arguments are not valid json: {e}")),
        })
        .collect();
    let text = str_at(&message, "/content").unwrap_or_default();
    Ok(Reply {
        turn: message,
        calls,
        text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::llm::tests::{arb_json, arb_text, cases, timed, CASE_LIMIT};
    use proptest::prelude::*;

    /// A tool call: mostly the shape the API sends (arguments a JSON string, often valid),
    /// with any field missing or mistyped.
    fn arb_call() -> impl Strategy<Value = Value> {
        let arguments = prop_oneof![
            arb_json().prop_map(|v| Value::from(v.to_string())),
            arb_text().prop_map(Value::from),
            arb_json(),
        ];
        let shaped = (
            prop::option::of(arb_text()),
            prop::option::of(arb_text()),
            prop::option::of(arguments),
        )
            .prop_map(|(id, name, arguments)| {
                let mut f = json!({});
                if let Some(n) = name {
                    f["name"] = n.into();
                }
                if let Some(a) = arguments {
                    f["arguments"] = a;
                }
                let mut c = json!({"type": "function", "function": f});
                if let Some(id) = id {
                    c["id"] = id.into();
                }
                c
            });
        prop_oneof![4 => shaped, 1 => arb_json()]
    }

    /// A response body: mostly chat-completions-shaped, sometimes anything at all.
    fn arb_response() -> impl Strategy<Value = Value> {
        let usage = prop_oneof![
            any::<(u64, u64)>()
                .prop_map(|(i, o)| json!({"prompt_tokens": i, "completion_tokens": o})),
            arb_json(),
        ];
        let message = (
            prop::option::of(prop_oneof![arb_text().prop_map(Value::from), arb_json()]),
            prop::option::of(prop_oneof![
                3 => prop::collection::vec(arb_call(), 0..4).prop_map(Value::Array),
                1 => arb_json(),
            ]),
        )
            .prop_map(|(content, calls)| {
                let mut m = json!({"role": "assistant"});
                if let Some(c) = content {
                    m["content"] = c;
                }
                if let Some(c) = calls {
                    m["tool_calls"] = c;
                }
                m
            });
        let shaped = (prop::collection::vec(message, 0..3), usage).prop_map(|(ms, usage)| {
            let choices: Vec<Value> = ms.into_iter().map(|m| json!({"message": m})).collect();
            json!({"choices": choices, "usage": usage})
        });
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
            let message = resp.pointer("/choices/0/message");
            match reply {
                Ok(reply) => {
                    let calls = message
                        .and_then(|m| m.get("tool_calls"))
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len);
                    prop_assert_eq!(reply.calls.len(), calls);
                    prop_assert_eq!(Some(&reply.turn), message);
                }
                Err(_) => prop_assert!(message.is_none()),
            }
        }
    }

    #[test]
    fn tool_calls_arguments_and_text_are_read() {
        let mut usage = Usage::default();
        let resp = json!({"choices": [{"message": {"role": "assistant", "content": "hm",
            "tool_calls": [
                {"id": "c1", "function": {"name": "read_file", "arguments": "{\"path\":\"a.py\"}"}},
                {"id": "c2", "function": {"name": "submit", "arguments": "{not json"}},
                {"id": "c3", "function": {"name": "list_dir"}},
            ]}}], "usage": {"prompt_tokens": 5, "completion_tokens": 2}});
        let reply = read_reply(&resp, &mut usage).unwrap();
        assert_eq!(reply.text, "hm");
        assert_eq!(reply.calls[0].input, Ok(json!({"path": "a.py"})));
        assert!(reply.calls[1]
            .input
            .as_ref()
            .is_err_and(|e| e.contains("not valid json")));
        assert_eq!(reply.calls[2].input, Ok(json!({})));
        assert_eq!((usage.input_tokens, usage.output_tokens), (5, 2));
        assert!(read_reply(&json!({"choices": []}), &mut usage).is_err());
    }
}
