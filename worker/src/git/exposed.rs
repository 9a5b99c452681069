//! A job's own git directory (`worktree.git` on its node), for agents that merge or rebase
//! with git: a `.git` inside the worktree holding only the objects reachable from the job's
//! start and the branches its node named, packed out of the worker's mirror (never linked to
//! it, so nothing of another run or another branch is there to read). The start is checked
//! out detached with an index that matches it; each named node's latest commit is a branch.
//!
//! The directory is the agent's to change; the harness never reads it: what the job hands on
//! is the harness's own commit of the worktree's files (`Worktree::commit_all`, which skips
//! `.git`), checked against the write scope like any other.

use super::GitError;
use git2::{Oid, Repository, ResetType};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// A branch name the graph checker already accepts as a node id (or `base`): letters, digits,
/// `_` and `-`, not starting with `-`.
fn is_branch_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Writes `dir/.git`: the objects of `start` and of `branches` (name → commit, every commit
/// in `mirror`), the branches, the head detached at `start`, its index.
pub fn expose(
    mirror: &Path,
    dir: &Path,
    start: &str,
    branches: &BTreeMap<String, String>,
) -> Result<(), GitError> {
    if let Some(bad) = branches.keys().find(|b| !is_branch_name(b)) {
        return Err(GitError::Git(git2::Error::from_str(&format!(
            "`{bad}` is not a branch name"
        ))));
    }
    let head = Oid::from_str(start)?;
    let tips = branches
        .iter()
        .map(|(name, commit)| Ok((name.as_str(), Oid::from_str(commit)?)))
        .collect::<Result<Vec<_>, GitError>>()?;

    let source = Repository::open_bare(mirror)?;
    let mut walk = source.revwalk()?;
    walk.push(head)?;
    for (_, oid) in &tips {
        walk.push(*oid)?;
    }
    let mut builder = source.packbuilder()?;
    builder.insert_walk(&mut walk)?;
    let mut pack = git2::Buf::new();
    builder.write_buf(&mut pack)?;

    let dot_git = dir.join(".git");
    if std::fs::symlink_metadata(&dot_git).is_ok() {
        return Err(GitError::Git(git2::Error::from_str(
            "the worktree already has a `.git`",
        )));
    }
    let repo = Repository::init(dir)?;
    {
        let odb = repo.odb()?;
        let mut writer = odb.packwriter()?;
        writer.write_all(&pack)?;
        writer.commit()?;
    }
    for (name, oid) in &tips {
        repo.reference(
            &format!("refs/heads/{name}"),
            *oid,
            true,
            "fleet: the run's commit",
        )?;
    }
    repo.set_head_detached(head)?;
    let start = repo.find_commit(head)?.into_object();
    repo.reset(&start, ResetType::Mixed, None)?;
    let mut config = repo.config()?;
    config.set_str("user.name", "agent")?;
    config.set_str("user.email", "agent@localhost")?;
    Ok(())
}
