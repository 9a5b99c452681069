//! The driver: feeds events to the pure engine and carries out what it decides. Every state
//! change goes through a compare-and-set in the run store together with the job messages it
//! causes (outbox); a relay publishes the outbox with publisher confirms. Nothing that matters
//! lives in memory, so several coordinators can run side by side and any of them can die.

use crate::metrics::CoordinatorMetrics;
use crate::submit::SubmitError;
use shared::engine::{self, Applied, Assembler, Effect, Event, RunState};
use shared::graph::GraphBundle;
use shared::ids::RunId;
use shared::messages::{JobEnvelope, JobResult, ResultEnvelope, INLINE_LIMIT, WIRE_VERSION};
use shared::ports::{CasOutcome, OutboxMessage, PortError, RunStore};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use thiserror::Error;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};
use worker::blobs::{BlobError, Blobs};
use worker::queue::{Broker, Incoming, QueueName};

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
    inbox: Mutex<Inbox>,
    /// Time after a started job's own timeout before the watchdog re-issues it.
    pub reissue_grace: Duration,
    mirrored: Mutex<HashMap<RunId, std::time::Instant>>,
}

const MIRROR_EVERY: Duration = Duration::from_secs(2);

pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Built-in result assemblers of exit nodes.
pub fn assembler(name: &str) -> Option<Assembler> {
    match name {
        "factory_summary" => Some(shared::factory::summarize as Assembler),
        "hybrid_result" => Some(shared::hybrid::assemble as Assembler),
        _ => None,
    }
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
            inbox: Mutex::new(Inbox::default()),
            reissue_grace: Duration::from_secs(
                std::env::var("FLEET_REISSUE_GRACE_SECONDS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(60),
            ),
            mirrored: Mutex::new(HashMap::new()),
        }
    }

    pub async fn bundle(&self, key: &str) -> Result<Arc<GraphBundle>, DriverError> {
        if let Some(b) = self.graphs.lock().expect("graph cache").get(key) {
            return Ok(b.clone());
        }
        let b: Arc<GraphBundle> = Arc::new(self.blobs.get_json(key).await?);
        self.graphs
            .lock()
            .expect("graph cache")
            .insert(key.to_string(), b.clone());
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
                }));
            }
        }
        Ok(out)
    }

    /// Creates a run (idempotent by run id) and starts it, atomically with its first jobs.
    pub async fn create_run(
        &self,
        state: RunState,
        bundle: &GraphBundle,
    ) -> Result<bool, DriverError> {
        let t = engine::apply(bundle, &state, &Event::Start { at: now() }, &assembler)?;
        let outbox = self.outbox_for(&t.effects).await?;
        if finishes(&t.effects) {
            self.write_results(&t.state).await?;
        }
        let created = self.store.create(&t.state, &outbox).await?;
        if created {
            self.after_commit(&t.state, &t.effects).await;
            self.outbox_ready.notify_one();
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
            let (state, version) = self.load_versioned(run).await?;
            let bundle = self.bundle(&state.graph_ref).await?;
            let mut current = state;
            let mut effects = Vec::new();
            let mut applied = Vec::with_capacity(events.len());
            let mut refused = None;
            for (i, event) in events.iter().enumerate() {
                if skip.contains(&i) {
                    applied.push(Applied::Ignored("engine error"));
                    continue;
                }
                match engine::apply_in_place(&bundle, &mut current, event, &assembler) {
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
            if !applied.contains(&Applied::Changed) {
                break applied;
            }
            let outbox = self.outbox_for(&effects).await?;
            if finishes(&effects) {
                self.write_results(&current).await?;
                wrote_results = true;
            }
            match self.store.commit(&current, version, &outbox).await? {
                CasOutcome::Committed => {
                    self.after_commit(&current, &effects).await;
                    self.watch(run, &effects).await;
                    self.stop_jobs(&effects).await;
                    if !outbox.is_empty() {
                        self.outbox_ready.notify_one();
                    }
                    if current.status.is_terminal() && current.pending_jobs().next().is_none() {
                        self.forget_run(run);
                    }
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

    fn forget_run(&self, run: &RunId) {
        self.run_locks.lock().expect("run locks").remove(run);
        self.mirrored.lock().expect("mirror times").remove(run);
    }

    fn result_files(state: &RunState) -> Vec<(String, serde_json::Value)> {
        let Some(result) = &state.result else {
            return Vec::new();
        };
        let prefix = format!("runs/{}/", state.run_id);
        let mut files = vec![(format!("{prefix}result.json"), result.clone())];
        if state.graph_name == "factory" && result.get("verdict").is_some() {
            files.push((format!("{prefix}run_summary.json"), result.clone()));
        }
        files
    }

    async fn write_results(&self, state: &RunState) -> Result<(), DriverError> {
        for (key, value) in Self::result_files(state) {
            self.blobs.put_json(&key, &value).await?;
        }
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
    async fn stop_jobs(&self, effects: &[Effect]) {
        for fx in effects {
            if let Effect::StopJobs(jobs) = fx {
                let control = shared::messages::Control {
                    v: WIRE_VERSION,
                    stop_jobs: jobs.clone(),
                };
                let body = serde_json::to_vec(&control).expect("control serializes");
                if let Err(e) = self.broker.broadcast(&body).await {
                    warn!(error = %e, count = jobs.len(), "could not ask the workers to stop jobs");
                }
            }
        }
    }

    /// Records the deadlines of started jobs for the watchdog.
    async fn watch(&self, run: &RunId, effects: &[Effect]) {
        let now = chrono::Utc::now().timestamp();
        for fx in effects {
            if let Effect::Watch {
                job_id,
                attempt,
                started_at,
                timeout_seconds,
            } = fx
            {
                let deadline = now + *timeout_seconds as i64 + self.reissue_grace.as_secs() as i64;
                let watch = format!("{run}|{job_id}|{attempt}|{started_at}");
                if let Err(e) = self.store.watch(&watch, deadline).await {
                    warn!(run = %run, job = %job_id, error = %e, "could not watch a started job");
                }
            }
        }
    }

    /// Re-issues started jobs whose deadline passed without a result (a hung or cut-off
    /// worker). The engine ignores watches of jobs that finished or moved on.
    pub async fn watchdog(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            let due = match self.store.due(chrono::Utc::now().timestamp(), 100).await {
                Ok(d) => d,
                Err(e) => {
                    warn!(error = %e, "watchdog could not read deadlines");
                    continue;
                }
            };
            for watch in due {
                let parts: Vec<&str> = watch.split('|').collect();
                let [run, job, attempt, started_at] = parts.as_slice() else {
                    continue;
                };
                let Ok(attempt) = attempt.parse() else {
                    continue;
                };
                let event = Event::Reissue {
                    job_id: shared::ids::JobId::new(*job),
                    attempt,
                    started_at: started_at.to_string(),
                    at: now(),
                };
                match self.apply(&RunId::new(*run), &event).await {
                    Ok(Applied::Changed) => {
                        warn!(run = %run, job = %job, attempt, "job passed its deadline; re-issued");
                        self.metrics.reissued.inc();
                    }
                    Ok(_) => {}
                    Err(e) => warn!(run = %run, job = %job, error = %e, "could not re-issue a job"),
                }
            }
        }
    }

    /// Mirrors the state to object storage, so a run can be recovered if Redis loses it.
    /// The mirror is written whenever a transition starts jobs and when the run ends, and
    /// otherwise at most every `MIRROR_EVERY` per run.
    async fn after_commit(&self, state: &RunState, effects: &[Effect]) {
        let due = {
            let mut times = self.mirrored.lock().expect("mirror times");
            let last = times.get(&state.run_id).copied();
            // Always when the transition started jobs: a restored run must know every job
            // that may still report.
            let publishes = effects.iter().any(|e| matches!(e, Effect::Publish(_)));
            let due = state.status.is_terminal()
                || publishes
                || last.is_none_or(|t| t.elapsed() >= MIRROR_EVERY);
            if due {
                times.insert(state.run_id.clone(), std::time::Instant::now());
            }
            due
        };
        if due {
            let key = format!("runs/{}/state.json", state.run_id);
            if let Err(e) = self.blobs.put_json(&key, state).await {
                warn!(run = %state.run_id, error = %e, "could not mirror run state to object storage");
            }
        }
        for fx in effects {
            if let Effect::Finished { status, .. } = fx {
                info!(run = %state.run_id, status = ?status, "run finished");
                self.metrics
                    .runs_finished
                    .with_label_values(&[&format!("{status:?}").to_lowercase()])
                    .inc();
            }
        }
    }

    pub async fn load(&self, run: &RunId) -> Result<RunState, DriverError> {
        Ok(self.load_versioned(run).await?.0)
    }

    /// Loads a run from the run store; a run the store lost (Redis can lose acknowledged
    /// writes) is restored from its mirror in object storage.
    async fn load_versioned(&self, run: &RunId) -> Result<(RunState, u64), DriverError> {
        if let Some(found) = self.store.load(run).await? {
            return Ok(found);
        }
        let key = format!("runs/{run}/state.json");
        let mirror: RunState = match self.blobs.get_json(&key).await {
            Ok(s) => s,
            Err(BlobError::Store(object_store::Error::NotFound { .. })) => {
                return Err(DriverError::UnknownRun(run.clone()))
            }
            Err(e) => return Err(e.into()),
        };
        if self.store.create(&mirror, &[]).await? {
            warn!(run = %run, "the run store had lost this run; restored it from object storage");
            self.metrics.restored.inc();
        }
        self.store
            .load(run)
            .await?
            .ok_or_else(|| DriverError::UnknownRun(run.clone()))
    }

    /// Publishes outbox messages with confirms; forgets each one only after the broker has it.
    pub async fn relay(self: Arc<Self>, shutdown: CancellationToken) {
        let mut last_recover = std::time::Instant::now() - Duration::from_secs(60);
        loop {
            if last_recover.elapsed() > Duration::from_secs(5) {
                match self.store.outbox_recover(&self.id).await {
                    Ok(0) => {}
                    Ok(n) => info!(
                        moved = n,
                        "recovered outbox messages of a stopped coordinator"
                    ),
                    Err(e) => warn!(error = %e, "outbox recovery failed"),
                }
                last_recover = std::time::Instant::now();
            }
            let batch = match self.store.outbox_claim(&self.id, 256).await {
                Ok(b) => b,
                Err(e) => {
                    warn!(error = %e, "outbox claim failed; retrying");
                    Vec::new()
                }
            };
            let mut published = Vec::new();
            let mut messages = Vec::new();
            for raw in &batch {
                match serde_json::from_str::<OutboxMessage>(raw) {
                    Ok(OutboxMessage::Job(env)) => {
                        let body = serde_json::to_vec(&env).expect("envelope serializes");
                        messages.push((body, format!("{}.a{}", env.job_id, env.attempt)));
                        published.push(raw.clone());
                    }
                    Err(e) => {
                        error!(error = %e, "dropping a malformed outbox message");
                        published.push(raw.clone());
                    }
                }
            }
            // Publish the whole batch, then wait for every confirm; retry the batch on failure
            // (duplicates are harmless: job ids are deterministic and results deduplicated).
            while !messages.is_empty() {
                match self.broker.publish_many(QueueName::Jobs, &messages).await {
                    Ok(()) => {
                        self.metrics.jobs_published.inc_by(messages.len() as u64);
                        break;
                    }
                    Err(e) => {
                        warn!(error = %e, count = messages.len(), "publish failed; retrying");
                        if shutdown.is_cancelled() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
            if !published.is_empty() {
                if let Err(e) = self.store.outbox_done(&self.id, &published).await {
                    warn!(error = %e, "could not forget published outbox messages; they may be published twice");
                }
            }
            if !batch.is_empty() {
                continue;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.outbox_ready.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }

    /// Consumes job results and dead-lettered jobs, applying them as events and acking after
    /// the commit. Messages that arrive together are applied per run in one batch.
    pub async fn consume(self: Arc<Self>, queue: QueueName, shutdown: CancellationToken) {
        let mut rx = self.broker.subscribe(queue, 1024);
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => return,
                m = rx.recv() => match m { Some(m) => m, None => return },
            };
            let mut batch = vec![first];
            while batch.len() < 1024 {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            let mut by_run: HashMap<RunId, Vec<(Event, Incoming)>> = HashMap::new();
            for msg in batch {
                match self.decode(queue, &msg.body).await {
                    Ok((run, event)) => by_run.entry(run).or_default().push((event, msg)),
                    Err(HandleError::Poison(reason)) => {
                        error!(queue = ?queue, %reason, "dropping a poison message");
                        let _ = msg.reject().await;
                    }
                    Err(HandleError::Transient(reason)) => {
                        warn!(queue = ?queue, %reason, "could not read a message; requeueing");
                        let _ = msg.requeue().await;
                    }
                }
            }
            for (run, items) in by_run {
                self.clone().enqueue(run, items);
            }
        }
    }

    /// Queues messages for a run; one flusher per run applies everything queued in one batch,
    /// so batches grow with the load instead of queueing behind each other.
    fn enqueue(self: Arc<Self>, run: RunId, items: Vec<(Event, Incoming)>) {
        let start = {
            let mut inbox = self.inbox.lock().expect("inbox");
            inbox.pending.entry(run.clone()).or_default().extend(items);
            inbox.flushing.insert(run.clone())
        };
        if start {
            tokio::spawn(async move { self.flush(run).await });
        }
    }

    async fn flush(&self, run: RunId) {
        loop {
            let items = {
                let mut inbox = self.inbox.lock().expect("inbox");
                match inbox.pending.remove(&run) {
                    Some(items) if !items.is_empty() => items,
                    _ => {
                        inbox.flushing.remove(&run);
                        return;
                    }
                }
            };
            // Events take the time they are applied at.
            let at = now();
            let items = items
                .into_iter()
                .map(|(mut e, m)| {
                    match &mut e {
                        Event::JobFinished { at: t, .. } | Event::JobDead { at: t, .. } => {
                            *t = at.clone()
                        }
                        _ => {}
                    }
                    (e, m)
                })
                .collect();
            self.settle(run.clone(), items).await;
        }
    }

    async fn settle(&self, run: RunId, items: Vec<(Event, Incoming)>) {
        let (events, msgs): (Vec<Event>, Vec<Incoming>) = items.into_iter().unzip();
        match self.apply_batch(&run, &events).await {
            Ok(_) => {
                for m in msgs {
                    let _ = m.ack().await;
                }
            }
            Err(DriverError::UnknownRun(_)) => {
                warn!(run = %run, "messages for an unknown run; dropping them");
                for m in msgs {
                    let _ = m.reject().await;
                }
            }
            Err(e) => {
                warn!(run = %run, error = %e, "could not apply messages; requeueing");
                tokio::time::sleep(Duration::from_millis(200)).await;
                for m in msgs {
                    let _ = m.requeue().await;
                }
            }
        }
    }

    /// The run and event a message stands for.
    async fn decode(&self, queue: QueueName, body: &[u8]) -> Result<(RunId, Event), HandleError> {
        match queue {
            QueueName::Results => {
                let env: ResultEnvelope =
                    serde_json::from_slice(body).map_err(|e| HandleError::Poison(e.to_string()))?;
                if let Some(worker) = env.started {
                    let event = Event::JobStarted {
                        job_id: env.job_id,
                        attempt: env.attempt,
                        worker,
                        at: now(),
                    };
                    return Ok((env.run_id, event));
                }
                let result: JobResult = match env.result {
                    Some(inline) => *inline,
                    None => self
                        .blobs
                        .get_content(&env.result_ref)
                        .await
                        .map_err(|e| match e {
                            BlobError::Decode { .. } | BlobError::Corrupt { .. } => {
                                HandleError::Poison(e.to_string())
                            }
                            other => HandleError::Transient(other.to_string()),
                        })?,
                };
                Ok((
                    env.run_id,
                    Event::JobFinished {
                        result: Box::new(result),
                        at: now(),
                    },
                ))
            }
            QueueName::DeadJobs => {
                let env: JobEnvelope =
                    serde_json::from_slice(body).map_err(|e| HandleError::Poison(e.to_string()))?;
                warn!(run = %env.run_id, job = %env.job_id, "job dead-lettered");
                Ok((
                    env.run_id,
                    Event::JobDead {
                        job_id: env.job_id.clone(),
                        attempt: env.attempt,
                        reason: "the job reached its delivery limit or was rejected as poison"
                            .into(),
                        at: now(),
                    },
                ))
            }
            QueueName::Jobs => Err(HandleError::Poison(
                "the coordinator does not take jobs".into(),
            )),
        }
    }

    pub async fn decide(
        &self,
        run: &RunId,
        node: &str,
        approved: bool,
        by: &str,
        comment: &str,
    ) -> Result<Applied, DriverError> {
        let event = Event::Decide {
            node: shared::ids::NodeId::new(node),
            approved,
            by: by.to_string(),
            comment: comment.to_string(),
            at: now(),
        };
        self.apply(run, &event).await
    }

    pub async fn cancel(&self, run: &RunId) -> Result<Applied, DriverError> {
        self.apply(run, &Event::Cancel { at: now() }).await
    }

    /// Runs the relay and both consumers until shutdown.
    pub async fn serve(self: Arc<Self>, shutdown: CancellationToken) {
        let relay = tokio::spawn(self.clone().relay(shutdown.clone()));
        let results = tokio::spawn(self.clone().consume(QueueName::Results, shutdown.clone()));
        let dead = tokio::spawn(self.clone().consume(QueueName::DeadJobs, shutdown.clone()));
        let watchdog = tokio::spawn(self.clone().watchdog(shutdown.clone()));
        let _ = tokio::join!(relay, results, dead, watchdog);
    }
}

/// Does the transition write the run's result (a finish, or a late advisory report)?
/// Messages waiting to be applied, per run, and the runs with a flusher at work.
#[derive(Default)]
struct Inbox {
    pending: HashMap<RunId, Vec<(Event, Incoming)>>,
    flushing: std::collections::HashSet<RunId>,
}

fn finishes(effects: &[Effect]) -> bool {
    effects
        .iter()
        .any(|e| matches!(e, Effect::Finished { .. } | Effect::ResultUpdated { .. }))
}

enum HandleError {
    Poison(String),
    Transient(String),
}

fn applied_label(a: &Applied) -> &'static str {
    match a {
        Applied::Changed => "changed",
        Applied::Duplicate => "duplicate",
        Applied::Stale { .. } => "stale",
        Applied::Ignored(_) => "ignored",
    }
}
