//! A job's worktree of its own, checked out of the worker's mirror without a git directory:
//! one is made on the job's first git read (`PendingGitDir`).

use super::worktree::PendingGitDir;
use super::{GitError, Worktree};
use git2::{build::CheckoutBuilder, Oid, Repository};
use std::path::Path;

/// A worktree of `commit` of the job's own: its files checked out at `dest/wt` straight from
/// the mirror, their index (with the files' stat data) at `dest/index`, outside what a
/// container sees; its git directory at `dest/git` is made on first read from the mirror and
/// a copy of that index (`PendingGitDir`), so a job that never reads git never pays for one.
///
/// The checkout goes through a handle on the mirror given `dest/wt` as its work directory and
/// `dest/index` as its index, both in this handle's memory only: the mirror's own files are
/// never written (no index, no work-directory link), and the checkout is the one a git
/// directory of the job's own would make (the same attributes, filters and path checks).
pub(super) fn check_out_own(
    mirror: &Path,
    commit: &str,
    dest: &Path,
) -> Result<Worktree, GitError> {
    let dir = dest.join("wt");
    std::fs::create_dir_all(&dir)?;
    let index_path = dest.join("index");
    let repo = Repository::open_bare(mirror)?;
    repo.set_workdir(&dir, false)?;
    let mut index = git2::Index::open(&index_path)?;
    repo.set_index(&mut index)?;
    let oid = Oid::from_str(commit)?;
    let object = repo.find_commit(oid)?.into_object();
    repo.checkout_tree(&object, Some(CheckoutBuilder::new().force()))?;
    Ok(Worktree::with_pending_git(
        dir,
        dest.join("git"),
        oid,
        PendingGitDir::new(mirror.to_path_buf(), index_path),
    ))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use git2::{Signature, Time};
    use std::collections::BTreeMap;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    /// A bare mirror holding one commit: a text file (`file.txt`, "hello\n"), an executable, a
    /// link, and a file whose attributes make its checkout differ from its blob (CRLF line
    /// ends). The commit's id.
    pub(in crate::git) fn mirror_with_a_commit(mirror: &Path) -> String {
        let repo = Repository::init_bare(mirror).unwrap();
        let mut tree = repo.treebuilder(None).unwrap();
        for (name, body, mode) in [
            ("file.txt", &b"hello\n"[..], 0o100644),
            ("run.sh", b"#!/bin/sh\necho hi\n", 0o100755),
            ("link", b"file.txt", 0o120000),
            (".gitattributes", b"*.crlf text eol=crlf\n", 0o100644),
            ("notes.crlf", b"one\ntwo\n", 0o100644),
        ] {
            tree.insert(name, repo.blob(body).unwrap(), mode).unwrap();
        }
        let tree = repo.find_tree(tree.write().unwrap()).unwrap();
        let sig = Signature::new("t", "t@localhost", &Time::new(0, 0)).unwrap();
        let oid = repo.commit(None, &sig, &sig, "one", &tree, &[]).unwrap();
        oid.to_string()
    }

    /// Every path under `root` with its kind, mode and content (a link's target).
    fn snapshot(root: &Path) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
        let mut out = BTreeMap::new();
        let mut todo = vec![root.to_path_buf()];
        while let Some(dir) = todo.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let meta = std::fs::symlink_metadata(&path).unwrap();
                let rel = path.strip_prefix(root).unwrap().to_path_buf();
                let body = if meta.is_symlink() {
                    std::fs::read_link(&path)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes()
                } else if meta.is_dir() {
                    todo.push(path.clone());
                    Vec::new()
                } else {
                    std::fs::read(&path).unwrap()
                };
                out.insert(rel, (meta.permissions().mode(), body));
            }
        }
        out
    }

    #[test]
    fn a_checkout_of_its_own_is_the_one_a_git_directory_of_its_own_makes_and_leaves_the_mirror_alone(
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let mirror = tmp.path().join("mirror");
        let commit = mirror_with_a_commit(&mirror);
        let before = snapshot(&mirror);

        let own = check_out_own(&mirror, &commit, &tmp.path().join("own")).unwrap();
        let eager =
            super::super::mirror::materialize_at(&mirror, &commit, &tmp.path().join("eager"))
                .unwrap();
        assert!(
            !tmp.path().join("own/git").exists(),
            "made before any git read"
        );
        // The same files, modes, link and filtered line ends as with a git directory of its own.
        let files = snapshot(&own.dir);
        assert_eq!(files, snapshot(&eager.dir));
        assert_eq!(
            files[Path::new("notes.crlf")].1,
            b"one\r\ntwo\r\n",
            "the attributes were not applied"
        );
        // Nothing of the mirror was written: no index, no work-directory link in its config.
        assert_eq!(snapshot(&mirror), before);

        // Read, the git directory is made at the base and finds the checkout unchanged.
        assert!(own.clone().changed_files(None).unwrap().is_empty());
        let git = Repository::open_bare(tmp.path().join("own/git")).unwrap();
        assert_eq!(git.head().unwrap().target().unwrap().to_string(), commit);
    }

    /// What an agent that wants its change unseen would do: rewrite a file in place to the same
    /// size and put its modification time back, before the harness has read git at all (the
    /// git directory is made after the container ran).
    #[test]
    fn a_change_made_before_the_git_directory_exists_is_still_seen() {
        let tmp = tempfile::tempdir().unwrap();
        let mirror = tmp.path().join("mirror");
        let commit = mirror_with_a_commit(&mirror);
        let wt = check_out_own(&mirror, &commit, &tmp.path().join("job")).unwrap();

        let file = wt.dir.join("file.txt");
        let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
        std::fs::write(&file, b"HELLO\n").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        std::fs::write(wt.dir.join("new.txt"), b"x").unwrap();
        assert!(!tmp.path().join("job/git").exists());

        let changed = wt.changed_files(None).unwrap();
        assert_eq!(
            changed.keys().map(String::as_str).collect::<Vec<_>>(),
            ["file.txt", "new.txt"],
            "{changed:?}"
        );
    }
}
