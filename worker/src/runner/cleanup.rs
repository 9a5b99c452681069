//! Sweeps of the jobs folder: at start, every folder this process did not make (what a killed
//! process left; its containers are reaped by label); while serving, folders older than the
//! maximum age that no running execution owns. Links are removed, never followed; the walks run
//! on the blocking pool.

use super::execution::unpoisoned;
use super::Runner;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tracing::warn;

impl Runner {
    pub(super) fn jobs_dir(&self) -> PathBuf {
        self.config.work_dir.join("jobs")
    }

    /// Removes the job folders of this worker that no execution of this process made: what a
    /// killed process left (its containers are reaped by label). Called once at start, before
    /// any job is taken. Returns how many were removed.
    pub async fn remove_leftover_job_dirs(&self) -> usize {
        let (jobs, nonce) = (self.jobs_dir(), self.nonce.clone());
        let removed = crate::safe_fs::blocking(move || {
            sweep_job_dirs(&jobs, |name, _| left_by_another_process(name, &nonce))
        })
        .await;
        self.metrics
            .job_dirs_removed
            .with_label_values(&["start"])
            .inc_by(removed as u64);
        removed
    }

    /// Removes job folders older than `resources.dir_max_age` that no running execution owns
    /// (a folder whose removal failed when its job ended). Returns how many were removed.
    pub async fn remove_stale_job_dirs(&self) -> usize {
        // Taken before the listing: an execution that starts later has a fresh folder.
        let running: std::collections::HashSet<String> =
            unpoisoned(&self.running).keys().cloned().collect();
        let (jobs, max_age) = (self.jobs_dir(), self.resources.dir_max_age);
        let removed = crate::safe_fs::blocking(move || {
            sweep_job_dirs(&jobs, |name, age| stale(name, age, &running, max_age))
        })
        .await;
        self.metrics
            .job_dirs_removed
            .with_label_values(&["stale"])
            .inc_by(removed as u64);
        removed
    }
}

/// The execution tag at the end of a job folder's name (`<job>-a<attempt>-e<N>-<nonce>`).
pub(super) fn folder_tag(name: &str) -> Option<&str> {
    let (rest, nonce) = name.rsplit_once('-')?;
    let (_, n) = rest.rsplit_once('-')?;
    let digits = n.strip_prefix('e')?;
    let plain = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric());
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || !plain(nonce) {
        return None;
    }
    Some(&name[name.len() - n.len() - 1 - nonce.len()..])
}

/// An entry of the jobs folder that no execution of the process with `nonce` made (anything
/// there that is not a job folder of this process counts too: the folder is the worker's).
pub(super) fn left_by_another_process(name: &str, nonce: &str) -> bool {
    folder_tag(name)
        .and_then(|t| t.rsplit_once('-'))
        .map(|(_, n)| n)
        != Some(nonce)
}

/// A job folder older than `max_age` whose execution is not running.
pub(super) fn stale(
    name: &str,
    age: Duration,
    running: &std::collections::HashSet<String>,
    max_age: Duration,
) -> bool {
    age > max_age && !folder_tag(name).is_some_and(|t| running.contains(t))
}

/// Removes the entries of `jobs` that `remove(name, age)` picks (age: since the entry last
/// changed); links are removed, never followed. Returns how many went.
pub(super) fn sweep_job_dirs(jobs: &Path, remove: impl Fn(&str, Duration) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(jobs) else {
        return 0;
    };
    let now = std::time::SystemTime::now();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let age = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or_default();
        if !remove(&name, age) {
            continue;
        }
        let path = entry.path();
        let gone = if meta.is_dir() {
            crate::git::layered::unmount_job(&path);
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match gone {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(dir = %path.display(), error = %e, "could not remove a job folder")
            }
        }
    }
    removed
}
