//! The sandbox port: a throwaway place to run a job's commands with its worktree mounted.
//! `docker` is the real adapter (bollard), `warm` a pool of its containers started ahead; `local` runs host processes and exists only for the
//! embedded mode when the user asks for it by name.

pub mod disk;
pub mod docker;
pub mod local;
pub mod warm;

use async_trait::async_trait;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum SandboxError {
    /// The container engine failed. Its adapter maps its own errors to this and decides
    /// whether another try may pass (see `docker::transient`).
    #[error("docker: {message}")]
    Engine { message: String, transient: bool },
    #[error("image `{0}` is not present (build it with scripts/build-image.sh)")]
    MissingImage(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The sandbox refuses the request as given (a root user): retrying cannot help.
    #[error("refused: {0}")]
    Refused(String),
    #[error("{0}")]
    Other(String),
}

impl SandboxError {
    /// May pass on another try (the engine unreachable or busy, a container that vanished,
    /// the host's file system). A request the engine refuses as malformed (as its adapter
    /// decides), a missing image and a refused user do not.
    pub fn is_transient(&self) -> bool {
        match self {
            SandboxError::Engine { transient, .. } => *transient,
            SandboxError::Io(_) | SandboxError::Other(_) => true,
            SandboxError::MissingImage(_) | SandboxError::Refused(_) => false,
        }
    }
}

/// Limits applied to every container.
#[derive(Clone, Debug)]
pub struct Limits {
    pub memory_bytes: i64,
    pub nano_cpus: i64,
    pub pids: i64,
    /// Bytes of stdout and of stderr kept per command (the tail is kept).
    pub output_bytes: usize,
    /// Size of the container's `/tmp` (a tmpfs: memory, charged to the container).
    pub tmp_bytes: i64,
    /// Size of the container's `/dev/shm` (a tmpfs too).
    pub shm_bytes: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 1024 * 1024 * 1024,
            nano_cpus: 1_000_000_000,
            pids: 256,
            output_bytes: 1024 * 1024,
            tmp_bytes: 256 * 1024 * 1024,
            shm_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Gives every file and folder under `dir` (itself included) to `uid:gid`, never following a
/// link; an entry that cannot be changed or read is passed over, and the first such error is
/// returned once the rest is done.
pub fn give_tree(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let mut first = None;
    let mut note = |r: std::io::Result<()>| {
        if let Err(e) = r {
            first.get_or_insert(e);
        }
    };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        note(std::os::unix::fs::lchown(&d, Some(uid), Some(gid)));
        let entries = match std::fs::read_dir(&d) {
            Ok(entries) => entries,
            Err(e) => {
                note(Err(e));
                continue;
            }
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            } else {
                note(std::os::unix::fs::lchown(e.path(), Some(uid), Some(gid)));
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// Checks the user containers run as: numeric `uid:gid`, neither of them root's (0). A name is
/// resolved inside the image, where any name may be uid 0; a uid without a group gets group 0
/// from Docker when the image does not know it. Refused with the reason and what to give.
pub fn check_user(user: &str) -> Result<(u32, u32), String> {
    let hint = "give a numeric, non-root `uid:gid` such as 10001:10001 (--sandbox-user / FLEET_SANDBOX_USER)";
    let number = |s: &str| -> Option<u32> {
        if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse::<u32>().ok()
    };
    let is_root_name = |s: &str| s.eq_ignore_ascii_case("root");
    let (u, g) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    if is_root_name(u) || number(u) == Some(0) {
        return Err(format!(
            "the sandbox user `{user}` is root (uid 0): containers never run as root; {hint}"
        ));
    }
    if let Some(g) = g {
        if is_root_name(g) || number(g) == Some(0) {
            return Err(format!(
                "the sandbox user `{user}` has root's group (gid 0): containers never run in it; {hint}"
            ));
        }
    }
    let Some(uid) = number(u) else {
        return Err(format!(
            "the sandbox user `{user}` is not numeric: a name is resolved inside the image, where it may be root; {hint}"
        ));
    };
    let Some(g) = g else {
        return Err(format!(
            "the sandbox user `{user}` has no group: Docker gives a uid the image does not know group 0 (root's); {hint}"
        ));
    };
    let Some(gid) = number(g) else {
        return Err(format!(
            "the sandbox user `{user}` has a group that is not numeric: a name is resolved inside the image, where it may be root's; {hint}"
        ));
    };
    if uid == u32::MAX || gid == u32::MAX {
        return Err(format!(
            "the sandbox user `{user}` is not a user (4294967295 is -1); {hint}"
        ));
    }
    Ok((uid, gid))
}

#[derive(Clone, Debug)]
pub struct SandboxSpec {
    /// Unique per execution (worker, job, attempt and an execution tag); becomes the container
    /// name. Two executions never share one: a name that is taken is an error, never replaced.
    pub name: String,
    pub image: String,
    pub worktree: PathBuf,
    pub writable: bool,
    /// The worktree is a checkout that a commit's read-only jobs share: mounted read-only
    /// where it is, never moved into a warm container (such a job's container starts cold).
    pub shared_worktree: bool,
    /// The worktree is an overlay mounted in the job folder (`git/layered.rs`): mounted where it
    /// is, never moved into a warm container (such a job's container starts cold).
    pub layered_worktree: bool,
    /// A folder of the harness's own (configs it pins, reports it reads), mounted read-write
    /// beside the worktree, never inside it.
    pub harness_dir: Option<PathBuf>,
    pub network: bool,
    /// The folder of the job's LLM gateway socket (command agents), mounted at
    /// [`GATEWAY_MOUNT`] in a container.
    pub gateway_dir: Option<PathBuf>,
    /// The container removes itself after this long even if its worker died.
    pub lifetime: Duration,
    pub labels: Vec<(String, String)>,
}

#[derive(Clone, Debug, Default)]
pub struct ExecOutput {
    pub exit_code: i64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub timed_out: bool,
    /// Output beyond the limit was dropped (the tail was kept).
    pub truncated: bool,
    pub duration: Duration,
}

/// Where commands run. Paths given to `exec` are relative to the worktree root.
#[async_trait]
pub trait Sandbox: Send + Sync {
    async fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn Session>, SandboxError>;
    /// Removes every container of this worker left over from before a restart.
    async fn reap(&self, worker_id: &str) -> Result<usize, SandboxError>;
    /// Removes the container of that name if there is one (none is not an error): the cleanup
    /// of an execution whose session was lost (its job panicked while it held it).
    async fn remove_named(&self, name: &str) -> Result<(), SandboxError>;
    /// The content id of `image` as this sandbox would run it (`sha256:...`), for the step
    /// cache's keys; none when the sandbox cannot name what it runs (host processes).
    async fn image_id(&self, image: &str) -> Result<Option<String>, SandboxError>;
    fn name(&self) -> &'static str;
    /// Releases what the sandbox holds ahead of jobs (a warm pool's containers); called once
    /// the worker has stopped taking jobs.
    async fn shutdown(&self) {}
    /// Whether containers are started ahead of jobs whose folders are moved into them (a warm
    /// pool): a job on a shared checkout cannot use one.
    fn keeps_warm(&self) -> bool {
        false
    }
    /// The folder where the engine keeps its images, when this process can see it (its free
    /// space says whether images must give room back); none for a sandbox without images.
    async fn image_store(&self) -> Option<PathBuf> {
        None
    }
    /// Removes the images that no container uses (running or not) and no tag names: what
    /// rebuilds of a tag leave behind, and what a low disk gives back first. An image a job may
    /// still ask for by its tag is never removed (no registry brings it back).
    async fn prune_unused_images(&self) -> Result<PrunedImages, SandboxError> {
        Ok(PrunedImages::default())
    }
}

/// What a prune of unused images gave back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrunedImages {
    /// The content ids of the images removed.
    pub removed: Vec<String>,
    /// The bytes the engine says it reclaimed.
    pub bytes: u64,
}

#[async_trait]
pub trait Session: Send + Sync {
    async fn exec(
        &self,
        argv: &[String],
        stdin: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<ExecOutput, SandboxError>;
    /// Stops and removes the container. Called exactly once, also on failure paths.
    async fn remove(&self) -> Result<(), SandboxError>;
    /// Where the worktree and the harness folder are, as commands in this session see them.
    fn mounts(&self) -> Mounts;
    /// Kills every process the job's commands left behind (a daemon that would rewrite a
    /// report after the runner exits), so what the harness reads next is final.
    async fn kill_strays(&self) -> Result<(), SandboxError>;
    /// True when the session is a container of its own (`kill -9 -1` in it reaches only the
    /// job's processes); false for host processes.
    fn isolated(&self) -> bool;
}

/// Paths as seen from inside a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mounts {
    pub work: String,
    pub harness: Option<String>,
    /// The folder of the LLM gateway's socket, when the job has one.
    pub gateway: Option<String>,
}

/// Where a container sees the folder of its job's LLM gateway socket.
pub const GATEWAY_MOUNT: &str = "/run/fleet-llm";

/// Keeps the last `limit` bytes of a stream.
pub(crate) struct TailBuffer {
    pub bytes: Vec<u8>,
    limit: usize,
    pub truncated: bool,
}

impl TailBuffer {
    pub fn new(limit: usize) -> Self {
        Self {
            bytes: Vec::new(),
            limit,
            truncated: false,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > self.limit {
            let cut = self.bytes.len() - self.limit;
            self.bytes.drain(..cut);
            self.truncated = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{check_user, Limits, SandboxError, TailBuffer};

    #[test]
    fn root_is_refused_as_the_sandbox_user_in_every_form() {
        for user in [
            "0",
            "0:0",
            "00:00",
            "root",
            "ROOT",
            "root:root",
            "0:10001",
            "root:10001",
            "10001:0",
            "10001:root",
            "10001:000",
        ] {
            let e = check_user(user).expect_err(user);
            assert!(e.contains("root"), "{user}: {e}");
            assert!(e.contains(&format!("`{user}`")), "{user}: {e}");
            assert!(e.contains("10001:10001"), "the fix is named: {e}");
        }
    }

    #[test]
    fn only_numeric_uid_and_gid_pairs_are_accepted() {
        assert_eq!(check_user("10001:10001"), Ok((10001, 10001)));
        assert_eq!(check_user("1000:100"), Ok((1000, 100)));
        for user in [
            "10001",
            "nobody",
            "nobody:nogroup",
            "10001:",
            ":10001",
            ":0",
            "+5:+5",
            "-1:-1",
            "1 :1",
            "4294967295:1",
            "99999999999:1",
            "",
        ] {
            assert!(check_user(user).is_err(), "{user} was accepted");
        }
        // A uid alone would get group 0 from Docker.
        assert!(check_user("10001").unwrap_err().contains("group 0"));
    }

    #[test]
    fn sandbox_errors_know_whether_a_retry_can_help() {
        let engine = |transient| SandboxError::Engine {
            message: "x".into(),
            transient,
        };
        assert!(engine(true).is_transient(), "as the adapter decided");
        assert!(!engine(false).is_transient(), "as the adapter decided");
        assert!(!SandboxError::MissingImage("img".into()).is_transient());
        assert!(!SandboxError::Refused("root".into()).is_transient());
        assert!(SandboxError::Io(std::io::Error::other("disk")).is_transient());
        assert!(SandboxError::Other("name taken".into()).is_transient());
    }

    #[test]
    fn tmpfs_sizes_are_capped_by_default() {
        let l = Limits::default();
        assert_eq!(l.tmp_bytes, 256 << 20);
        assert_eq!(l.shm_bytes, 64 << 20);
    }

    #[test]
    fn tail_buffer_keeps_the_last_bytes() {
        let mut b = TailBuffer::new(4);
        b.push(b"abc");
        b.push(b"def");
        assert_eq!(b.bytes, b"cdef");
        assert!(b.truncated);
    }
}
