//! The sandbox port: a throwaway place to run a job's commands with its worktree mounted.
//! `docker` is the real adapter (bollard); `local` runs host processes and exists only for the
//! embedded mode when the user asks for it by name.

pub mod docker;
pub mod local;

use async_trait::async_trait;
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum SandboxError {
    #[error("docker: {0}")]
    Docker(#[from] bollard::errors::Error),
    #[error("image `{0}` is not present (build it with scripts/build-image.sh)")]
    MissingImage(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Other(String),
}

/// Limits applied to every container.
#[derive(Clone, Debug)]
pub struct Limits {
    pub memory_bytes: i64,
    pub nano_cpus: i64,
    pub pids: i64,
    /// Bytes of stdout and of stderr kept per command (the tail is kept).
    pub output_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 1024 * 1024 * 1024,
            nano_cpus: 1_000_000_000,
            pids: 256,
            output_bytes: 1024 * 1024,
        }
    }
}

#[derive(Clone, Debug)]
pub struct SandboxSpec {
    /// Unique per execution (worker, job, attempt and an execution tag); becomes the container
    /// name. Two executions never share one: a name that is taken is an error, never replaced.
    pub name: String,
    pub image: String,
    pub worktree: PathBuf,
    pub writable: bool,
    /// A folder of the harness's own (configs it pins, reports it reads), mounted read-write
    /// beside the worktree, never inside it.
    pub harness_dir: Option<PathBuf>,
    pub network: bool,
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
    fn name(&self) -> &'static str;
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
}

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
    use super::TailBuffer;

    #[test]
    fn tail_buffer_keeps_the_last_bytes() {
        let mut b = TailBuffer::new(4);
        b.push(b"abc");
        b.push(b"def");
        assert_eq!(b.bytes, b"cdef");
        assert!(b.truncated);
    }
}
