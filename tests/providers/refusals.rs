//! The strict fake refuses each request that breaks a provider rule, in the provider's error
//! shape and status, and consumes no scripted reply for it (so the fake cannot silently
//! become kind). The requests start from a valid one and break one rule each.

use fleet_tests::fake_llm::{FakeLlm, ScriptedReply};
use serde_json::{json, Value};

pub const CLAUDE: &str = "claude-haiku-4-5";
pub const GPT: &str = "gpt-4o-mini";

/// Posts `body` to the fake's Messages API (`anthropic`) or chat completions; status and body.
pub async fn post(fake: &FakeLlm, anthropic: bool, body: &Value) -> anyhow::Result<(u16, Value)> {
    let client = reqwest::Client::new();
    let req = if anthropic {
        client
            .post(format!("{}/v1/messages", fake.base_url))
            .header("x-api-key", "k")
            .header("anthropic-version", "2023-06-01")
    } else {
        client
            .post(format!("{}/v1/chat/completions", fake.base_url))
            .bearer_auth("k")
    };
    let resp = req.json(body).send().await?;
    let status = resp.status().as_u16();
    Ok((status, resp.json().await.unwrap_or(Value::Null)))
}

fn tool(name: &str, schema: Value) -> Value {
    json!({"name": name, "description": "d", "input_schema": schema})
}

fn anthropic_ok() -> Value {
    json!({
        "model": CLAUDE, "max_tokens": 1024, "temperature": 0.0, "system": "s",
        "tools": [tool("submit", json!({"type": "object", "properties": {"a": {"type": "string"}}}))],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "submit", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "no", "is_error": true},
                {"type": "text", "text": "again"}]},
        ],
    })
}

fn openai_function(name: &str, parameters: Value) -> Value {
    json!({"type": "function", "function": {"name": name, "description": "d", "parameters": parameters}})
}

fn openai_ok() -> Value {
    json!({
        "model": GPT, "max_tokens": 1024, "temperature": 0.0,
        "tools": [openai_function("submit", json!({"type": "object"}))],
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "submit", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "no"},
        ],
    })
}

/// Each case: a name, the body, the status and the text the error message must hold.
type Case = (&'static str, Value, u16, &'static str);

fn anthropic_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut with = |name, edit: &dyn Fn(&mut Value), status, text| {
        let mut b = anthropic_ok();
        edit(&mut b);
        cases.push((name, b, status, text));
    };
    with(
        "unknown model",
        &|b| b["model"] = json!("claude-x"),
        404,
        "model: claude-x",
    );
    with(
        "no max_tokens",
        &|b| {
            b.as_object_mut().unwrap().remove("max_tokens");
        },
        400,
        "max_tokens",
    );
    with(
        "max_tokens past the ceiling",
        &|b| b["max_tokens"] = json!(64_001),
        400,
        "64001 > 64000",
    );
    with(
        "temperature above 1",
        &|b| b["temperature"] = json!(1.5),
        400,
        "temperature",
    );
    with(
        "tool name with a dot",
        &|b| b["tools"][0]["name"] = json!("a.b"),
        400,
        "tools.0.custom.name",
    );
    with(
        "tool name of 65",
        &|b| b["tools"][0]["name"] = json!("x".repeat(65)),
        400,
        "tools.0.custom.name",
    );
    with(
        "repeated tool name",
        &|b| {
            b["tools"] = json!([
                tool("a", json!({"type": "object"})),
                tool("a", json!({"type": "object"}))
            ])
        },
        400,
        "unique",
    );
    with(
        "schema not an object",
        &|b| b["tools"][0]["input_schema"] = json!({"type": "array"}),
        400,
        "input_schema.type",
    );
    with(
        "top-level oneOf",
        &|b| b["tools"][0]["input_schema"]["oneOf"] = json!([{}, {}]),
        400,
        "does not support oneOf, allOf, or anyOf at the top level",
    );
    with(
        "top-level allOf",
        &|b| b["tools"][0]["input_schema"]["allOf"] = json!([{}]),
        400,
        "does not support oneOf, allOf, or anyOf at the top level",
    );
    with(
        "top-level anyOf",
        &|b| b["tools"][0]["input_schema"]["anyOf"] = json!([{}]),
        400,
        "does not support oneOf, allOf, or anyOf at the top level",
    );
    with(
        "invalid json schema",
        &|b| b["tools"][0]["input_schema"]["properties"] = json!({"a": {"type": 5}}),
        400,
        "JSON schema is invalid",
    );
    with(
        "system role message",
        &|b| b["messages"][0]["role"] = json!("system"),
        400,
        "messages.0.role",
    );
    with(
        "system not text",
        &|b| b["system"] = json!([{"type": "image"}]),
        400,
        "system",
    );
    with(
        "tool_use in a user message",
        &|b| {
            b["messages"][0]["content"] =
                json!([{"type": "tool_use", "id": "x", "name": "a", "input": {}}])
        },
        400,
        "messages.0.content.0.type",
    );
    with(
        "empty text block",
        &|b| b["messages"][2]["content"][1]["text"] = json!(""),
        400,
        "non-empty",
    );
    with(
        "text before tool_result",
        &|b| {
            let c = b["messages"][2]["content"].as_array_mut().unwrap();
            c.reverse();
        },
        400,
        "tool_result blocks must come first",
    );
    with(
        "tool_use unanswered",
        &|b| {
            b["messages"].as_array_mut().unwrap().pop();
        },
        400,
        "without `tool_result` blocks immediately after",
    );
    with(
        "tool_result answering nothing",
        &|b| {
            let c = b["messages"][2]["content"].as_array_mut().unwrap();
            c.insert(
                1,
                json!({"type": "tool_result", "tool_use_id": "t9", "content": "?"}),
            );
        },
        400,
        "unexpected `tool_use_id`",
    );
    cases
}

fn openai_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut with = |name, edit: &dyn Fn(&mut Value), status, text| {
        let mut b = openai_ok();
        edit(&mut b);
        cases.push((name, b, status, text));
    };
    with(
        "unknown model",
        &|b| b["model"] = json!("gpt-x"),
        404,
        "does not exist",
    );
    with(
        "max_tokens past the ceiling",
        &|b| b["max_tokens"] = json!(16_385),
        400,
        "supports at most 16384 completion tokens",
    );
    with(
        "max_tokens to a reasoning model",
        &|b| {
            b["model"] = json!("gpt-5-mini");
            b.as_object_mut().unwrap().remove("temperature");
        },
        400,
        "Use 'max_completion_tokens' instead",
    );
    with(
        "temperature to a reasoning model",
        &|b| {
            b["model"] = json!("gpt-5-mini");
            b.as_object_mut().unwrap().remove("max_tokens");
        },
        400,
        "Only the default (1) value is supported",
    );
    with(
        "temperature above 2",
        &|b| b["temperature"] = json!(2.5),
        400,
        "temperature",
    );
    with(
        "129 tools",
        &|b| {
            b["tools"] = json!((0..129)
                .map(|i| openai_function(&format!("t{i}"), json!({"type": "object"})))
                .collect::<Vec<_>>())
        },
        400,
        "maximum length 128",
    );
    with(
        "tool name with a space",
        &|b| b["tools"][0]["function"]["name"] = json!("a b"),
        400,
        "function.name",
    );
    with(
        "parameters without type object",
        &|b| b["tools"][0]["function"]["parameters"] = json!({"oneOf": []}),
        400,
        "schema must be a JSON Schema of 'type: \"object\"'",
    );
    with(
        "unknown role",
        &|b| b["messages"][1]["role"] = json!("human"),
        400,
        "invalid value: 'human'",
    );
    with(
        "tool call unanswered",
        &|b| {
            b["messages"].as_array_mut().unwrap().pop();
        },
        400,
        "must be followed by tool messages",
    );
    with(
        "tool message answering nothing",
        &|b| b["messages"][3]["tool_call_id"] = json!("c9"),
        400,
        "must be a response to a preceding message",
    );
    cases
}

#[tokio::test]
async fn the_valid_requests_pass_both_providers() -> anyhow::Result<()> {
    let fake = FakeLlm::start(vec![ScriptedReply::text("{}"), ScriptedReply::text("{}")]).await?;
    assert_eq!(post(&fake, true, &anthropic_ok()).await?.0, 200);
    assert_eq!(post(&fake, false, &openai_ok()).await?.0, 200);
    Ok(())
}

#[tokio::test]
async fn the_fake_refuses_each_broken_anthropic_rule_in_the_api_shape() -> anyhow::Result<()> {
    let fake = FakeLlm::start(vec![ScriptedReply::text("{}")]).await?;
    for (name, body, status, text) in anthropic_cases() {
        let (got, resp) = post(&fake, true, &body).await?;
        assert_eq!(got, status, "{name}: {resp}");
        assert_eq!(resp["type"], "error", "{name}: {resp}");
        let kind = if status == 404 {
            "not_found_error"
        } else {
            "invalid_request_error"
        };
        assert_eq!(resp["error"]["type"], kind, "{name}: {resp}");
        let message = resp["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(text), "{name}: {message}");
    }
    assert_eq!(fake.remaining(), 1, "a refused request consumed a reply");
    Ok(())
}

#[tokio::test]
async fn the_fake_refuses_each_broken_openai_rule_in_the_api_shape() -> anyhow::Result<()> {
    let fake = FakeLlm::start(vec![ScriptedReply::text("{}")]).await?;
    for (name, body, status, text) in openai_cases() {
        let (got, resp) = post(&fake, false, &body).await?;
        assert_eq!(got, status, "{name}: {resp}");
        assert_eq!(
            resp["error"]["type"], "invalid_request_error",
            "{name}: {resp}"
        );
        assert!(resp["error"].get("param").is_some() && resp["error"].get("code").is_some());
        let message = resp["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(text), "{name}: {message}");
    }
    assert_eq!(fake.remaining(), 1, "a refused request consumed a reply");
    Ok(())
}

#[tokio::test]
async fn a_body_past_32_mb_is_413_request_too_large_for_anthropic() -> anyhow::Result<()> {
    let fake = FakeLlm::start(vec![]).await?;
    let mut body = anthropic_ok();
    body["messages"][0]["content"] = json!("x".repeat(33 * 1024 * 1024));
    let (status, resp) = post(&fake, true, &body).await?;
    assert_eq!(status, 413, "{resp}");
    assert_eq!(resp["error"]["type"], "request_too_large");
    Ok(())
}

#[tokio::test]
async fn throttles_and_overloads_carry_the_providers_shape_and_retry_after() -> anyhow::Result<()> {
    let mut overloaded = ScriptedReply::throttled(3);
    if let fleet_tests::fake_llm::Reply::Error { status, .. } = &mut overloaded.reply {
        *status = 529;
    }
    let fake = FakeLlm::start(vec![ScriptedReply::throttled(2), overloaded]).await?;
    let client = reqwest::Client::new();
    for (status, kind, after) in [
        (429, "rate_limit_error", "2"),
        (529, "overloaded_error", "3"),
    ] {
        let resp = client
            .post(format!("{}/v1/messages", fake.base_url))
            .header("x-api-key", "k")
            .header("anthropic-version", "2023-06-01")
            .json(&anthropic_ok())
            .send()
            .await?;
        assert_eq!(resp.status().as_u16(), status);
        assert_eq!(resp.headers()["retry-after"], after);
        let body: Value = resp.json().await?;
        assert_eq!(body["error"]["type"], kind, "{body}");
    }
    Ok(())
}
