//! Tests of the batch model: datasets, the state machine, outcomes of runs, reports.

mod dataset;
mod flaky;
mod html;
mod outcome;
mod report;
mod slice;
mod state;

use super::*;
use crate::ids::BatchId;
use chrono::{DateTime, TimeDelta, Utc};
use std::collections::BTreeMap;

/// `secs` seconds after a fixed instant.
fn t(secs: i64) -> DateTime<Utc> {
    "2026-11-22T10:00:00Z".parse::<DateTime<Utc>>().unwrap() + TimeDelta::seconds(secs)
}

fn item(id: &str) -> DatasetItem {
    DatasetItem {
        id: id.into(),
        repo: "https://example.com/r.git".into(),
        git_ref: None,
        input: None,
        work_order: None,
        script: None,
        mirror: false,
    }
}

fn spec(trials: u32, max_running: u32) -> BatchSpec {
    BatchSpec {
        trials,
        max_running,
        max_infra_retries: 2,
        labels: BTreeMap::new(),
        weight: 1,
    }
}

fn batch(ids: &[&str], spec: BatchSpec) -> BatchState {
    let items: Vec<DatasetItem> = ids.iter().map(|id| item(id)).collect();
    BatchState::new(
        BatchId::new("0123456789abcdef"),
        "factory",
        "bundles/g",
        spec,
        &items,
        t(0),
    )
}

fn outcome(status: crate::engine::RunStatus, verdict: Option<&str>) -> ItemOutcome {
    ItemOutcome {
        status,
        verdict: verdict.map(String::from),
        ended_stage: None,
        error: None,
        infra_error: false,
        cost_usd: 0.5,
        tokens: 100,
        flaky_tests: Vec::new(),
        suspected_special_case: Vec::new(),
        steps: 0,
        cache_hits: 0,
    }
}

fn infra(reason: &str) -> ItemOutcome {
    ItemOutcome {
        error: Some(reason.into()),
        infra_error: true,
        ..outcome(crate::engine::RunStatus::Failed, None)
    }
}

/// Whether `f` changed the batch.
fn changes(b: &mut BatchState, f: impl FnOnce(&mut BatchState)) -> bool {
    let before = b.clone();
    f(b);
    *b != before
}

/// Any outcome a run may report: a verdict, an infrastructure error, a cancel, or none yet.
fn arb_outcome(kind: u8) -> ItemOutcome {
    use crate::engine::RunStatus;
    match kind % 6 {
        0 => outcome(RunStatus::Succeeded, None),
        1 => outcome(RunStatus::Failed, Some("FAIL")),
        2 | 3 => infra("lost"),
        4 => outcome(RunStatus::Cancelled, None),
        _ => outcome(RunStatus::Running, None),
    }
}
