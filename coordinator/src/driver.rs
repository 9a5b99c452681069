//! The driver: feeds events to the pure engine and carries out what it decides. Every state
//! change goes through a compare-and-set in the run store together with the job messages it
//! causes (outbox); a relay publishes the outbox with publisher confirms. Nothing that matters
//! lives in memory, so several coordinators can run side by side and any of them can die.

use crate::metrics::CoordinatorMetrics;
use crate::submit::SubmitError;
use shared::engine::{self, Applied, Assembler, Effect, Event, RunState};
use shared::graph::GraphBundle;
use shared::ids::RunId;
use shared::messages::{JobEnvelope, JobResult, ResultEnvelope, WIRE_VERSION};
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
}

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
                let spec_ref = self.blobs.put_content(spec.as_ref()).await?;
                out.push(OutboxMessage::Job(JobEnvelope {
                    v: WIRE_VERSION,
                    job_id: spec.job_id.clone(),
                    run_id: spec.run_id.clone(),
                    attempt: spec.attempt,
                    spec_ref,
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
    ///
    /// A finishing transition writes the run's result files *before* its commit, so that a
    /// client that sees the run finished can read them. A coordinator that wrote them and then
    /// lost the race puts the files back in line with the committed state.
    pub async fn apply(&self, run: &RunId, event: &Event) -> Result<Applied, DriverError> {
        let mut wrote_results = false;
        let outcome = loop {
            let (state, version) = self
                .store
                .load(run)
                .await?
                .ok_or_else(|| DriverError::UnknownRun(run.clone()))?;
            let bundle = self.bundle(&state.graph_ref).await?;
            let t = engine::apply(&bundle, &state, event, &assembler)?;
            if t.applied != Applied::Changed {
                self.metrics
                    .events
                    .with_label_values(&[applied_label(&t.applied)])
                    .inc();
                debug!(run = %run, applied = ?t.applied, "event changed nothing");
                break t.applied;
            }
            let outbox = self.outbox_for(&t.effects).await?;
            if finishes(&t.effects) {
                self.write_results(&t.state).await?;
                wrote_results = true;
            }
            match self.store.commit(&t.state, version, &outbox).await? {
                CasOutcome::Committed => {
                    self.metrics.events.with_label_values(&["changed"]).inc();
                    self.after_commit(&t.state, &t.effects).await;
                    if !outbox.is_empty() {
                        self.outbox_ready.notify_one();
                    }
                    return Ok(Applied::Changed);
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

    /// Mirrors the state to object storage, so a run can be recovered if Redis loses it.
    async fn after_commit(&self, state: &RunState, effects: &[Effect]) {
        let key = format!("runs/{}/state.json", state.run_id);
        if let Err(e) = self.blobs.put_json(&key, state).await {
            warn!(run = %state.run_id, error = %e, "could not mirror run state to object storage");
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
        Ok(self
            .store
            .load(run)
            .await?
            .ok_or_else(|| DriverError::UnknownRun(run.clone()))?
            .0)
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
            for raw in &batch {
                let published = match serde_json::from_str::<OutboxMessage>(raw) {
                    Ok(OutboxMessage::Job(env)) => {
                        let body = serde_json::to_vec(&env).expect("envelope serializes");
                        let id = format!("{}.a{}", env.job_id, env.attempt);
                        loop {
                            match self.broker.publish(QueueName::Jobs, &body, &id).await {
                                Ok(()) => break true,
                                Err(e) => {
                                    warn!(job = %env.job_id, error = %e, "publish failed; retrying");
                                    if shutdown.is_cancelled() {
                                        break false;
                                    }
                                    tokio::time::sleep(Duration::from_millis(500)).await;
                                }
                            }
                        }
                    }
                    Err(e) => {
                        error!(error = %e, "dropping a malformed outbox message");
                        true
                    }
                };
                if published {
                    self.metrics.jobs_published.inc();
                    if let Err(e) = self.store.outbox_done(&self.id, raw).await {
                        warn!(error = %e, "could not forget a published outbox message; it may be published twice");
                    }
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

    /// Consumes job results and dead-lettered jobs, applying each as an event, acking after.
    pub async fn consume(self: Arc<Self>, queue: QueueName, shutdown: CancellationToken) {
        let mut rx = self.broker.subscribe(queue, 64);
        loop {
            let msg = tokio::select! {
                _ = shutdown.cancelled() => return,
                m = rx.recv() => match m { Some(m) => m, None => return },
            };
            let this = self.clone();
            tokio::spawn(async move { this.handle(queue, msg).await });
        }
    }

    async fn handle(&self, queue: QueueName, msg: Incoming) {
        let outcome = match queue {
            QueueName::Results => self.handle_result(&msg.body).await,
            QueueName::DeadJobs => self.handle_dead(&msg.body).await,
            QueueName::Jobs => Ok(()),
        };
        match outcome {
            Ok(()) => {
                let _ = msg.ack().await;
            }
            Err(HandleError::Poison(reason)) => {
                error!(queue = ?queue, %reason, "dropping a poison message");
                let _ = msg.reject().await;
            }
            Err(HandleError::Transient(reason)) => {
                warn!(queue = ?queue, %reason, "could not apply a message; requeueing");
                tokio::time::sleep(Duration::from_millis(200)).await;
                let _ = msg.requeue().await;
            }
        }
    }

    async fn handle_result(&self, body: &[u8]) -> Result<(), HandleError> {
        let env: ResultEnvelope =
            serde_json::from_slice(body).map_err(|e| HandleError::Poison(e.to_string()))?;
        let result: JobResult =
            self.blobs
                .get_content(&env.result_ref)
                .await
                .map_err(|e| match e {
                    BlobError::Decode { .. } | BlobError::Corrupt { .. } => {
                        HandleError::Poison(e.to_string())
                    }
                    other => HandleError::Transient(other.to_string()),
                })?;
        let event = Event::JobFinished {
            result: Box::new(result),
            at: now(),
        };
        match self.apply(&env.run_id, &event).await {
            Ok(applied) => {
                debug!(run = %env.run_id, job = %env.job_id, ?applied, "result applied");
                Ok(())
            }
            Err(DriverError::UnknownRun(_)) => {
                Err(HandleError::Poison(format!("unknown run {}", env.run_id)))
            }
            Err(DriverError::Engine(e)) => Err(HandleError::Poison(e.to_string())),
            Err(e) => Err(HandleError::Transient(e.to_string())),
        }
    }

    async fn handle_dead(&self, body: &[u8]) -> Result<(), HandleError> {
        let env: JobEnvelope =
            serde_json::from_slice(body).map_err(|e| HandleError::Poison(e.to_string()))?;
        warn!(run = %env.run_id, job = %env.job_id, "job dead-lettered");
        let event = Event::JobDead {
            job_id: env.job_id.clone(),
            attempt: env.attempt,
            reason: "the job reached its delivery limit or was rejected as poison".into(),
            at: now(),
        };
        match self.apply(&env.run_id, &event).await {
            Ok(_) => Ok(()),
            Err(DriverError::UnknownRun(_)) => Ok(()),
            Err(e) => Err(HandleError::Transient(e.to_string())),
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
        let _ = tokio::join!(relay, results, dead);
    }
}

/// Does the transition write the run's result (a finish, or a late advisory report)?
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
