//! An execution of a job attempt and the names it alone uses: its tag (`e<N>-<process nonce>`),
//! its job folder and container name; the guards that remove the folder and the stop-registry
//! entry on every exit path (a result, an error, a panic); and the stop registry itself, so a
//! stop from the coordinator reaches every execution of the job.

use super::Runner;
use shared::messages::JobSpec;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// The executions running in a worker, by tag, with their job and stop token.
pub(super) type StopRegistry = Mutex<HashMap<String, (shared::ids::JobId, CancellationToken)>>;

/// One execution of a job attempt in this worker: the names it alone uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Execution {
    /// `e<N>-<nonce>`, unique in this worker across restarts.
    pub tag: String,
    /// The job folder (worktree, harness folder), `jobs/<job>-a<attempt>-<tag>`.
    pub dir: PathBuf,
    /// The container name, `fleet-<worker>-<job>-a<attempt>-<tag>`.
    pub container: String,
}

impl Execution {
    /// Where this execution's artifacts go: a folder of its own beneath the job's prefix, so a
    /// duplicate execution of the attempt never overwrites the one the run accepted.
    pub fn artifact_prefix(&self, spec: &JobSpec) -> String {
        format!("{}exec-{}/", spec.artifact_prefix, self.tag)
    }
}

/// The job folder, removed whenever the execution ends: a result, an error, a panic. `remove`
/// does it on the blocking pool; dropped without it (a panic on the way), it is removed where
/// it is dropped.
pub(super) struct JobFolder {
    dir: Option<PathBuf>,
    job: String,
}

impl JobFolder {
    pub(super) fn create(dir: &Path, job: &str) -> std::io::Result<Self> {
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // Not `create_dir_all`: a folder that exists belongs to another execution.
        std::fs::create_dir(dir)?;
        Ok(Self {
            dir: Some(dir.to_path_buf()),
            job: job.to_string(),
        })
    }

    /// Removes the folder, if the execution made one.
    pub(super) async fn remove_if_made(folder: Option<Self>) {
        if let Some(folder) = folder {
            folder.remove().await;
        }
    }

    /// Removes the folder on the blocking pool (a job folder may hold gigabytes).
    pub(super) async fn remove(mut self) {
        let (Some(dir), job) = (self.dir.take(), std::mem::take(&mut self.job)) else {
            return;
        };
        crate::safe_fs::blocking(move || remove_job_dir(&dir, &job)).await;
    }
}

fn remove_job_dir(dir: &Path, job: &str) {
    crate::git::layered::unmount_job(dir);
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            warn!(job = %job, dir = %dir.display(), error = %e, "could not remove the job folder")
        }
    }
}

impl Drop for JobFolder {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            remove_job_dir(&dir, &self.job);
        }
    }
}

/// An execution's entry in the stop registry, removed on every exit path.
pub(super) struct Registered<'a> {
    pub(super) running: &'a StopRegistry,
    pub(super) tag: String,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        unpoisoned(self.running).remove(&self.tag);
    }
}

/// A lock that a panic elsewhere did not make unusable (the maps it guards stay consistent:
/// every update is a single insert or remove).
pub(super) fn unpoisoned<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Random enough to tell two processes of one worker id apart (std only: the hasher's keys are
/// random per process).
pub(crate) fn process_nonce() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    format!("{:06x}", h.finish() & 0xff_ffff)
}

/// Container names are unique per worker, job, attempt and execution.
pub(super) fn container_name(worker: &str, spec: &JobSpec, tag: &str) -> String {
    let raw = format!("fleet-{worker}-{}-a{}-{tag}", spec.job_id, spec.attempt);
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Runner {
    /// Stops every execution of a job running here (its run ended); false when none runs here.
    pub fn stop(&self, job: &shared::ids::JobId) -> bool {
        let running = unpoisoned(&self.running);
        let mut found = false;
        for (j, token) in running.values() {
            if j == job {
                token.cancel();
                found = true;
            }
        }
        found
    }

    /// The names of a new execution of the job's attempt.
    pub fn execution(&self, spec: &JobSpec) -> Execution {
        let n = self.executions.fetch_add(1, Ordering::Relaxed) + 1;
        let tag = format!("e{n}-{}", self.nonce);
        let dir = self.config.work_dir.join("jobs").join(format!(
            "{}-a{}-{tag}",
            spec.job_id.as_str().replace(['/', '\\'], "_"),
            spec.attempt
        ));
        Execution {
            container: container_name(&self.config.id, spec, &tag),
            tag,
            dir,
        }
    }
}
