//! Exercises the fake LLM server over real HTTP on 127.0.0.1.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fleet_tests::fake_llm::{FakeLlm, Reply, ScriptedReply};
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

const MODEL: &str = "claude-test-model";

struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Value,
}

async fn send(request: reqwest::RequestBuilder, body: &Value) -> anyhow::Result<Answer> {
    let response = request.json(body).send().await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}

async fn anthropic(fake: &FakeLlm, body: &Value) -> anyhow::Result<Answer> {
    let request = reqwest::Client::new()
        .post(format!("{}/v1/messages", fake.base_url))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01");
    send(request, body).await
}

async fn openai(fake: &FakeLlm, body: &Value) -> anyhow::Result<Answer> {
    let request = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", fake.base_url))
        .bearer_auth("sk-test");
    send(request, body).await
}

fn anthropic_request(messages: Value) -> Value {
    json!({ "model": MODEL, "max_tokens": 1024, "messages": messages })
}

fn openai_request(messages: Value) -> Value {
    json!({ "model": "gpt-test", "messages": messages })
}

fn user(text: &str) -> Value {
    json!({ "role": "user", "content": text })
}

fn statuses(fake: &FakeLlm) -> Vec<u16> {
    fake.requests().iter().map(|r| r.status).collect()
}

#[tokio::test]
async fn anthropic_two_turn_tool_use_conversation() -> anyhow::Result<()> {
    let fake = FakeLlm::start(vec![
        ScriptedReply::tool_use("read_file", json!({ "path": "src/lib.rs" })).with_usage(12, 7),
        ScriptedReply::text("the file is empty"),
    ])
    .await?;

    let first = anthropic(&fake, &anthropic_request(json!([user("read it")]))).await?;
    assert_eq!(first.status, 200);
    let body = &first.body;
    assert!(body["id"].as_str().is_some_and(|id| id.starts_with("msg_")));
    assert_eq!(body["type"], "message");
    assert_eq!(body["role"], "assistant");
    assert_eq!(body["model"], MODEL);
    assert_eq!(body["stop_reason"], "tool_use");
    assert_eq!(body["stop_sequence"], Value::Null);
    assert_eq!(
        body["usage"],
        json!({ "input_tokens": 12, "output_tokens": 7 })
    );
    let tool_use = body["content"]
        .as_array()
        .and_then(|blocks| blocks.iter().find(|b| b["type"] == "tool_use"))
        .cloned()
        .expect("a tool_use block");
    let tool_id = tool_use["id"].as_str().expect("tool_use id").to_string();
    assert!(tool_id.starts_with("toolu_"));
    assert_eq!(tool_use["name"], "read_file");
    assert_eq!(tool_use["input"], json!({ "path": "src/lib.rs" }));

    let messages = json!([
        user("read it"),
        { "role": "assistant", "content": body["content"] },
        { "role": "user", "content": [
            { "type": "tool_result", "tool_use_id": tool_id, "content": "" }
        ] },
    ]);
    let second = anthropic(&fake, &anthropic_request(messages)).await?;
    assert_eq!(second.status, 200);
    assert_eq!(second.body["stop_reason"], "end_turn");
    assert_eq!(
        second.body["content"],
        json!([{ "type": "text", "text": "the file is empty" }])
    );
    assert_eq!(
        second.body["usage"],
        json!({ "input_tokens": 100, "output_tokens": 50 })
    );
    assert_ne!(second.body["id"], body["id"]);

    assert_eq!(fake.remaining(), 0);
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests.iter().all(|r| r.path == "/v1/messages"));
    assert_eq!(statuses(&fake), vec![200, 200]);
    assert_eq!(requests[0].header("x-api-key"), Some("sk-ant-test"));
    assert_eq!(
        requests[1].body["messages"][2]["content"][0]["tool_use_id"],
        tool_id
    );
    Ok(())
}

#[tokio::test]
async fn openai_tool_calls_with_string_arguments() -> anyhow::Result<()> {
    let input = json!({ "cmd": "ls", "args": ["-l"] });
    let fake = FakeLlm::start(vec![
        ScriptedReply::tool_use("run", input.clone()).with_usage(7, 3),
        ScriptedReply::text("two files"),
    ])
    .await?;

    let first = openai(&fake, &openai_request(json!([user("list")]))).await?;
    assert_eq!(first.status, 200);
    let body = &first.body;
    assert!(body["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("chatcmpl-")));
    assert_eq!(body["object"], "chat.completion");
    assert!(body["created"].as_u64().is_some_and(|t| t > 1_600_000_000));
    assert_eq!(body["model"], "gpt-test");
    assert_eq!(
        body["usage"],
        json!({ "prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10 })
    );
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    let call_id = call["id"].as_str().expect("call id").to_string();
    assert!(call_id.starts_with("call_"));
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "run");
    let arguments = call["function"]["arguments"]
        .as_str()
        .expect("arguments is a json string");
    assert_eq!(serde_json::from_str::<Value>(arguments)?, input);

    let messages = json!([
        { "role": "system", "content": "be brief" },
        user("list"),
        choice["message"],
        { "role": "tool", "tool_call_id": call_id, "content": "a\nb" },
    ]);
    let second = openai(&fake, &openai_request(messages)).await?;
    assert_eq!(second.status, 200);
    let choice = &second.body["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["message"]["content"], "two files");
    assert!(choice["message"].get("tool_calls").is_none());

    assert_eq!(fake.remaining(), 0);
    let requests = fake.requests();
    assert!(requests.iter().all(|r| r.path == "/v1/chat/completions"));
    assert_eq!(requests[0].header("authorization"), Some("Bearer sk-test"));
    Ok(())
}

#[tokio::test]
async fn rate_limit_with_retry_after_then_success() -> anyhow::Result<()> {
    let fake = FakeLlm::start(vec![
        ScriptedReply::error(429),
        ScriptedReply::text("hello"),
        ScriptedReply::error(429),
    ])
    .await?;
    let request = anthropic_request(json!([user("hi")]));

    let limited = anthropic(&fake, &request).await?;
    assert_eq!(limited.status, 429);
    assert_eq!(
        limited.headers.get("retry-after").map(|v| v.as_bytes()),
        Some(&b"0"[..])
    );
    assert_eq!(limited.body["type"], "error");
    assert_eq!(limited.body["error"]["type"], "rate_limit_error");
    assert!(limited.body["error"]["message"].is_string());

    let retried = anthropic(&fake, &request).await?;
    assert_eq!(retried.status, 200);
    assert_eq!(retried.body["content"][0]["text"], "hello");

    let openai_limited = openai(&fake, &openai_request(json!([user("hi")]))).await?;
    assert_eq!(openai_limited.status, 429);
    assert!(openai_limited.headers.contains_key("retry-after"));
    assert_eq!(openai_limited.body["error"]["type"], "rate_limit_exceeded");
    assert_eq!(openai_limited.body["error"]["param"], Value::Null);
    assert_eq!(openai_limited.body["error"]["code"], Value::Null);

    assert_eq!(statuses(&fake), vec![429, 200, 429]);
    Ok(())
}

#[tokio::test]
async fn overloaded_and_server_errors() -> anyhow::Result<()> {
    let fake = FakeLlm::start(vec![
        ScriptedReply::error(529),
        ScriptedReply::error(529),
        ScriptedReply::error(500),
    ])
    .await?;

    let overloaded = anthropic(&fake, &anthropic_request(json!([user("hi")]))).await?;
    assert_eq!(overloaded.status, 529);
    assert_eq!(overloaded.body["type"], "error");
    assert_eq!(overloaded.body["error"]["type"], "overloaded_error");
    assert!(overloaded.headers.get("retry-after").is_none());

    let openai_overloaded = openai(&fake, &openai_request(json!([user("hi")]))).await?;
    assert_eq!(openai_overloaded.status, 529);
    assert_eq!(openai_overloaded.body["error"]["type"], "server_error");

    let failed = anthropic(&fake, &anthropic_request(json!([user("hi")]))).await?;
    assert_eq!(failed.status, 500);
    assert_eq!(failed.body["error"]["type"], "api_error");
    assert_eq!(fake.remaining(), 0);
    Ok(())
}

#[tokio::test]
async fn missing_key_is_401_and_consumes_nothing() -> anyhow::Result<()> {
    let fake = FakeLlm::start(vec![ScriptedReply::text("unused")]).await?;
    let client = reqwest::Client::new();

    let no_key = client
        .post(format!("{}/v1/messages", fake.base_url))
        .header("anthropic-version", "2023-06-01");
    let answer = send(no_key, &anthropic_request(json!([user("hi")]))).await?;
    assert_eq!(answer.status, 401);
    assert_eq!(answer.body["type"], "error");
    assert_eq!(answer.body["error"]["type"], "authentication_error");

    let no_bearer = client
        .post(format!("{}/v1/chat/completions", fake.base_url))
        .header("authorization", "sk-test");
    let answer = send(no_bearer, &openai_request(json!([user("hi")]))).await?;
    assert_eq!(answer.status, 401);
    assert_eq!(answer.body["error"]["type"], "authentication_error");

    let no_version = client
        .post(format!("{}/v1/messages", fake.base_url))
        .header("x-api-key", "sk-ant-test");
    let answer = send(no_version, &anthropic_request(json!([user("hi")]))).await?;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.body["error"]["type"], "invalid_request_error");

    assert_eq!(fake.remaining(), 1);
    assert_eq!(statuses(&fake), vec![401, 401, 400]);
    Ok(())
}

#[tokio::test]
async fn missing_fields_are_400() -> anyhow::Result<()> {
    let fake = FakeLlm::start(vec![ScriptedReply::text("unused")]).await?;

    let no_model = json!({ "max_tokens": 10, "messages": [user("hi")] });
    let answer = anthropic(&fake, &no_model).await?;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.body["error"]["type"], "invalid_request_error");
    assert!(answer.body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("model")));

    let no_messages = json!({ "model": MODEL, "max_tokens": 10 });
    assert_eq!(anthropic(&fake, &no_messages).await?.status, 400);

    let answer = openai(&fake, &json!({ "model": "gpt-test" })).await?;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.body["error"]["type"], "invalid_request_error");
    assert!(answer.body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("messages")));

    let answer = openai(&fake, &json!({ "messages": [user("hi")] })).await?;
    assert_eq!(answer.status, 400);

    assert_eq!(fake.remaining(), 1);
    assert_eq!(statuses(&fake), vec![400, 400, 400, 400]);
    Ok(())
}

#[tokio::test]
async fn unanswered_tool_use_is_400_and_consumes_nothing() -> anyhow::Result<()> {
    let fake = FakeLlm::start(vec![ScriptedReply::text("finally")]).await?;
    let tool_use = json!({
        "role": "assistant",
        "content": [
            { "type": "text", "text": "let me look" },
            { "type": "tool_use", "id": "toolu_abc", "name": "read_file", "input": {} }
        ]
    });

    let broken = anthropic_request(json!([user("go"), tool_use, user("and?")]));
    let answer = anthropic(&fake, &broken).await?;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.body["type"], "error");
    assert_eq!(answer.body["error"]["type"], "invalid_request_error");
    assert!(answer.body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("toolu_abc")));
    assert_eq!(fake.remaining(), 1);

    let orphan = anthropic_request(json!([
        user("go"),
        { "role": "assistant", "content": "ok" },
        { "role": "user", "content": [
            { "type": "tool_result", "tool_use_id": "toolu_zzz", "content": "x" }
        ] },
    ]));
    assert_eq!(anthropic(&fake, &orphan).await?.status, 400);

    let openai_broken = openai_request(json!([
        user("go"),
        { "role": "assistant", "content": null, "tool_calls": [
            { "id": "call_1", "type": "function",
              "function": { "name": "run", "arguments": "{}" } }
        ] },
        user("and?"),
    ]));
    let answer = openai(&fake, &openai_broken).await?;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.body["error"]["type"], "invalid_request_error");
    assert!(answer.body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("call_1")));
    assert_eq!(fake.remaining(), 1);

    let fixed = anthropic_request(json!([
        user("go"),
        tool_use,
        { "role": "user", "content": [
            { "type": "tool_result", "tool_use_id": "toolu_abc", "content": "x" },
            { "type": "text", "text": "and?" }
        ] },
    ]));
    let answer = anthropic(&fake, &fixed).await?;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body["content"][0]["text"], "finally");
    assert_eq!(statuses(&fake), vec![400, 400, 400, 200]);
    Ok(())
}

#[tokio::test]
async fn exhausted_script_is_500() -> anyhow::Result<()> {
    let fake = FakeLlm::start(vec![ScriptedReply::text("only one")]).await?;
    let request = anthropic_request(json!([user("hi")]));
    assert_eq!(anthropic(&fake, &request).await?.status, 200);

    let exhausted = anthropic(&fake, &request).await?;
    assert_eq!(exhausted.status, 500);
    assert_eq!(exhausted.body["error"]["type"], "api_error");
    assert!(exhausted.body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("exhausted")));

    let exhausted = openai(&fake, &openai_request(json!([user("hi")]))).await?;
    assert_eq!(exhausted.status, 500);
    assert_eq!(exhausted.body["error"]["type"], "server_error");
    assert!(exhausted.body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("exhausted")));
    assert_eq!(statuses(&fake), vec![200, 500, 500]);
    Ok(())
}

#[tokio::test]
async fn one_queue_is_shared_by_both_apis() -> anyhow::Result<()> {
    let fake = FakeLlm::start(vec![
        ScriptedReply::text("first"),
        ScriptedReply::text("second"),
    ])
    .await?;
    let answer = openai(&fake, &openai_request(json!([user("hi")]))).await?;
    assert_eq!(answer.body["choices"][0]["message"]["content"], "first");
    let answer = anthropic(&fake, &anthropic_request(json!([user("hi")]))).await?;
    assert_eq!(answer.body["content"][0]["text"], "second");
    Ok(())
}

#[tokio::test]
async fn delay_is_applied_before_answering() -> anyhow::Result<()> {
    let delay = Duration::from_millis(300);
    let fake = FakeLlm::start_with(vec![ScriptedReply::text("late")], 0, delay).await?;
    let started = Instant::now();
    let answer = anthropic(&fake, &anthropic_request(json!([user("hi")]))).await?;
    assert_eq!(answer.status, 200);
    assert!(started.elapsed() >= delay);
    Ok(())
}

#[tokio::test]
async fn script_parses_from_json_with_default_usage() -> anyhow::Result<()> {
    let script: Vec<ScriptedReply> = serde_json::from_value(json!([
        { "reply": { "type": "tool_use", "name": "run", "input": { "cmd": "ls" } } },
        { "reply": { "type": "text", "text": "done" }, "input_tokens": 3, "output_tokens": 4 },
        { "reply": { "type": "error", "status": 429 } },
    ]))?;
    assert_eq!(
        script,
        vec![
            ScriptedReply::tool_use("run", json!({ "cmd": "ls" })),
            ScriptedReply::text("done").with_usage(3, 4),
            ScriptedReply::error(429),
        ]
    );
    assert_eq!((script[0].input_tokens, script[0].output_tokens), (100, 50));
    let round_trip = serde_json::to_value(&script[2].reply)?;
    assert_eq!(round_trip, json!({ "type": "error", "status": 429 }));
    assert!(matches!(script[1].reply, Reply::Text { .. }));
    Ok(())
}

#[tokio::test]
async fn drop_shuts_the_server_down() -> anyhow::Result<()> {
    let fake = FakeLlm::start(vec![]).await?;
    let url = format!("{}/v1/messages", fake.base_url);
    drop(fake);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let refused = reqwest::Client::new().post(&url).send().await.is_err();
        if refused {
            return Ok(());
        }
        assert!(
            Instant::now() < deadline,
            "server still answering after drop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Kills the child process when the test ends, even on failure.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn binary_serves_a_script_file() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("script.json");
    let replies = json!([{ "reply": { "type": "text", "text": "from file" } }]);
    std::fs::write(&script, replies.to_string())?;

    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_fake-llm"))
            .arg("--script")
            .arg(&script)
            .args(["--delay-ms", "1"])
            .stdout(Stdio::piped())
            .spawn()?,
    );
    let stdout = child.0.stdout.take().expect("piped stdout");
    let first_line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await??;
    let base_url = first_line
        .trim()
        .strip_prefix("listening on ")
        .expect("first line announces the address")
        .to_string();
    assert!(base_url.starts_with("http://127.0.0.1:"));

    let response = reqwest::Client::new()
        .post(format!("{base_url}/v1/messages"))
        .header("x-api-key", "k")
        .header("anthropic-version", "2023-06-01")
        .json(&anthropic_request(json!([user("hi")])))
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 200);
    let body: Value = response.json().await?;
    assert_eq!(body["content"][0]["text"], "from file");
    Ok(())
}
