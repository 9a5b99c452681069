//! The copy of each run in object storage, and the restore of runs the run store lost.
//!
//! Durability in one sentence: every committed state is mirrored to object storage before any
//! message its commit consumed is acked, and a run the store lost is restored from that mirror
//! with every job it still waits for issued again as a new attempt, so whatever was lost with
//! the store (outbox, deadlines, in-flight results) is redone, never waited for.
//!
//! A run is listed under `active-runs/` from its first mirror until its final one, so runs
//! that nobody asks about (their outbox was lost with the store) are found by a sweep: at
//! start, whenever the store's epoch changes (it was wiped), and every `SWEEP_EVERY`.

use super::{Coordinator, DriverError};
use shared::engine::{self, Applied, Event, RunState};
use shared::ids::RunId;
use shared::time::rfc3339;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use worker::blobs::BlobError;

const SWEEP_EVERY: Duration = Duration::from_secs(60);
const EPOCH_CHECK_EVERY: Duration = Duration::from_secs(2);

fn mirror_key(run: &RunId) -> String {
    format!("runs/{run}/state.json")
}

fn active_key(run: &RunId) -> String {
    format!("active-runs/{run}")
}

impl Coordinator {
    /// Writes the mirror of `state` (at store version `version`).
    pub(super) async fn mirror(&self, state: &RunState, version: u64) -> Result<(), DriverError> {
        self.blobs
            .put_json(&mirror_key(&state.run_id), state)
            .await?;
        self.mirrored
            .lock()
            .expect("mirror versions")
            .insert(state.run_id.clone(), version);
        if state.status.is_terminal() && state.pending_jobs().next().is_none() {
            if let Err(e) = self.blobs.delete(&active_key(&state.run_id)).await {
                warn!(run = %state.run_id, error = %e, "could not unlist a finished run; the sweep will look at it again");
            }
        }
        Ok(())
    }

    /// Writes the mirror unless this coordinator knows it already holds `version`.
    pub(super) async fn mirror_if_behind(
        &self,
        state: &RunState,
        version: u64,
    ) -> Result<(), DriverError> {
        let known = self
            .mirrored
            .lock()
            .expect("mirror versions")
            .get(&state.run_id)
            .copied();
        if known == Some(version) {
            return Ok(());
        }
        self.mirror(state, version).await
    }

    pub(super) async fn mark_active(&self, state: &RunState) -> Result<(), DriverError> {
        if !state.status.is_terminal() {
            self.blobs
                .put(&active_key(&state.run_id), Vec::new())
                .await?;
        }
        Ok(())
    }

    /// Loads a run from the run store; a run the store lost is restored from its mirror.
    pub(super) async fn load_versioned(&self, run: &RunId) -> Result<(RunState, u64), DriverError> {
        if let Some(found) = self.store.load(run).await? {
            return Ok(found);
        }
        self.restore(run).await?;
        self.store
            .load(run)
            .await?
            .ok_or_else(|| DriverError::UnknownRun(run.clone()))
    }

    /// Puts a run the store lost back from its mirror, with every job it still waits for
    /// issued again (the restored state and those jobs are created in one atomic write, so
    /// of racing coordinators exactly one restores).
    async fn restore(&self, run: &RunId) -> Result<(), DriverError> {
        let mirror: RunState = match self.blobs.get_json(&mirror_key(run)).await {
            Ok(s) => s,
            Err(e) if BlobError::is_not_found(&e) => {
                return Err(DriverError::UnknownRun(run.clone()))
            }
            Err(e) => return Err(e.into()),
        };
        let bundle = self.bundle(&mirror.graph_ref).await?;
        let t = engine::apply(
            &bundle,
            &mirror,
            &Event::Restored {
                at: self.clock.now(),
            },
            &shared::builtins::assembler,
        )?;
        let outbox = self.outbox_for(&t.effects).await?;
        if self.store.create(&t.state, &outbox).await? {
            let reissued = outbox.len();
            warn!(run = %run, reissued, "the run store had lost this run; restored it from object storage");
            self.metrics.restored.inc();
            self.mirror(&t.state, 1).await?;
            self.watch(run, &t.effects).await;
            if t.applied == Applied::Changed {
                self.outbox_ready.notify_one();
            }
        }
        Ok(())
    }

    /// Finds active runs the store does not hold and restores them.
    async fn sweep(&self) -> Result<usize, DriverError> {
        let mut restored = 0;
        for key in self.blobs.list("active-runs/").await? {
            let Some(id) = key.rsplit('/').next().filter(|s| !s.is_empty()) else {
                continue;
            };
            let run = RunId::new(id);
            if self.store.exists(&run).await? {
                continue;
            }
            let lock = self.run_lock(&run);
            let _guard = lock.lock().await;
            match self.load_versioned(&run).await {
                Ok(_) => restored += 1,
                Err(DriverError::UnknownRun(_)) => {
                    warn!(run = %run, "an active run has no mirror; unlisting it");
                    let _ = self.blobs.delete(&key).await;
                }
                Err(e) => warn!(run = %run, error = %e, "could not restore a lost run"),
            }
        }
        Ok(restored)
    }

    /// Sweeps for lost runs at start, when the store's epoch changes and every `SWEEP_EVERY`.
    pub(super) async fn recover_lost_runs(self: Arc<Self>, shutdown: CancellationToken) {
        let mine = format!("{}-{}", self.id, rfc3339(&self.clock.now()));
        let mut epoch: Option<String> = None;
        let mut last_sweep: Option<std::time::Instant> = None;
        loop {
            let current = match self.store.epoch(&mine).await {
                Ok(e) => Some(e),
                Err(e) => {
                    warn!(error = %e, "could not read the run store's epoch");
                    None
                }
            };
            let wiped = matches!((&epoch, &current), (Some(a), Some(b)) if a != b);
            if wiped {
                warn!("the run store's epoch changed (its data was lost); restoring active runs");
            }
            if current.is_some() && (wiped || last_sweep.is_none_or(|t| t.elapsed() >= SWEEP_EVERY))
            {
                match self.sweep().await {
                    Ok(0) => {}
                    Ok(n) => info!(restored = n, "restored runs the run store had lost"),
                    Err(e) => warn!(error = %e, "the sweep for lost runs failed"),
                }
                last_sweep = Some(std::time::Instant::now());
                epoch = current;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(EPOCH_CHECK_EVERY) => {}
            }
        }
    }
}
