//! How far a batch has come ([`progress`]): items done, running and queued, the pass rate so
//! far, what it has cost, and when it should end at the pace so far. What `fleet batch wait`
//! draws as its progress bar and `GET /v1/batches/:id` returns.

use super::state::BatchHeader;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A batch's progress at one moment.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Progress {
    pub total: usize,
    /// Items settled (passed, failed, errored or cancelled).
    pub done: usize,
    pub running: usize,
    pub queued: usize,
    /// Passed over items with a verdict (passed or failed); none before the first verdict.
    pub pass_rate: Option<f64>,
    /// Spent so far over every attempt of every item.
    pub cost_usd: f64,
    pub tokens: u64,
    /// Seconds since the batch was created (to its end once finished).
    pub elapsed_seconds: f64,
    /// Seconds left at the pace of the items done so far; none before the first item settled
    /// and once finished.
    pub eta_seconds: Option<f64>,
}

/// The batch's progress at `now`, from its header's books (no item is read).
pub fn progress(header: &BatchHeader, now: DateTime<Utc>) -> Progress {
    let c = &header.counts;
    let mut p = Progress {
        total: c.total,
        done: c.done(),
        running: c.running,
        queued: c.queued,
        cost_usd: header.cost_usd,
        tokens: header.tokens,
        ..Progress::default()
    };
    if c.passed + c.failed > 0 {
        p.pass_rate = Some(c.passed as f64 / (c.passed + c.failed) as f64);
    }
    let end = header.finished_at.unwrap_or(now);
    p.elapsed_seconds = ((end - header.created_at).num_milliseconds().max(0)) as f64 / 1000.0;
    let left = p.total - p.done;
    if p.done > 0 && left > 0 && header.finished_at.is_none() {
        p.eta_seconds = Some(p.elapsed_seconds / p.done as f64 * left as f64);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{parse_dataset, BatchSpec};
    use crate::batch::{BatchState, ItemOutcome};
    use crate::engine::RunStatus;
    use crate::ids::BatchId;
    use chrono::TimeZone;

    fn t(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + seconds, 0).unwrap()
    }

    fn outcome(verdict: &str, cost_usd: f64) -> ItemOutcome {
        ItemOutcome {
            status: RunStatus::Succeeded,
            verdict: Some(verdict.into()),
            ended_stage: None,
            error: None,
            infra_error: false,
            cost_usd,
            tokens: 100,
            flaky_tests: Vec::new(),
            suspected_special_case: Vec::new(),
            steps: 0,
            cache_hits: 0,
        }
    }

    fn batch(n: usize) -> BatchState {
        let lines: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"id": "i{i}", "repo": "/r"}}"#))
            .collect();
        let items = parse_dataset(&lines.join("\n")).unwrap();
        let spec = BatchSpec {
            trials: 1,
            max_running: 2,
            max_infra_retries: 0,
            labels: Default::default(),
            weight: 1,
        };
        BatchState::new(BatchId::new("b"), "g", "k", spec, &items, t(0))
    }

    #[test]
    fn before_anything_settles_there_is_no_rate_and_no_eta() {
        let mut b = batch(4);
        b.started(0, b.run_id_for(0), t(1));
        let p = progress(&b, t(10));
        assert_eq!((p.total, p.done, p.running, p.queued), (4, 0, 1, 3));
        assert_eq!(p.pass_rate, None);
        assert_eq!(p.eta_seconds, None);
        assert_eq!(p.elapsed_seconds, 10.0);
    }

    #[test]
    fn the_pace_so_far_gives_the_eta_and_verdicts_the_rate() {
        let mut b = batch(4);
        for i in 0..2 {
            b.started(i, b.run_id_for(i), t(1));
        }
        b.finished(0, &outcome("PASS", 0.25), t(5));
        b.finished(1, &outcome("FAIL", 0.5), t(10));
        let p = progress(&b, t(10));
        assert_eq!((p.done, p.running, p.queued), (2, 0, 2));
        assert_eq!(p.pass_rate, Some(0.5));
        assert_eq!(p.cost_usd, 0.75);
        assert_eq!(p.tokens, 200);
        // Two items in 10 s: two more take 10 s.
        assert_eq!(p.eta_seconds, Some(10.0));
    }

    #[test]
    fn a_finished_batch_has_no_eta_and_stops_its_clock() {
        let mut b = batch(1);
        b.started(0, b.run_id_for(0), t(1));
        b.finished(0, &outcome("PASS", 0.0), t(3));
        let p = progress(&b, t(100));
        assert_eq!(p.eta_seconds, None);
        assert_eq!(p.elapsed_seconds, 3.0);
        assert_eq!(p.pass_rate, Some(1.0));
    }
}
