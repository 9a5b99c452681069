//! The Anthropic Messages API wire format.

use super::llm::{LlmError, LlmSettings};
use super::provider::{ChatApi, Endpoint, Reply, Tokens, ToolCall, ToolOutput, ToolResult};
use crate::tools::ToolDef;
use serde_json::{json, Value};
use shared::messages::LlmConfig;

const SYSTEM: &str = "You are a coding agent working in a sandboxed repository. Use the tools to \
inspect it. When you are done, call the `submit` tool with your final answer.";

/// The Messages API: the system prompt beside the messages, content as blocks, every tool
/// result of a turn in one user message.
pub struct Anthropic;

impl ChatApi for Anthropic {
    const NAME: &'static str = "anthropic";
    const TOOL_NOUN: &'static str = "tool";

    fn endpoint(&self, settings: &LlmSettings) -> Result<Endpoint, LlmError> {
        let key = settings
            .anthropic_api_key
            .clone()
            .ok_or(LlmError::NoKey("ANTHROPIC_API_KEY"))?;
        Ok(Endpoint {
            url: format!(
                "{}/v1/messages",
                settings.anthropic_base_url.trim_end_matches('/')
            ),
            headers: vec![
                ("x-api-key", key),
                ("anthropic-version", "2023-06-01".to_string()),
            ],
        })
    }

    /// The conversation so far (a continued session) plus the new prompt. A trailing assistant
    /// turn with tool calls (the earlier `submit`) gets its tool results first, as the API
    /// requires.
    fn start(&self, prior: Option<&Value>, prompt: &str) -> Vec<Value> {
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

    fn request(&self, cfg: &LlmConfig, tools: &[ToolDef], messages: &[Value]) -> Value {
        let tools: Vec<Value> = tools
            .iter()
            .map(
                |d| json!({"name": d.name, "description": d.description, "input_schema": d.schema}),
            )
            .collect();
        json!({
            "model": cfg.model,
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
            "system": SYSTEM,
            "tools": tools,
            "messages": messages,
        })
    }

    fn usage(&self, body: &Value) -> Tokens {
        Tokens {
            input: body.pointer("/usage/input_tokens").and_then(Value::as_u64),
            output: body.pointer("/usage/output_tokens").and_then(Value::as_u64),
        }
    }

    /// The content blocks: `tool_use` blocks are the calls, every block's `text` the answer.
    fn parse(&self, body: &Value) -> Result<Reply, LlmError> {
        let content = body
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
            stop_reason: body
                .get("stop_reason")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }

    /// One user message of `tool_result` blocks, failures and refusals flagged `is_error`.
    fn tool_results(&self, results: Vec<ToolResult>) -> Vec<Value> {
        let blocks: Vec<Value> = results
            .into_iter()
            .map(|r| {
                let (text, is_error) = match r.output {
                    ToolOutput::Done(text) => (text, false),
                    ToolOutput::Failed(e) | ToolOutput::Refused(e) => (e, true),
                };
                json!({"type": "tool_result", "tool_use_id": r.id, "content": text, "is_error": is_error})
            })
            .collect();
        vec![json!({"role": "user", "content": blocks})]
    }

    fn user_text(&self, text: String) -> Value {
        json!({"role": "user", "content": text})
    }

    /// Added to the last user message (a text block, or a paragraph of its text): the API
    /// wants user and assistant turns to alternate.
    fn nudge(&self, messages: &mut Vec<Value>, text: &str) {
        if let Some(last) = messages.last_mut().filter(|m| m["role"] == "user") {
            match last["content"].as_array_mut() {
                Some(blocks) => blocks.push(json!({"type": "text", "text": text})),
                None => {
                    let earlier = last["content"].as_str().unwrap_or_default().to_string();
                    last["content"] = json!(format!("{earlier}\n\n{text}"));
                }
            }
        }
    }

    fn transcript(&self, model: &str, messages: Vec<Value>) -> Value {
        json!({"api": Self::NAME, "model": model, "system": SYSTEM, "messages": messages})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::chat::read_reply;
    use crate::agent::llm::tests::{arb_json, arb_text, cases, timed, CASE_LIMIT};
    use crate::agent::NUDGE;
    use proptest::prelude::*;
    use shared::messages::Usage;

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

    fn cfg() -> LlmConfig {
        LlmConfig {
            model: "claude-x".into(),
            temperature: 0.25,
            max_tokens: 99,
            max_turns: 3,
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
            let (reply, took) = timed(|| read_reply(&Anthropic, &resp, &mut usage));
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
            let messages = Anthropic.start(Some(&prior), &prompt);
            prop_assert!(messages.last().is_some_and(|m| m["role"] == "user"));
        }

        #[test]
        fn any_conversation_is_nudged_without_panicking(
            messages in prop::collection::vec(arb_json(), 0..4),
        ) {
            let mut nudged = messages.clone();
            Anthropic.nudge(&mut nudged, NUDGE);
            prop_assert_eq!(nudged.len(), messages.len());
        }
    }

    #[test]
    fn tool_uses_and_text_are_read_from_the_content() {
        let mut usage = Usage::default();
        let resp = json!({"content": [
            {"type": "text", "text": "let me look"},
            {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a.py"}},
        ], "stop_reason": "tool_use", "usage": {"input_tokens": 7, "output_tokens": 3}});
        let reply = read_reply(&Anthropic, &resp, &mut usage).unwrap();
        assert_eq!(reply.text, "let me look");
        assert_eq!(reply.calls[0].name, "read_file");
        assert_eq!(reply.calls[0].input, Ok(json!({"path": "a.py"})));
        assert_eq!(reply.stop_reason.as_deref(), Some("tool_use"));
        assert_eq!(
            reply.turn,
            json!({"role": "assistant", "content": resp["content"]})
        );
        assert_eq!((usage.input_tokens, usage.output_tokens), (7, 3));
        assert!(read_reply(
            &Anthropic,
            &json!({"usage": {"input_tokens": 1}}),
            &mut usage
        )
        .is_err());
        assert_eq!(
            usage.input_tokens, 8,
            "a malformed reply's tokens still count"
        );
    }

    #[test]
    fn malformed_replies_are_errors_or_empty_never_panics() {
        for body in [
            json!(null),
            json!([]),
            json!({"content": "text"}),
            json!({"content": {}}),
        ] {
            assert!(
                matches!(Anthropic.parse(&body), Err(LlmError::Malformed(_))),
                "{body}"
            );
            assert_eq!(Anthropic.usage(&body), Tokens::default());
        }
        // Blocks of any shape: a tool_use without id, name or input is a call with empty
        // fields and a null input; other values are kept in the turn and ignored.
        let body = json!({"content": [7, null, {"type": "tool_use"}, {"text": 3}],
            "stop_reason": 1, "usage": {"input_tokens": "9", "output_tokens": -1}});
        let reply = Anthropic.parse(&body).unwrap();
        assert_eq!(
            reply.calls,
            vec![ToolCall {
                id: String::new(),
                name: String::new(),
                input: Ok(Value::Null)
            }]
        );
        assert_eq!((reply.text.as_str(), reply.stop_reason), ("", None));
        assert_eq!(Anthropic.usage(&body), Tokens::default());
    }

    #[test]
    fn the_endpoint_needs_the_key_and_trims_the_base_url() {
        let mut settings = LlmSettings {
            anthropic_base_url: "http://llm.test/".into(),
            ..LlmSettings::default()
        };
        assert!(matches!(
            Anthropic.endpoint(&settings),
            Err(LlmError::NoKey("ANTHROPIC_API_KEY"))
        ));
        settings.anthropic_api_key = Some("k".into());
        assert_eq!(
            Anthropic.endpoint(&settings).unwrap(),
            Endpoint {
                url: "http://llm.test/v1/messages".into(),
                headers: vec![
                    ("x-api-key", "k".into()),
                    ("anthropic-version", "2023-06-01".into())
                ],
            }
        );
    }

    #[test]
    fn the_request_carries_the_system_prompt_and_the_tools_as_input_schemas() {
        let tools = [ToolDef {
            name: "submit",
            description: "d",
            schema: json!({"type": "object"}),
        }];
        let messages = [json!({"role": "user", "content": "hi"})];
        let body = Anthropic.request(&cfg(), &tools, &messages);
        assert_eq!(
            body,
            json!({"model": "claude-x", "max_tokens": 99, "temperature": 0.25,
                "system": SYSTEM,
                "tools": [{"name": "submit", "description": "d",
                    "input_schema": {"type": "object"}}],
                "messages": messages})
        );
    }

    #[test]
    fn a_turns_tool_results_are_one_user_message_flagging_errors() {
        let results = vec![
            ToolResult {
                id: "a".into(),
                output: ToolOutput::Done("out".into()),
            },
            ToolResult {
                id: "b".into(),
                output: ToolOutput::Failed("no such file".into()),
            },
            ToolResult {
                id: "c".into(),
                output: ToolOutput::Refused("breaks the schema".into()),
            },
        ];
        assert_eq!(
            Anthropic.tool_results(results),
            vec![json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "a", "content": "out", "is_error": false},
                {"type": "tool_result", "tool_use_id": "b", "content": "no such file",
                    "is_error": true},
                {"type": "tool_result", "tool_use_id": "c", "content": "breaks the schema",
                    "is_error": true},
            ]})]
        );
    }

    #[test]
    fn a_fresh_conversation_is_the_prompt_and_a_continued_one_answers_the_submit() {
        assert_eq!(
            Anthropic.start(None, "go"),
            vec![json!({"role": "user", "content": "go"})]
        );
        let prior = Anthropic.transcript(
            "m",
            vec![
                json!({"role": "user", "content": "go"}),
                json!({"role": "assistant", "content": [
                    {"type": "text", "text": "done"},
                    {"type": "tool_use", "id": "t9", "name": "submit", "input": {}},
                ]}),
            ],
        );
        assert_eq!(prior["api"], "anthropic");
        assert_eq!(prior["system"], SYSTEM);
        let messages = Anthropic.start(Some(&prior), "more");
        assert_eq!(messages.len(), 3);
        assert_eq!(
            messages[2],
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t9", "content": "accepted"},
                {"type": "text", "text": "more"},
            ]})
        );
    }

    #[test]
    fn the_nudge_joins_the_last_user_message() {
        let mut messages = vec![Anthropic.user_text("go".into())];
        Anthropic.nudge(&mut messages, "hurry");
        assert_eq!(
            messages,
            vec![json!({"role": "user", "content": "go\n\nhurry"})]
        );
        let mut messages = Anthropic.tool_results(vec![ToolResult {
            id: "a".into(),
            output: ToolOutput::Done("out".into()),
        }]);
        Anthropic.nudge(&mut messages, "hurry");
        assert_eq!(
            messages[0]["content"][1],
            json!({"type": "text", "text": "hurry"})
        );
        let mut messages = vec![json!({"role": "assistant", "content": "x"})];
        Anthropic.nudge(&mut messages, "hurry");
        assert_eq!(messages, vec![json!({"role": "assistant", "content": "x"})]);
    }
}
