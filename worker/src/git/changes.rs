//! Changes as git computes them (`PathChange`: both sides of renames, modes), from a delta of
//! a tree diff or from libgit2's parse of a patch, for the write scope to judge.

use super::GitError;
use shared::scope::{ChangeKind, PathChange};

/// The changes a unified diff would make, as libgit2 parses it (the same parse `apply_patch`
/// applies): both sides of renames and copies, quoted paths decoded, modes from the headers.
pub fn patch_changes(diff: &str) -> Result<Vec<PathChange>, GitError> {
    let parsed = git2::Diff::from_buffer(diff.as_bytes())
        .map_err(|e| GitError::Apply(e.message().to_string()))?;
    Ok(parsed.deltas().map(|d| delta_change(&d)).collect())
}

fn git_mode(mode: git2::FileMode) -> u32 {
    match mode {
        git2::FileMode::Unreadable => 0,
        git2::FileMode::Tree => 0o040000,
        git2::FileMode::Blob => 0o100644,
        git2::FileMode::BlobGroupWritable => 0o100664,
        git2::FileMode::BlobExecutable => 0o100755,
        git2::FileMode::Link => 0o120000,
        git2::FileMode::Commit => 0o160000,
    }
}

pub(super) fn delta_change(d: &git2::DiffDelta<'_>) -> PathChange {
    let path = |f: git2::DiffFile<'_>| {
        f.path_bytes()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    };
    let kind = match d.status() {
        git2::Delta::Added | git2::Delta::Untracked => ChangeKind::Added,
        git2::Delta::Deleted => ChangeKind::Deleted,
        git2::Delta::Modified => ChangeKind::Modified,
        git2::Delta::Renamed => ChangeKind::Renamed,
        git2::Delta::Copied => ChangeKind::Copied,
        git2::Delta::Typechange => ChangeKind::TypeChange,
        _ => ChangeKind::Other,
    };
    let (old_mode, new_mode) = (git_mode(d.old_file().mode()), git_mode(d.new_file().mode()));
    PathChange {
        kind,
        old_path: if kind == ChangeKind::Added {
            None
        } else {
            path(d.old_file())
        },
        new_path: if kind == ChangeKind::Deleted {
            None
        } else {
            path(d.new_file())
        },
        old_mode: if kind == ChangeKind::Added {
            0
        } else {
            old_mode
        },
        new_mode: if kind == ChangeKind::Deleted {
            0
        } else {
            new_mode
        },
    }
}
