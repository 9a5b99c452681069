//! Schedules: a batch fired on a cron expression by whichever coordinator claims the tick
//! first, its report written to object storage when the batch finishes and delivered to a
//! webhook. The pure rules are `shared::schedule`; this module carries them out.
//!
//! - `mod.rs`: adding (every check before anything is stored), removing, `run-now`, creating
//!   a firing's batch, and `update`, the compare-and-set loop every change goes through;
//! - `drive.rs`: every coordinator's tick over every schedule (claim a due tick, create
//!   batches, notice finished ones, claim delivery attempts);
//! - `report.rs`: the report files of a finished firing;
//! - `webhook.rs`: one signed POST;
//! - `api.rs`: the `/v1/schedules` routes.
//!
//! The webhook's secret comes with the schedule (the CLI reads it from the environment variable
//! named by `--webhook-secret-env`), is kept in the run store with the definition, and is never
//! answered, logged or written to object storage.

pub mod api;
mod drive;
mod report;
pub(crate) mod webhook;

pub use drive::drive;

use crate::batches::{submit_batch_as, BatchRequest};
use crate::driver::{Coordinator, DriverError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use shared::batch::BatchSpec;
use shared::graph::GraphBundle;
use shared::hashing::sha256_hex;
use shared::ids::BatchId;
use shared::messages::AgentConfig;
use shared::ports::{CasOutcome, PortError};
use shared::schedule::{
    check_name, CronSchedule, Firing, RetryPolicy, ScheduleDef, ScheduleState, Webhook,
    MAX_SCHEDULES,
};
use std::time::Duration;
use thiserror::Error;
use tracing::info;

/// Compare-and-set attempts of one change before it is given up (and tried on a later tick).
const CAS_TRIES: usize = 8;

#[derive(Debug, Error)]
pub enum ScheduleError {
    #[error(transparent)]
    Invalid(#[from] shared::schedule::ScheduleError),
    #[error("schedule `{0}` already exists (remove it first to change it)")]
    Exists(String),
    #[error("schedule `{0}` not found")]
    Unknown(String),
    #[error("there are {MAX_SCHEDULES} schedules already; remove one first")]
    TooMany,
    #[error("team `{0}` has {1} schedules, its limit (schedules); remove one first")]
    TeamTooMany(String, u32),
    #[error("schedule `{0}` has no report of batch `{1}` (yet)")]
    NoReport(String, BatchId),
    #[error("schedule `{0}` kept changing under this write; try again")]
    Busy(String),
    #[error(transparent)]
    Driver(#[from] DriverError),
}

impl From<PortError> for ScheduleError {
    fn from(e: PortError) -> Self {
        ScheduleError::Driver(e.into())
    }
}

/// Where the morning report goes: the URL and the HMAC key, never answered back.
#[derive(Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookRequest {
    /// `http://` or `https://`, without credentials.
    pub url: String,
    /// The HMAC-SHA256 key of the `X-Fleet-Signature` header, 16 to 1024 bytes.
    pub secret: String,
}

impl std::fmt::Debug for WebhookRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookRequest")
            .field("url", &shared::schedule::shown_url(&self.url))
            .finish_non_exhaustive()
    }
}

/// `POST /v1/schedules`: a name, a cron expression and the batch each tick fires.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    /// 1 to 64 of `[A-Za-z0-9_.-]`, starting with a letter or digit.
    pub name: String,
    /// 5 fields (`0 2 * * *`), or 6 with seconds first (`*/2 * * * * *`); UTC.
    pub cron: String,
    #[schema(value_type = Object)]
    pub graph: GraphBundle,
    /// The dataset as JSONL, kept as it is now (with its sha256) for every firing.
    pub dataset: String,
    #[serde(default)]
    pub agent: AgentConfig,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub options: Value,
    #[schema(value_type = Object)]
    pub spec: BatchSpec,
    #[serde(default)]
    pub webhook: Option<WebhookRequest>,
    /// Where items read from a mirror (SWE-bench lines) find their repositories (an absolute
    /// path on the coordinators), as a batch's `mirror_dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_dir: Option<String>,
    /// The caller's team, set by the server (never read from a request body).
    #[serde(skip)]
    pub team: Option<String>,
}

/// What `POST /v1/schedules` answers.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ScheduleAdded {
    pub name: String,
    pub dataset_sha256: String,
    /// The first tick it will fire (UTC).
    pub next_fire_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// What `POST /v1/schedules/:name/run` answers.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Fired {
    #[schema(value_type = String)]
    pub batch_id: BatchId,
}

/// The retry policy of deliveries: the default, or `FLEET_WEBHOOK_MAX_ATTEMPTS` and
/// `FLEET_WEBHOOK_RETRY_BASE_SECONDS` (the first wait, doubled after each failure).
pub fn retry_policy() -> RetryPolicy {
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let mut p = RetryPolicy::default();
    if let Some(n) = env("FLEET_WEBHOOK_MAX_ATTEMPTS").filter(|n| (1..=100).contains(n)) {
        p.max_attempts = n as u32;
    }
    if let Some(s) = env("FLEET_WEBHOOK_RETRY_BASE_SECONDS").filter(|s| *s <= 3600) {
        p.base = Duration::from_secs(s);
    }
    p
}

/// Checks a schedule and stores it; nothing is stored unless every check passed.
pub async fn add_schedule(
    coord: &Coordinator,
    req: ScheduleRequest,
) -> Result<ScheduleAdded, ScheduleError> {
    check_name(&req.name)?;
    let shown = req.name.clone();
    let now = coord.clock.now();
    let def = ScheduleDef {
        v: shared::schedule::def::SCHEDULE_DEF_VERSION,
        dataset_sha256: sha256_hex(req.dataset.as_bytes()),
        name: shared::schedule::stored_name(req.team.as_deref(), &req.name),
        cron: req.cron.trim().to_string(),
        graph: req.graph,
        dataset: req.dataset,
        agent: req.agent,
        options: req.options,
        spec: req.spec,
        webhook: req.webhook.map(|w| Webhook {
            url: w.url,
            secret: w.secret,
        }),
        created_at: now,
        team: req.team,
        mirror_dir: req.mirror_dir,
    };
    let cron = def.check(now)?;
    if let Some(hook) = &def.webhook {
        // The client that will send it must read it too.
        reqwest::Url::parse(&hook.url).map_err(|e| {
            shared::schedule::ScheduleError::Webhook(format!("the url does not parse: {e}"))
        })?;
        coord
            .http
            .policy
            .check_url(&hook.url)
            .await
            .map_err(shared::schedule::ScheduleError::Webhook)?;
    }
    if coord.store.schedule_state(&def.name).await?.is_some() {
        return Err(ScheduleError::Exists(shown));
    }
    let stored = coord.store.list_schedules().await?;
    if stored.len() >= MAX_SCHEDULES {
        return Err(ScheduleError::TooMany);
    }
    // A team's own cap (under the operator's ceiling): one team never fills the fleet's.
    if let Some(team) = &def.team {
        let max = coord.ledger.limits(team).await.map_err(|e| {
            ScheduleError::Driver(crate::submit::SubmitError::Preflight(e.to_string()).into())
        })?;
        let prefix = shared::schedule::stored_name(Some(team), "");
        let mine = stored.iter().filter(|n| n.starts_with(&prefix)).count();
        if let Some(max) = max.schedules.filter(|m| mine >= *m as usize) {
            return Err(ScheduleError::TeamTooMany(team.clone(), max));
        }
    }
    let state = ScheduleState::new(&def);
    if !coord.store.add_schedule(&def, &state).await? {
        return Err(ScheduleError::Exists(shown));
    }
    info!(schedule = %def.name, cron = %def.cron, dataset_sha256 = %def.dataset_sha256, "schedule added");
    Ok(ScheduleAdded {
        next_fire_at: cron.next_after(now),
        name: shown,
        dataset_sha256: def.dataset_sha256,
    })
}

/// Forgets a schedule. Batches it fired go on; their reports are no longer written or sent.
pub async fn remove_schedule(coord: &Coordinator, name: &str) -> Result<(), ScheduleError> {
    if !coord.store.remove_schedule(name).await? {
        return Err(ScheduleError::Unknown(name.to_string()));
    }
    info!(schedule = %name, "schedule removed");
    Ok(())
}

/// The definition, its uid and the parsed cron expression of a schedule.
pub(crate) struct Loaded {
    pub def: ScheduleDef,
    pub uid: String,
    pub cron: CronSchedule,
}

pub(crate) async fn load(coord: &Coordinator, name: &str) -> Result<Loaded, ScheduleError> {
    let def = coord
        .store
        .schedule_def(name)
        .await?
        .ok_or_else(|| ScheduleError::Unknown(name.to_string()))?;
    // Checked when added; parsed again (it never fails then) with a time that it fired after.
    let cron = CronSchedule::parse(&def.cron, def.created_at)?;
    Ok(Loaded {
        uid: def.uid(),
        def,
        cron,
    })
}

/// Fires the schedule now, under an id of its own; the new batch's id.
pub async fn run_now(coord: &Coordinator, name: &str) -> Result<Fired, ScheduleError> {
    let loaded = load(coord, name).await?;
    let now = coord.clock.now();
    let (batch_id, state) = update(coord, name, |s| {
        (s.uid == loaded.uid).then(|| s.claim_run_now(now, &coord.id))
    })
    .await?
    .ok_or_else(|| ScheduleError::Unknown(name.to_string()))?;
    let batch_id = batch_id.ok_or_else(|| ScheduleError::Unknown(name.to_string()))?;
    let firing = state
        .firing(&batch_id)
        .cloned()
        .ok_or_else(|| ScheduleError::Busy(name.to_string()))?;
    info!(schedule = %name, batch = %batch_id, "run now");
    create_batch(coord, &loaded.def, &firing).await?;
    Ok(Fired { batch_id })
}

/// Creates a claimed firing's batch (idempotent: the id is the firing's) and records it; a
/// batch the coordinator refuses marks the firing failed.
pub(crate) async fn create_batch(
    coord: &Coordinator,
    def: &ScheduleDef,
    firing: &Firing,
) -> Result<(), ScheduleError> {
    let req = BatchRequest {
        graph: def.graph.clone(),
        dataset: def.dataset.clone(),
        agent: def.agent.clone(),
        options: def.options.clone(),
        spec: def.fired_spec(&firing.scheduled_for),
        mirror_dir: def.mirror_dir.clone(),
        team: def.team.clone(),
    };
    let id = &firing.batch_id;
    match submit_batch_as(coord, req, Some(id.clone())).await {
        Ok(_) => {
            update(coord, &def.name, |s| s.created(id)).await?;
            Ok(())
        }
        Err(DriverError::Submit(e)) => {
            let why = e.to_string();
            tracing::warn!(schedule = %def.name, batch = %id, error = %why, "the firing's batch was refused");
            update(coord, &def.name, |s| s.failed(id, &why)).await?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Applies `change` to the schedule's state and commits it by compare-and-set when it
/// changed anything, reloading and applying it again on a conflict: the change's answer and
/// the state after it; None when the schedule is gone.
pub(crate) async fn update<T>(
    coord: &Coordinator,
    name: &str,
    mut change: impl FnMut(&mut ScheduleState) -> T,
) -> Result<Option<(T, ScheduleState)>, ScheduleError> {
    for _ in 0..CAS_TRIES {
        let Some((mut state, version)) = coord.store.schedule_state(name).await? else {
            return Ok(None);
        };
        let before = state.clone();
        let answer = change(&mut state);
        if state == before {
            return Ok(Some((answer, state)));
        }
        match coord.store.commit_schedule(&state, version).await? {
            CasOutcome::Committed => return Ok(Some((answer, state))),
            CasOutcome::Conflict => continue,
        }
    }
    Err(ScheduleError::Busy(name.to_string()))
}
