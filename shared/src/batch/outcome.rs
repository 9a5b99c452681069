//! What an ended run means for its batch item ([`outcome_of`]): a verdict, or an error of the
//! infrastructure (never a verdict), with what the run cost.

use super::flaky::{flaky_error, flaky_of, FLAKY_VERDICT};
use super::state::MAX_ERROR_CHARS;
use crate::engine::{RunState, RunStatus};
use crate::messages::JobStatus;
use crate::special_case::SuspectedSpecialCase;
use crate::text::head;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Run results whose `reason` says the infrastructure failed, not the agent: a job
/// dead-lettered, a job re-issued until its attempts ran out (lost workers), a commit the
/// engine expected and never got, a run that stopped moving without ending. Every other reason (`budget_exhausted`, `fanout_too_wide`,
/// ...) is the graph's or the agent's.
pub const INFRA_REASONS: &[&str] = &[
    "job_dead_lettered",
    "job_never_finished",
    "missing_commit",
    crate::engine::stall::STALLED_REASON,
];

/// The verdict of an item whose run passed with suspected special cases: held for a person.
pub const HELD_VERDICT: &str = "HELD";

/// Why an item is held: its signals, `path:line` and the literal, a few of them.
pub fn held_reason(signals: &[SuspectedSpecialCase]) -> String {
    let shown: Vec<String> = signals
        .iter()
        .take(5)
        .map(|s| format!("{}:{} {} on {}", s.path, s.line, s.why, s.literal))
        .collect();
    format!(
        "held for review: the run passed, but {} line(s) of the code under test special-case the tests' or the examples' literals ({})",
        signals.len(),
        shown.join("; ")
    )
}

/// What an ended run means for its item (see [`outcome_of`]).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ItemOutcome {
    pub status: RunStatus,
    pub verdict: Option<String>,
    pub ended_stage: Option<String>,
    pub error: Option<String>,
    pub infra_error: bool,
    pub cost_usd: f64,
    pub tokens: u64,
    /// The tests the run's test runs found flaky (whatever its verdict).
    pub flaky_tests: Vec<String>,
    /// The special-casing signals the run's last check reported (`shared::special_case`): a
    /// passing run with any is held for a person ([`HELD_VERDICT`]).
    #[serde(default)]
    pub suspected_special_case: Vec<SuspectedSpecialCase>,
    /// Jobs the run's workers answered, and how many of them reused a kept result (the step
    /// cache) instead of running.
    pub steps: u32,
    pub cache_hits: u32,
}

/// What an ended run means for its batch item:
/// - `verdict`: the result's `verdict` when it is a string (the factory writes `PASS` or
///   `FAIL`), else `PASS` for a succeeded run and `FAIL` for a failed one; none for a run that
///   has not ended, was cancelled or hit an infrastructure error;
/// - `ended_stage`: the result's `ended_stage` when a string;
/// - `infra_error`: the run failed, and either one of its outcomes has job status `error` or
///   `dead` (the infrastructure failed, not the agent), or the result's `reason` is one of
///   [`INFRA_REASONS`]; timeouts, invalid output and budgets are the agent's;
/// - `error`: the result's `reason` (with its node and detail), else the first infrastructure
///   failure's node and error, else the last failed outcome's; at most [`MAX_ERROR_CHARS`];
/// - `cost_usd` and `tokens` (input plus output): summed over the run's outcomes; `steps` (jobs
///   a worker answered) and `cache_hits` (of those, results reused from the step cache);
/// - the verdict is [`FLAKY_VERDICT`] when the run failed (not for the infrastructure) at a job
///   whose output says `flaky: true` (a test run whose verdict would have depended on the
///   run), unless the result names its own; the error then lists the flaky tests
///   ([`super::flaky::flaky_of`], [`flaky_error`]).
pub fn outcome_of(run: &RunState) -> ItemOutcome {
    let null = Value::Null;
    let result = run.result.as_ref().unwrap_or(&null);
    let reason = result["reason"].as_str();
    let infra_reason = reason.is_some_and(|r| INFRA_REASONS.contains(&r));
    let infra_job = run
        .history
        .iter()
        .find(|o| matches!(o.status, JobStatus::Error | JobStatus::Dead));
    let infra_error = run.status == RunStatus::Failed && (infra_reason || infra_job.is_some());
    let (flaky, ended_flaky) = flaky_of(run);
    let verdict = match run.status {
        RunStatus::Succeeded | RunStatus::Failed if !infra_error => Some(
            result["verdict"]
                .as_str()
                .unwrap_or(if run.status == RunStatus::Succeeded {
                    "PASS"
                } else if ended_flaky {
                    FLAKY_VERDICT
                } else {
                    "FAIL"
                })
                .to_string(),
        ),
        _ => None,
    };
    let of_job = |o: &crate::engine::Outcome| {
        let status = serde_json::to_value(o.status).unwrap_or(Value::Null);
        let status = status.as_str().unwrap_or("failed");
        match &o.error {
            Some(e) => format!("node {} {status}: {e}", o.node),
            None => format!("node {} {status}", o.node),
        }
    };
    let error = match (reason, infra_job) {
        (Some(r), _) if infra_reason || !infra_error => Some(reason_text(r, result)),
        (_, Some(o)) if infra_error => Some(of_job(o)),
        _ if run.status == RunStatus::Failed => run
            .history
            .iter()
            .rev()
            .find(|o| !o.ok && o.error.is_some())
            .map(of_job),
        _ => None,
    };
    let error = match verdict.as_deref() {
        Some(FLAKY_VERDICT) => Some(flaky_error(&flaky)),
        _ => error,
    };
    let (mut cost_usd, mut tokens, mut steps, mut cache_hits) = (0.0, 0u64, 0u32, 0u32);
    for o in &run.history {
        if !o.worker.is_empty() {
            steps = steps.saturating_add(1);
        }
        if o.cached_from.is_some() {
            cache_hits = cache_hits.saturating_add(1);
        }
        cost_usd += o.usage.cost_usd;
        tokens = tokens
            .saturating_add(o.usage.input_tokens)
            .saturating_add(o.usage.output_tokens);
    }
    ItemOutcome {
        status: run.status,
        verdict,
        ended_stage: result["ended_stage"].as_str().map(String::from),
        error: error.map(|e| head(&e, MAX_ERROR_CHARS)),
        infra_error,
        cost_usd,
        tokens,
        flaky_tests: flaky,
        suspected_special_case: serde_json::from_value(crate::special_case::last_reported(
            run.history.iter().map(|o| &o.output),
        ))
        .unwrap_or_default(),
        steps,
        cache_hits,
    }
}

/// `<reason>[ at node <node>][: <detail>]`.
fn reason_text(reason: &str, result: &Value) -> String {
    let mut text = reason.to_string();
    if let Some(node) = result["node"].as_str() {
        text.push_str(&format!(" at node {node}"));
    }
    match &result["detail"] {
        Value::Null => {}
        Value::String(d) => text.push_str(&format!(": {d}")),
        other => text.push_str(&format!(": {other}")),
    }
    text
}
