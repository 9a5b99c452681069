//! The disk quota of a job. A job writes its worktree (and the harness folder) through bind
//! mounts, which a container's own limits do not bound, so the worker watches the job folder:
//! every 50 to 500 ms (the longer a walk takes, the longer the pause; at most 100 ms past half
//! the quota) it adds up what the folder occupies on disk, and a folder over its quota ends the
//! job (`disk_quota_exceeded`; the runner removes the container, which stops the writer). The
//! folder is measured once more when the step ends, so a writer quicker than the watch is
//! caught too. How far a writer gets past the quota depends on its speed: a `dd` from
//! `/dev/zero` on the test machine got 12 to 70 MiB past a 50 MiB quota before it was killed.
//!
//! The walk never follows a symlink nor enters another file system (a layered worktree's
//! overlay: its upper layer, in the folder, holds what the job wrote), and counts each file at
//! the larger of its length and its allocated blocks (`st_blocks * 512`): a sparse file costs
//! its length (`truncate -s 8G` costs no block, but everything that reads the worktree after
//! the job, its commit and its tree hash, would read 8 GiB), a preallocated one what it
//! reserved, and a file with several links inside the folder is counted once. It runs on the
//! blocking pool.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The bytes free for unprivileged users on the file system holding `path` (`statvfs`).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let st = rustix::fs::statvfs(path)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// What a job folder occupies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Allocated bytes (blocks of 512 bytes).
    pub bytes: u64,
    /// Directory entries seen (the root included).
    pub entries: u64,
}

/// Adds up the blocks allocated under `root` (itself included), never following a link. Entries
/// that vanish during the walk, or cannot be read, are skipped: the next walk sees them.
pub fn usage(root: &Path) -> DiskUsage {
    let mut out = DiskUsage::default();
    let Ok(meta) = std::fs::symlink_metadata(root) else {
        return out;
    };
    let mut seen_links: HashSet<(u64, u64)> = HashSet::new();
    let root_dev = meta.dev();
    add(&mut out, &meta, &mut seen_links);
    if !meta.is_dir() {
        return out;
    }
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            // `DirEntry::metadata` does not follow a symlink (fstatat with NOFOLLOW).
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            add(&mut out, &meta, &mut seen_links);
            // Another file system (a layered worktree's overlay) is not the folder's: what the
            // job wrote through it is in its upper layer, which is.
            if meta.is_dir() && meta.dev() == root_dev {
                stack.push(entry.path());
            }
        }
    }
    out
}

fn add(out: &mut DiskUsage, meta: &std::fs::Metadata, seen_links: &mut HashSet<(u64, u64)>) {
    out.entries += 1;
    if !meta.is_dir() && meta.nlink() > 1 && !seen_links.insert((meta.dev(), meta.ino())) {
        return;
    }
    let allocated = meta.blocks().saturating_mul(512);
    let logical = if meta.is_file() { meta.len() } else { 0 };
    out.bytes = out.bytes.saturating_add(allocated.max(logical));
}

/// `usage` on the blocking pool.
pub async fn measure(root: &Path) -> DiskUsage {
    let root = root.to_path_buf();
    crate::safe_fs::blocking(move || usage(&root)).await
}

/// A job folder's quota and how often it is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    pub limit_bytes: u64,
    /// Between two walks while the folder is below half its quota.
    pub every: Duration,
}

/// A job folder found over its quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exceeded {
    pub used_bytes: u64,
    pub limit_bytes: u64,
}

impl Exceeded {
    /// The job's error: the reason's code first, then both sizes.
    pub fn message(&self) -> String {
        format!(
            "disk_quota_exceeded: the job folder reached {} ({} bytes), over the job's disk quota of {} ({} bytes); its container was killed",
            mib(self.used_bytes),
            self.used_bytes,
            mib(self.limit_bytes),
            self.limit_bytes
        )
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// `Some` when `used` is over the quota (equal is within it).
pub fn over(used: DiskUsage, quota: Quota) -> Option<Exceeded> {
    (used.bytes > quota.limit_bytes).then_some(Exceeded {
        used_bytes: used.bytes,
        limit_bytes: quota.limit_bytes,
    })
}

/// The pause before the next walk: short for a small folder (a walk costs little, and a fast
/// writer is caught sooner), up to `every` as walks get longer (twenty times the last walk:
/// walking takes at most a twentieth of a core), a fifth of `every` once past half the quota,
/// and never less than twice the last walk nor 50 ms.
pub fn next_pause(quota: Quota, used: DiskUsage, walk_took: Duration) -> Duration {
    let ceiling = if used.bytes.saturating_mul(2) > quota.limit_bytes {
        quota.every / 5
    } else {
        quota.every
    };
    (walk_took * 20)
        .min(ceiling)
        .max(walk_took * 2)
        .max(Duration::from_millis(50))
}

/// Watches `root` until it is over the quota, then returns what was measured; never returns
/// otherwise (it ends when the caller drops it).
pub async fn watch(root: &Path, quota: Quota) -> Exceeded {
    loop {
        let started = Instant::now();
        let used = measure(root).await;
        if let Some(exceeded) = over(used, quota) {
            return exceeded;
        }
        tokio::time::sleep(next_pause(quota, used, started.elapsed())).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1024 * 1024;

    fn quota(limit_bytes: u64) -> Quota {
        Quota {
            limit_bytes,
            every: Duration::from_millis(500),
        }
    }

    fn used(bytes: u64) -> DiskUsage {
        DiskUsage { bytes, entries: 1 }
    }

    #[test]
    fn a_folder_is_over_only_past_its_quota() {
        assert_eq!(over(used(50 * MB), quota(50 * MB)), None);
        assert_eq!(
            over(used(50 * MB + 1), quota(50 * MB)),
            Some(Exceeded {
                used_bytes: 50 * MB + 1,
                limit_bytes: 50 * MB
            })
        );
    }

    #[test]
    fn the_error_names_the_reason_and_both_sizes() {
        let m = Exceeded {
            used_bytes: 60 * MB,
            limit_bytes: 50 * MB,
        }
        .message();
        assert!(m.starts_with("disk_quota_exceeded: "), "{m}");
        assert!(m.contains("60.0 MiB (62914560 bytes)"), "{m}");
        assert!(m.contains("50.0 MiB (52428800 bytes)"), "{m}");
    }

    #[test]
    fn walks_come_faster_as_the_folder_fills_and_never_hog_a_core() {
        let q = quota(100 * MB);
        let ms = Duration::from_millis;
        // A small folder: walked every 50 ms.
        assert_eq!(next_pause(q, used(10 * MB), ms(1)), ms(50));
        // Longer walks, longer pauses: at most every 500 ms below half the quota...
        assert_eq!(next_pause(q, used(10 * MB), ms(10)), ms(200));
        assert_eq!(next_pause(q, used(10 * MB), ms(100)), ms(500));
        // ...100 ms above it...
        assert_eq!(next_pause(q, used(60 * MB), ms(10)), ms(100));
        // ...and never less than twice the last walk.
        assert_eq!(next_pause(q, used(60 * MB), ms(400)), ms(800));
        let tiny = Quota {
            limit_bytes: 1,
            every: Duration::ZERO,
        };
        assert_eq!(next_pause(tiny, used(1), ms(1)), ms(50));
    }
}
