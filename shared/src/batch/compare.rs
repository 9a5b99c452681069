//! Two batches side by side, item by item (matched by item id): what improved, what regressed,
//! what flipped between passing and failing, what only one of them has, and the cost deltas.
//! An item's score is the share of its judged trials that passed (errored, cancelled and
//! unfinished trials are no verdict and count for nothing).

use super::{BatchState, ItemState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One item's trials in one batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ItemScore {
    pub passed: usize,
    pub judged: usize,
    pub cost_usd: f64,
}

impl ItemScore {
    /// Passed / judged; `None` when no trial was judged.
    pub fn rate(&self) -> Option<f64> {
        (self.judged > 0).then(|| self.passed as f64 / self.judged as f64)
    }
}

/// An item in both batches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ItemChange {
    pub item_id: String,
    pub before: ItemScore,
    pub after: ItemScore,
    pub cost_delta_usd: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub before: String,
    pub after: String,
    /// Judged in both, with a higher pass share after.
    pub improved: Vec<ItemChange>,
    /// Judged in both, with a lower pass share after.
    pub regressed: Vec<ItemChange>,
    /// Judged in both and on the other side of one half (passing ↔ failing): a subset of
    /// `improved` and `regressed`, the changes a reader looks at first.
    pub flipped: Vec<String>,
    /// Judged in both, with the same pass share.
    pub unchanged: usize,
    /// In both, but without a verdict on at least one side (errored, cancelled, unfinished).
    pub not_comparable: Vec<String>,
    pub only_before: Vec<String>,
    pub only_after: Vec<String>,
    pub cost_before_usd: f64,
    pub cost_after_usd: f64,
    pub cost_delta_usd: f64,
}

fn scores(state: &BatchState) -> BTreeMap<&str, ItemScore> {
    let mut out: BTreeMap<&str, ItemScore> = BTreeMap::new();
    for item in &state.items {
        let s = out.entry(item.item_id.as_str()).or_default();
        s.cost_usd += item.cost_usd;
        match item.state {
            ItemState::Passed => {
                s.passed += 1;
                s.judged += 1;
            }
            ItemState::Failed => s.judged += 1,
            _ => {}
        }
    }
    out
}

/// `after` against `before`.
pub fn compare(before: &BatchState, after: &BatchState) -> Comparison {
    let (a, b) = (scores(before), scores(after));
    let mut c = Comparison {
        before: before.batch_id.to_string(),
        after: after.batch_id.to_string(),
        improved: Vec::new(),
        regressed: Vec::new(),
        flipped: Vec::new(),
        unchanged: 0,
        not_comparable: Vec::new(),
        only_before: a
            .keys()
            .filter(|k| !b.contains_key(*k))
            .map(|k| k.to_string())
            .collect(),
        only_after: b
            .keys()
            .filter(|k| !a.contains_key(*k))
            .map(|k| k.to_string())
            .collect(),
        cost_before_usd: a.values().map(|s| s.cost_usd).sum(),
        cost_after_usd: b.values().map(|s| s.cost_usd).sum(),
        cost_delta_usd: 0.0,
    };
    c.cost_delta_usd = c.cost_after_usd - c.cost_before_usd;
    for (id, before) in &a {
        let Some(after) = b.get(id) else { continue };
        let change = ItemChange {
            item_id: id.to_string(),
            before: *before,
            after: *after,
            cost_delta_usd: after.cost_usd - before.cost_usd,
        };
        match (before.rate(), after.rate()) {
            (Some(x), Some(y)) => {
                if (x >= 0.5) != (y >= 0.5) {
                    c.flipped.push(id.to_string());
                }
                if y > x {
                    c.improved.push(change);
                } else if y < x {
                    c.regressed.push(change);
                } else {
                    c.unchanged += 1;
                }
            }
            _ => c.not_comparable.push(id.to_string()),
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{parse_dataset, BatchSpec, ItemOutcome};
    use crate::engine::RunStatus;
    use crate::ids::{BatchId, RunId};

    fn batch(id: &str, verdicts: &[(&str, Option<&str>, f64)]) -> BatchState {
        let lines: Vec<String> = verdicts
            .iter()
            .map(|(i, _, _)| format!(r#"{{"id": "{i}", "repo": "/r"}}"#))
            .collect();
        let items = parse_dataset(&lines.join("\n")).unwrap();
        let spec = BatchSpec {
            trials: 1,
            max_running: 100,
            max_infra_retries: 0,
            labels: Default::default(),
            weight: 1,
        };
        let at = chrono::Utc::now();
        let mut s = BatchState::new(BatchId::new(id), "g", "graphs/g.json", spec, &items, at);
        for (i, (_, verdict, cost)) in verdicts.iter().enumerate() {
            s.started(i, RunId::new(format!("r{i}")), at);
            let outcome = ItemOutcome {
                status: if *verdict == Some("PASS") {
                    RunStatus::Succeeded
                } else {
                    RunStatus::Failed
                },
                verdict: verdict.map(str::to_string),
                ended_stage: None,
                error: verdict.is_none().then(|| "lost".to_string()),
                infra_error: verdict.is_none(),
                cost_usd: *cost,
                tokens: 0,
                flaky_tests: Vec::new(),
                suspected_special_case: Vec::new(),
                steps: 0,
                cache_hits: 0,
            };
            s.finished(i, &outcome, at);
        }
        s
    }

    #[test]
    fn items_are_matched_by_id_and_sorted_into_what_changed() {
        let a = batch(
            "a",
            &[
                ("same", Some("PASS"), 1.0),
                ("fixed", Some("FAIL"), 1.0),
                ("broke", Some("PASS"), 2.0),
                ("lost", None, 0.5),
                ("gone", Some("PASS"), 0.0),
            ],
        );
        let b = batch(
            "b",
            &[
                ("same", Some("PASS"), 1.5),
                ("fixed", Some("PASS"), 1.0),
                ("broke", Some("FAIL"), 1.0),
                ("lost", Some("PASS"), 0.5),
                ("new", Some("FAIL"), 0.25),
            ],
        );
        let c = compare(&a, &b);
        let ids = |v: &[ItemChange]| v.iter().map(|c| c.item_id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&c.improved), vec!["fixed"]);
        assert_eq!(ids(&c.regressed), vec!["broke"]);
        assert_eq!(c.flipped, vec!["broke", "fixed"]);
        assert_eq!(c.unchanged, 1);
        assert_eq!(
            c.not_comparable,
            vec!["lost"],
            "an errored item has no verdict to compare"
        );
        assert_eq!(c.only_before, vec!["gone"]);
        assert_eq!(c.only_after, vec!["new"]);
        assert!((c.cost_before_usd - 4.5).abs() < 1e-9);
        assert!((c.cost_after_usd - 4.25).abs() < 1e-9);
        assert!((c.cost_delta_usd + 0.25).abs() < 1e-9);
        assert!((c.regressed[0].cost_delta_usd + 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_batch_against_itself_changes_nothing() {
        let a = batch("a", &[("x", Some("PASS"), 1.0), ("y", Some("FAIL"), 0.0)]);
        let c = compare(&a, &a);
        assert!(c.improved.is_empty() && c.regressed.is_empty() && c.flipped.is_empty());
        assert_eq!(c.unchanged, 2);
        assert_eq!(c.cost_delta_usd, 0.0);
    }
}
