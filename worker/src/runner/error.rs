//! The errors of a job that stops before it has a result (`RunError`, classed once where it is
//! made: `Transient` is requeued, `Permanent` is reported at once as an `Error` result), and why a
//! worker cannot start (`StartError`).

use crate::blobs::BlobError;
use crate::git::GitError;
use crate::sandbox::SandboxError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RunError {
    /// May pass on another try (store or docker unreachable): requeue.
    #[error("transient: {0}")]
    Transient(String),
    /// Cannot pass on another try (a node not in the graph, a bad git object, a malformed
    /// bundle): reported at once as an `Error` result of the attempt, never requeued.
    #[error("permanent: {0}")]
    Permanent(String),
}

impl RunError {
    /// The class, decided where the error was made.
    pub fn is_transient(&self) -> bool {
        matches!(self, RunError::Transient(_))
    }

    /// What went wrong, without the class.
    pub fn reason(&self) -> &str {
        match self {
            RunError::Transient(r) | RunError::Permanent(r) => r,
        }
    }

    fn classed(transient: bool, reason: String) -> Self {
        if transient {
            RunError::Transient(reason)
        } else {
            RunError::Permanent(reason)
        }
    }
}

impl From<BlobError> for RunError {
    fn from(e: BlobError) -> Self {
        RunError::classed(e.is_transient(), e.to_string())
    }
}

impl From<GitError> for RunError {
    fn from(e: GitError) -> Self {
        RunError::classed(e.is_transient(), e.to_string())
    }
}

impl From<SandboxError> for RunError {
    fn from(e: SandboxError) -> Self {
        RunError::classed(e.is_transient(), e.to_string())
    }
}

/// Why a worker cannot start.
#[derive(Debug, Error)]
pub enum StartError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Git(#[from] GitError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}
