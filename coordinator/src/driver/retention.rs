//! Finished runs leave Redis after `FLEET_RUN_RETENTION_SECONDS` (7 days by default); their
//! mirror, result files and artifacts stay in object storage (expired there by the bucket's
//! lifecycle rules), so an old run read again is restored from its mirror, finished.

use super::{Coordinator, DriverError};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

const PRUNE_EVERY: Duration = Duration::from_secs(600);
const BATCH: usize = 500;

impl Coordinator {
    /// Removes from the store finished runs created before `before_ms` (unix milliseconds).
    pub async fn prune_finished(&self, before_ms: i64) -> Result<usize, DriverError> {
        let mut removed = 0;
        for run in self.store.created_before(before_ms, BATCH).await? {
            let Some((state, _, _)) = self.stored(&run).await? else {
                continue;
            };
            if state.status.is_terminal() && state.pending_jobs().next().is_none() {
                self.store.remove(&run).await?;
                self.forget_run(&run);
                removed += 1;
            }
        }
        Ok(removed)
    }

    pub(super) async fn retention(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let before =
                chrono::Utc::now().timestamp_millis() - self.run_retention.as_millis() as i64;
            match self.prune_finished(before).await {
                Ok(0) => {}
                Ok(n) => info!(
                    removed = n,
                    "removed finished runs past their retention from the run store"
                ),
                Err(e) => warn!(error = %e, "could not prune finished runs"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(PRUNE_EVERY.min(self.run_retention.max(Duration::from_secs(1)))) => {}
            }
        }
    }
}
