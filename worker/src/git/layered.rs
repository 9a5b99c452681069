//! Layered worktrees (issue 13, item 5): a job that needs a worktree of its own (it writes it, or
//! the harness writes into it from the worker's side) gets an overlay mount whose lower layer is
//! its commit's shared checkout (`shared_checkout.rs`, never changed) and whose upper layer is in
//! the job folder. Making one is a mount, not a checkout of every file; what the job writes, and
//! only that, lands in the upper layer (a file's first change copies it up), so the checkout that
//! the commit's other jobs read stays as it was.
//!
//! What holds:
//! - the lower layer is a published shared checkout held by the job's lease, owned by the
//!   sandbox user (so the job may change any file of it in the overlay) and never written:
//!   overlayfs sends every change to the upper layer;
//! - the overlay is mounted `nosuid,nodev` at `<job folder>/wt`, upper and work folders beside
//!   it; it is unmounted before the job folder is removed, and every overlay left under the
//!   work folder by a killed process is unmounted at start (`unmount_within`);
//! - the disk quota's walk does not enter another file system, so a job is charged for its
//!   upper layer, not for the checkout it did not write;
//! - layering needs the right to mount (root or `CAP_SYS_ADMIN`) and a Docker engine that sees
//!   the worker's mounts: `FLEET_LAYERED_WORKTREES=auto` (the default) uses it when a probe
//!   mount works and a `dockerd` shares the worker's mount namespace (a worker in a container of
//!   its own, or with a remote engine, has none); `on` requires it, `off` never uses it. Without
//!   it a job checks its tree out.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use tracing::{info, warn};

pub const LAYERED_WORKTREES_ENV: &str = "FLEET_LAYERED_WORKTREES";

/// Whether to layer worktrees (`FLEET_LAYERED_WORKTREES`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Layer when a probe mount works and the Docker engine shares the worker's mounts.
    Auto,
    /// Layer; a worker that cannot mount refuses to start.
    On,
    Off,
}

impl Mode {
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.trim() {
            "" | "auto" => Ok(Self::Auto),
            "on" | "1" | "true" => Ok(Self::On),
            "off" | "0" | "false" => Ok(Self::Off),
            other => Err(format!(
                "{LAYERED_WORKTREES_ENV} is `{other}`: give auto, on or off"
            )),
        }
    }

    pub fn from_env() -> Result<Self, String> {
        Self::parse(&std::env::var(LAYERED_WORKTREES_ENV).unwrap_or_default())
    }
}

/// Why the Docker engine would not see this process's mounts, if it would not: a job's overlay
/// must be in the mount namespace of the `dockerd` that binds it into the job's container. A
/// worker in a container of its own (with the engine's socket) or with a remote engine finds no
/// `dockerd` sharing its namespace.
fn engine_blind_to_mounts() -> Option<String> {
    let mine = match std::fs::read_link("/proc/self/ns/mnt") {
        Ok(ns) => ns,
        Err(e) => return Some(format!("this process's mount namespace is unreadable: {e}")),
    };
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Some("/proc is unreadable".into());
    };
    let mut seen = false;
    for p in procs.flatten() {
        let path = p.path();
        let is_engine =
            std::fs::read_to_string(path.join("comm")).is_ok_and(|c| c.trim() == "dockerd");
        if !is_engine {
            continue;
        }
        seen = true;
        if std::fs::read_link(path.join("ns/mnt")).is_ok_and(|ns| ns == mine) {
            return None;
        }
    }
    Some(if seen {
        "the docker engine runs in another mount namespace (the worker is in a container)".into()
    } else {
        "no docker engine (dockerd) runs beside the worker to see its mounts".into()
    })
}

/// Decides whether worktrees are layered here: `Ok(true)` when they are, `Ok(false)` when `Auto`
/// finds it cannot (logged), an error when `On` cannot.
pub fn decide(mode: Mode, scratch: &Path) -> Result<bool, String> {
    if mode == Mode::Off {
        return Ok(false);
    }
    let reason = probe(scratch)
        .err()
        .map(|e| format!("a probe overlay mount failed: {e}"))
        .or_else(engine_blind_to_mounts);
    match (reason, mode) {
        (None, _) => Ok(true),
        (Some(why), Mode::On) => Err(format!(
            "{LAYERED_WORKTREES_ENV}=on but worktrees cannot be layered: {why}"
        )),
        (Some(why), _) => {
            info!(reason = %why, "worktrees are checked out, not layered");
            Ok(false)
        }
    }
}

/// Mounts an overlay in `scratch` and checks that a write through it lands in the upper layer
/// and leaves the lower one as it was; unmounts and removes it.
fn probe(scratch: &Path) -> io::Result<()> {
    if scratch.exists() {
        unmount_within(scratch);
        std::fs::remove_dir_all(scratch)?;
    }
    let lower = scratch.join("lower");
    std::fs::create_dir_all(&lower)?;
    std::fs::write(lower.join("f"), b"lower")?;
    let job = scratch.join("job");
    std::fs::create_dir_all(&job)?;
    let result = mount(&lower, &job).and_then(|merged| {
        std::fs::write(merged.join("f"), b"upper")?;
        let (lower_now, upper_now) = (
            std::fs::read(lower.join("f"))?,
            std::fs::read(job.join(UPPER).join("f"))?,
        );
        if lower_now != b"lower" || upper_now != b"upper" {
            return Err(io::Error::other(
                "a write through the overlay reached its lower layer",
            ));
        }
        Ok(())
    });
    unmount_within(scratch);
    let removed = std::fs::remove_dir_all(scratch);
    result.and(removed)
}

const UPPER: &str = "upper";
const WORK: &str = "work";
const MERGED: &str = "wt";

/// Mounts an overlay of `lower` at `job/wt`, its upper and work layers in `job/upper` and
/// `job/work` (created here). Returns the merged folder, whose root (the upper's) is the
/// worker's until the runner gives the worktree away.
pub fn mount(lower: &Path, job: &Path) -> io::Result<PathBuf> {
    let (upper, work, merged) = (job.join(UPPER), job.join(WORK), job.join(MERGED));
    for dir in [&upper, &work, &merged] {
        std::fs::create_dir_all(dir)?;
    }
    let options = options(lower, &upper, &work)?;
    let options = std::ffi::CString::new(options)
        .map_err(|_| io::Error::other("an overlay path holds a nul byte"))?;
    use rustix::mount::MountFlags;
    rustix::mount::mount(
        "fleet-worktree",
        &merged,
        "overlay",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(options.as_c_str()),
    )?;
    Ok(merged)
}

/// The overlay's mount options; refuses paths the option syntax cannot carry (`,` and `:`
/// separate options and layers, `\` escapes).
fn options(lower: &Path, upper: &Path, work: &Path) -> io::Result<String> {
    let text = |p: &Path| -> io::Result<String> {
        let s = p
            .to_str()
            .ok_or_else(|| io::Error::other(format!("{} is not UTF-8", p.display())))?;
        if s.contains([',', ':', '\\', '\n']) || !p.is_absolute() {
            return Err(io::Error::other(format!(
                "{s} cannot be an overlay layer: it is relative or holds `,`, `:` or `\\`"
            )));
        }
        Ok(s.to_string())
    };
    Ok(format!(
        "lowerdir={},upperdir={},workdir={}",
        text(lower)?,
        text(upper)?,
        text(work)?
    ))
}

/// Whether `dir` is the root of a file system other than its parent's (an overlay mounted there).
pub fn is_mount_point(dir: &Path) -> bool {
    let (Ok(me), Some(Ok(parent))) = (
        std::fs::symlink_metadata(dir),
        dir.parent().map(std::fs::symlink_metadata),
    ) else {
        return false;
    };
    me.is_dir() && me.dev() != parent.dev()
}

/// Unmounts (lazily) the overlay of a job folder, if one is mounted there: before the folder is
/// removed (removing through a mounted overlay would leave it mounted and fill its upper layer
/// with whiteouts).
pub fn unmount_job(job: &Path) {
    let merged = job.join(MERGED);
    if is_mount_point(&merged) {
        if let Err(e) = rustix::mount::unmount(&merged, rustix::mount::UnmountFlags::DETACH) {
            warn!(mount = %merged.display(), error = %e, "could not unmount a job's overlay");
        }
    }
}

/// Unmounts (lazily) every mount at or under `dir`, deepest first; returns how many. What a
/// killed process left mounted is found in `/proc/self/mountinfo`.
pub fn unmount_within(dir: &Path) -> usize {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return 0;
    };
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mut n = 0;
    for point in mount_points_within(&table, &dir) {
        match rustix::mount::unmount(&point, rustix::mount::UnmountFlags::DETACH) {
            Ok(()) => n += 1,
            Err(e) => warn!(mount = %point.display(), error = %e, "could not unmount an overlay"),
        }
    }
    n
}

/// The mount points of a `mountinfo` table at or under `dir`, deepest first.
pub fn mount_points_within(table: &str, dir: &Path) -> Vec<PathBuf> {
    let mut points: Vec<PathBuf> = table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
}

/// `mountinfo` writes space, tab, newline and backslash in paths as three octal digits.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(b) = u8::from_str_radix(digits, 8) {
                out.push(b);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
90 22 0:50 / /w/jobs/j1-a1-e1/wt rw,nosuid,nodev - overlay fleet-worktree rw,lowerdir=/w/git/checkouts/c/wt
91 22 0:51 / /w/jobs/j2\\040x/wt rw - overlay fleet-worktree rw
92 90 0:52 / /w/jobs/j1-a1-e1/wt/deeper rw - tmpfs t rw
93 22 0:53 / /w/jobsx/wt rw - overlay fleet-worktree rw
";

    #[test]
    fn mount_points_under_a_folder_come_deepest_first_and_unescaped() {
        let points = mount_points_within(TABLE, Path::new("/w/jobs"));
        assert_eq!(
            points,
            vec![
                PathBuf::from("/w/jobs/j1-a1-e1/wt/deeper"),
                PathBuf::from("/w/jobs/j1-a1-e1/wt"),
                PathBuf::from("/w/jobs/j2 x/wt"),
            ]
        );
    }

    #[test]
    fn a_sibling_folder_with_the_same_prefix_is_not_within() {
        let points = mount_points_within(TABLE, Path::new("/w/jobs/j1-a1-e1"));
        assert_eq!(points.len(), 2);
        assert!(mount_points_within(TABLE, Path::new("/w/job")).is_empty());
    }

    #[test]
    fn paths_the_option_syntax_cannot_carry_are_refused() {
        let ok = options(Path::new("/a"), Path::new("/b"), Path::new("/c")).unwrap();
        assert_eq!(ok, "lowerdir=/a,upperdir=/b,workdir=/c");
        for bad in ["/a,b", "/a:b", "/a\\b", "relative"] {
            assert!(
                options(Path::new(bad), Path::new("/b"), Path::new("/c")).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_mode_reads_auto_on_and_off_and_refuses_the_rest() {
        assert_eq!(Mode::parse("").unwrap(), Mode::Auto);
        assert_eq!(Mode::parse("auto").unwrap(), Mode::Auto);
        assert_eq!(Mode::parse("on").unwrap(), Mode::On);
        assert_eq!(Mode::parse("off").unwrap(), Mode::Off);
        assert!(Mode::parse("sometimes")
            .unwrap_err()
            .contains("auto, on or off"));
    }
}
