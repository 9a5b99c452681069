//! The agent loop over both wire formats, against a scripted transport and a recording
//! session: no I/O.

use super::anthropic::Anthropic;
use super::chat::{conclude, Chat, Ended, Money, Transport};
use super::llm::{LlmError, Price};
use super::openai::OpenAi;
use super::provider::{ChatApi, Endpoint};
use super::{AgentJob, NUDGE};
use crate::sandbox::{ExecOutput, Mounts, SandboxError, Session};
use crate::tools::{Journal, ToolBox, NO_RETRY};
use async_trait::async_trait;
use serde_json::{json, Value};
use shared::graph::Tool;
use shared::messages::{JobStatus, LlmConfig, Usage};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

/// A wire format as the tests write replies in it and read requests of it.
trait Wire: ChatApi {
    fn text(text: &str) -> Value;
    /// Tool calls `(id, name, input)`; a string input is sent as is (OpenAI's raw arguments).
    fn calls(calls: &[(&str, &str, Value)]) -> Value;
    /// The texts answering the last turn's tool calls in a request.
    fn results(body: &Value) -> Vec<String>;
    fn tool_names(body: &Value) -> Vec<String>;
}

fn strings<'v>(values: impl Iterator<Item = &'v Value>) -> Vec<String> {
    values
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

fn messages(body: &Value) -> &[Value] {
    body["messages"].as_array().map_or(&[], Vec::as_slice)
}

impl Wire for Anthropic {
    fn text(text: &str) -> Value {
        json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 10, "output_tokens": 1}})
    }
    fn calls(calls: &[(&str, &str, Value)]) -> Value {
        let content: Vec<Value> = calls
            .iter()
            .map(|(id, name, input)| {
                json!({"type": "tool_use", "id": id, "name": name, "input": input})
            })
            .collect();
        json!({"content": content, "stop_reason": "tool_use",
            "usage": {"input_tokens": 10, "output_tokens": 1}})
    }
    fn results(body: &Value) -> Vec<String> {
        let last = messages(body).last().cloned().unwrap_or_default();
        let blocks = last["content"].as_array().cloned().unwrap_or_default();
        strings(
            blocks
                .iter()
                .filter(|b| b["type"] == "tool_result")
                .map(|b| &b["content"]),
        )
    }
    fn tool_names(body: &Value) -> Vec<String> {
        strings(
            body["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| &t["name"]),
        )
    }
}

impl Wire for OpenAi {
    fn text(text: &str) -> Value {
        json!({"choices": [{"finish_reason": "stop",
            "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1}})
    }
    fn calls(calls: &[(&str, &str, Value)]) -> Value {
        let calls: Vec<Value> = calls
            .iter()
            .map(|(id, name, input)| {
                let arguments = input
                    .as_str()
                    .map_or_else(|| input.to_string(), str::to_string);
                json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": arguments}})
            })
            .collect();
        json!({"choices": [{"finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": null, "tool_calls": calls}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1}})
    }
    fn results(body: &Value) -> Vec<String> {
        let tail = messages(body)
            .iter()
            .rev()
            .take_while(|m| m["role"] == "tool")
            .collect::<Vec<_>>();
        strings(tail.into_iter().rev().map(|m| &m["content"]))
    }
    fn tool_names(body: &Value) -> Vec<String> {
        strings(
            body["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| &t["function"]["name"]),
        )
    }
}

/// Answers with the scripted replies in turn (a 500 once they run out); keeps every body.
#[derive(Default)]
struct Scripted {
    replies: Mutex<VecDeque<Result<Value, LlmError>>>,
    bodies: Mutex<Vec<Value>>,
}

#[async_trait]
impl Transport for Scripted {
    async fn post(
        &self,
        _endpoint: &Endpoint,
        body: &Value,
        usage: &mut Usage,
    ) -> Result<Value, LlmError> {
        self.bodies.lock().unwrap().push(body.clone());
        let next = self.replies.lock().unwrap().pop_front();
        let reply = next.unwrap_or_else(|| {
            Err(LlmError::Api {
                status: 500,
                body: "exhausted".into(),
            })
        });
        usage.llm_calls += u32::from(reply.is_ok());
        reply
    }
}

/// A session that records every command and answers each with `listing`.
#[derive(Default)]
struct Recorder {
    commands: Mutex<Vec<Vec<String>>>,
}

#[async_trait]
impl Session for Recorder {
    async fn exec(
        &self,
        argv: &[String],
        _stdin: Option<Vec<u8>>,
        _timeout: Duration,
    ) -> Result<ExecOutput, SandboxError> {
        self.commands.lock().unwrap().push(argv.to_vec());
        Ok(ExecOutput {
            exit_code: 0,
            stdout: b"listing".to_vec(),
            stderr: vec![],
            timed_out: false,
            truncated: false,
            duration: Duration::ZERO,
        })
    }
    async fn remove(&self) -> Result<(), SandboxError> {
        Ok(())
    }
    fn mounts(&self) -> Mounts {
        Mounts {
            work: "/work".into(),
            harness: None,
            gateway: None,
        }
    }
    async fn kill_strays(&self) -> Result<(), SandboxError> {
        Ok(())
    }
    fn isolated(&self) -> bool {
        true
    }
}

struct Case {
    max_turns: u32,
    nudge_after: Option<Duration>,
    /// The run's budget left (`AgentJob::usd_left`), output at $1000 a million tokens.
    usd_left: Option<f64>,
}

const CASE: Case = Case {
    max_turns: 5,
    nudge_after: None,
    usd_left: None,
};

/// What a conversation came to.
struct Run {
    ended: Result<Ended, LlmError>,
    messages: Vec<Value>,
    usage: Usage,
    bodies: Vec<Value>,
    commands: Vec<Vec<String>>,
}

async fn converse<A: Wire>(api: &A, case: Case, replies: Vec<Result<Value, LlmError>>) -> Run {
    let schema = json!({"type": "object", "properties": {"summary": {"type": "string"}},
        "required": ["summary"]});
    let session = Recorder::default();
    let params = json!({});
    let job = AgentJob {
        node: "n",
        visit: 1,
        params: &params,
        nudge_after: case.nudge_after,
        prompt: "do it".into(),
        schema: &schema,
        tools: ToolBox {
            session: &session,
            allowed: &[Tool::ReadFile, Tool::ListDir],
            command_timeout: Duration::from_secs(1),
            evidence: None,
            journal: &Journal::default(),
            retry: Some(&NO_RETRY),
        },
        inbox: None,
        invocation: None,
        usd_left: case.usd_left,
    };
    let cfg = LlmConfig {
        model: "m".into(),
        temperature: 0.0,
        max_tokens: 10,
        max_turns: case.max_turns,
    };
    let transport = Scripted {
        replies: Mutex::new(replies.into()),
        ..Scripted::default()
    };
    let chat = Chat {
        api,
        job: &job,
        cfg: &cfg,
        endpoint: Endpoint {
            url: "http://llm.test".into(),
            headers: vec![],
        },
        transport: &transport,
        money: Money {
            price: Price::new(0.0, 1000.0),
            usd_left: job.usd_left,
        },
    };
    let mut messages = api.start(None, &job.prompt);
    let mut usage = Usage::default();
    let ended = chat.converse(&mut messages, &mut usage).await;
    Run {
        ended,
        messages,
        usage,
        bodies: transport.bodies.into_inner().unwrap(),
        commands: session.commands.into_inner().unwrap(),
    }
}

async fn a_valid_submit_ends_the_conversation<A: Wire>(api: &A) {
    let calls = A::calls(&[
        ("c1", "list_dir", json!({})),
        ("c2", "submit", json!({"summary": "ok"})),
        ("c3", "list_dir", json!({})),
    ]);
    let run = converse(api, CASE, vec![Ok(calls)]).await;
    assert_eq!(
        run.ended.unwrap(),
        Ok(json!({"summary": "ok"})),
        "{}",
        A::NAME
    );
    assert_eq!(
        run.commands.len(),
        1,
        "{}: the call after submit never ran",
        A::NAME
    );
    assert_eq!(run.bodies.len(), 1);
    assert_eq!(
        A::tool_names(&run.bodies[0]),
        ["read_file", "list_dir", "submit"]
    );
    let usage = (
        run.usage.llm_calls,
        run.usage.input_tokens,
        run.usage.output_tokens,
    );
    assert_eq!(usage, (1, 10, 1), "{}", A::NAME);
}

#[tokio::test]
async fn a_valid_submit_ends_the_conversation_and_later_calls_never_run() {
    a_valid_submit_ends_the_conversation(&Anthropic).await;
    a_valid_submit_ends_the_conversation(&OpenAi).await;
}

async fn text_answers<A: Wire>(api: &A) {
    let replies = vec![
        Ok(A::text("thinking")),
        Ok(A::text("{\"summary\": 3}")),
        Ok(A::text("here:\n```json\n{\"summary\": \"t\"}\n```")),
    ];
    let run = converse(api, CASE, replies).await;
    assert_eq!(
        run.ended.unwrap(),
        Ok(json!({"summary": "t"})),
        "{}",
        A::NAME
    );
    let reminder = |at: usize| {
        messages(&run.bodies[at])
            .last()
            .cloned()
            .unwrap_or_default()
    };
    let first = format!(
        "Call the `submit` {} with your final answer. (the agent never submitted)",
        A::TOOL_NOUN
    );
    assert_eq!(reminder(1), api.user_text(first), "{}", A::NAME);
    assert!(
        reminder(2).to_string().contains("breaks the schema"),
        "{}",
        A::NAME
    );
    assert_eq!(run.usage.llm_calls, 3);
}

#[tokio::test]
async fn a_json_text_answer_is_accepted_and_any_other_text_is_reminded_to_submit() {
    text_answers(&Anthropic).await;
    text_answers(&OpenAi).await;
}

async fn turns_run_out<A: Wire>(api: &A) {
    let replies = vec![
        Ok(A::calls(&[
            ("c1", "run_command", json!({"command": "ls"})),
            ("c2", "read_file", json!({"path": "a.py"})),
        ])),
        Ok(A::calls(&[("c3", "submit", json!({"summary": 5}))])),
        Ok(A::text("no")),
    ];
    let case = Case {
        max_turns: 3,
        ..CASE
    };
    let run = converse(api, case, replies).await;
    let invalid = run.ended.unwrap().unwrap_err();
    assert!(
        invalid.starts_with("no valid answer within 3 turns: output breaks the schema"),
        "{}: {invalid}",
        A::NAME
    );
    let results = A::results(&run.bodies[1]);
    assert_eq!(results.len(), 2, "{}", A::NAME);
    assert!(
        results[0].contains("`run_command` is not available"),
        "{results:?}"
    );
    assert_eq!(results[1], "listing");
    assert!(A::results(&run.bodies[2])[0].contains("breaks the schema"));
    assert_eq!(run.commands.len(), 1, "only read_file ran");
    assert_eq!(run.bodies.len(), 3);
}

#[tokio::test]
async fn failed_and_refused_calls_are_answered_until_the_turns_run_out() {
    turns_run_out(&Anthropic).await;
    turns_run_out(&OpenAi).await;
}

#[tokio::test]
async fn a_failed_tool_reads_as_an_error_in_each_wire_format() {
    let call = [("c1", "run_command", json!({"command": "ls"}))];
    let run = converse(&Anthropic, CASE, vec![Ok(Anthropic::calls(&call))]).await;
    let last = messages(&run.bodies[1]).last().cloned().unwrap_or_default();
    assert_eq!(last["content"][0]["is_error"], true);
    let run = converse(&OpenAi, CASE, vec![Ok(OpenAi::calls(&call))]).await;
    assert!(OpenAi::results(&run.bodies[1])[0].starts_with("error: tool `run_command`"));
}

#[tokio::test]
async fn unreadable_arguments_are_refused_without_running_anything() {
    let replies = vec![
        Ok(OpenAi::calls(&[("c1", "list_dir", json!("{oops"))])),
        Ok(OpenAi::calls(&[("c2", "submit", json!("{oops"))])),
        Ok(OpenAi::calls(&[("c3", "submit", json!({"summary": "s"}))])),
    ];
    let run = converse(&OpenAi, CASE, replies).await;
    assert_eq!(run.ended.unwrap(), Ok(json!({"summary": "s"})));
    assert!(run.commands.is_empty());
    for at in [1, 2] {
        let results = OpenAi::results(&run.bodies[at]);
        assert!(
            results[0].starts_with("arguments are not valid json"),
            "{results:?}"
        );
    }
}

async fn nudged<A: Wire>(api: &A, nudge_after: Option<Duration>) -> Vec<usize> {
    let replies = vec![
        Ok(A::calls(&[("c1", "list_dir", json!({}))])),
        Ok(A::text("hm")),
        Ok(A::calls(&[("c2", "submit", json!({"summary": "s"}))])),
    ];
    let case = Case {
        nudge_after,
        ..CASE
    };
    let run = converse(api, case, replies).await;
    assert!(run.ended.unwrap().is_ok());
    let nudges = |body: &Value| body.to_string().matches(NUDGE).count();
    run.bodies.iter().map(nudges).collect()
}

async fn nudged_once<A: Wire>(api: &A) {
    let now = nudged(api, Some(Duration::ZERO)).await;
    assert_eq!(
        now,
        [1, 1, 1],
        "{}: on the first turn, and only once",
        A::NAME
    );
    assert_eq!(nudged(api, None).await, [0, 0, 0], "{}", A::NAME);
    let later = nudged(api, Some(Duration::from_secs(3600))).await;
    assert_eq!(later, [0, 0, 0], "{}", A::NAME);
}

#[tokio::test]
async fn the_agent_is_nudged_once_when_its_time_is_up() {
    nudged_once(&Anthropic).await;
    nudged_once(&OpenAi).await;
}

async fn errors<A: Wire>(api: &A) {
    let malformed = json!({"usage": {"input_tokens": 4, "prompt_tokens": 4}});
    let run = converse(api, CASE, vec![Ok(malformed)]).await;
    assert!(
        matches!(run.ended, Err(LlmError::Malformed(_))),
        "{}",
        A::NAME
    );
    assert_eq!(
        run.usage.input_tokens,
        4,
        "{}: its tokens still count",
        A::NAME
    );
    assert_eq!(run.messages, api.start(None, "do it"));

    let failed = Err(LlmError::Api {
        status: 400,
        body: "bad".into(),
    });
    let run = converse(api, CASE, vec![Ok(A::text("hm")), failed]).await;
    let error = run.ended.unwrap_err().to_string();
    assert_eq!(error, "llm api returned 400: bad");
    assert_eq!(run.bodies.len(), 2);
    assert_eq!(run.usage.llm_calls, 1);

    let case = Case {
        max_turns: 0,
        ..CASE
    };
    let run = converse(api, case, vec![]).await;
    let none = "no valid answer within 0 turns: the agent never submitted";
    assert_eq!(run.ended.unwrap(), Err(none.to_string()));
    assert!(run.bodies.is_empty());
}

#[tokio::test]
async fn a_malformed_reply_or_a_failed_call_ends_the_conversation_in_an_error() {
    errors(&Anthropic).await;
    errors(&OpenAi).await;
}

#[test]
fn an_ending_concludes_in_the_matching_status() {
    let outcome = |ended| conclude(ended, Usage::default(), Value::Null);
    let ok = outcome(Ok(Ok(json!({"a": 1}))));
    assert_eq!(
        (ok.status, ok.output, ok.error),
        (JobStatus::Ok, json!({"a": 1}), None)
    );
    let invalid = outcome(Ok(Err("why".into())));
    assert_eq!(invalid.status, JobStatus::OutputInvalid);
    assert_eq!(invalid.error.as_deref(), Some("why"));
    let error = outcome(Err(LlmError::NoKey("K")));
    assert_eq!(error.status, JobStatus::Error);
    assert_eq!(error.error.as_deref(), Some("no api key: set K"));
}

/// A script that plays one node differently per run of a tree: the step whose `when` matches
/// the job's parameters answers, counted by visit among those that match; none matching is an
/// error that names the node.
#[tokio::test]
async fn a_scripted_step_answers_only_the_jobs_its_when_matches() {
    let script: std::collections::BTreeMap<String, Vec<shared::messages::ScriptStep>> =
        serde_json::from_value(json!({"scaffold": [
            {"when": {"module": "a"}, "output": {"summary": "a first"}},
            {"when": {"module": "b"}, "output": {"summary": "b only"}},
            {"when": {"module": "a"}, "output": {"summary": "a again"}},
        ]}))
        .expect("a script");
    let schema = json!({"type": "object"});
    let session = Recorder::default();
    let answer = |module: &'static str, visit: u32| {
        let params = json!({"module": module});
        let (script, schema, session) = (&script, &schema, &session);
        async move {
            let job = AgentJob {
                node: "scaffold",
                visit,
                params: &params,
                nudge_after: None,
                prompt: "plan".into(),
                schema,
                tools: ToolBox {
                    session,
                    allowed: &[],
                    command_timeout: Duration::from_secs(1),
                    evidence: None,
                    journal: &Journal::default(),
                    retry: Some(&NO_RETRY),
                },
                inbox: None,
                invocation: None,
                usd_left: None,
            };
            super::scripted(job, script, None).await
        }
    };
    assert_eq!(answer("a", 1).await.output["summary"], "a first");
    assert_eq!(answer("a", 2).await.output["summary"], "a again");
    assert_eq!(answer("b", 1).await.output["summary"], "b only");
    let none = answer("c", 1).await;
    assert_eq!(none.status, JobStatus::Error);
    assert!(none.error.unwrap().contains("`scaffold`"));
}

/// A budget that runs out mid-conversation: the call it cannot pay in full is clamped to the
/// output tokens left, and the next one is not sent; the spend never passes the budget.
async fn a_budget_clamps_max_tokens_and_is_never_overshot<A: Wire>(api: &A) {
    let spending = |output: u64| {
        let mut r = A::calls(&[("c1", "list_dir", json!({}))]);
        r["usage"] = json!({"input_tokens": 0, "output_tokens": output,
            "prompt_tokens": 0, "completion_tokens": output});
        Ok(r)
    };
    let case = Case {
        usd_left: Some(0.015),
        ..CASE
    };
    // $0.001 an output token: 15 tokens in all; max_tokens is 10.
    let run = converse(api, case, vec![spending(8), spending(7), spending(1)]).await;
    let max: Vec<u64> = run
        .bodies
        .iter()
        .map(|b| b["max_tokens"].as_u64().unwrap_or_default())
        .collect();
    assert_eq!(max, vec![10, 7], "{}", A::NAME);
    assert!(
        run.usage.cost_usd <= 0.015 + 1e-12,
        "{}: {}",
        A::NAME,
        run.usage.cost_usd
    );
    assert!((run.usage.cost_usd - 0.015).abs() < 1e-9, "{}", A::NAME);
    match run.ended {
        Err(LlmError::Budget { left }) => assert!(left < 1e-9, "{left}"),
        other => panic!("{}: {other:?}", A::NAME),
    }
}

#[tokio::test]
async fn a_budget_clamps_max_tokens_on_both_apis() {
    a_budget_clamps_max_tokens_and_is_never_overshot(&Anthropic).await;
    a_budget_clamps_max_tokens_and_is_never_overshot(&OpenAi).await;
}
