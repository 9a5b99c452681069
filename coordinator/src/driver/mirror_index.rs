//! Whether a submitted run id is taken, answered by the run store when it can vouch for the
//! mirror. A submission must not start a second run under the id of one the mirror holds (a
//! run Redis lost, or pruned after its retention); asking object storage costs a request on
//! every submission. So the store keeps an index (`shared::ports::MirrorIndex`): once it was
//! reconciled with the mirror (every run folder the mirror holds noted) under its current
//! identity (epoch and server process), an id it neither holds nor noted is free without a
//! request. Until then, and for noted ids, the mirror is asked as before.

use super::{Coordinator, DriverError};
use shared::engine::RunState;
use shared::ids::RunId;
use tracing::{info, warn};

/// Run ids noted in the store per call while reconciling.
const NOTE_CHUNK: usize = 1000;

impl Coordinator {
    /// Reconciles the store with the mirror unless it is reconciled under its current
    /// identity; a failure is logged and tried again at the next check.
    pub(super) async fn reconcile_if_needed(&self) {
        match self.store.reconciled().await {
            Ok(true) => {}
            Ok(false) => match self.reconcile().await {
                Ok(Some(runs)) => info!(runs, "reconciled the run store with the mirror"),
                Ok(None) => info!("the run store changed while it was reconciled; again later"),
                Err(e) => warn!(error = %e, "could not reconcile the run store with the mirror"),
            },
            Err(e) => warn!(error = %e, "could not read whether the run store is reconciled"),
        }
    }

    /// Notes every run folder the mirror holds in the store, then marks the store reconciled
    /// as the identity it had before the listing began: the number of runs noted, or `None`
    /// when the store's identity changed meanwhile (nothing is marked).
    pub async fn reconcile(&self) -> Result<Option<usize>, DriverError> {
        let Some(token) = self.store.index_token().await? else {
            return Ok(None);
        };
        let runs: Vec<RunId> = (self.blobs.list_folders("runs/").await?)
            .into_iter()
            .map(RunId::new)
            .collect();
        for chunk in runs.chunks(NOTE_CHUNK) {
            self.store.note_mirror_runs(chunk).await?;
        }
        let marked = self.store.mark_reconciled(&token).await?;
        let outcome = if marked { "marked" } else { "superseded" };
        self.metrics.reconciles.with_label_values(&[outcome]).inc();
        Ok(marked.then_some(runs.len()))
    }

    /// The run a submission's id names, if one exists: held, stored, or restored from the
    /// mirror, which is asked only when the store cannot vouch that it holds no such run.
    pub async fn load_existing(&self, run: &RunId) -> Result<RunState, DriverError> {
        if let Some((state, _)) = self.held_copy(run).await? {
            return Ok(state);
        }
        if let Some((state, _, _)) = self.stored(run).await? {
            return Ok(state);
        }
        if !self.store.mirror_may_hold(run).await? {
            let lookups = &self.metrics.mirror_lookups;
            lookups.with_label_values(&["store"]).inc();
            return Err(DriverError::UnknownRun(run.clone()));
        }
        self.load(run).await
    }
}
