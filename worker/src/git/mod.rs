//! Git adapter (git2). Git objects travel between machines as packfiles in object storage; each
//! worker keeps a bare mirror as a cache and materialises a fresh worktree per job whose git
//! directory lives *outside* the folder mounted into the container, so nothing of the object
//! database (and nothing of a sibling branch) is reachable from inside.
//!
//! libgit2 blocks: async callers run it on the blocking pool (`GitCache::materialize`,
//! `Worktree::blocking`).
//!
//! `mirror.rs`: packs into the bare mirror and a worktree out of it; `own_checkout.rs`: a job's
//! worktree of its own, its git directory made on first read; `worktree.rs`: a job's
//! worktree (commits, picks, restores, the pack of its new commits); `changes.rs`: what changed,
//! as git computes it (both sides of renames, modes), from a tree diff or a patch; `repo.rs`:
//! packing a submitted repository and the clean-tree preflight; `exposed.rs`: the git directory
//! of its own that a node asking for one (`worktree.git`) finds in its worktree, limited to the
//! branches it named; `shared_checkout.rs`: the checkout a commit's read-only jobs share;
//! `layered.rs`: the overlay on that checkout that is a job's own worktree.

mod changes;
mod exposed;
pub mod layered;
mod mirror;
mod own_checkout;
mod repo;
mod shared_checkout;
#[cfg(test)]
mod tests;
mod upload;
mod worktree;

pub use changes::patch_changes;
pub use mirror::{GitCache, MirrorHold};
pub use repo::{
    pack_commit, pack_repository, paths_on_disk, resolve_clean, tree_hash_on_disk, RepoPack,
};
pub use shared_checkout::{Lease, SHARED_CHECKOUTS_ENV};
pub use upload::{inspect_pack, UploadedCommit};
pub use worktree::{PickOutcome, Worktree};

use crate::blobs::BlobError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum GitError {
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Blob(#[from] BlobError),
    #[error("working tree of `{0}` is not clean: commit or stash first ({1})")]
    Dirty(String, String),
    #[error("the patch does not apply: {0}")]
    Apply(String),
    #[error(transparent)]
    SafeFs(#[from] crate::safe_fs::SafeFsError),
    #[error("the diff is too large: {0}")]
    TooLarge(String),
    /// A worktree file longer than what is read of one (sparse files included).
    #[error("a worktree file is too large: {0}")]
    FileTooLarge(String),
    /// An uploaded pack refused: not a pack, or not holding what it is said to hold.
    #[error("the uploaded pack is refused: {0}")]
    Upload(String),
    /// A change asked of a read-only checkout that a commit's jobs share.
    #[error("the worktree is a checkout shared by read-only jobs: it cannot be changed ({0})")]
    SharedCheckout(&'static str),
}

impl GitError {
    /// May pass on another try: the operating system (disk, locks), the network, the object
    /// store. A missing or malformed object, a commit id that is not one, a patch that does not
    /// apply, content git refuses: retrying the same job cannot help.
    pub fn is_transient(&self) -> bool {
        match self {
            GitError::Git(e) => {
                matches!(
                    e.class(),
                    git2::ErrorClass::Os
                        | git2::ErrorClass::Net
                        | git2::ErrorClass::Ssl
                        | git2::ErrorClass::Http
                        | git2::ErrorClass::Ssh
                        | git2::ErrorClass::Callback
                ) || e.code() == git2::ErrorCode::Locked
            }
            GitError::Io(_) => true,
            GitError::Blob(e) => e.is_transient(),
            GitError::Dirty(..)
            | GitError::Apply(_)
            | GitError::TooLarge(_)
            | GitError::FileTooLarge(_)
            | GitError::Upload(_)
            | GitError::SharedCheckout(_) => false,
            GitError::SafeFs(e) => matches!(e, crate::safe_fs::SafeFsError::Io { .. }),
        }
    }

    /// Git refused what is in the worktree (a nested repository, a path it will not index):
    /// the content's fault, so retrying cannot help. Errors of the operating system are not.
    pub fn is_refused_content(&self) -> bool {
        matches!(self, GitError::Git(e) if e.class() != git2::ErrorClass::Os)
    }
}
