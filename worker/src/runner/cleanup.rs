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
    fn jobs_dir(&self) -> PathBuf {
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

/// Under disk pressure, a job folder no running execution owns is removed once it is this old
/// (not at once: an execution that started after the list of running ones was taken has a
/// folder younger than this).
const PRESSURE_MIN_AGE: Duration = Duration::from_secs(60);

impl Runner {
    /// When the work folder's file system has less free space than `resources.disk_low_water`,
    /// removes what the worker keeps that no job is using: idle shared checkouts, the git mirror
    /// when no job holds it (its packs are fetched again when needed), and job folders no
    /// running execution owns older than a minute (not a day). Returns how many checkouts and
    /// job folders went.
    pub async fn relieve_disk_pressure(&self) -> (usize, usize) {
        let Some(low) = self.resources.disk_low_water else {
            return (0, 0);
        };
        let free = match crate::sandbox::disk::free_bytes(&self.config.work_dir) {
            Ok(f) => f,
            Err(e) => {
                warn!(error = %e, "cannot read the work folder's free space");
                return (0, 0);
            }
        };
        if free >= low {
            return (0, 0);
        }
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
        let m = &self.metrics.disk_pressure_evictions;
        m.with_label_values(&["checkout"]).inc_by(checkouts as u64);
        m.with_label_values(&["mirror"]).inc_by(mirror as u64);
        m.with_label_values(&["job_dir"]).inc_by(dirs as u64);
        (checkouts, dirs)
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
