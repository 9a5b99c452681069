use super::brief::{failure_brief_of, FailureBrief};
use crate::engine::{Outcome, RunState};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CmdResult {
    pub command: Vec<String>,
    pub exit_code: i64,
    pub stdout_trunc: String,
    pub stderr_trunc: String,
    pub stdout_path: String,
    pub stderr_path: String,
    pub duration_seconds: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AttemptRecord {
    pub attempt_index: u32,
    pub baseline_commit: String,
    pub patch_path: String,
    pub touched_files: Vec<String>,
    pub apply_ok: bool,
    pub verify: Vec<CmdResult>,
    pub acceptance: Vec<CmdResult>,
    pub failure_brief: Option<FailureBrief>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunSummary {
    pub run_id: String,
    pub repo_path: String,
    pub work_order_path: String,
    pub work_order_hash: String,
    pub repo_baseline_commit: String,
    pub repo_tree_hash_before: String,
    pub repo_tree_hash_after: String,
    pub max_attempts: u32,
    pub attempts: Vec<AttemptRecord>,
    pub verdict: String,
    pub ended_stage: String,
    /// Lines of the patch that branch on the tests' or the examples' literals (the last
    /// attempt's): a signal for a person, which a batch holds (`HELD`) rather than count a pass.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suspected_special_case: Vec<crate::special_case::SuspectedSpecialCase>,
    pub started_utc: DateTime<Utc>,
    pub ended_utc: DateTime<Utc>,
}

fn attempt_of(o: &Outcome) -> u32 {
    o.output
        .get("attempt_index")
        .and_then(Value::as_u64)
        .map(|n| n as u32)
        .unwrap_or(o.visit)
}

fn from_output<T: serde::de::DeserializeOwned + Default>(o: Option<&Outcome>, key: &str) -> T {
    o.and_then(|o| o.output.get(key))
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

/// Assembles `run_summary.json` from the run's history of `se`, `tr` and `po` outcomes.
pub fn summarize(
    state: &RunState,
    _exit: &crate::ids::NodeId,
    success: bool,
    at: DateTime<Utc>,
) -> Value {
    let by = |node: &str, attempt: u32| -> Option<&Outcome> {
        state
            .history
            .iter()
            .rev()
            .find(|o| o.node.as_str() == node && attempt_of(o) == attempt)
    };
    let mut attempts = Vec::new();
    for se in state.history.iter().filter(|o| o.node.as_str() == "se") {
        let n = se.visit;
        let tr = by("tr", n);
        let po = by("po", n);
        let failure_brief = [Some(se), tr, po]
            .into_iter()
            .flatten()
            .find_map(failure_brief_of);
        attempts.push(AttemptRecord {
            attempt_index: n,
            baseline_commit: state.repo.base_commit.clone(),
            patch_path: from_output(tr, "patch_path"),
            touched_files: from_output(tr, "touched_files"),
            apply_ok: from_output(tr, "apply_ok"),
            verify: from_output(po, "verify"),
            acceptance: from_output(po, "acceptance"),
            failure_brief,
        });
    }
    let meta = |k: &str| {
        state
            .meta
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let before = meta("repo_tree_hash_before");
    let after = if success {
        state
            .last_outcome(&crate::ids::NodeId::new("po"))
            .and_then(|o| o.output.get("tree_hash_after"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| before.clone())
    } else {
        // Every failed attempt is rolled back to the baseline: the tree is as it was.
        before.clone()
    };
    let ended_stage = if success {
        "success".to_string()
    } else {
        attempts
            .last()
            .and_then(|a| a.failure_brief.as_ref())
            .map(|b| {
                serde_json::to_value(b.stage)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            })
            .unwrap_or_else(|| "exception".to_string())
    };
    let summary = RunSummary {
        run_id: state.run_id.to_string(),
        repo_path: state.repo.url.clone(),
        work_order_path: state
            .input
            .get("work_order_path")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        work_order_hash: meta("work_order_hash"),
        repo_baseline_commit: state.repo.base_commit.clone(),
        repo_tree_hash_before: before,
        repo_tree_hash_after: after,
        max_attempts: state
            .input
            .pointer("/options/max_attempts")
            .and_then(Value::as_u64)
            .unwrap_or(2) as u32,
        attempts,
        verdict: if success { "PASS" } else { "FAIL" }.to_string(),
        ended_stage,
        suspected_special_case: serde_json::from_value(crate::special_case::last_reported(
            state.history.iter().map(|o| &o.output),
        ))
        .unwrap_or_default(),
        started_utc: state.created_at,
        ended_utc: at,
    };
    serde_json::to_value(summary).unwrap_or(Value::Null)
}
