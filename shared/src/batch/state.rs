//! A batch's state ([`BatchState`]): one [`BatchItem`] per dataset item and trial, moved by
//! [`BatchState::started`], [`BatchState::finished`] and [`BatchState::cancel`]; what ended runs
//! mean for it ([`outcome_of`]); the batch's id ([`batch_id`]).
//!
//! An item's life: `Queued` → `Running` → `Passed` | `Failed` | `Flaky` | `Errored` |
//! `Cancelled`. A run that failed for the infrastructure (not the agent) puts its item back to
//! `Queued` as the next attempt while retries are left, and never counts as a verdict. A run
//! whose verdict would have depended on a flaky test (the harness's reruns disagreed) settles
//! its item `Flaky`: no verdict either, counted apart, its flaky tests listed.

use super::dataset::DatasetItem;
use super::flaky::{flaky_error, flaky_of, FLAKY_VERDICT};
use crate::engine::{RunState, RunStatus};
use crate::hashing::{canonical_hash, sha256_hex};
use crate::ids::{BatchId, RunId};
use crate::messages::JobStatus;
use crate::text::head;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// The version of [`BatchState`]'s stored form.
pub const BATCH_STATE_VERSION: u32 = 1;
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
/// Run results whose `reason` says the infrastructure failed, not the agent: a job
/// dead-lettered, a job re-issued until its attempts ran out (lost workers), a commit the
/// engine expected and never got. Every other reason (`budget_exhausted`, `fanout_too_wide`,
/// ...) is the graph's or the agent's.
pub const INFRA_REASONS: &[&str] = &["job_dead_lettered", "job_never_finished", "missing_commit"];

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

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    Queued,
    Running,
    Passed,
    Failed,
    Errored,
    Cancelled,
    /// The run's verdict would have depended on flaky tests: no verdict.
    Flaky,
}

impl ItemState {
    /// Whether the item is done for good: passed, failed, errored or cancelled.
    pub fn is_settled(self) -> bool {
        !matches!(self, ItemState::Queued | ItemState::Running)
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

/// How many items are in each state.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct BatchCounts {
    pub total: usize,
    pub queued: usize,
    pub running: usize,
    pub passed: usize,
    pub failed: usize,
    pub errored: usize,
    pub cancelled: usize,
    #[serde(default)]
    pub flaky: usize,
}

impl BatchCounts {
    /// Items settled: passed, failed, flaky, errored or cancelled.
    pub fn done(&self) -> usize {
        self.passed + self.failed + self.flaky + self.errored + self.cancelled
    }
}

/// A batch as stored (compare-and-set) and driven by the coordinator.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct BatchState {
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
    /// Item order, then trial order.
    pub items: Vec<BatchItem>,
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
    /// Jobs the run's workers answered, and how many of them reused a kept result (the step
    /// cache) instead of running.
    pub steps: u32,
    pub cache_hits: u32,
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
        Self {
            v: BATCH_STATE_VERSION,
            batch_id,
            graph: graph.into(),
            graph_ref: graph_ref.into(),
            spec,
            created_at: at,
            finished_at: items.is_empty().then_some(at),
            cancelled: false,
            items,
        }
    }

    pub fn counts(&self) -> BatchCounts {
        let mut c = BatchCounts {
            total: self.items.len(),
            ..BatchCounts::default()
        };
        for item in &self.items {
            *match item.state {
                ItemState::Queued => &mut c.queued,
                ItemState::Running => &mut c.running,
                ItemState::Passed => &mut c.passed,
                ItemState::Failed => &mut c.failed,
                ItemState::Errored => &mut c.errored,
                ItemState::Cancelled => &mut c.cancelled,
                ItemState::Flaky => &mut c.flaky,
            } += 1;
        }
        c
    }

    /// Whether every item has settled.
    pub fn is_finished(&self) -> bool {
        self.items.iter().all(|i| i.state.is_settled())
    }

    /// The items to start now: `Queued` ones in order, at most `max_new` (what the batch's
    /// share of the fleet's slots lets it start, see [`super::share`]) and as many as
    /// `max_running` leaves room for; none once cancelled.
    pub fn to_start(&self, max_new: usize) -> Vec<usize> {
        if self.cancelled {
            return Vec::new();
        }
        let running = self
            .items
            .iter()
            .filter(|i| i.state == ItemState::Running)
            .count();
        let room = (self.spec.max_running as usize)
            .saturating_sub(running)
            .min(max_new);
        self.items
            .iter()
            .enumerate()
            .filter(|(_, i)| i.state == ItemState::Queued)
            .map(|(index, _)| index)
            .take(room)
            .collect()
    }

    /// The run of the item's current attempt: `b<batch>-<item>-t<trial>-a<attempt>`, with
    /// `<batch>` the batch id (or the first 16 hex digits of its sha256 when it is longer or
    /// has other characters) and `<item>` the first 16 hex digits of the item id's sha256.
    /// Deterministic; at most 58 characters of `[A-Za-z0-9_-]`, so a valid run id (no `.`:
    /// job ids are `<run>.<node>.<visit>`).
    ///
    /// # Panics
    /// When `index` is not an item's.
    pub fn run_id_for(&self, index: usize) -> RunId {
        let item = &self.items[index];
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

    /// The item's run was started: a `Queued` item becomes `Running`. Anything else (another
    /// state, an unknown index) changes nothing.
    pub fn started(&mut self, index: usize, run_id: RunId, at: DateTime<Utc>) {
        if let Some(item) = self.items.get_mut(index) {
            if item.state == ItemState::Queued && !self.cancelled {
                item.state = ItemState::Running;
                item.run_id = Some(run_id);
                item.started_at = Some(at);
            }
        }
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
    /// Ignored: an unknown index, a settled item, a run that has not ended.
    pub fn finished(&mut self, index: usize, outcome: &ItemOutcome, at: DateTime<Utc>) {
        let cancelled = self.cancelled;
        let retries = self.spec.max_infra_retries;
        let Some(item) = self.items.get_mut(index) else {
            return;
        };
        if item.state.is_settled() || !outcome.status.is_terminal() {
            return;
        }
        item.cost_usd += outcome.cost_usd;
        item.tokens = item.tokens.saturating_add(outcome.tokens);
        item.steps = item.steps.saturating_add(outcome.steps);
        item.cache_hits = item.cache_hits.saturating_add(outcome.cache_hits);
        let cancelled_run = outcome.status == RunStatus::Cancelled;
        if outcome.infra_error && !cancelled_run && !cancelled && item.attempt <= retries {
            let reason = outcome.error.as_deref().unwrap_or("infrastructure error");
            item.infra_errors.push(head(reason, MAX_ERROR_CHARS));
            item.attempt += 1;
            item.state = ItemState::Queued;
            item.run_id = None;
            item.started_at = None;
            return;
        }
        item.finished_at = Some(at);
        item.ended_stage = outcome.ended_stage.clone();
        item.flaky_tests = outcome.flaky_tests.clone();
        item.error = outcome.error.as_deref().map(|e| head(e, MAX_ERROR_CHARS));
        item.state = if cancelled_run || (outcome.infra_error && cancelled) {
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
            let state = match verdict.as_str() {
                "PASS" => ItemState::Passed,
                FLAKY_VERDICT => ItemState::Flaky,
                _ => ItemState::Failed,
            };
            item.verdict = Some(verdict);
            state
        };
        self.settle(at);
    }

    /// Cancels the batch: `Queued` items become `Cancelled`, `Running` ones settle when their
    /// run ends (with their verdict if they have one). Changes nothing when already cancelled
    /// or finished.
    pub fn cancel(&mut self, at: DateTime<Utc>) {
        if self.cancelled || self.is_finished() {
            return;
        }
        self.cancelled = true;
        for item in &mut self.items {
            if item.state == ItemState::Queued {
                item.state = ItemState::Cancelled;
                item.finished_at = Some(at);
            }
        }
        self.settle(at);
    }

    fn settle(&mut self, at: DateTime<Utc>) {
        if self.finished_at.is_none() && self.is_finished() {
            self.finished_at = Some(at);
        }
    }
}

fn queued(item_id: &str, trial: u32) -> BatchItem {
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
        steps: 0,
        cache_hits: 0,
        cost_usd: 0.0,
        tokens: 0,
        started_at: None,
        finished_at: None,
    }
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

/// The batch's id: the first 16 hex digits of the sha256 of the canonical JSON of the graph's
/// hash, the items and the spec (labels included). `graph_hash` should name everything else
/// that makes two batches' runs differ (the bundle's hash and, unless items bring their own
/// scripts, the agent's identity), so the same submission gets the same id.
pub fn batch_id(graph_hash: &str, items: &[DatasetItem], spec: &BatchSpec) -> BatchId {
    let hash = canonical_hash(&json!({"graph": graph_hash, "items": items, "spec": spec}));
    BatchId::new(&hash[..16])
}
