//! A schedule's state ([`ScheduleState`]): the last tick claimed and the firings, each with its
//! batch, report and webhook delivery. Written by compare-and-set, so each change below is
//! made by one coordinator only: a tick is claimed once (`last_tick` only moves forward), a
//! firing's batch id is fixed by the schedule's name and the tick (creating it twice finds the
//! first), and each delivery attempt is claimed before it is made.
//!
//! A firing's life: `Claimed` (batch not created yet) → `Running` → `Finished` (the batch
//! finished; the firing it is compared with is chosen) → `Reported` (its report is in object
//! storage); or `Failed` when the batch could not be created. A delivery: `Pending` (attempts
//! claimed one at a time; a failed one is retried after a backoff) → `Delivered` | `GaveUp`.

use super::cron::CronSchedule;
use super::def::ScheduleDef;
use super::webhook::{delivery_id, RetryPolicy};
use crate::ids::BatchId;
use crate::text::head;
use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The version of [`ScheduleState`]'s stored form.
pub const SCHEDULE_STATE_VERSION: u32 = 1;
/// Settled firings (reported and delivered or given up, or failed) beyond this many are
/// forgotten, oldest first; their reports stay in object storage.
pub const MAX_FIRINGS_KEPT: usize = 100;
/// An attempt's or a firing's error is cut to this many characters.
pub const MAX_ERROR_CHARS: usize = 500;

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FiringKind {
    /// A tick of the cron expression.
    Tick,
    /// `run-now`: its own id, the cron's ticks unchanged.
    RunNow,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FiringStage {
    Claimed,
    Running,
    Finished,
    Reported,
    Failed,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    Pending,
    Delivered,
    GaveUp,
}

/// One POST of a delivery.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct DeliveryAttempt {
    /// 1-based.
    pub n: u32,
    /// The coordinator that made it.
    pub by: String,
    pub started_at: DateTime<Utc>,
    /// None while under way.
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
    /// The HTTP status the webhook answered.
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub error: Option<String>,
}

/// The webhook delivery of a finished firing's report.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Delivery {
    /// Sent as `X-Fleet-Delivery` with every attempt (receivers drop repeats by it).
    pub id: String,
    pub state: DeliveryState,
    /// No attempt starts before this (the backoff, or the lease of an attempt under way).
    pub next_attempt_at: DateTime<Utc>,
    pub attempts: Vec<DeliveryAttempt>,
}

/// One firing of a schedule: one batch.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Firing {
    #[schema(value_type = String)]
    pub batch_id: BatchId,
    pub kind: FiringKind,
    /// The tick (or, for `run-now`, the time it was asked for).
    pub scheduled_for: DateTime<Utc>,
    pub claimed_at: DateTime<Utc>,
    pub claimed_by: String,
    /// Ticks before this one that were due but not fired (every coordinator was down).
    #[serde(default)]
    pub missed: u32,
    pub stage: FiringStage,
    /// Why the batch could not be created.
    #[serde(default)]
    pub error: Option<String>,
    /// When its batch was seen finished.
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
    /// The firing it is compared with: the latest earlier one whose batch had finished.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub previous: Option<BatchId>,
    #[serde(default)]
    pub delivery: Option<Delivery>,
}

impl Firing {
    /// Nothing more will happen to it.
    pub fn is_settled(&self) -> bool {
        match self.stage {
            FiringStage::Failed => true,
            FiringStage::Reported => self
                .delivery
                .as_ref()
                .is_none_or(|d| d.state != DeliveryState::Pending),
            _ => false,
        }
    }
}

/// The batch id of a tick: `<name>-<YYYYMMDDTHHMMSSZ>`.
pub fn tick_batch_id(name: &str, at: &DateTime<Utc>) -> BatchId {
    BatchId::new(format!("{name}-{}", at.format("%Y%m%dT%H%M%SZ")))
}

/// The batch id of a `run-now`: `<name>-now-<YYYYMMDDTHHMMSSmmmZ>`.
pub fn run_now_batch_id(name: &str, at: &DateTime<Utc>) -> BatchId {
    BatchId::new(format!("{name}-now-{}", at.format("%Y%m%dT%H%M%S%3fZ")))
}

/// The mutable half of a schedule.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ScheduleState {
    /// [`SCHEDULE_STATE_VERSION`].
    pub v: u32,
    pub name: String,
    /// The definition's [`ScheduleDef::uid`]: a write meant for a removed schedule never lands
    /// on one added later under the same name.
    pub uid: String,
    /// The latest tick claimed; ticks at or before it never fire.
    pub last_tick: DateTime<Utc>,
    /// Oldest first.
    pub firings: Vec<Firing>,
}

impl ScheduleState {
    /// A new schedule: it fires on ticks after it was added.
    pub fn new(def: &ScheduleDef) -> Self {
        Self {
            v: SCHEDULE_STATE_VERSION,
            name: def.name.clone(),
            uid: def.uid(),
            last_tick: def.created_at,
            firings: Vec::new(),
        }
    }

    pub fn firing(&self, batch: &BatchId) -> Option<&Firing> {
        self.firings.iter().find(|f| &f.batch_id == batch)
    }

    fn firing_mut(&mut self, batch: &BatchId) -> Option<&mut Firing> {
        self.firings.iter_mut().find(|f| &f.batch_id == batch)
    }

    fn push(&mut self, firing: Firing) -> BatchId {
        let id = firing.batch_id.clone();
        self.firings.push(firing);
        self.trim();
        id
    }

    /// Claims the tick due at `now` (see [`CronSchedule::due`]): at most one, whatever was
    /// missed. The new firing's batch id, or None when no tick is due.
    pub fn claim_tick(
        &mut self,
        cron: &CronSchedule,
        now: DateTime<Utc>,
        by: &str,
    ) -> Option<BatchId> {
        let due = cron.due(self.last_tick, now)?;
        self.last_tick = due.at;
        let batch_id = tick_batch_id(&self.name, &due.at);
        if self.firing(&batch_id).is_some() {
            return None;
        }
        Some(self.push(Firing {
            batch_id,
            kind: FiringKind::Tick,
            scheduled_for: due.at,
            claimed_at: now,
            claimed_by: by.to_string(),
            missed: due.missed,
            stage: FiringStage::Claimed,
            error: None,
            finished_at: None,
            previous: None,
            delivery: None,
        }))
    }

    /// A `run-now` firing at `now`, with an id of its own (`-2`, `-3`, ... when two come in the
    /// same millisecond).
    pub fn claim_run_now(&mut self, now: DateTime<Utc>, by: &str) -> BatchId {
        let base = run_now_batch_id(&self.name, &now);
        let mut batch_id = base.clone();
        let mut n = 1;
        while self.firing(&batch_id).is_some() {
            n += 1;
            batch_id = BatchId::new(format!("{base}-{n}"));
        }
        self.push(Firing {
            batch_id,
            kind: FiringKind::RunNow,
            scheduled_for: now,
            claimed_at: now,
            claimed_by: by.to_string(),
            missed: 0,
            stage: FiringStage::Claimed,
            error: None,
            finished_at: None,
            previous: None,
            delivery: None,
        })
    }

    /// The firing's batch exists: `Claimed` → `Running`.
    pub fn created(&mut self, batch: &BatchId) {
        if let Some(f) = self.firing_mut(batch) {
            if f.stage == FiringStage::Claimed {
                f.stage = FiringStage::Running;
            }
        }
    }

    /// The firing's batch cannot be created: `Claimed` → `Failed`.
    pub fn failed(&mut self, batch: &BatchId, error: &str) {
        if let Some(f) = self.firing_mut(batch) {
            if f.stage == FiringStage::Claimed {
                f.stage = FiringStage::Failed;
                f.error = Some(head(error, MAX_ERROR_CHARS));
            }
        }
        self.trim();
    }

    /// The firing's batch finished: `Running` → `Finished`, compared with the latest earlier
    /// firing whose batch had finished, and (with a webhook) a delivery due at once.
    pub fn finished(&mut self, batch: &BatchId, now: DateTime<Utc>, webhook: bool) {
        let Some(i) = self.firings.iter().position(|f| &f.batch_id == batch) else {
            return;
        };
        if self.firings[i].stage != FiringStage::Running {
            return;
        }
        let previous = self.firings[..i]
            .iter()
            .rev()
            .find(|f| matches!(f.stage, FiringStage::Finished | FiringStage::Reported))
            .map(|f| f.batch_id.clone());
        let f = &mut self.firings[i];
        f.stage = FiringStage::Finished;
        f.finished_at = Some(now);
        f.previous = previous;
        f.delivery = webhook.then(|| Delivery {
            id: delivery_id(batch),
            state: DeliveryState::Pending,
            next_attempt_at: now,
            attempts: Vec::new(),
        });
    }

    /// The firing's report is in object storage: `Finished` → `Reported`.
    pub fn reported(&mut self, batch: &BatchId) {
        if let Some(f) = self.firing_mut(batch) {
            if f.stage == FiringStage::Finished {
                f.stage = FiringStage::Reported;
            }
        }
        self.trim();
    }

    /// Claims the next delivery attempt of a reported firing when one is due at `now`: its
    /// number. An attempt still marked under way whose lease passed is closed as lost first;
    /// with every attempt spent the delivery gives up instead.
    pub fn claim_attempt(
        &mut self,
        batch: &BatchId,
        now: DateTime<Utc>,
        by: &str,
        policy: &RetryPolicy,
    ) -> Option<u32> {
        let f = self.firing_mut(batch)?;
        if f.stage != FiringStage::Reported {
            return None;
        }
        let d = f.delivery.as_mut()?;
        if d.state != DeliveryState::Pending || d.next_attempt_at > now {
            return None;
        }
        if let Some(last) = d.attempts.last_mut() {
            if last.finished_at.is_none() {
                last.finished_at = Some(now);
                last.error = Some("no outcome recorded (the coordinator making it stopped)".into());
            }
        }
        let n = d.attempts.len() as u32 + 1;
        if n > policy.max_attempts {
            d.state = DeliveryState::GaveUp;
            self.trim();
            return None;
        }
        d.attempts.push(DeliveryAttempt {
            n,
            by: by.to_string(),
            started_at: now,
            finished_at: None,
            status: None,
            error: None,
        });
        d.next_attempt_at = later(now, policy.lease);
        Some(n)
    }

    /// Records how attempt `n` ended (`Ok(status)` when the webhook answered): a 2xx status
    /// delivers; otherwise the next attempt is due after the policy's backoff, or the delivery
    /// gives up when `n` was the last. Ignored unless `n` is the attempt under way.
    pub fn attempt_done(
        &mut self,
        batch: &BatchId,
        n: u32,
        outcome: Result<u16, String>,
        now: DateTime<Utc>,
        policy: &RetryPolicy,
    ) {
        let Some(d) = self.firing_mut(batch).and_then(|f| f.delivery.as_mut()) else {
            return;
        };
        if d.state != DeliveryState::Pending {
            return;
        }
        let Some(a) = d.attempts.last_mut() else {
            return;
        };
        if a.n != n || a.finished_at.is_some() {
            return;
        }
        a.finished_at = Some(now);
        let delivered = match outcome {
            Ok(status) => {
                a.status = Some(status);
                if !(200..300).contains(&status) {
                    a.error = Some(format!("the webhook answered {status}"));
                }
                (200..300).contains(&status)
            }
            Err(e) => {
                a.error = Some(head(&e, MAX_ERROR_CHARS));
                false
            }
        };
        if delivered {
            d.state = DeliveryState::Delivered;
        } else if n >= policy.max_attempts {
            d.state = DeliveryState::GaveUp;
        } else {
            d.next_attempt_at = later(now, policy.delay_after(n));
        }
        self.trim();
    }

    /// Forgets the oldest settled firings beyond [`MAX_FIRINGS_KEPT`].
    fn trim(&mut self) {
        let mut extra = self.firings.len().saturating_sub(MAX_FIRINGS_KEPT);
        if extra == 0 {
            return;
        }
        self.firings.retain(|f| {
            if extra > 0 && f.is_settled() {
                extra -= 1;
                false
            } else {
                true
            }
        });
    }
}

/// `d` after `now`, or the end of time.
fn later(now: DateTime<Utc>, d: std::time::Duration) -> DateTime<Utc> {
    TimeDelta::from_std(d)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}
