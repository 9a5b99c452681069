//! What a worker gives back when its disks run low. Below `resources.disk_low_water` free on
//! the work folder's file system: idle shared checkouts, the git mirror when no job holds it
//! (its packs are fetched again when needed) and job folders no running execution owns that
//! are older than a minute. Below the same mark on the file system of the engine's images:
//! the images no container uses and no tag names (what rebuilds of a tag leave behind), at most
//! once a minute. An image a job may still ask for by its tag is never removed: no registry
//! would bring it back.

use super::cleanup::{stale, sweep_job_dirs};
use super::execution::unpoisoned;
use super::Runner;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Under disk pressure, a job folder no running execution owns is removed once it is this old
/// (not at once: an execution that started after the list of running ones was taken has a
/// folder younger than this).
const PRESSURE_MIN_AGE: Duration = Duration::from_secs(60);

/// Unused images are pruned at most this often: a prune asks the engine to walk every image,
/// and a disk that stays low would otherwise have every job pay for one.
pub(super) const IMAGE_PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Whether a prune is due: none yet, or the last one at least `every` before `now`.
pub(super) fn prune_due(last: Option<Instant>, now: Instant, every: Duration) -> bool {
    last.is_none_or(|at| now.saturating_duration_since(at) >= every)
}

impl Runner {
    /// Gives back what no job is using on whichever disk is below `resources.disk_low_water`
    /// (the work folder's, the images'); nothing when neither is, or the mark is off.
    pub async fn relieve_disk_pressure(&self) {
        let Some(low) = self.resources.disk_low_water else {
            return;
        };
        match crate::sandbox::disk::free_bytes(&self.config.work_dir) {
            Ok(free) if free < low => self.relieve_work_folder(free, low).await,
            Ok(_) => {}
            Err(e) => warn!(error = %e, "cannot read the work folder's free space"),
        }
        self.relieve_image_store(low).await;
    }

    /// Idle shared checkouts, the idle git mirror and unowned job folders older than a minute.
    async fn relieve_work_folder(&self, free: u64, low: u64) {
        let checkouts = self.git.evict_idle_checkouts().await;
        let mirror = match self.git.evict_idle_mirror().await {
            Ok(emptied) => usize::from(emptied),
            Err(e) => {
                warn!(error = %e, "could not empty the idle git mirror");
                0
            }
        };
        let running: std::collections::HashSet<String> =
            unpoisoned(&self.running).keys().cloned().collect();
        let jobs = self.jobs_dir();
        let dirs = crate::safe_fs::blocking(move || {
            sweep_job_dirs(&jobs, |name, age| {
                stale(name, age, &running, PRESSURE_MIN_AGE)
            })
        })
        .await;
        warn!(
            free_bytes = free,
            low_water_bytes = low,
            checkouts,
            mirror,
            job_dirs = dirs,
            "the work folder's disk is low: idle shared checkouts, the git mirror when no job holds it and unowned job folders removed"
        );
        self.count_evictions("checkout", checkouts);
        self.count_evictions("mirror", mirror);
        self.count_evictions("job_dir", dirs);
    }

    /// Prunes the unused, untagged images when the engine's image store is visible here, its
    /// disk is below `low` and no prune ran in the last minute.
    async fn relieve_image_store(&self, low: u64) {
        let Some(store) = self.sandbox.image_store().await else {
            return;
        };
        let free = match crate::sandbox::disk::free_bytes(&store) {
            Ok(free) if free < low => free,
            Ok(_) => return,
            Err(e) => {
                warn!(store = %store.display(), error = %e, "cannot read the image store's free space");
                return;
            }
        };
        // One prune at a time; a job that finds one running goes on without waiting.
        let Ok(mut last) = self.image_prune.try_lock() else {
            return;
        };
        if !prune_due(*last, Instant::now(), IMAGE_PRUNE_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        match self.sandbox.prune_unused_images().await {
            Ok(pruned) => {
                let images = pruned.removed.len();
                if images > 0 {
                    warn!(
                        free_bytes = free,
                        low_water_bytes = low,
                        images,
                        reclaimed_bytes = pruned.bytes,
                        "the image store's disk is low: images no container uses and no tag names removed"
                    );
                } else {
                    info!(
                        free_bytes = free,
                        low_water_bytes = low,
                        "the image store's disk is low and no image is unused and untagged"
                    );
                }
                self.count_evictions("image", images);
            }
            Err(e) => warn!(error = %e, "could not prune the unused images"),
        }
    }

    fn count_evictions(&self, what: &str, n: usize) {
        (self.metrics.disk_pressure_evictions)
            .with_label_values(&[what])
            .inc_by(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_prune_is_due_first_and_then_once_a_minute() {
        let t0 = Instant::now();
        assert!(prune_due(None, t0, IMAGE_PRUNE_EVERY));
        let soon = t0 + Duration::from_secs(59);
        assert!(!prune_due(Some(t0), soon, IMAGE_PRUNE_EVERY));
        let later = t0 + IMAGE_PRUNE_EVERY;
        assert!(prune_due(Some(t0), later, IMAGE_PRUNE_EVERY));
        // A clock read before the last prune (another task's `now`) is not due.
        assert!(!prune_due(Some(soon), t0, IMAGE_PRUNE_EVERY));
    }
}
