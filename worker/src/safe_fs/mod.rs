//! Host-side reads and writes of worktree content, which untrusted agents and repositories write.
//!
//! Every path is resolved one component at a time from a directory handle opened on the worktree
//! root (`cap-std`, `openat` with `O_NOFOLLOW`), so a symlink anywhere in the path is refused,
//! never followed, and a directory swapped for a symlink between a check and the open cannot
//! redirect us: there is no check-then-open on a path, only opens relative to handles already
//! held. Files are opened with `O_NONBLOCK | O_NOCTTY` (a FIFO opens at once instead of blocking),
//! checked on the open handle to be regular files, and read through a cap, so `/dev/zero`, a FIFO
//! or a 2 GB sparse file cannot stall or exhaust the worker. Relative paths are normalised with
//! `shared::paths::normalize_relative`; absolute paths and paths escaping with `..` are refused.
//!
//! `resolve.rs` opens the parent of a path one component at a time; `file.rs` reads, writes and
//! removes one file beneath a root; `walk.rs` walks every regular file beneath it.

mod file;
mod resolve;
#[cfg(test)]
mod tests;
mod walk;

pub use file::{read_capped, read_text_within, remove_beneath, write_beneath, Capped};
pub use walk::{regular_files, regular_files_where, Files};

use std::io;

/// Flags added to every open of worktree content: never block on a FIFO, never take a terminal.
const OPEN_FLAGS: i32 = libc::O_NONBLOCK | libc::O_NOCTTY;

#[derive(Debug, thiserror::Error)]
pub enum SafeFsError {
    /// A component of the path (named: the prefix up to it) is a symlink.
    #[error("`{0}` is a symlink")]
    Symlink(String),
    #[error("`{0}` is not a regular file")]
    NotRegular(String),
    /// Absolute, with a drive letter, or leaving the worktree through `..`.
    #[error("`{0}` escapes the worktree")]
    Escapes(String),
    #[error("path is empty")]
    EmptyPath,
    /// Only from [`read_text_within`].
    #[error("`{path}` is larger than {limit} bytes")]
    TooLarge { path: String, limit: usize },
    #[error("`{path}`: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl SafeFsError {
    /// True when the path (or one of its parents) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, SafeFsError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Runs `f` on the blocking pool and waits for it: file-system walks and libgit2 must not hold
/// one of the runtime's threads. A panic in `f` continues in the caller (where a job's panic is
/// caught and reported), as if `f` had run there.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Only when the runtime shuts down before the task started.
        Err(e) => panic!("blocking work did not run: {e}"),
    }
}

fn io_error(path: &str, source: io::Error) -> SafeFsError {
    SafeFsError::Io {
        path: path.to_string(),
        source,
    }
}
