//! A batch's state: its [`BatchHeader`] (spec, books) and one [`BatchItem`] per dataset item
//! and trial, moved by the header's transitions ([`BatchHeader::start_item`],
//! [`BatchHeader::finish_item`], [`BatchHeader::cancel_item`]) which keep the books; the whole
//! batch ([`BatchState`]); the batch's id ([`batch_id`]).
//!
//! An item's life: `Queued` → `Running` → `Passed` | `Failed` | `Flaky` | `Errored` |
//! `Cancelled`. A run that failed for the infrastructure (not the agent) puts its item back to
//! `Queued` as the next attempt while retries are left, and never counts as a verdict. A run
//! whose verdict would have depended on a flaky test (the harness's reruns disagreed) settles
//! its item `Flaky`: no verdict either, counted apart, its flaky tests listed.

use super::counts::BatchCounts;
pub use super::counts::ItemState;
use super::dataset::DatasetItem;
use super::flaky::FLAKY_VERDICT;
use super::outcome::ItemOutcome;
use super::outcome::{held_reason, HELD_VERDICT};
use crate::engine::RunStatus;
use crate::hashing::{canonical_hash, sha256_hex};
use crate::ids::{BatchId, RunId};
use crate::special_case::SuspectedSpecialCase;
use crate::text::head;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// The version of [`BatchState`]'s stored form.
pub const BATCH_STATE_VERSION: u32 = 2;
/// A batch runs each item at most this many times.
pub const MAX_TRIALS: u32 = 100;
/// Retries after infrastructure errors are bounded, so a broken fleet cannot loop forever.
pub const MAX_INFRA_RETRIES: u32 = 10;
/// Labels: at most this many, keys of at most `MAX_LABEL_KEY_CHARS`, values of at most
/// `MAX_LABEL_VALUE_CHARS`.
pub const MAX_LABELS: usize = 32;
pub const MAX_LABEL_KEY_CHARS: usize = 64;
pub const MAX_LABEL_VALUE_CHARS: usize = 256;
/// An item's error (and each infrastructure error it keeps) is cut to this many characters.
pub const MAX_ERROR_CHARS: usize = 2000;

const fn default_trials() -> u32 {
    1
}

const fn default_infra_retries() -> u32 {
    2
}

const fn default_weight() -> u32 {
    1
}

/// A batch's weight is at most this (see [`super::share`]).
pub const MAX_WEIGHT: u32 = 1000;

/// How a batch runs its dataset.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct BatchSpec {
    /// Runs per item, 1 to [`MAX_TRIALS`] (default 1).
    #[serde(default = "default_trials")]
    pub trials: u32,
    /// Runs under way at once (at least 1).
    pub max_running: u32,
    /// New runs of an item after infrastructure errors (default 2, at most
    /// [`MAX_INFRA_RETRIES`]).
    #[serde(default = "default_infra_retries")]
    pub max_infra_retries: u32,
    /// Free-form tags carried into the reports (model, prompt version, ...).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Its part of the fleet's batch slots against the other unfinished batches, 1 to
    /// [`MAX_WEIGHT`] (default 1): a batch of weight 2 gets twice the slots of one of weight 1
    /// when both want more than their share (see [`super::share::fair_shares`]).
    #[serde(default = "default_weight")]
    pub weight: u32,
}

impl BatchSpec {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_TRIALS).contains(&self.trials) {
            return Err(format!(
                "trials is {}, not between 1 and {MAX_TRIALS}",
                self.trials
            ));
        }
        if self.max_running == 0 {
            return Err("max_running must be at least 1".into());
        }
        if self.max_infra_retries > MAX_INFRA_RETRIES {
            return Err(format!(
                "max_infra_retries is {}, over {MAX_INFRA_RETRIES}",
                self.max_infra_retries
            ));
        }
        if !(1..=MAX_WEIGHT).contains(&self.weight) {
            return Err(format!(
                "weight is {}, not between 1 and {MAX_WEIGHT}",
                self.weight
            ));
        }
        if self.labels.len() > MAX_LABELS {
            return Err(format!("more than {MAX_LABELS} labels"));
        }
        for (key, value) in &self.labels {
            let key_ok = (1..=MAX_LABEL_KEY_CHARS).contains(&key.len())
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
            if !key_ok {
                let shown: String = key.chars().take(MAX_LABEL_KEY_CHARS).collect();
                return Err(format!(
                    "label {shown:?}: a key is 1 to {MAX_LABEL_KEY_CHARS} of `[A-Za-z0-9_.-]`"
                ));
            }
            if value.chars().count() > MAX_LABEL_VALUE_CHARS {
                return Err(format!(
                    "label {key:?}: the value is over {MAX_LABEL_VALUE_CHARS} characters"
                ));
            }
        }
        Ok(())
    }
}

/// One trial of one dataset item, across its attempts.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct BatchItem {
    pub item_id: String,
    /// 1-based.
    pub trial: u32,
    /// 1-based: the run after an infrastructure error is attempt 2, and so on.
    pub attempt: u32,
    /// The current attempt's run, once started.
    #[serde(default)]
    pub run_id: Option<RunId>,
    pub state: ItemState,
    #[serde(default)]
    pub verdict: Option<String>,
    #[serde(default)]
    pub ended_stage: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
    /// The reasons of earlier attempts' infrastructure errors, oldest first.
    #[serde(default)]
    pub infra_errors: Vec<String>,
    /// The flaky tests its settling run's test runs found (a `Flaky` item's decide it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flaky_tests: Vec<String>,
    /// The special-casing signals of its settling run (a `Held` item's decide it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suspected_special_case: Vec<SuspectedSpecialCase>,
    /// Jobs its runs' workers answered over every attempt, and how many of them reused a kept
    /// result (the step cache).
    #[serde(default)]
    pub steps: u32,
    #[serde(default)]
    pub cache_hits: u32,
    /// Spent over every attempt.
    #[serde(default)]
    pub cost_usd: f64,
    /// Input plus output tokens over every attempt.
    #[serde(default)]
    pub tokens: u64,
    /// When the current attempt started and when the item settled.
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
}

/// Everything of a batch but its items: what it runs, whether it was cancelled, and its books
/// (how many items are in each state, what they spent), kept by the transitions of its items
/// ([`BatchHeader::start_item`], [`BatchHeader::finish_item`], [`BatchHeader::cancel_item`]).
/// A store can drive a batch through its header and the few items a pass touches
/// ([`super::BatchSlice`]) without reading every item.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct BatchHeader {
    /// [`BATCH_STATE_VERSION`].
    pub v: u32,
    pub batch_id: BatchId,
    /// The graph's name.
    pub graph: String,
    pub graph_ref: String,
    pub spec: BatchSpec,
    pub created_at: DateTime<Utc>,
    /// When the last item settled.
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub cancelled: bool,
    /// Items in each state.
    #[serde(default)]
    pub counts: BatchCounts,
    /// Spent over every attempt of every item.
    #[serde(default)]
    pub cost_usd: f64,
    /// Input plus output tokens over every attempt of every item.
    #[serde(default)]
    pub tokens: u64,
    /// The team that owns the batch and its runs (none: the open API's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

impl BatchHeader {
    /// Whether every item has settled.
    pub fn is_finished(&self) -> bool {
        self.counts.queued == 0 && self.counts.running == 0
    }

    /// How many items may start now: `max_running` less the running ones, at most `max_new`
    /// (what the batch's share of the fleet's slots lets it start, see [`super::share`]);
    /// none once cancelled.
    pub fn room(&self, max_new: usize) -> usize {
        if self.cancelled {
            return 0;
        }
        (self.spec.max_running as usize)
            .saturating_sub(self.counts.running)
            .min(max_new)
            .min(self.counts.queued)
    }

    /// The run of the item's current attempt: `b<batch>-<item>-t<trial>-a<attempt>`, with
    /// `<batch>` the batch id (or the first 16 hex digits of its sha256 when it is longer or
    /// has other characters) and `<item>` the first 16 hex digits of the item id's sha256.
    /// Deterministic; at most 58 characters of `[A-Za-z0-9_-]`, so a valid run id (no `.`:
    /// job ids are `<run>.<node>.<visit>`).
    pub fn run_id_for(&self, item: &BatchItem) -> RunId {
        let id = self.batch_id.as_str();
        let tag = if (1..=16).contains(&id.len())
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            id.to_string()
        } else {
            sha256_hex(id.as_bytes())[..16].to_string()
        };
        let item_hash = &sha256_hex(item.item_id.as_bytes())[..16];
        RunId::new(format!(
            "b{tag}-{item_hash}-t{}-a{}",
            item.trial, item.attempt
        ))
    }

    /// The item's run was started: a `Queued` item becomes `Running` (not in a cancelled
    /// batch). Whether it changed.
    pub fn start_item(&mut self, item: &mut BatchItem, run_id: RunId, at: DateTime<Utc>) -> bool {
        if item.state != ItemState::Queued || self.cancelled {
            return false;
        }
        item.run_id = Some(run_id);
        item.started_at = Some(at);
        self.moved(item, ItemState::Running, at);
        true
    }

    /// The item's run ended. Its cost and tokens are added to the item's, then:
    /// - an infrastructure error with retries left (`attempt <= max_infra_retries`, batch not
    ///   cancelled): back to `Queued` as the next attempt, the reason kept in `infra_errors`,
    ///   no verdict;
    /// - a cancelled run → `Cancelled`; an infrastructure error without retries → `Errored`
    ///   (`Cancelled` in a cancelled batch);
    /// - otherwise the verdict (the outcome's, else `PASS` for a succeeded run and `FAIL` for a
    ///   failed one): `Passed` when it is exactly `PASS`, `Flaky` when it is
    ///   [`FLAKY_VERDICT`], else `Failed`; the run's flaky tests are kept with any verdict.
    ///
    /// The outcome must be of the item's current run (its `run_id`), or of none for a `Queued`
    /// item whose run could not be created: the caller fences out reports of earlier attempts.
    /// Ignored (false): a settled item, a run that has not ended.
    pub fn finish_item(
        &mut self,
        item: &mut BatchItem,
        outcome: &ItemOutcome,
        at: DateTime<Utc>,
    ) -> bool {
        if item.state.is_settled() || !outcome.status.is_terminal() {
            return false;
        }
        item.cost_usd += outcome.cost_usd;
        item.tokens = item.tokens.saturating_add(outcome.tokens);
        item.steps = item.steps.saturating_add(outcome.steps);
        item.cache_hits = item.cache_hits.saturating_add(outcome.cache_hits);
        self.cost_usd += outcome.cost_usd;
        self.tokens = self.tokens.saturating_add(outcome.tokens);
        let cancelled_run = outcome.status == RunStatus::Cancelled;
        let retries = self.spec.max_infra_retries;
        if outcome.infra_error && !cancelled_run && !self.cancelled && item.attempt <= retries {
            let reason = outcome.error.as_deref().unwrap_or("infrastructure error");
            item.infra_errors.push(head(reason, MAX_ERROR_CHARS));
            item.attempt += 1;
            item.run_id = None;
            item.started_at = None;
            self.moved(item, ItemState::Queued, at);
            return true;
        }
        item.finished_at = Some(at);
        item.ended_stage = outcome.ended_stage.clone();
        item.flaky_tests = outcome.flaky_tests.clone();
        item.error = outcome.error.as_deref().map(|e| head(e, MAX_ERROR_CHARS));
        let to = if cancelled_run || (outcome.infra_error && self.cancelled) {
            ItemState::Cancelled
        } else if outcome.infra_error {
            ItemState::Errored
        } else {
            let verdict = outcome.verdict.clone().unwrap_or_else(|| {
                if outcome.status == RunStatus::Succeeded {
                    "PASS".into()
                } else {
                    "FAIL".into()
                }
            });
            let mut state = match verdict.as_str() {
                "PASS" => ItemState::Passed,
                FLAKY_VERDICT => ItemState::Flaky,
                _ => ItemState::Failed,
            };
            let mut verdict = verdict;
            if state == ItemState::Passed && !outcome.suspected_special_case.is_empty() {
                state = ItemState::Held;
                verdict = HELD_VERDICT.into();
                item.error = Some(head(
                    &held_reason(&outcome.suspected_special_case),
                    MAX_ERROR_CHARS,
                ));
            }
            item.suspected_special_case = outcome.suspected_special_case.clone();
            item.verdict = Some(verdict);
            state
        };
        self.moved(item, to, at);
        true
    }

    /// Cancels the batch: nothing starts any more; its `Queued` items are to become
    /// `Cancelled` ([`Self::cancel_item`]) and its `Running` ones settle when their run ends.
    /// False when already cancelled or finished.
    pub fn cancel(&mut self) -> bool {
        if self.cancelled || self.is_finished() {
            return false;
        }
        self.cancelled = true;
        true
    }

    /// A `Queued` item of a cancelled batch becomes `Cancelled`. Whether it changed.
    pub fn cancel_item(&mut self, item: &mut BatchItem, at: DateTime<Utc>) -> bool {
        if !self.cancelled || item.state != ItemState::Queued {
            return false;
        }
        item.finished_at = Some(at);
        self.moved(item, ItemState::Cancelled, at);
        true
    }

    /// Moves the item to `to`, keeping the counts, and notes the batch's end.
    fn moved(&mut self, item: &mut BatchItem, to: ItemState, at: DateTime<Utc>) {
        let from = item.state;
        *self.counts.of_mut(from) = self.counts.of_mut(from).saturating_sub(1);
        *self.counts.of_mut(to) += 1;
        item.state = to;
        if self.finished_at.is_none() && self.is_finished() {
            self.finished_at = Some(at);
        }
    }
}

/// A whole batch: its header and every item (item order, then trial order), as the reports
/// and the API read it and as it is mirrored to object storage. Read back, its books are
/// counted again from its items (so a stored form is never believed over its items).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(from = "StoredBatch")]
pub struct BatchState {
    #[serde(flatten)]
    header: BatchHeader,
    pub items: Vec<BatchItem>,
}

/// [`BatchState`]'s stored form, before its books are counted.
#[derive(Deserialize)]
struct StoredBatch {
    #[serde(flatten)]
    header: BatchHeader,
    items: Vec<BatchItem>,
}

impl From<StoredBatch> for BatchState {
    fn from(s: StoredBatch) -> Self {
        BatchState::from_parts(s.header, s.items)
    }
}

impl std::ops::Deref for BatchState {
    type Target = BatchHeader;
    fn deref(&self) -> &BatchHeader {
        &self.header
    }
}

impl BatchState {
    /// One `Queued` item, attempt 1, per dataset item and trial (item order, then trial).
    pub fn new(
        batch_id: BatchId,
        graph: impl Into<String>,
        graph_ref: impl Into<String>,
        spec: BatchSpec,
        items: &[DatasetItem],
        at: DateTime<Utc>,
    ) -> Self {
        let items: Vec<BatchItem> = items
            .iter()
            .flat_map(|item| (1..=spec.trials).map(move |trial| queued(&item.id, trial)))
            .collect();
        let header = BatchHeader {
            v: BATCH_STATE_VERSION,
            batch_id,
            graph: graph.into(),
            graph_ref: graph_ref.into(),
            spec,
            created_at: at,
            finished_at: items.is_empty().then_some(at),
            cancelled: false,
            counts: BatchCounts::default(),
            cost_usd: 0.0,
            tokens: 0,
            team: None,
        };
        Self::from_parts(header, items)
    }

    /// The batch as `team`'s.
    pub fn with_team(mut self, team: Option<String>) -> Self {
        self.header.team = team;
        self
    }

    /// A batch of this header and these items, its books counted from the items.
    pub fn from_parts(mut header: BatchHeader, items: Vec<BatchItem>) -> Self {
        let mut counts = BatchCounts {
            total: items.len(),
            ..BatchCounts::default()
        };
        let (mut cost_usd, mut tokens) = (0.0, 0u64);
        for item in &items {
            *counts.of_mut(item.state) += 1;
            cost_usd += item.cost_usd;
            tokens = tokens.saturating_add(item.tokens);
        }
        header.counts = counts;
        header.cost_usd = cost_usd;
        header.tokens = tokens;
        Self { header, items }
    }

    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    pub fn counts(&self) -> BatchCounts {
        self.header.counts
    }

    /// The items to start now: `Queued` ones in order, as many as [`BatchHeader::room`]
    /// leaves.
    pub fn to_start(&self, max_new: usize) -> Vec<usize> {
        self.items
            .iter()
            .enumerate()
            .filter(|(_, i)| i.state == ItemState::Queued)
            .map(|(index, _)| index)
            .take(self.header.room(max_new))
            .collect()
    }

    /// The run of the item's current attempt ([`BatchHeader::run_id_for`]).
    ///
    /// # Panics
    /// When `index` is not an item's.
    pub fn run_id_for(&self, index: usize) -> RunId {
        self.header.run_id_for(&self.items[index])
    }

    /// [`BatchHeader::start_item`] of the item at `index` (an unknown index changes nothing).
    pub fn started(&mut self, index: usize, run_id: RunId, at: DateTime<Utc>) {
        if let Some(item) = self.items.get_mut(index) {
            self.header.start_item(item, run_id, at);
        }
    }

    /// [`BatchHeader::finish_item`] of the item at `index` (an unknown index changes nothing).
    pub fn finished(&mut self, index: usize, outcome: &ItemOutcome, at: DateTime<Utc>) {
        if let Some(item) = self.items.get_mut(index) {
            self.header.finish_item(item, outcome, at);
        }
    }

    /// Cancels the batch ([`BatchHeader::cancel`]) and every `Queued` item.
    pub fn cancel(&mut self, at: DateTime<Utc>) {
        if self.header.cancel() {
            for item in &mut self.items {
                self.header.cancel_item(item, at);
            }
        }
    }

    /// Replaces the item at `index` (a store applying a [`super::BatchSlice`]'s changes); the
    /// books are the caller's to keep (the slice's header).
    pub(crate) fn set_item(&mut self, index: usize, item: BatchItem) {
        if let Some(slot) = self.items.get_mut(index) {
            *slot = item;
        }
    }

    /// The header, to change what a test needs (the books are the test's to keep).
    #[cfg(test)]
    pub(crate) fn header_mut(&mut self) -> &mut BatchHeader {
        &mut self.header
    }

    pub(crate) fn set_header(&mut self, header: BatchHeader) {
        self.header = header;
    }
}

pub(crate) fn queued(item_id: &str, trial: u32) -> BatchItem {
    BatchItem {
        item_id: item_id.to_string(),
        trial,
        attempt: 1,
        run_id: None,
        state: ItemState::Queued,
        verdict: None,
        ended_stage: None,
        error: None,
        infra_errors: Vec::new(),
        flaky_tests: Vec::new(),
        suspected_special_case: Vec::new(),
        steps: 0,
        cache_hits: 0,
        cost_usd: 0.0,
        tokens: 0,
        started_at: None,
        finished_at: None,
    }
}

/// The batch's id: the first 16 hex digits of the sha256 of the canonical JSON of the graph's
/// hash, the items and the spec (labels included). `graph_hash` should name everything else
/// that makes two batches' runs differ (the bundle's hash and, unless items bring their own
/// scripts, the agent's identity), so the same submission gets the same id.
pub fn batch_id(graph_hash: &str, items: &[DatasetItem], spec: &BatchSpec) -> BatchId {
    let hash = canonical_hash(&json!({"graph": graph_hash, "items": items, "spec": spec}));
    BatchId::new(&hash[..16])
}
