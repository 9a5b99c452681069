//! Exercises the fake LLM server over real HTTP on 127.0.0.1.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fleet_tests::fake_llm::{Conversation, FakeLlm, Reply, ScriptedReply};
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

const MODEL: &str = "claude-haiku-4-5";

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
    json!({ "model": "gpt-4o-mini", "messages": messages })
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
        // The Messages API reports the prompt cache's writes and reads too (0 here).
        json!({ "input_tokens": 12, "output_tokens": 7,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0 })
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
        json!({ "input_tokens": 100, "output_tokens": 50,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0 })
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
    assert_eq!(body["model"], "gpt-4o-mini");
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

    let answer = openai(&fake, &json!({ "model": "gpt-4o-mini" })).await?;
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

// ---- conversations keyed by prompt ----

const ALPHA: &str = "[task:alpha]";
const BETA: &str = "[task:beta]";

/// Two conversations, each a tool call then a text answer.
fn two_conversations() -> Vec<Conversation> {
    vec![
        Conversation::new(
            ALPHA,
            vec![
                ScriptedReply::tool_use("read_file", json!({ "path": "alpha.txt" })),
                ScriptedReply::text("alpha done"),
            ],
        ),
        Conversation::new(
            BETA,
            vec![
                ScriptedReply::tool_use("read_file", json!({ "path": "beta.txt" })),
                ScriptedReply::text("beta done"),
            ],
        ),
    ]
}

fn conversations_of(fake: &FakeLlm) -> Vec<Option<String>> {
    fake.requests()
        .iter()
        .map(|r| r.conversation.clone())
        .collect()
}

fn error_message(answer: &Answer) -> &str {
    answer.body["error"]["message"].as_str().unwrap_or("")
}

/// The first Anthropic turn's follow-up: the tool result for the tool_use in `reply`.
fn anthropic_follow_up(first_user: &Value, reply: &Value) -> Value {
    let tool_id = reply["content"][0]["id"].clone();
    anthropic_request(json!([
        first_user,
        { "role": "assistant", "content": reply["content"] },
        { "role": "user", "content": [
            { "type": "tool_result", "tool_use_id": tool_id, "content": "contents" }
        ] },
    ]))
}

#[tokio::test]
async fn anthropic_conversations_interleave() -> anyhow::Result<()> {
    let fake = FakeLlm::start_conversations(two_conversations(), Duration::ZERO).await?;
    assert_eq!(fake.remaining(), 4);
    let alpha_user = user(&format!("you are agent {ALPHA}: read the file"));
    // content as a list of blocks: the key is looked for in their concatenated text
    let beta_user = json!({ "role": "user", "content": [
        { "type": "text", "text": "you are agent " },
        { "type": "text", "text": format!("{BETA}: read the file") },
    ] });

    let alpha_1 = anthropic(&fake, &anthropic_request(json!([alpha_user]))).await?;
    let beta_1 = anthropic(&fake, &anthropic_request(json!([beta_user]))).await?;
    assert_eq!((alpha_1.status, beta_1.status), (200, 200));
    assert_eq!(alpha_1.body["content"][0]["input"]["path"], "alpha.txt");
    assert_eq!(beta_1.body["content"][0]["input"]["path"], "beta.txt");

    let alpha_2 = anthropic(&fake, &anthropic_follow_up(&alpha_user, &alpha_1.body)).await?;
    let beta_2 = anthropic(&fake, &anthropic_follow_up(&beta_user, &beta_1.body)).await?;
    assert_eq!(alpha_2.status, 200);
    assert_eq!(alpha_2.body["content"][0]["text"], "alpha done");
    assert_eq!(beta_2.status, 200);
    assert_eq!(beta_2.body["content"][0]["text"], "beta done");

    assert_eq!(fake.remaining(), 0);
    assert_eq!(fake.remaining_in(ALPHA), Some(0));
    assert_eq!(fake.remaining_in("unknown"), None);
    let alpha = Some(ALPHA.to_string());
    let beta = Some(BETA.to_string());
    assert_eq!(
        conversations_of(&fake),
        vec![alpha.clone(), beta.clone(), alpha, beta]
    );
    assert_eq!(statuses(&fake), vec![200, 200, 200, 200]);
    Ok(())
}

#[tokio::test]
async fn openai_conversations_interleave() -> anyhow::Result<()> {
    let fake = FakeLlm::start_conversations(two_conversations(), Duration::ZERO).await?;
    // the system message comes first; the key is looked for in the first user message
    let system = json!({ "role": "system", "content": format!("shared system prompt {BETA}") });
    let alpha_user = user(&format!("you are agent {ALPHA}"));
    let beta_user = json!({ "role": "user", "content": [
        { "type": "text", "text": format!("you are agent {BETA}") },
    ] });

    let alpha_1 = openai(&fake, &openai_request(json!([system, alpha_user]))).await?;
    let beta_1 = openai(&fake, &openai_request(json!([system, beta_user]))).await?;
    let path_of = |answer: &Answer| -> anyhow::Result<Value> {
        let call = &answer.body["choices"][0]["message"]["tool_calls"][0];
        let arguments = call["function"]["arguments"].as_str().unwrap_or("null");
        Ok(serde_json::from_str::<Value>(arguments)?["path"].clone())
    };
    assert_eq!((alpha_1.status, beta_1.status), (200, 200));
    assert_eq!(path_of(&alpha_1)?, "alpha.txt");
    assert_eq!(path_of(&beta_1)?, "beta.txt");

    let follow_up = |first_user: &Value, reply: &Answer| {
        let message = reply.body["choices"][0]["message"].clone();
        let call_id = message["tool_calls"][0]["id"].clone();
        openai_request(json!([
            system,
            first_user,
            message,
            { "role": "tool", "tool_call_id": call_id, "content": "contents" },
        ]))
    };
    let alpha_2 = openai(&fake, &follow_up(&alpha_user, &alpha_1)).await?;
    let beta_2 = openai(&fake, &follow_up(&beta_user, &beta_1)).await?;
    assert_eq!(
        alpha_2.body["choices"][0]["message"]["content"],
        "alpha done"
    );
    assert_eq!(beta_2.body["choices"][0]["message"]["content"], "beta done");

    assert_eq!(fake.remaining(), 0);
    let alpha = Some(ALPHA.to_string());
    let beta = Some(BETA.to_string());
    assert_eq!(
        conversations_of(&fake),
        vec![alpha.clone(), beta.clone(), alpha, beta]
    );
    Ok(())
}

#[tokio::test]
async fn parallel_conversations_get_their_own_replies() -> anyhow::Result<()> {
    let keys: Vec<String> = (0..12).map(|i| format!("<agent-{i}>")).collect();
    let convs = keys
        .iter()
        .map(|key| {
            let replies = (0..3)
                .map(|turn| ScriptedReply::text(format!("{key} turn {turn}")))
                .collect();
            Conversation::new(key.clone(), replies)
        })
        .collect();
    let fake =
        std::sync::Arc::new(FakeLlm::start_conversations(convs, Duration::from_millis(5)).await?);
    let mut tasks = Vec::new();
    for key in keys.clone() {
        let fake = fake.clone();
        tasks.push(tokio::spawn(async move {
            let mut texts = Vec::new();
            for _ in 0..3 {
                let request = anthropic_request(json!([user(&format!("hello {key}"))]));
                let answer = anthropic(&fake, &request).await?;
                texts.push(answer.body["content"][0]["text"].clone());
            }
            anyhow::Ok((key, texts))
        }));
    }
    for task in tasks {
        let (key, texts) = task.await??;
        let expected: Vec<Value> = (0..3)
            .map(|turn| json!(format!("{key} turn {turn}")))
            .collect();
        assert_eq!(texts, expected);
    }
    assert_eq!(fake.remaining(), 0);
    assert_eq!(fake.requests().len(), 36);
    Ok(())
}

#[tokio::test]
async fn unmatched_prompt_is_500_and_consumes_nothing() -> anyhow::Result<()> {
    let fake = FakeLlm::start_conversations(two_conversations(), Duration::ZERO).await?;

    let answer = anthropic(&fake, &anthropic_request(json!([user("nobody")]))).await?;
    assert_eq!(answer.status, 500);
    assert_eq!(answer.body["error"]["type"], "api_error");
    assert!(error_message(&answer).contains("no conversation matches"));

    // the key only in the system prompt or in a later message does not count
    let request = openai_request(json!([
        { "role": "system", "content": ALPHA },
        user("nobody"),
        { "role": "assistant", "content": "who?" },
        user(ALPHA),
    ]));
    let answer = openai(&fake, &request).await?;
    assert_eq!(answer.status, 500);
    assert_eq!(answer.body["error"]["type"], "server_error");
    assert!(error_message(&answer).contains("no conversation matches"));

    // a request of a known conversation that fails validation consumes nothing either
    let broken = anthropic_request(json!([
        user(ALPHA),
        { "role": "assistant", "content": [
            { "type": "tool_use", "id": "toolu_x", "name": "read_file", "input": {} }
        ] },
        user("and?"),
    ]));
    assert_eq!(anthropic(&fake, &broken).await?.status, 400);

    assert_eq!(fake.remaining(), 4);
    assert_eq!(fake.remaining_in(ALPHA), Some(2));
    assert_eq!(statuses(&fake), vec![500, 500, 400]);
    assert_eq!(conversations_of(&fake), vec![None, None, None]);
    Ok(())
}

#[tokio::test]
async fn unmatched_prompt_falls_back_to_the_shared_queue() -> anyhow::Result<()> {
    let fake = FakeLlm::start_conversations_with(
        vec![ScriptedReply::text("shared")],
        two_conversations(),
        0,
        Duration::ZERO,
    )
    .await?;
    let answer = anthropic(&fake, &anthropic_request(json!([user("nobody")]))).await?;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body["content"][0]["text"], "shared");

    let answer = anthropic(&fake, &anthropic_request(json!([user("nobody")]))).await?;
    assert_eq!(answer.status, 500);
    assert!(error_message(&answer).contains("no conversation matches"));

    let answer = anthropic(&fake, &anthropic_request(json!([user(BETA)]))).await?;
    assert_eq!(answer.body["content"][0]["input"]["path"], "beta.txt");
    assert_eq!(
        conversations_of(&fake),
        vec![None, None, Some(BETA.to_string())]
    );
    assert_eq!(fake.remaining(), 3);
    Ok(())
}

#[tokio::test]
async fn exhausted_conversation_is_500_without_taking_from_others() -> anyhow::Result<()> {
    let fake = FakeLlm::start_conversations_with(
        vec![ScriptedReply::text("shared")],
        vec![
            Conversation::new("short", vec![ScriptedReply::text("once")]),
            Conversation::new("other", vec![ScriptedReply::text("other")]),
        ],
        0,
        Duration::ZERO,
    )
    .await?;
    let request = anthropic_request(json!([user("the short one")]));
    assert_eq!(anthropic(&fake, &request).await?.status, 200);
    let exhausted = anthropic(&fake, &request).await?;
    assert_eq!(exhausted.status, 500);
    assert!(error_message(&exhausted).contains("exhausted"));
    assert!(error_message(&exhausted).contains("short"));
    assert_eq!(fake.remaining(), 2);
    assert_eq!(
        conversations_of(&fake),
        vec![Some("short".to_string()), Some("short".to_string())]
    );
    Ok(())
}

#[tokio::test]
async fn the_longest_matching_key_wins() -> anyhow::Result<()> {
    let fake = FakeLlm::start_conversations(
        vec![
            Conversation::new("task-1", vec![ScriptedReply::text("one")]),
            Conversation::new("task-10", vec![ScriptedReply::text("ten")]),
        ],
        Duration::ZERO,
    )
    .await?;
    let ten = anthropic(&fake, &anthropic_request(json!([user("do task-10")]))).await?;
    assert_eq!(ten.body["content"][0]["text"], "ten");
    let one = anthropic(&fake, &anthropic_request(json!([user("do task-1")]))).await?;
    assert_eq!(one.body["content"][0]["text"], "one");
    Ok(())
}

#[tokio::test]
async fn duplicate_or_empty_keys_are_refused_at_start() {
    let duplicate = FakeLlm::start_conversations(
        vec![
            Conversation::new("same", vec![ScriptedReply::text("a")]),
            Conversation::new("same", vec![ScriptedReply::text("b")]),
        ],
        Duration::ZERO,
    )
    .await;
    let error = duplicate.err().expect("duplicate keys are an error");
    assert!(error.to_string().contains("duplicate"), "{error}");

    let empty =
        FakeLlm::start_conversations(vec![Conversation::new("", vec![])], Duration::ZERO).await;
    assert!(empty.is_err());
}

#[tokio::test]
async fn delay_applies_to_conversations() -> anyhow::Result<()> {
    let delay = Duration::from_millis(300);
    let fake = FakeLlm::start_conversations(two_conversations(), delay).await?;
    let started = Instant::now();
    let answer = anthropic(&fake, &anthropic_request(json!([user(ALPHA)]))).await?;
    assert_eq!(answer.status, 200);
    assert!(started.elapsed() >= delay);

    let started = Instant::now();
    let unmatched = openai(&fake, &openai_request(json!([user("nobody")]))).await?;
    assert_eq!(unmatched.status, 500);
    assert!(started.elapsed() >= delay);
    Ok(())
}

#[tokio::test]
async fn conversations_parse_from_json() -> anyhow::Result<()> {
    let convs: Vec<Conversation> = serde_json::from_value(json!([
        { "key": "a", "replies": [{ "reply": { "type": "text", "text": "x" } }] },
        { "key": "b", "replies": [] },
    ]))?;
    assert_eq!(
        convs,
        vec![
            Conversation::new("a", vec![ScriptedReply::text("x")]),
            Conversation::new("b", vec![]),
        ]
    );
    Ok(())
}

#[tokio::test]
async fn binary_serves_a_conversations_file() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("conversations.json");
    std::fs::write(&path, serde_json::to_string(&two_conversations())?)?;

    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_fake-llm"))
            .arg("--conversations")
            .arg(&path)
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

    let ask = |prompt: &str| {
        reqwest::Client::new()
            .post(format!("{base_url}/v1/chat/completions"))
            .bearer_auth("k")
            .json(&openai_request(json!([user(prompt)])))
            .send()
    };
    let beta: Value = ask(BETA).await?.json().await?;
    let call = &beta["choices"][0]["message"]["tool_calls"][0]["function"];
    assert!(call["arguments"]
        .as_str()
        .is_some_and(|a| a.contains("beta.txt")));
    let alpha: Value = ask(ALPHA).await?.json().await?;
    let call = &alpha["choices"][0]["message"]["tool_calls"][0]["function"];
    assert!(call["arguments"]
        .as_str()
        .is_some_and(|a| a.contains("alpha.txt")));
    let unmatched = ask("nobody").await?;
    assert_eq!(unmatched.status().as_u16(), 500);
    Ok(())
}
