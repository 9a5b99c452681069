//! Resources of a job the worker enforces itself, beyond the container's own limits: the job
//! folder's disk quota and the age after which a folder no execution owns is removed. Read from
//! the environment (`FLEET_JOB_DISK_MB`, `FLEET_JOB_DIR_MAX_AGE_SECONDS`), and the free space
//! below which the worker evicts what it keeps on disk (`FLEET_DISK_LOW_WATER_MB`).

use super::StartError;
use crate::sandbox::disk;
use std::time::Duration;

/// The default disk quota of a job folder (`FLEET_JOB_DISK_MB`).
pub const DEFAULT_JOB_DISK_MB: u64 = 2048;
/// The default age after which a job folder no execution owns is removed
/// (`FLEET_JOB_DIR_MAX_AGE_SECONDS`).
pub const DEFAULT_JOB_DIR_MAX_AGE_SECONDS: u64 = 24 * 3600;
/// The default free space of the work folder's file system below which the worker evicts idle
/// shared checkouts and job folders no execution owns (`FLEET_DISK_LOW_WATER_MB`).
pub const DEFAULT_DISK_LOW_WATER_MB: u64 = 1024;

/// Resources of a job the worker enforces itself (the container's own limits are `Limits`).
/// Read from the environment (`from_env`) until the CLI has flags for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobResources {
    /// What a job folder (worktree, git directory, harness folder) may hold on disk; `None`: no
    /// quota (`FLEET_JOB_DISK_MB=0`).
    pub disk_quota: Option<disk::Quota>,
    /// Job folders older than this that no running execution owns are removed.
    pub dir_max_age: Duration,
    /// Below this many free bytes on the work folder's file system, the worker evicts what it
    /// keeps (`Runner::relieve_disk_pressure`); `None`: never (`FLEET_DISK_LOW_WATER_MB=0`).
    pub disk_low_water: Option<u64>,
}

impl Default for JobResources {
    fn default() -> Self {
        Self {
            disk_quota: Some(disk::Quota {
                limit_bytes: DEFAULT_JOB_DISK_MB * 1024 * 1024,
                every: Duration::from_millis(500),
            }),
            dir_max_age: Duration::from_secs(DEFAULT_JOB_DIR_MAX_AGE_SECONDS),
            disk_low_water: Some(DEFAULT_DISK_LOW_WATER_MB * 1024 * 1024),
        }
    }
}

impl JobResources {
    /// `FLEET_JOB_DISK_MB` (default 2048; 0 turns the quota off) and
    /// `FLEET_JOB_DIR_MAX_AGE_SECONDS` (default 86400).
    pub fn from_env() -> Result<Self, StartError> {
        Self::from_lookup(|k| std::env::var(k).ok()).map_err(StartError::Config)
    }

    /// The same, over any source of variables.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let number = |key: &str| -> Result<Option<u64>, String> {
            match get(key).map(|v| v.trim().to_string()) {
                None => Ok(None),
                Some(v) if v.is_empty() => Ok(None),
                Some(v) => v
                    .parse::<u64>()
                    .map(Some)
                    .map_err(|_| format!("{key}=`{v}` is not a whole number")),
            }
        };
        let mut r = Self::default();
        match number("FLEET_JOB_DISK_MB")? {
            None => {}
            Some(0) => r.disk_quota = None,
            Some(mb) => {
                let limit_bytes = mb
                    .checked_mul(1024 * 1024)
                    .ok_or_else(|| format!("FLEET_JOB_DISK_MB={mb} is too large"))?;
                r.disk_quota = Some(disk::Quota {
                    limit_bytes,
                    every: Duration::from_millis(500),
                });
            }
        }
        match number("FLEET_DISK_LOW_WATER_MB")? {
            None => {}
            Some(0) => r.disk_low_water = None,
            Some(mb) => {
                r.disk_low_water = Some(
                    mb.checked_mul(1024 * 1024)
                        .ok_or_else(|| format!("FLEET_DISK_LOW_WATER_MB={mb} is too large"))?,
                )
            }
        }
        match number("FLEET_JOB_DIR_MAX_AGE_SECONDS")? {
            None => {}
            Some(0) => return Err("FLEET_JOB_DIR_MAX_AGE_SECONDS must be above 0".into()),
            Some(s) => r.dir_max_age = Duration::from_secs(s),
        }
        Ok(r)
    }

    /// How often stale job folders are looked for: a quarter of their maximum age, between a
    /// second and an hour.
    pub fn sweep_every(&self) -> Duration {
        (self.dir_max_age / 4).clamp(Duration::from_secs(1), Duration::from_secs(3600))
    }
}
