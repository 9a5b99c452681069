//! Results the runner makes itself rather than a step: an `Error` result of the attempt (a panic,
//! a permanent failure), and what every reported output goes through (no host path of the
//! worker).

use chrono::{DateTime, Utc};
use serde_json::Value;
use shared::messages::{JobResult, JobSpec, JobStatus, Usage, WIRE_VERSION};

/// The message of a panic payload (`panic!` gives a `&str` or a `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// When an attempt ran: from its start to the result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ran {
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
}

/// An `Error` result of the attempt, carrying `error`.
pub fn error_result(
    spec: &JobSpec,
    worker: &str,
    execution: &str,
    ran: Ran,
    error: String,
) -> JobResult {
    JobResult {
        v: WIRE_VERSION,
        job_id: spec.job_id.clone(),
        run_id: spec.run_id.clone(),
        attempt: spec.attempt,
        status: JobStatus::Error,
        output: Value::Null,
        error: Some(error),
        commit: None,
        pack: None,
        artifacts: Default::default(),
        usage: Usage::default(),
        worker: worker.to_string(),
        execution: execution.to_string(),
        started_at: ran.started_at,
        finished_at: ran.finished_at,
        container_seconds: 0.0,
        cached_from: None,
        events: Vec::new(),
    }
}

/// The result of an execution that panicked: an infrastructure error of this attempt, routed by
/// the engine like any other.
pub fn panicked_result(
    spec: &JobSpec,
    worker: &str,
    execution: &str,
    ran: Ran,
    message: &str,
) -> JobResult {
    error_result(
        spec,
        worker,
        execution,
        ran,
        format!(
            "the worker panicked running this job: {}",
            shared::text::head(message, 2000)
        ),
    )
}

/// The result of an execution that failed for good (`RunError::Permanent`): an error of this
/// attempt, reported at once rather than requeued until the delivery limit.
pub fn permanent_result(
    spec: &JobSpec,
    worker: &str,
    execution: &str,
    ran: Ran,
    reason: &str,
) -> JobResult {
    error_result(
        spec,
        worker,
        execution,
        ran,
        format!(
            "the job cannot run (a permanent failure, not retried): {}",
            shared::text::head(reason, 2000)
        ),
    )
}

/// `value` with the worker's host paths in every string made worktree-relative.
pub(super) fn without_host_paths(value: Value) -> Value {
    match value {
        Value::String(s) => Value::String(shared::factory::strip_host_paths(&s)),
        Value::Array(items) => Value::Array(items.into_iter().map(without_host_paths).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, without_host_paths(v)))
                .collect(),
        ),
        other => other,
    }
}
