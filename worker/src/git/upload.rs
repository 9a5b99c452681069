//! A pack a client uploaded, checked before any run starts from it: indexed into a throwaway
//! bare repository (libgit2's indexer verifies every object), the commit it is for present
//! with its whole history, and its tree's files read back for the seed's tree hash, bounded:
//! their sizes are read from the objects' headers before any is inflated, and the hash reads
//! one file at a time, so a small pack that inflates to gigabytes is refused without being
//! inflated, and memory holds one file at most.

use super::GitError;
use git2::{ObjectType, Oid, Repository, TreeWalkMode, TreeWalkResult};
use std::io::Write;

/// What an uploaded pack holds for one commit: the commit and its tree's hash.
pub struct UploadedCommit {
    pub commit: String,
    /// The seed's tree hash over every regular file of the commit.
    pub tree_hash: String,
    /// The regular files the commit holds.
    pub files: usize,
}

/// Indexes `pack` in a throwaway repository and reads `commit` out of it: the commit and every
/// ancestor must be in the pack, and its files may expand to `max_file_bytes` in all (a pack's
/// deltas can make a small upload very large), counted from the objects' headers before any
/// is inflated. Anything else is `GitError::Upload`.
pub fn inspect_pack(
    pack: &[u8],
    commit: &str,
    max_file_bytes: u64,
) -> Result<UploadedCommit, GitError> {
    let refused = |why: String| GitError::Upload(why);
    let oid = Oid::from_str(commit)
        .ok()
        .filter(|_| commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| refused(format!("`{commit}` is not a full commit id")))?;
    let dir = tempfile::tempdir()?;
    let repo = Repository::init_bare(dir.path())?;
    {
        let odb = repo.odb()?;
        let mut writer = odb.packwriter()?;
        writer
            .write_all(pack)
            .and_then(|_| writer.commit().map(|_| ()).map_err(std::io::Error::other))
            .map_err(|e| refused(format!("not a valid git pack: {e}")))?;
    }
    let tip = repo
        .find_commit(oid)
        .map_err(|_| refused(format!("commit {commit} is not in the pack")))?;
    let mut walk = repo.revwalk()?;
    walk.push(oid)?;
    for ancestor in walk {
        let ancestor =
            ancestor.map_err(|e| refused(format!("its history is not in the pack: {e}")))?;
        repo.find_commit(ancestor)
            .map_err(|_| refused(format!("ancestor {ancestor} is not in the pack")))?;
    }
    let tree = tip
        .tree()
        .map_err(|_| refused(format!("the tree of {commit} is not in the pack")))?;
    let mut files = sized_files(&repo, &tree, max_file_bytes)?;
    files.sort();
    let mut hasher = shared::factory::TreeHasher::default();
    for (path, id) in files
        .iter()
        .filter(|(p, _)| !shared::factory::tree_excluded(p))
    {
        let blob = repo
            .find_blob(*id)
            .map_err(|_| refused(format!("`{path}` is not in the pack")))?;
        hasher.add(path, blob.content());
    }
    Ok(UploadedCommit {
        commit: tip.id().to_string(),
        tree_hash: hasher.finish(),
        files: files.len(),
    })
}

/// The regular files of `tree` with their blob ids, their sizes summed from the objects'
/// headers (nothing inflated) and refused past `max_file_bytes`.
fn sized_files(
    repo: &Repository,
    tree: &git2::Tree<'_>,
    max_file_bytes: u64,
) -> Result<Vec<(String, Oid)>, GitError> {
    let refused = |why: String| GitError::Upload(why);
    let odb = repo.odb()?;
    let mut files = Vec::new();
    let mut total: u64 = 0;
    let mut failure = None;
    let walked = tree.walk(TreeWalkMode::PreOrder, |dir, entry| {
        let regular = matches!(entry.filemode(), 0o100644 | 0o100755);
        if entry.kind() != Some(ObjectType::Blob) || !regular {
            return TreeWalkResult::Ok;
        }
        let path = format!("{dir}{}", entry.name().unwrap_or_default());
        match odb.read_header(entry.id()) {
            Ok((size, ObjectType::Blob)) => {
                total = total.saturating_add(size as u64);
                if total > max_file_bytes {
                    failure = Some(refused(format!(
                        "its files expand past {} MiB",
                        max_file_bytes >> 20
                    )));
                    return TreeWalkResult::Abort;
                }
                files.push((path, entry.id()));
            }
            _ => {
                failure = Some(refused(format!("`{path}` is not in the pack")));
                return TreeWalkResult::Abort;
            }
        }
        TreeWalkResult::Ok
    });
    if let Some(e) = failure {
        return Err(e);
    }
    walked?;
    Ok(files)
}
