//! The driver: feeds events to the pure engine and carries out what it decides. Every state
//! change goes through a compare-and-set in the run store together with the job messages it
//! causes (outbox); a relay publishes the outbox with publisher confirms. Nothing that matters
//! lives in memory, so several coordinators can run side by side and any of them can die.
//!
//! The rooms: this file applies events and commits them; `mirror` keeps the copy of each run
//! in object storage and restores runs the store lost; `relay` publishes the outbox; `inbox`
//! consumes results and batches them per run; `watchdog` re-issues jobs past their deadline;
//! `tree` carries child runs' starts, ends and cancels between runs; `job_slots` holds a team's
//! jobs to its `concurrent_jobs`.

mod inbox;
mod job_slots;
mod mirror;
mod mirror_index;
mod notices;
mod relay;
mod retention;
mod state_cache;
mod store_log;
mod stored_content;
mod team_notices;
#[cfg(test)]
mod tests;
mod tree;
mod watchdog;

use crate::metrics::CoordinatorMetrics;
use crate::submit::SubmitError;
use shared::builtins;
use shared::engine::{self, Applied, Effect, Event, RunState};
use shared::graph::GraphBundle;
use shared::ids::RunId;
use shared::messages::{JobEnvelope, INLINE_LIMIT, WIRE_VERSION};
use shared::ports::{CasOutcome, OutboxMessage, PortError, RunStore};
use shared::time::{Clock, SystemClock};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use thiserror::Error;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};
use worker::blobs::{BlobError, Blobs};
use worker::queue::{Broker, QueueName};

#[derive(Debug, Error)]
pub enum DriverError {
    #[error(transparent)]
    Store(#[from] PortError),
    #[error(transparent)]
    Blob(#[from] BlobError),
    #[error("engine: {0}")]
    Engine(#[from] engine::EngineError),
    #[error("run `{0}` not found")]
    UnknownRun(RunId),
    #[error("batch `{0}` not found")]
    UnknownBatch(shared::ids::BatchId),
    #[error(transparent)]
    Submit(#[from] SubmitError),
}

pub struct Coordinator {
    pub id: String,
    pub store: Arc<dyn RunStore>,
    pub broker: Arc<dyn Broker>,
    pub blobs: Blobs,
    pub metrics: CoordinatorMetrics,
    graphs: Mutex<HashMap<String, Arc<GraphBundle>>>,
    outbox_ready: Notify,
    run_locks: Mutex<HashMap<RunId, Arc<tokio::sync::Mutex<()>>>>,
    inbox: Mutex<inbox::Inbox>,
    /// Time after a started job's own timeout before the watchdog re-issues it.
    pub reissue_grace: Duration,
    /// Time a run may wait for nothing before the watchdog ends it as stalled.
    pub stall_grace: Duration,
    /// Time a published job may wait in the queue (plus its own timeout) before the watchdog
    /// issues it again.
    pub queue_grace: Duration,
    /// Finished runs leave the run store this long after they were created.
    pub run_retention: Duration,
    /// Runs of batches under way at once over the whole fleet, shared by the unfinished
    /// batches by weight (`shared::batch::share`); every coordinator must be given the same.
    pub batch_slots: usize,
    /// The key that signs run notices (`FLEET_WEBHOOK_SECRET`); a run may name a webhook
    /// only when it is set.
    pub webhook_secret: Option<String>,
    /// The API without tokens (`--open-api`, for local use): one admin over every team.
    /// Otherwise every route but the public ones needs a token. True for the embedded mode and
    /// tests; `fleet coordinator` sets it from its flag (off by default).
    pub open_api: bool,
    /// Where on this coordinator's disk a submission may name a repository
    /// (`FLEET_REPO_ROOTS`).
    pub repo_roots: crate::repo_roots::RepoRoots,
    /// The largest repository pack a client may upload (`FLEET_MAX_UPLOAD_MB`, 256 MiB); the
    /// files of its commit may expand to four times that.
    pub max_upload_bytes: u64,
    /// Uploads checked at once (`FLEET_UPLOAD_CONCURRENCY`, 2), each a pack and a file in memory.
    pub upload_slots: Arc<tokio::sync::Semaphore>,
    /// The fleet's quota ledger (Redis when served; memory otherwise): teams' limits, spend,
    /// runs under way, webhooks and notices.
    pub ledger: Arc<dyn worker::quota::Ledger>,
    /// Rung with a run's id after every commit of it here (the dashboard's live views).
    pub run_changed: tokio::sync::broadcast::Sender<RunId>,
    pub(crate) http: crate::schedules::webhook::WebhookClient,
    /// The LLM price table (defaults and `FLEET_PRICES`): a run whose model has no price is
    /// refused at submission, never counted at $0.
    pub prices: worker::agent::PriceTable,
    /// What this coordinator last mirrored of each run.
    mirrored: Mutex<HashMap<RunId, mirror::MirrorMark>>,
    states: state_cache::StateCache,
    /// Where the times of events (and so of run states) come from; also the deadlines'.
    pub clock: Arc<dyn Clock>,
    /// Content-addressed keys this coordinator knows to be stored (graph bundles, packs): a
    /// submission does not store them again. A bound, not an LRU.
    stored: Mutex<std::collections::HashSet<String>>,
    /// (repository, commit) → (pack key, tree hash) of repositories this coordinator packed
    /// and stored: a batch's runs of one repository pack it once. A bound, not an LRU.
    snapshots: Mutex<HashMap<(String, String), (String, String)>>,
    /// Upload records (by their key: team and commit) read or written here (`known_upload`).
    uploads: Mutex<HashMap<String, shared::http::Uploaded>>,
    /// Rung when a run finishes here, so the batch driver settles it and starts the next
    /// item at once rather than at its next tick.
    pub batch_wake: Notify,
    /// Teams' `concurrent_jobs` as last read from the ledger, and when (`job_slots`).
    team_job_limits: Mutex<HashMap<String, (std::time::Instant, Option<u32>)>>,
}

/// A coordinator id no other process shares: in containers every process is pid 1, so the
/// pid alone would make restarted coordinators inherit each other's leases.
pub fn unique_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "coordinator-{host}-{}-{:x}",
        std::process::id(),
        nanos & 0xffff_ffff
    )
}

/// Graph bundles a coordinator keeps in memory at most.
const GRAPH_CACHE_MAX: usize = 256;

/// Runs of batches under way at once over the fleet unless `FLEET_BATCH_SLOTS` says otherwise.
pub const DEFAULT_BATCH_SLOTS: usize = 32;

/// A whole number from the environment (seconds, slots), or `default`.
fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl Coordinator {
    pub fn new(
        id: String,
        store: Arc<dyn RunStore>,
        broker: Arc<dyn Broker>,
        blobs: Blobs,
        metrics: CoordinatorMetrics,
    ) -> Self {
        Self {
            id,
            store,
            broker,
            blobs,
            metrics,
            graphs: Mutex::new(HashMap::new()),
            outbox_ready: Notify::new(),
            run_locks: Mutex::new(HashMap::new()),
            inbox: Mutex::new(inbox::Inbox::default()),
            reissue_grace: Duration::from_secs(env_u64("FLEET_REISSUE_GRACE_SECONDS", 60)),
            stall_grace: Duration::from_secs(env_u64("FLEET_STALL_GRACE_SECONDS", 60)),
            run_retention: Duration::from_secs(env_u64(
                "FLEET_RUN_RETENTION_SECONDS",
                7 * 24 * 3600,
            )),
            queue_grace: Duration::from_secs(env_u64("FLEET_QUEUE_GRACE_SECONDS", 6 * 3600)),
            batch_slots: env_u64("FLEET_BATCH_SLOTS", DEFAULT_BATCH_SLOTS as u64) as usize,
            mirrored: Mutex::new(HashMap::new()),
            states: state_cache::StateCache::with_bound(
                env_u64("FLEET_STATE_CACHE_MB", state_cache::DEFAULT_STATE_CACHE_MB)
                    .saturating_mul(1 << 20) as usize,
            ),
            clock: Arc::new(SystemClock),
            batch_wake: Notify::new(),
            stored: Mutex::new(std::collections::HashSet::new()),
            snapshots: Mutex::new(HashMap::new()),
            uploads: Mutex::new(HashMap::new()),
            webhook_secret: std::env::var("FLEET_WEBHOOK_SECRET")
                .ok()
                .filter(|s| !s.is_empty()),
            open_api: true,
            repo_roots: crate::repo_roots::RepoRoots::from_env(),
            max_upload_bytes: env_u64("FLEET_MAX_UPLOAD_MB", 256).saturating_mul(1 << 20),
            upload_slots: Arc::new(tokio::sync::Semaphore::new(
                env_u64("FLEET_UPLOAD_CONCURRENCY", 2).clamp(1, 64) as usize,
            )),
            ledger: Arc::new(worker::quota::memory::MemoryLedger::new()),
            run_changed: tokio::sync::broadcast::channel(1024).0,
            prices: worker::agent::PriceTable::from_env().unwrap_or_else(|e| {
                tracing::error!(error = %e, "FLEET_PRICES is refused; only the default prices hold");
                worker::agent::PriceTable::with_defaults()
            }),
            http: crate::schedules::webhook::client(),
            team_job_limits: Mutex::new(HashMap::new()),
        }
    }

    /// Replaces the system clock (tests, embedders).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub async fn bundle(&self, key: &str) -> Result<Arc<GraphBundle>, DriverError> {
        if let Some(b) = self.graphs.lock().expect("graph cache").get(key) {
            return Ok(b.clone());
        }
        let b: Arc<GraphBundle> = Arc::new(self.blobs.get_json(key).await?);
        let mut cache = self.graphs.lock().expect("graph cache");
        // Bundles are content-addressed and cheap to fetch again: a bound, not an LRU.
        if cache.len() >= GRAPH_CACHE_MAX {
            cache.clear();
        }
        cache.insert(key.to_string(), b.clone());
        Ok(b)
    }

    /// Stores each job spec and turns publish effects into outbox messages.
    async fn outbox_for(&self, effects: &[Effect]) -> Result<Vec<OutboxMessage>, DriverError> {
        let mut out = Vec::new();
        for fx in effects {
            if let Effect::Publish(spec) = fx {
                let (spec_ref, inline) = self
                    .blobs
                    .inline_or_store(spec.as_ref(), INLINE_LIMIT)
                    .await?;
                out.push(OutboxMessage::Job(JobEnvelope {
                    v: WIRE_VERSION,
                    job_id: spec.job_id.clone(),
                    run_id: spec.run_id.clone(),
                    attempt: spec.attempt,
                    spec_ref,
                    spec: inline.map(Box::new),
                    team: spec.team.clone(),
                    image: spec.image.clone(),
                }));
            }
            self.run_messages(fx, &mut out).await?;
        }
        Ok(out)
    }

    /// Creates a run (idempotent by run id) and starts it, atomically with its first jobs.
    pub async fn create_run(
        &self,
        state: RunState,
        bundle: &GraphBundle,
    ) -> Result<bool, DriverError> {
        // Held until the creation's mirror is written: its jobs may finish before that, and
        // their results are committed (and mirrored) only after it.
        let lock = self.run_lock(&state.run_id);
        let _guard = lock.lock().await;
        let mut t = engine::apply(
            bundle,
            &state,
            &Event::Start {
                at: self.clock.now(),
            },
            &builtins::assembler,
        )?;
        let outbox = self.outbox_for(&t.effects).await?;
        if finishes(&t.effects) {
            self.write_results(&t.state).await?;
        }
        t.state.commit = mirror::commit_id();
        let created = self.store.create(&t.state, &outbox).await?;
        if created {
            // The jobs go out while the mirror is written; the submitter hears of the run only
            // once it is.
            self.outbox_ready.notify_one();
            worker::faults::point("coordinator.before_first_mirror").await;
            let watch = async {
                self.watch(&t.state, &t.effects).await;
                Ok(())
            };
            let (first, active) = (self.first_snapshot(&t.state), self.mark_active(&t.state));
            tokio::try_join!(first, active, watch)?;
            self.after_commit(&t.state, &t.effects);
            self.metrics.runs_created.inc();
        }
        Ok(created)
    }

    /// Applies one event with optimistic concurrency: reload and retry on conflict.
    pub async fn apply(&self, run: &RunId, event: &Event) -> Result<Applied, DriverError> {
        let applied = self.apply_batch(run, std::slice::from_ref(event)).await?;
        Ok(applied
            .into_iter()
            .next()
            .unwrap_or(Applied::Ignored("no event")))
    }

    /// Applies events to one run in order and commits them in one compare-and-set (a group
    /// commit: a fan-out's many arrivals cost one state write per batch, not one each).
    ///
    /// A finishing transition writes the run's result files *before* its commit, so that a
    /// client that sees the run finished can read them. A coordinator that wrote them and then
    /// lost the race puts the files back in line with the committed state.
    pub async fn apply_batch(
        &self,
        run: &RunId,
        events: &[Event],
    ) -> Result<Vec<Applied>, DriverError> {
        let lock = self.run_lock(run);
        let _guard = lock.lock().await;
        let mut wrote_results = false;
        let mut skip = std::collections::HashSet::new();
        let outcome = loop {
            let mut phase = crate::metrics::CommitPhases::start(&self.metrics);
            let (state, version, weight) = self.load_for_commit(run).await?;
            let bundle = self.bundle(&state.graph_ref).await?;
            let base = state.commit.clone();
            phase.end("load");
            let mut current = state;
            let mut effects = Vec::new();
            let mut applied = Vec::with_capacity(events.len());
            let mut refused = None;
            for (i, event) in events.iter().enumerate() {
                if skip.contains(&i) {
                    applied.push(Applied::Ignored("engine error"));
                    continue;
                }
                match engine::apply_in_place(&bundle, &mut current, event, &builtins::assembler) {
                    Ok((fx, a)) => {
                        if a != Applied::Changed {
                            debug!(run = %run, applied = ?a, "event changed nothing");
                        }
                        effects.extend(fx);
                        applied.push(a);
                    }
                    Err(e) => {
                        error!(run = %run, error = %e, "the engine refused an event; skipping it");
                        refused = Some(i);
                        break;
                    }
                }
            }
            if let Some(i) = refused {
                // The state may be half-changed: reload and apply the others.
                skip.insert(i);
                continue;
            }
            for a in &applied {
                self.metrics
                    .events
                    .with_label_values(&[applied_label(a)])
                    .inc();
            }
            phase.end("engine");
            if !applied.contains(&Applied::Changed) {
                // Nothing changed (duplicates): the mirror must still hold this version before
                // the messages are acked (a commit whose mirror write failed is redelivered).
                self.mirror_if_behind(&current).await?;
                // A result seen again (its first commit's coordinator died before the ack)
                // frees its slot if that coordinator could not.
                self.release_slots(&current, events).await;
                self.states.put(current, version, weight);
                break applied;
            }
            current.commit = mirror::commit_id();
            let outbox = self.outbox_for(&effects).await?;
            if finishes(&effects) {
                self.write_results(&current).await?;
                wrote_results = true;
            }
            let replayable: Vec<&Event> = (events.iter().enumerate())
                .filter(|(i, _)| !skip.contains(i))
                .map(|(_, e)| e)
                .collect();
            let delta = store_log::encode_delta(&base, &current, &replayable);
            phase.end("outbox");
            let (committed, weight) =
                (self.write_commit(&current, version, weight, &delta, &outbox)).await?;
            phase.end("store");
            match committed {
                CasOutcome::Committed => {
                    worker::faults::point("coordinator.after_commit").await;
                    // Before any message this commit consumed is acked.
                    self.mirror_commit(&base, &current, &delta).await?;
                    phase.end("mirror");
                    self.after_commit(&current, &effects);
                    self.watch(&current, &effects).await;
                    self.control(&effects).await;
                    // Before the messages that ended the attempts are acked.
                    self.release_slots(&current, events).await;
                    if finishes(&effects) {
                        self.release_run_slots(&current).await;
                    }
                    if !outbox.is_empty() {
                        self.outbox_ready.notify_one();
                    }
                    if current.status.is_terminal() && current.pending_jobs().next().is_none() {
                        // No more commits here; its state stays held for reads while the
                        // cache's bound allows.
                        self.let_go_run(run);
                    }
                    self.states.put(current, version + 1, weight);
                    phase.end("after");
                    return Ok(applied);
                }
                CasOutcome::Conflict => {
                    self.metrics.cas_conflicts.inc();
                    debug!(run = %run, "state changed under us; re-applying");
                }
            }
        };
        if wrote_results {
            let committed = self.load(run).await?;
            if committed.status.is_terminal() {
                self.write_results(&committed).await?;
            } else {
                self.remove_results(&committed).await;
            }
        }
        Ok(outcome)
    }

    /// Serialises this coordinator's writes to one run (other coordinators are fenced by CAS).
    fn run_lock(&self, run: &RunId) -> Arc<tokio::sync::Mutex<()>> {
        self.run_locks
            .lock()
            .expect("run locks")
            .entry(run.clone())
            .or_default()
            .clone()
    }

    /// Drops what this coordinator keeps to commit a run: its lock and its mirror mark.
    fn let_go_run(&self, run: &RunId) {
        self.run_locks.lock().expect("run locks").remove(run);
        self.mirrored.lock().expect("mirror marks").remove(run);
    }

    /// Drops everything this coordinator keeps of a run, its state too.
    fn forget_run(&self, run: &RunId) {
        self.let_go_run(run);
        self.states.forget(run);
    }

    async fn write_results(&self, state: &RunState) -> Result<(), DriverError> {
        let bundle = self.bundle(&state.graph_ref).await?;
        // The files at once: each is one write to the store.
        let files = shared::builtins::result_files(&bundle, state);
        futures::future::try_join_all(
            (files.iter()).map(|(key, value)| self.blobs.put_json(key, value)),
        )
        .await?;
        Ok(())
    }

    async fn remove_results(&self, state: &RunState) {
        let prefix = format!("runs/{}/", state.run_id);
        for name in ["result.json", "run_summary.json"] {
            if let Err(e) = self.blobs.delete(&format!("{prefix}{name}")).await {
                warn!(run = %state.run_id, error = %e, "could not remove a result file of a lost race");
            }
        }
    }

    /// Tells the workers to stop jobs their run no longer needs (best effort: a job that is
    /// not stopped finishes and its result is ignored).
    /// The control channel, after the commit: jobs to stop, messages for running sessions.
    /// Best effort: a lost stop only wastes a worker's time, and a lost message is sent again
    /// when its session's next progress shows it missing.
    async fn control(&self, effects: &[Effect]) {
        for fx in effects {
            let control = match fx {
                Effect::StopJobs(jobs) => shared::messages::Control {
                    v: WIRE_VERSION,
                    stop_jobs: jobs.clone(),
                    deliver: Vec::new(),
                },
                Effect::Deliver(deliveries) => shared::messages::Control {
                    v: WIRE_VERSION,
                    stop_jobs: Vec::new(),
                    deliver: deliveries.clone(),
                },
                _ => continue,
            };
            let body = serde_json::to_vec(&control).expect("control serializes");
            if let Err(e) = self.broker.broadcast(&body).await {
                warn!(error = %e, stops = control.stop_jobs.len(), deliveries = control.deliver.len(), "could not send on the control channel");
            }
        }
    }

    /// Logs and counts the runs a commit finished.
    fn after_commit(&self, state: &RunState, effects: &[Effect]) {
        // Nobody watching is not an error.
        let _ = self.run_changed.send(state.run_id.clone());
        for fx in effects {
            if let Effect::Finished { status, .. } = fx {
                tracing::info!(run = %state.run_id, status = ?status, "run finished");
                // A batch may have a slot free now: its driver looks without waiting a tick.
                self.batch_wake.notify_one();
                self.metrics
                    .runs_finished
                    .with_label_values(&[&format!("{status:?}").to_lowercase()])
                    .inc();
                if let Some(team) = state.team.clone() {
                    // No longer under way for the team's limit (a loss here is found stale by
                    // the next submission past the limit).
                    let (ledger, run) = (self.ledger.clone(), state.run_id.to_string());
                    tokio::spawn(async move {
                        if let Err(e) = ledger.run_ended(&team, &run).await {
                            warn!(team, run, error = %e, "run not taken off the team's runs under way");
                        }
                    });
                }
            }
        }
    }

    pub async fn decide(
        &self,
        run: &RunId,
        node: &str,
        approved: bool,
        by: &str,
        comment: &str,
        edits: Option<serde_json::Value>,
    ) -> Result<Applied, DriverError> {
        let event = Event::Decide {
            node: shared::ids::NodeId::new(node),
            approved,
            by: by.to_string(),
            comment: comment.to_string(),
            at: self.clock.now(),
            edits,
        };
        self.apply(run, &event).await
    }

    pub async fn cancel(&self, run: &RunId) -> Result<Applied, DriverError> {
        let at = self.clock.now();
        self.apply(run, &Event::Cancel { at }).await
    }

    /// Runs the relay and both consumers until shutdown.
    pub async fn serve(self: Arc<Self>, shutdown: CancellationToken) {
        let relay = tokio::spawn(self.clone().relay(shutdown.clone()));
        let results = tokio::spawn(self.clone().consume(QueueName::Results, shutdown.clone()));
        let dead = tokio::spawn(self.clone().consume(QueueName::DeadJobs, shutdown.clone()));
        let watchdog = tokio::spawn(self.clone().watchdog(shutdown.clone()));
        let recovery = tokio::spawn(self.clone().recover_lost_runs(shutdown.clone()));
        let retention = tokio::spawn(self.clone().retention(shutdown.clone()));
        let batches = tokio::spawn(crate::batches::drive(self.clone(), shutdown.clone()));
        let schedules = tokio::spawn(crate::schedules::drive(self.clone(), shutdown.clone()));
        let team_notices = tokio::spawn(self.clone().team_notices(shutdown.clone()));
        let _ = tokio::join!(
            relay,
            results,
            dead,
            watchdog,
            recovery,
            retention,
            batches,
            schedules,
            team_notices
        );
    }
}

/// Does the transition write the run's result (a finish, or a late advisory report)?
fn finishes(effects: &[Effect]) -> bool {
    effects
        .iter()
        .any(|e| matches!(e, Effect::Finished { .. } | Effect::ResultUpdated { .. }))
}

fn applied_label(a: &Applied) -> &'static str {
    match a {
        Applied::Changed => "changed",
        Applied::Duplicate => "duplicate",
        Applied::Stale { .. } => "stale",
        Applied::Ignored(_) => "ignored",
        Applied::Refused(_) => "refused",
    }
}
