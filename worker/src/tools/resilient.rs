//! Seed 004's resilient executor around one tool call: the input checked against the tool's
//! schema before anything runs, each failed attempt classified and recorded (`tool_error`),
//! retried after the class's backoff when it is retriable and running it again is safe
//! (`tool_retry`), and the call's end recorded (`tool_use`: attempts and outcome). The agent
//! gets the answer, or the error with its class, the outcome and the seed's hint.

use super::{Failure, ToolBox};
use chrono::Utc;
use serde_json::{json, Value};
use shared::resilience::{classify, next_step, ClassifiedError, ExecutionOutcome, Next};
use shared::tracking::{EventType, JobEvent};
use std::sync::Mutex;
use tracing::debug;

/// The longest error text kept in an event.
const MAX_EVENT_ERROR: usize = 500;

/// The events a job's tool calls recorded, handed to the job's result when it ends.
#[derive(Default)]
pub struct Journal {
    events: Mutex<Vec<JobEvent>>,
}

impl Journal {
    pub fn record(&self, event_type: EventType, data: Value) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(JobEvent::new(Utc::now(), event_type, data));
    }

    /// The events so far, leaving none.
    pub fn take(&self) -> Vec<JobEvent> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The call's input against the tool's schema (the `submit` tool is not a tool here). The
/// browser's input is checked by its own, stricter rules before anything runs, with reasons
/// the agent can act on (`shared::browser::validate`).
fn check_input(tools: &ToolBox<'_>, name: &str, input: &Value) -> Result<(), Failure> {
    if name == super::tool_name(shared::graph::Tool::Browser) {
        return Ok(());
    }
    let Some(def) = tools
        .allowed
        .iter()
        .map(|t| super::definition(*t))
        .find(|d| d.name == name)
    else {
        return Ok(()); // not offered: the attempt refuses it as a permission error
    };
    shared::schema::validate(&def.schema, input)
        .map_err(|e| Failure::invalid(format!("the input does not fit {name}'s schema: {e}")))
}

pub(super) async fn execute(
    tools: &ToolBox<'_>,
    name: &str,
    input: &Value,
) -> Result<String, String> {
    let mut attempt = 0u32;
    let checked = check_input(tools, name, input);
    loop {
        attempt += 1;
        let result = match &checked {
            Err(refused) => Err(refused.clone()),
            Ok(()) => tools.attempt(name, input).await,
        };
        let failure = match result {
            Ok(answer) => {
                tools.journal.record(
                    EventType::ToolUse,
                    json!({"tool": name, "attempts": attempt, "outcome": "success"}),
                );
                return Ok(answer);
            }
            Err(f) => f,
        };
        let classified = match failure.known {
            Some(kind) => ClassifiedError::known(kind, name, &failure.error),
            None => classify(name, &failure.error),
        };
        tools.journal.record(
            EventType::ToolError,
            json!({
                "tool": name,
                "attempt": attempt,
                "error_type": classified.error_type.as_str(),
                "error": shared::text::head(&failure.error, MAX_EVENT_ERROR),
            }),
        );
        match next_step(
            classified.error_type,
            attempt,
            tools.retry,
            failure.replayable,
        ) {
            Next::Retry { wait } => {
                tools.journal.record(
                    EventType::ToolRetry,
                    json!({"tool": name, "attempt": attempt, "next_attempt": attempt + 1,
                        "wait_seconds": wait.as_secs()}),
                );
                debug!(
                    tool = name,
                    attempt,
                    wait_seconds = wait.as_secs(),
                    "tool retry"
                );
                tokio::time::sleep(wait).await;
            }
            Next::Stop(outcome) => {
                tools.journal.record(
                    EventType::ToolUse,
                    json!({"tool": name, "attempts": attempt, "outcome": outcome.as_str(),
                        "error_type": classified.error_type.as_str()}),
                );
                return Err(for_agent(&classified, &failure, outcome, attempt));
            }
        }
    }
}

/// The agent's view of a failed call.
fn for_agent(
    c: &ClassifiedError,
    failure: &Failure,
    outcome: ExecutionOutcome,
    attempts: u32,
) -> String {
    let what = match outcome {
        ExecutionOutcome::RetryExhausted => format!("failed after {attempts} attempts"),
        ExecutionOutcome::NotReplayable => {
            "not retried: the call may already have taken effect".to_string()
        }
        ExecutionOutcome::Fatal => "fatal".to_string(),
        _ => "needs a change".to_string(),
    };
    let mut text = format!(
        "{}\n[{} error, {what}] hint: {}",
        c.original,
        c.error_type.as_str(),
        c.hint
    );
    if let Some(detail) = &failure.detail {
        text = format!("{text}\n{detail}");
    }
    text
}
