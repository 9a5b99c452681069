use super::*;
use crate::agent::llm::tests::{arb_json, arb_text, cases, timed, CASE_LIMIT};
use crate::sandbox::{ExecOutput, Mounts, SandboxError};
use async_trait::async_trait;
use proptest::prelude::*;
use shared::resilience::RetryConfig;
use std::sync::Mutex;

/// A session that records every argv and answers with canned output, after failing its
/// first `failures` execs with `error`.
struct Canned {
    out: ExecOutput,
    seen: Mutex<Vec<Vec<String>>>,
    failures: usize,
    error: fn() -> SandboxError,
}

#[async_trait]
impl Session for Canned {
    async fn exec(
        &self,
        argv: &[String],
        _stdin: Option<Vec<u8>>,
        _timeout: Duration,
    ) -> Result<ExecOutput, SandboxError> {
        let mut seen = self.seen.lock().unwrap();
        seen.push(argv.to_vec());
        if seen.len() <= self.failures {
            return Err((self.error)());
        }
        Ok(self.out.clone())
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

const ALL: [Tool; 6] = [
    Tool::ReadFile,
    Tool::ListDir,
    Tool::WriteFile,
    Tool::EditFile,
    Tool::RunCommand,
    Tool::Browser,
];

/// Tool arguments: mostly objects with the tools' keys holding paths and text of any kind
/// (or values of the wrong type), sometimes any JSON at all.
fn arb_input() -> impl Strategy<Value = Value> {
    let path = prop_oneof![
        arb_text(),
        "[a./\\\\:C ]{0,12}",
        prop::sample::select(vec!["..", "../x", "/etc/passwd", "a/../../b", "C:x", "."])
            .prop_map(str::to_string),
    ];
    let value = prop_oneof![
        4 => path.prop_map(Value::from),
        1 => arb_json(),
    ];
    let keys = prop::sample::subsequence(
        vec!["path", "content", "old_text", "new_text", "command"],
        0..=5,
    );
    let shaped = (keys, prop::collection::vec(value, 5)).prop_map(|(keys, values)| {
        Value::Object(keys.into_iter().map(str::to_string).zip(values).collect())
    });
    prop_oneof![4 => shaped, 1 => arb_json()]
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn any_tool_call_is_answered_and_never_leaves_the_worktree(
        name in prop_oneof![
            4 => prop::sample::select(ALL.to_vec()).prop_map(tool_name),
            1 => Just("submit"),
        ],
        allowed in prop::sample::subsequence(ALL.to_vec(), 0..=6),
        input in arb_input(),
        stdout in prop_oneof![arb_text(), "(ab|a|b|\\\\PC){0,40}"],
        exit_code in prop_oneof![Just(0i64), any::<i64>()],
        timed_out in any::<bool>(),
    ) {
        let session = Canned {
            out: ExecOutput {
                exit_code,
                stdout: stdout.clone().into_bytes(),
                stderr: stdout.into_bytes(),
                timed_out,
                ..ExecOutput::default()
            },
            seen: Mutex::new(Vec::new()),
            failures: 0,
            error: reset,
        };
        let tools = ToolBox {
            session: &session,
            allowed: &allowed,
            command_timeout: Duration::from_secs(1),
            evidence: None,
            journal: &Journal::default(),
            retry: Some(&NO_RETRY),
        };
        let (answer, took) = timed(|| futures::executor::block_on(tools.call(name, &input)));
        prop_assert!(took < CASE_LIMIT);
        let offered = allowed.iter().any(|t| tool_name(*t) == name);
        prop_assert!(offered || answer.is_err());
        // Every path that reached the container is relative and stays beneath the root.
        for argv in session.seen.lock().unwrap().iter() {
            let path = match argv.iter().map(String::as_str).collect::<Vec<_>>()[..] {
                ["cat", "--", p] | ["ls", "-la", "--", p] | ["sh", "-c", _, "sh", p] => p,
                ["sh", "-c", _] | ["fleet-browser"] => continue,
                _ => return Err(TestCaseError::fail(format!("unexpected argv {argv:?}"))),
            };
            prop_assert!(
                !path.is_empty()
                    && !path.starts_with('/')
                    && !path.split('/').any(|c| c == ".."),
                "{path:?} from {input}"
            );
        }
    }
}

fn reset() -> SandboxError {
    SandboxError::Other("read: connection reset by peer".into())
}

fn gone() -> SandboxError {
    SandboxError::Other("exec: \"cat\": executable file not found in $PATH".into())
}

/// Calls `name` on a flaky session with three attempts and no waits; the answer, the number
/// of execs and the events as `(type, data)`.
fn flaky_call(
    failures: usize,
    error: fn() -> SandboxError,
    name: &str,
    input: Value,
) -> (Result<String, String>, usize, Vec<(String, Value)>) {
    let session = Canned {
        out: ExecOutput {
            stdout: b"ok".to_vec(),
            ..ExecOutput::default()
        },
        seen: Mutex::new(Vec::new()),
        failures,
        error,
    };
    let journal = Journal::default();
    let fast = RetryConfig {
        max_attempts: 3,
        backoff_seconds: vec![0],
    };
    let tools = ToolBox {
        session: &session,
        allowed: &ALL,
        command_timeout: Duration::from_secs(1),
        evidence: None,
        journal: &journal,
        retry: Some(&fast),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let answer = rt.block_on(tools.call(name, &input));
    let events = journal
        .take()
        .into_iter()
        .map(|e| {
            let kind = serde_json::to_value(e.event_type).unwrap();
            (kind.as_str().unwrap().to_string(), e.data)
        })
        .collect();
    let calls = session.seen.lock().unwrap().len();
    (answer, calls, events)
}

fn kinds(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(k, _)| k.as_str()).collect()
}

#[test]
fn a_transient_failure_is_retried_until_the_call_succeeds() {
    let (answer, calls, events) = flaky_call(2, reset, "read_file", json!({"path": "src/app.py"}));
    assert_eq!(answer.as_deref(), Ok("ok"));
    assert_eq!(calls, 3);
    assert_eq!(
        kinds(&events),
        [
            "tool_error",
            "tool_retry",
            "tool_error",
            "tool_retry",
            "tool_use"
        ]
    );
    assert_eq!(events[0].1["error_type"], "transient");
    assert_eq!(events[3].1["next_attempt"], 3);
    assert_eq!(
        events[4].1,
        json!({"tool": "read_file", "attempts": 3, "outcome": "success"})
    );
}

#[test]
fn retries_stop_when_the_strategy_is_spent() {
    let (answer, calls, events) = flaky_call(10, reset, "list_dir", json!({}));
    let error = answer.unwrap_err();
    assert!(error.contains("failed after 3 attempts"), "{error}");
    assert_eq!(calls, 3);
    assert_eq!(events.last().unwrap().1["outcome"], "retry_exhausted");
}

#[test]
fn a_command_that_may_have_run_is_never_run_twice() {
    let (answer, calls, events) = flaky_call(1, reset, "run_command", json!({"command": "make"}));
    assert!(answer
        .unwrap_err()
        .contains("may already have taken effect"));
    assert_eq!(calls, 1);
    assert_eq!(events.last().unwrap().1["outcome"], "not_replayable");
}

#[test]
fn a_fatal_error_is_not_retried() {
    let (answer, calls, events) = flaky_call(1, gone, "read_file", json!({"path": "a.py"}));
    let error = answer.unwrap_err();
    assert!(error.contains("[not_installed error, fatal]"), "{error}");
    assert!(
        error.contains("Tool 'read_file' may not be installed."),
        "{error}"
    );
    assert_eq!(calls, 1);
    assert_eq!(kinds(&events), ["tool_error", "tool_use"]);
}

#[test]
fn refused_input_never_reaches_the_container_and_comes_back_with_a_hint() {
    // Off the schema: checked before running, whatever the tool would have done.
    let (answer, calls, events) = flaky_call(0, reset, "write_file", json!({"path": "a.py"}));
    let error = answer.unwrap_err();
    assert!(
        error.contains("write_file requires 'path' and 'content'"),
        "{error}"
    );
    assert_eq!(calls, 0);
    assert_eq!(events[0].1["error_type"], "invalid_input");
    // A path out of the worktree: a permission error, fatal.
    let (answer, calls, events) =
        flaky_call(0, reset, "read_file", json!({"path": "../../etc/passwd"}));
    assert!(answer.unwrap_err().contains("[permission error, fatal]"));
    assert_eq!(calls, 0);
    assert_eq!(events[0].1["error_type"], "permission");
    // A page off the container's loopback: refused as a permission error.
    let (answer, calls, _) = flaky_call(0, reset, "browser", json!({"url": "http://example.com/"}));
    assert!(answer.unwrap_err().contains("[permission error, fatal]"));
    assert_eq!(calls, 0);
}

#[test]
fn a_browser_failure_is_replayed_only_when_no_input_reached_the_page() {
    let failed_load = json!({"ok": false, "error": "network error: connection refused (net::ERR_CONNECTION_REFUSED) loading x",
        "actions": [{"action": "click", "ok": false, "error": "skipped"}]});
    assert!(shared::browser::replay_safe(&failed_load));
    let clicked = json!({"ok": false, "error": "action 1 (wait_for) failed",
        "actions": [{"action": "click", "ok": true, "acted": true},
                    {"action": "wait_for", "ok": false, "acted": false}]});
    assert!(!shared::browser::replay_safe(&clicked));
    let unmarked = json!({"ok": false, "actions": [{"action": "type", "ok": false, "error": "x"}]});
    assert!(!shared::browser::replay_safe(&unmarked));
    let looked = json!({"ok": false, "actions": [{"action": "text", "ok": true, "acted": false},
        {"action": "click", "ok": false, "acted": false, "error": "no element matches"}]});
    assert!(shared::browser::replay_safe(&looked));
}
