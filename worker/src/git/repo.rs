//! Submissions: a repository packed at a ref for object storage, and the files on disk with the
//! clean-tree preflight.

use super::GitError;
use git2::{ObjectType, Repository, Status, StatusOptions, TreeWalkMode, TreeWalkResult};
use std::path::Path;

/// A repository snapshot for submission: the commit of `refname` and a pack of its history.
pub struct RepoPack {
    pub commit: String,
    pub pack: Vec<u8>,
    /// (path, bytes) of every regular file in the commit, for the seed's tree hash.
    pub files: Vec<(String, Vec<u8>)>,
}

/// Opens a local repository, refuses a dirty working tree (the seed's clean-tree preflight),
/// resolves `refname` and packs everything reachable from it.
pub fn pack_repository(path: &Path, refname: &str) -> Result<RepoPack, GitError> {
    let commit = resolve_clean(path, refname)?;
    pack_commit(path, &commit)
}

/// The clean-tree preflight and the commit `refname` names (its id), without packing.
pub fn resolve_clean(path: &Path, refname: &str) -> Result<String, GitError> {
    let repo = Repository::open(path)?;
    if !repo.is_bare() {
        let mut opts = StatusOptions::new();
        opts.include_untracked(true).include_ignored(false);
        let statuses = repo.statuses(Some(&mut opts))?;
        let dirty: Vec<String> = statuses
            .iter()
            .filter(|s| s.status() != Status::CURRENT)
            .filter_map(|s| s.path().map(str::to_string))
            .take(5)
            .collect();
        if !dirty.is_empty() {
            return Err(GitError::Dirty(
                path.display().to_string(),
                dirty.join(", "),
            ));
        }
    }
    let commit = repo.revparse_single(refname)?.peel_to_commit()?;
    Ok(commit.id().to_string())
}

/// The pack of everything reachable from `commit` and its files (no preflight: see
/// [`resolve_clean`]).
pub fn pack_commit(path: &Path, commit: &str) -> Result<RepoPack, GitError> {
    let repo = Repository::open(path)?;
    let commit = repo.find_commit(git2::Oid::from_str(commit)?)?;
    let mut walk = repo.revwalk()?;
    walk.push(commit.id())?;
    let mut pb = repo.packbuilder()?;
    pb.insert_walk(&mut walk)?;
    let mut buf = git2::Buf::new();
    pb.write_buf(&mut buf)?;

    let mut files = Vec::new();
    let tree = commit.tree()?;
    let mut failure = None;
    tree.walk(TreeWalkMode::PreOrder, |dir, entry| {
        let regular = matches!(entry.filemode(), 0o100644 | 0o100755);
        if entry.kind() == Some(ObjectType::Blob) && regular {
            match repo.find_blob(entry.id()) {
                Ok(blob) => files.push((
                    format!("{dir}{}", entry.name().unwrap_or_default()),
                    blob.content().to_vec(),
                )),
                Err(e) => {
                    failure = Some(e);
                    return TreeWalkResult::Abort;
                }
            }
        }
        TreeWalkResult::Ok
    })?;
    if let Some(e) = failure {
        return Err(e.into());
    }
    Ok(RepoPack {
        commit: commit.id().to_string(),
        pack: buf.to_vec(),
        files,
    })
}

/// Relative paths of every non-directory entry under `root` (links included, never followed).
pub fn paths_on_disk(root: &Path) -> Result<Vec<String>, GitError> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let ft = entry.file_type()?;
            let path = entry.path();
            if ft.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(root) {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    Ok(out)
}

/// The seed's tree hash of the regular files under `root` (links neither entered nor read),
/// one file at a time in 64 KiB reads; a file longer than `max_file` is refused by its length,
/// before it is read.
pub fn tree_hash_on_disk(root: &Path, max_file: u64) -> Result<String, GitError> {
    use std::io::Read;
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            // `file_type` does not follow a link: links are neither entered nor read.
            let ft = entry.file_type()?;
            let path = entry.path();
            if ft.is_dir() {
                stack.push(path);
            } else if ft.is_file() {
                let rel = path
                    .strip_prefix(root)
                    .expect("walked under root")
                    .to_string_lossy()
                    .replace('\\', "/");
                if !shared::factory::tree_excluded(&rel) {
                    files.push((rel, path, entry.metadata()?.len()));
                }
            }
        }
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = shared::factory::TreeHasher::default();
    let mut buf = vec![0u8; 64 << 10];
    for (rel, path, len) in files {
        // Lengths, not blocks: a sparse file is refused before a byte of it is read.
        if len > max_file {
            return Err(GitError::FileTooLarge(format!(
                "{rel} is {len} bytes long, over the {max_file} bytes a worktree file may hold"
            )));
        }
        let mut f = std::fs::File::open(&path)?.take(max_file);
        h.begin(&rel);
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        h.end();
    }
    Ok(h.finish())
}
