//! The OpenAI-compatible chat completions wire format.

use super::llm::{LlmError, LlmSettings};
use super::provider::{ChatApi, Endpoint, Reply, Tokens, ToolCall, ToolOutput, ToolResult};
use crate::tools::ToolDef;
use serde_json::{json, Value};
use shared::messages::LlmConfig;

const SYSTEM: &str = "You are a coding agent working in a sandboxed repository. Use the tools to \
inspect it. When you are done, call the `submit` function with your final answer.";

/// Chat completions: the system prompt as the first message, tools as functions whose
/// arguments are a JSON string, one `tool` message per tool result.
pub struct OpenAi;

/// OpenAI's reasoning models (o-series, GPT-5): `max_completion_tokens`, no temperature.
pub fn reasoning_model(model: &str) -> bool {
    ["o1", "o3", "o4", "gpt-5"].iter().any(|family| {
        model
            .strip_prefix(family)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
    })
}

impl ChatApi for OpenAi {
    const NAME: &'static str = "openai";
    const TOOL_NOUN: &'static str = "function";

    fn endpoint(&self, settings: &LlmSettings) -> Result<Endpoint, LlmError> {
        let key = settings
            .openai_api_key
            .clone()
            .ok_or(LlmError::NoKey("OPENAI_API_KEY"))?;
        Ok(Endpoint {
            url: format!(
                "{}/v1/chat/completions",
                settings.openai_base_url.trim_end_matches('/')
            ),
            headers: vec![("authorization", format!("Bearer {key}"))],
        })
    }

    /// The continued session's messages (else the system prompt), its earlier tool calls (the
    /// `submit`) answered, then the prompt.
    fn start(&self, prior: Option<&Value>, prompt: &str) -> Vec<Value> {
        let mut messages: Vec<Value> = prior
            .and_then(|p| p.get("messages"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_else(|| vec![json!({"role": "system", "content": SYSTEM})]);
        if let Some(last) = messages
            .last()
            .cloned()
            .filter(|m| m["role"] == "assistant")
        {
            for call in last["tool_calls"].as_array().cloned().unwrap_or_default() {
                messages.push(
                    json!({"role": "tool", "tool_call_id": call["id"], "content": "accepted"}),
                );
            }
        }
        messages.push(json!({"role": "user", "content": prompt}));
        messages
    }

    fn request(&self, cfg: &LlmConfig, tools: &[ToolDef], messages: &[Value]) -> Value {
        let tools: Vec<Value> = tools
            .iter()
            .map(|d| {
                json!({"type": "function", "function":
                {"name": d.name, "description": d.description, "parameters": d.schema}})
            })
            .collect();
        if reasoning_model(&cfg.model) {
            // OpenAI's reasoning models refuse `max_tokens` ("Use 'max_completion_tokens'
            // instead") and any temperature but the default (the API's 400s, `unsupported_
            // parameter` / `unsupported_value`; the reference: `max_tokens` "is not compatible
            // with o-series models").
            return json!({
                "model": cfg.model,
                "max_completion_tokens": cfg.max_tokens,
                "tools": tools,
                "messages": messages,
            });
        }
        json!({
            "model": cfg.model,
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
            "tools": tools,
            "messages": messages,
        })
    }

    fn usage(&self, body: &Value) -> Tokens {
        Tokens {
            input: body.pointer("/usage/prompt_tokens").and_then(Value::as_u64),
            output: body
                .pointer("/usage/completion_tokens")
                .and_then(Value::as_u64),
        }
    }

    /// `choices[0].message`: its `tool_calls` (arguments are a JSON string) or its text
    /// `content`.
    fn parse(&self, body: &Value) -> Result<Reply, LlmError> {
        let message = body
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
            stop_reason: str_at(body, "/choices/0/finish_reason"),
        })
    }

    /// One `tool` message per result; a failed tool's message starts with `error: `.
    fn tool_results(&self, results: Vec<ToolResult>) -> Vec<Value> {
        results
            .into_iter()
            .map(|r| {
                let text = match r.output {
                    ToolOutput::Done(text) | ToolOutput::Refused(text) => text,
                    ToolOutput::Failed(e) => format!("error: {e}"),
                };
                json!({"role": "tool", "tool_call_id": r.id, "content": text})
            })
            .collect()
    }

    fn user_text(&self, text: String) -> Value {
        json!({"role": "user", "content": text})
    }

    /// A user message of its own.
    fn nudge(&self, messages: &mut Vec<Value>, text: &str) {
        messages.push(self.user_text(text.to_string()));
    }

    fn transcript(&self, model: &str, messages: Vec<Value>) -> Value {
        json!({"api": Self::NAME, "model": model, "messages": messages})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::chat::read_reply;
    use crate::agent::llm::tests::{arb_json, arb_text, cases, timed, CASE_LIMIT};
    use proptest::prelude::*;
    use shared::messages::Usage;

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

    fn cfg() -> LlmConfig {
        LlmConfig {
            model: "gpt-x".into(),
            temperature: 0.0,
            max_tokens: 12,
            max_turns: 3,
        }
    }

    fn result(id: &str, output: ToolOutput) -> ToolResult {
        ToolResult {
            id: id.into(),
            output,
        }
    }

    proptest! {
        #![proptest_config(cases(256))]

        #[test]
        fn any_response_body_is_read_without_panicking(
            resp in arb_response(),
            start in any::<(u64, u64)>(),
        ) {
            let mut usage = Usage { input_tokens: start.0, output_tokens: start.1, ..Usage::default() };
            let (reply, took) = timed(|| read_reply(&OpenAi, &resp, &mut usage));
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

        #[test]
        fn any_prior_transcript_is_continued_without_panicking(
            prior in prop_oneof![
                arb_json(),
                prop::collection::vec(arb_json(), 0..4)
                    .prop_map(|m| json!({"messages": m})),
                prop::collection::vec(arb_call(), 0..4).prop_map(|calls| {
                    json!({"messages": [{"role": "user", "content": "x"},
                                        {"role": "assistant", "tool_calls": calls}]})
                }),
            ],
            prompt in arb_text(),
        ) {
            let messages = OpenAi.start(Some(&prior), &prompt);
            prop_assert_eq!(
                messages.last(),
                Some(&json!({"role": "user", "content": prompt}))
            );
        }
    }

    #[test]
    fn tool_calls_arguments_and_text_are_read() {
        let mut usage = Usage::default();
        let resp = json!({"choices": [{"finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": "hm",
            "tool_calls": [
                {"id": "c1", "function": {"name": "read_file", "arguments": "{\"path\":\"a.py\"}"}},
                {"id": "c2", "function": {"name": "submit", "arguments": "{not json"}},
                {"id": "c3", "function": {"name": "list_dir"}},
            ]}}], "usage": {"prompt_tokens": 5, "completion_tokens": 2}});
        let reply = read_reply(&OpenAi, &resp, &mut usage).unwrap();
        assert_eq!(reply.text, "hm");
        assert_eq!(reply.stop_reason.as_deref(), Some("tool_calls"));
        assert_eq!(reply.turn, resp["choices"][0]["message"]);
        assert_eq!(reply.calls[0].input, Ok(json!({"path": "a.py"})));
        assert!(reply.calls[1]
            .input
            .as_ref()
            .is_err_and(|e| e.contains("not valid json")));
        assert_eq!(reply.calls[2].input, Ok(json!({})));
        assert_eq!((usage.input_tokens, usage.output_tokens), (5, 2));
        assert!(read_reply(&OpenAi, &json!({"choices": []}), &mut usage).is_err());
    }

    #[test]
    fn malformed_replies_are_errors_or_empty_never_panics() {
        for body in [
            json!(null),
            json!({"choices": {}}),
            json!({"choices": [{}]}),
            json!({"choices": [7]}),
        ] {
            assert!(
                matches!(OpenAi.parse(&body), Err(LlmError::Malformed(_))),
                "{body}"
            );
            assert_eq!(OpenAi.usage(&body), Tokens::default());
        }
        // A message of any shape: calls without fields are calls with empty fields and `{}`
        // as input; arguments that are not a string read as `{}`.
        let body = json!({"choices": [{"message": {"content": 4, "tool_calls": [
            null, {"function": {"arguments": {"a": 1}}}]}}], "usage": {"prompt_tokens": 1.5}});
        let reply = OpenAi.parse(&body).unwrap();
        let empty = ToolCall {
            id: String::new(),
            name: String::new(),
            input: Ok(json!({})),
        };
        assert_eq!(reply.calls, vec![empty.clone(), empty]);
        assert_eq!((reply.text.as_str(), reply.stop_reason), ("", None));
        assert_eq!(OpenAi.usage(&body), Tokens::default());
        // `tool_calls` that is no array is no call.
        let body = json!({"choices": [{"message": {"content": "{}", "tool_calls": "x"}}]});
        assert!(OpenAi.parse(&body).unwrap().calls.is_empty());
    }

    #[test]
    fn the_endpoint_needs_the_key_and_sends_it_as_a_bearer_token() {
        let mut settings = LlmSettings {
            openai_base_url: "http://llm.test//".into(),
            ..LlmSettings::default()
        };
        assert!(matches!(
            OpenAi.endpoint(&settings),
            Err(LlmError::NoKey("OPENAI_API_KEY"))
        ));
        settings.openai_api_key = Some("k".into());
        assert_eq!(
            OpenAi.endpoint(&settings).unwrap(),
            Endpoint {
                url: "http://llm.test/v1/chat/completions".into(),
                headers: vec![("authorization", "Bearer k".into())],
            }
        );
    }

    #[test]
    fn the_request_carries_the_tools_as_functions() {
        let tools = [ToolDef {
            name: "read_file",
            description: "d",
            schema: json!({"type": "object"}),
        }];
        let messages = OpenAi.start(None, "hi");
        assert_eq!(
            messages,
            vec![
                json!({"role": "system", "content": SYSTEM}),
                json!({"role": "user", "content": "hi"}),
            ]
        );
        assert_eq!(
            OpenAi.request(&cfg(), &tools, &messages),
            json!({"model": "gpt-x", "max_tokens": 12, "temperature": 0.0,
                "tools": [{"type": "function", "function": {"name": "read_file",
                    "description": "d", "parameters": {"type": "object"}}}],
                "messages": messages})
        );
    }

    #[test]
    fn each_tool_result_is_a_tool_message_and_only_a_failed_tool_says_error() {
        let results = vec![
            result("a", ToolOutput::Done("out".into())),
            result("b", ToolOutput::Failed("no such file".into())),
            result("c", ToolOutput::Refused("breaks the schema".into())),
        ];
        assert_eq!(
            OpenAi.tool_results(results),
            vec![
                json!({"role": "tool", "tool_call_id": "a", "content": "out"}),
                json!({"role": "tool", "tool_call_id": "b", "content": "error: no such file"}),
                json!({"role": "tool", "tool_call_id": "c", "content": "breaks the schema"}),
            ]
        );
        assert!(OpenAi.tool_results(vec![]).is_empty());
    }

    #[test]
    fn a_continued_conversation_answers_every_open_call_then_adds_the_prompt() {
        let prior = OpenAi.transcript(
            "m",
            vec![
                json!({"role": "system", "content": SYSTEM}),
                json!({"role": "user", "content": "go"}),
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function",
                        "function": {"name": "submit", "arguments": "{}"}},
                ]}),
            ],
        );
        assert_eq!(prior["api"], "openai");
        let messages = OpenAi.start(Some(&prior), "more");
        assert_eq!(
            messages[3..],
            [
                json!({"role": "tool", "tool_call_id": "c1", "content": "accepted"}),
                json!({"role": "user", "content": "more"}),
            ]
        );
        // A transcript of no messages starts from nothing, not from the system prompt.
        let messages = OpenAi.start(Some(&json!({"messages": []})), "x");
        assert_eq!(messages, vec![json!({"role": "user", "content": "x"})]);
    }

    #[test]
    fn the_nudge_is_a_user_message_of_its_own() {
        let mut messages = OpenAi.tool_results(vec![result("a", ToolOutput::Done("x".into()))]);
        OpenAi.nudge(&mut messages, "hurry");
        assert_eq!(messages[1], json!({"role": "user", "content": "hurry"}));
    }
}
