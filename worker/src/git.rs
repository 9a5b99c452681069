//! Git adapter (git2). Git objects travel between machines as packfiles in object storage; each
//! worker keeps a bare mirror as a cache and materialises a fresh worktree per job whose git
//! directory lives *outside* the folder mounted into the container, so nothing of the object
//! database (and nothing of a sibling branch) is reachable from inside.
//!
//! libgit2 blocks: async callers run it on the blocking pool (`GitCache::materialize`,
//! `Worktree::blocking`).

use crate::blobs::{BlobError, Blobs};
use git2::{
    build::CheckoutBuilder, IndexAddOption, ObjectType, Oid, Repository, Signature, Status,
    StatusOptions, Time, TreeWalkMode, TreeWalkResult,
};
use shared::hashing::sha256_hex;
use shared::scope::{ChangeKind, PathChange};
use std::io::Write;
use std::path::{Path, PathBuf};
use thiserror::Error;
use tokio::sync::Mutex;

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
            GitError::Dirty(..) | GitError::Apply(_) => false,
            GitError::SafeFs(e) => matches!(e, crate::safe_fs::SafeFsError::Io { .. }),
        }
    }

    /// Git refused what is in the worktree (a nested repository, a path it will not index):
    /// the content's fault, so retrying cannot help. Errors of the operating system are not.
    pub fn is_refused_content(&self) -> bool {
        matches!(self, GitError::Git(e) if e.class() != git2::ErrorClass::Os)
    }
}

/// The per-worker cache: one bare mirror holding every pack the worker has seen.
pub struct GitCache {
    mirror: PathBuf,
    lock: Mutex<()>,
}

impl GitCache {
    pub fn open(root: &Path) -> Result<Self, GitError> {
        let mirror = root.join("mirror.git");
        if !mirror.join("objects").exists() {
            std::fs::create_dir_all(&mirror)?;
            Repository::init_bare(&mirror)?;
        }
        std::fs::create_dir_all(root.join("packs-indexed"))?;
        Ok(Self {
            mirror,
            lock: Mutex::new(()),
        })
    }

    fn marker(&self, key: &str) -> PathBuf {
        self.mirror
            .parent()
            .expect("mirror has a parent")
            .join("packs-indexed")
            .join(sha256_hex(key.as_bytes()))
    }

    /// Downloads and indexes every pack not yet in the mirror.
    pub async fn ensure_packs(&self, blobs: &Blobs, packs: &[String]) -> Result<(), GitError> {
        let _guard = self.lock.lock().await;
        for key in packs {
            let marker = self.marker(key);
            if marker.exists() {
                continue;
            }
            let bytes = blobs.get(key).await?;
            let mirror = self.mirror.clone();
            tokio::task::spawn_blocking(move || index_pack(&mirror, &bytes))
                .await
                .map_err(|e| GitError::Io(std::io::Error::other(e)))??;
            std::fs::write(&marker, key.as_bytes())?;
        }
        Ok(())
    }

    /// A fresh worktree of `commit` at `dest/wt`, git directory at `dest/git` (checked out on
    /// the blocking pool).
    pub async fn materialize(&self, commit: &str, dest: &Path) -> Result<Worktree, GitError> {
        let (mirror, commit, dest) = (self.mirror.clone(), commit.to_string(), dest.to_path_buf());
        crate::safe_fs::blocking(move || materialize_at(&mirror, &commit, &dest)).await
    }
}

fn materialize_at(mirror: &Path, commit: &str, dest: &Path) -> Result<Worktree, GitError> {
    let git_dir = dest.join("git");
    let dir = dest.join("wt");
    std::fs::create_dir_all(&dir)?;
    Repository::init_bare(&git_dir)?;
    let alternates = git_dir.join("objects/info/alternates");
    std::fs::create_dir_all(alternates.parent().expect("has parent"))?;
    std::fs::write(
        &alternates,
        format!("{}\n", mirror.join("objects").display()),
    )?;
    let repo = Repository::open_bare(&git_dir)?;
    repo.set_workdir(&dir, false)?;
    let oid = Oid::from_str(commit)?;
    let object = repo.find_commit(oid)?.into_object();
    repo.checkout_tree(&object, Some(CheckoutBuilder::new().force()))?;
    repo.set_head_detached(oid)?;
    Ok(Worktree {
        dir,
        git_dir,
        base: oid,
        head: std::sync::Arc::new(std::sync::Mutex::new(oid)),
    })
}

fn index_pack(mirror: &Path, bytes: &[u8]) -> Result<(), GitError> {
    let repo = Repository::open_bare(mirror)?;
    let odb = repo.odb()?;
    let mut writer = odb.packwriter()?;
    writer.write_all(bytes)?;
    writer.commit()?;
    Ok(())
}

/// A job's worktree. `dir` is what the container sees. Clones are handles on the same worktree
/// (they share the head).
#[derive(Clone)]
pub struct Worktree {
    pub dir: PathBuf,
    git_dir: PathBuf,
    base: Oid,
    /// Moves when a git step adds commits on top of the base.
    head: std::sync::Arc<std::sync::Mutex<Oid>>,
}

/// What a cherry-pick, squash-merge or rebase did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PickOutcome {
    Applied {
        head: String,
        applied: Vec<String>,
    },
    Conflict {
        commit: String,
        paths: Vec<String>,
        applied: Vec<String>,
    },
}

impl Worktree {
    /// Runs `f` on this worktree on the blocking pool (libgit2 and walks of the worktree must
    /// not hold a runtime thread); a panic in `f` continues in the caller.
    pub async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Worktree) -> T + Send + 'static,
    ) -> T {
        let wt = self.clone();
        crate::safe_fs::blocking(move || f(&wt)).await
    }

    fn repo(&self) -> Result<Repository, GitError> {
        let repo = Repository::open_bare(&self.git_dir)?;
        repo.set_workdir(&self.dir, false)?;
        Ok(repo)
    }

    pub fn base(&self) -> String {
        self.base.to_string()
    }

    pub fn head(&self) -> String {
        self.head_oid().to_string()
    }

    fn head_oid(&self) -> Oid {
        *self.head.lock().expect("head lock")
    }

    /// Applies `commits` in order on top of the head, each as its own commit; with `squash`,
    /// the result becomes one commit with that message on top of the original head. Conflicts
    /// stop the step and are reported, never half-applied to the worktree.
    pub fn cherry_pick(
        &self,
        commits: &[String],
        squash: Option<&str>,
    ) -> Result<PickOutcome, GitError> {
        let repo = self.repo()?;
        let start = repo.find_commit(self.head_oid())?;
        let mut head = start.clone();
        let sig = Signature::new("fleet", "fleet@localhost", &Time::new(0, 0))?;
        let mut applied = Vec::new();
        for c in commits {
            let pick = repo.find_commit(Oid::from_str(c)?)?;
            let mut index = repo.cherrypick_commit(&pick, &head, 0, None)?;
            if index.has_conflicts() {
                let mut paths: Vec<String> = index
                    .conflicts()?
                    .filter_map(Result::ok)
                    .filter_map(|c| c.our.or(c.their).or(c.ancestor))
                    .map(|e| String::from_utf8_lossy(&e.path).into_owned())
                    .collect();
                paths.sort();
                paths.dedup();
                return Ok(PickOutcome::Conflict {
                    commit: c.clone(),
                    paths,
                    applied,
                });
            }
            let tree = repo.find_tree(index.write_tree_to(&repo)?)?;
            let message = pick.message().unwrap_or("cherry-pick").to_string();
            let oid = repo.commit(None, &sig, &sig, &message, &tree, &[&head])?;
            head = repo.find_commit(oid)?;
            applied.push(c.clone());
        }
        if let Some(message) = squash {
            let tree = head.tree()?;
            let oid = repo.commit(None, &sig, &sig, message, &tree, &[&start])?;
            head = repo.find_commit(oid)?;
        }
        repo.checkout_tree(head.as_object(), Some(CheckoutBuilder::new().force()))?;
        repo.set_head_detached(head.id())?;
        *self.head.lock().expect("head lock") = head.id();
        Ok(PickOutcome::Applied {
            head: head.id().to_string(),
            applied,
        })
    }

    /// Paths added or modified in the working directory since `since` (default: the job's
    /// base), with their contents.
    pub fn changed_files(
        &self,
        since: Option<&str>,
    ) -> Result<std::collections::BTreeMap<String, String>, GitError> {
        let repo = self.repo()?;
        let since = match since {
            Some(c) => Oid::from_str(c)?,
            None => self.base,
        };
        let base_tree = repo.find_commit(since)?.tree()?;
        let mut opts = git2::DiffOptions::new();
        opts.include_untracked(true).recurse_untracked_dirs(true);
        let diff = repo.diff_tree_to_workdir(Some(&base_tree), Some(&mut opts))?;
        let mut out = std::collections::BTreeMap::new();
        for delta in diff.deltas() {
            if delta.status() == git2::Delta::Deleted {
                continue;
            }
            if let Some(p) = delta.new_file().path() {
                let rel = p.to_string_lossy().replace('\\', "/");
                // Regular files only, never through a link, at most 1 MiB each.
                if let Ok(text) = crate::safe_fs::read_text_within(&self.dir, &rel, 1 << 20) {
                    out.insert(rel, text);
                }
            }
        }
        Ok(out)
    }

    /// The changes from commit `from` to commit `to`, as git computes them (renames found, both
    /// sides kept, file modes), for write scopes.
    pub fn changes(&self, from: &str, to: &str) -> Result<Vec<PathChange>, GitError> {
        let repo = self.repo()?;
        let a = repo.find_commit(Oid::from_str(from)?)?.tree()?;
        let b = repo.find_commit(Oid::from_str(to)?)?.tree()?;
        let mut opts = git2::DiffOptions::new();
        opts.include_typechange(true).ignore_submodules(false);
        let mut diff = repo.diff_tree_to_tree(Some(&a), Some(&b), Some(&mut opts))?;
        let mut find = git2::DiffFindOptions::new();
        find.renames(true).copies(true).for_untracked(true);
        diff.find_similar(Some(&mut find))?;
        Ok(diff.deltas().map(|d| delta_change(&d)).collect())
    }

    /// Lays down, from `commit`, every regular file whose path `covers` accepts (replacing what
    /// is on disk, never following a link), and removes files it accepts that `commit` lacks.
    /// The frozen tests of a run, restored before the harness runs them. Returns the paths laid.
    pub fn restore_paths(
        &self,
        commit: &str,
        covers: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<String>, GitError> {
        let repo = self.repo()?;
        let tree = repo.find_commit(Oid::from_str(commit)?)?.tree()?;
        let mut wanted: Vec<(String, Oid)> = Vec::new();
        tree.walk(TreeWalkMode::PreOrder, |dir, entry| {
            let path = format!("{dir}{}", entry.name().unwrap_or_default());
            let regular = matches!(entry.filemode(), 0o100644 | 0o100755);
            if entry.kind() == Some(ObjectType::Blob) && regular && covers(&path) {
                wanted.push((path, entry.id()));
            }
            TreeWalkResult::Ok
        })?;
        for existing in paths_on_disk(&self.dir)? {
            if covers(&existing) && !wanted.iter().any(|(p, _)| *p == existing) {
                crate::safe_fs::remove_beneath(&self.dir, &existing)?;
            }
        }
        for (path, oid) in &wanted {
            let blob = repo.find_blob(*oid)?;
            crate::safe_fs::write_beneath(&self.dir, path, blob.content())?;
        }
        Ok(wanted.into_iter().map(|(p, _)| p).collect())
    }

    /// Applies a unified diff to the working directory (`git apply` semantics, no unsafe paths).
    pub fn apply_patch(&self, diff: &str) -> Result<(), GitError> {
        let repo = self.repo()?;
        let parsed = git2::Diff::from_buffer(diff.as_bytes())
            .map_err(|e| GitError::Apply(e.message().to_string()))?;
        repo.apply(&parsed, git2::ApplyLocation::WorkDir, None)
            .map_err(|e| GitError::Apply(e.message().to_string()))
    }

    /// Commits every change of the working directory on top of the base. Deterministic: a fixed
    /// author and time, so the same change gives the same commit id. `None` when nothing changed.
    pub fn commit_all(&self, message: &str) -> Result<Option<String>, GitError> {
        let repo = self.repo()?;
        let mut index = repo.index()?;
        index.add_all(["*"], IndexAddOption::DEFAULT, None)?;
        index.update_all(["*"], None)?;
        index.write()?;
        let tree_id = index.write_tree()?;
        let parent = repo.find_commit(self.head_oid())?;
        if parent.tree_id() == tree_id {
            return Ok(None);
        }
        let tree = repo.find_tree(tree_id)?;
        let sig = Signature::new("fleet", "fleet@localhost", &Time::new(0, 0))?;
        let oid = repo.commit(None, &sig, &sig, message, &tree, &[&parent])?;
        *self.head.lock().expect("head lock") = oid;
        Ok(Some(oid.to_string()))
    }

    /// A packfile of the objects `commit` adds over the base.
    pub fn pack_since_base(&self, commit: &str) -> Result<Vec<u8>, GitError> {
        let repo = self.repo()?;
        let mut walk = repo.revwalk()?;
        walk.push(Oid::from_str(commit)?)?;
        walk.hide(self.base)?;
        let mut pb = repo.packbuilder()?;
        pb.insert_walk(&mut walk)?;
        let mut buf = git2::Buf::new();
        pb.write_buf(&mut buf)?;
        Ok(buf.to_vec())
    }
}

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

fn delta_change(d: &git2::DiffDelta<'_>) -> PathChange {
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
fn paths_on_disk(root: &Path) -> Result<Vec<String>, GitError> {
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

/// (path, bytes) of the regular files under `root`, skipping symlinks, for the tree hash.
pub fn files_on_disk(root: &Path) -> Result<Vec<(String, Vec<u8>)>, GitError> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
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
                out.push((rel, std::fs::read(&path)?));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::patch_changes;
    use crate::agent::llm::tests::{arb_text, cases, timed, CASE_LIMIT};
    use proptest::prelude::*;
    use shared::scope::{check, ChangeKind, ViolationReason, WriteScope};

    /// Lines of unified diffs (git's extended headers included), and a path or two to use.
    const DIFF_LINES: &[&str] = &[
        "diff --git a/{p} b/{q}",
        "diff --git \"a/{p}\" \"b/{q}\"",
        "diff --git a/{p}",
        "--- a/{p}",
        "+++ b/{q}",
        "--- /dev/null",
        "+++ /dev/null",
        "--- \"a/\\303\\244{p}\"",
        "@@ -1 +1 @@",
        "@@ -0,0 +1,3 @@",
        "@@ -1,2 +1,2 @@ fn x",
        "@@ -4294967295,4294967295 +1 @@",
        "@@ -1,0 +0,0 @@",
        "-old",
        "+new",
        " context",
        "\\ No newline at end of file",
        "new file mode 100644",
        "new file mode 120000",
        "deleted file mode 100755",
        "old mode 100644",
        "new mode 160000",
        "similarity index 90%",
        "dissimilarity index 100%",
        "rename from {p}",
        "rename to {q}",
        "copy from {p}",
        "copy to {q}",
        "index 0000000..1111111 100644",
        "Binary files a/{p} and b/{q} differ",
        "GIT binary patch",
        "literal 5",
        "delta 3",
        "zcmV?d00001",
        "",
    ];

    fn arb_path() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => "[a-c][a-c/.]{0,8}",
            1 => arb_text(),
            1 => prop::sample::select(vec![
                "../x", "/etc/passwd", ".git/config", "a b", "tests/t.py", "\"q\\tx\""
            ])
            .prop_map(str::to_string),
        ]
    }

    /// One file's section: the git header, extended headers, the file lines, a hunk whose
    /// counts agree with its lines.
    fn arb_section() -> impl Strategy<Value = String> {
        // Extended headers that belong together, and whether the old / new side is /dev/null.
        let headers = prop::sample::select(vec![
            (vec![], false, false),
            (vec!["new file mode 100644"], true, false),
            (vec!["new file mode 120000"], true, false),
            (vec!["new file mode 160000"], true, false),
            (vec!["deleted file mode 100755"], false, true),
            (vec!["old mode 100644", "new mode 100755"], false, false),
            (vec!["old mode 100644", "new mode 120000"], false, false),
            (
                vec!["similarity index 90%", "rename from {p}", "rename to {q}"],
                false,
                false,
            ),
            (
                vec!["similarity index 90%", "copy from {p}", "copy to {q}"],
                false,
                false,
            ),
            (vec!["index 0000000..1111111 100644"], false, false),
        ]);
        let text = "[a-z ]{0,6}";
        (
            arb_path(),
            arb_path(),
            headers,
            prop::collection::vec(text, 0..3),
            prop::collection::vec(text, 0..3),
            prop::collection::vec(text, 0..2),
        )
            .prop_map(|(p, q, (headers, from_null, to_null), old, new, context)| {
                let q = if from_null || to_null || headers.len() == 1 {
                    p.clone()
                } else {
                    q
                };
                let mut out = vec![format!("diff --git a/{p} b/{q}")];
                out.extend(
                    headers
                        .iter()
                        .map(|h| h.replace("{p}", &p).replace("{q}", &q)),
                );
                out.push(if from_null {
                    "--- /dev/null".into()
                } else {
                    format!("--- a/{p}")
                });
                out.push(if to_null {
                    "+++ /dev/null".into()
                } else {
                    format!("+++ b/{q}")
                });
                let context = if from_null || to_null {
                    vec![]
                } else {
                    context
                };
                let old = if from_null { vec![] } else { old };
                let new = if to_null { vec![] } else { new };
                let (o, n) = (old.len() + context.len(), new.len() + context.len());
                out.push(format!("@@ -{},{o} +{},{n} @@", o.min(1), n.min(1)));
                out.extend(context.iter().map(|c| format!(" {c}")));
                out.extend(old.iter().map(|l| format!("-{l}")));
                out.extend(new.iter().map(|l| format!("+{l}")));
                out.join("\n") + "\n"
            })
    }

    /// A diff: sections of files, sometimes broken by a line of any diff vocabulary or text.
    fn arb_diff() -> impl Strategy<Value = String> {
        let odd_line = (prop::sample::select(DIFF_LINES), arb_path(), arb_path())
            .prop_map(|(l, p, q)| l.replace("{p}", &p).replace("{q}", &q));
        let odd_line = prop_oneof![3 => odd_line, 1 => arb_text()];
        (
            prop::collection::vec(arb_section(), 0..4),
            prop::collection::vec((any::<prop::sample::Index>(), odd_line), 0..2),
            any::<bool>(),
        )
            .prop_map(|(sections, odd, newline)| {
                let mut lines: Vec<String> =
                    sections.concat().lines().map(str::to_string).collect();
                for (at, line) in odd {
                    let i = at.index(lines.len() + 1);
                    lines.insert(i, line);
                }
                let mut diff = lines.join("\n");
                if newline {
                    diff.push('\n');
                }
                diff
            })
    }

    proptest! {
        #![proptest_config(cases(256))]

        /// Diffs are the agent's: libgit2 parses any of them or refuses it, quickly, and every
        /// change it reports names a path.
        #[test]
        fn any_diff_is_parsed_or_refused(diff in arb_diff()) {
            let (changes, took) = timed(|| patch_changes(&diff));
            prop_assert!(took < CASE_LIMIT);
            if let Ok(changes) = changes {
                for c in &changes {
                    prop_assert!(!c.paths().is_empty(), "{c:?} from {diff:?}");
                }
            }
        }
    }

    fn allowed(p: &str) -> WriteScope {
        WriteScope {
            globs: vec![p.into()],
            ..Default::default()
        }
    }

    #[test]
    fn a_rename_onto_the_tests_is_seen_on_both_sides_whatever_the_header_says() {
        let diff = "diff --git a/calc.py b/calc.py\nsimilarity index 50%\nrename from tests/test_calc.py\nrename to tests/test_calc.py\n--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n@@ -1 +1 @@\n-assert add(1, 2) == 3\n+assert True\n";
        match patch_changes(diff) {
            Ok(changes) => {
                let paths: Vec<&str> = changes.iter().flat_map(|c| c.paths()).collect();
                assert!(
                    paths.contains(&"tests/test_calc.py"),
                    "libgit2 sees {changes:?}"
                );
                let v = check(&allowed("calc.py"), &changes).unwrap();
                assert!(v.iter().any(|v| v.path == "tests/test_calc.py"), "{v:?}");
            }
            // Refusing to parse it is as good: it cannot apply either.
            Err(e) => assert!(e.to_string().contains("patch"), "{e}"),
        }
    }

    #[test]
    fn quoted_paths_are_decoded_before_the_scope_sees_them() {
        let diff = "diff --git \"a/tests/test_calc.py\" \"b/tests/test_calc.py\"\n--- \"a/tests/test_calc.py\"\n+++ \"b/tests/test_calc.py\"\n@@ -1 +1 @@\n-x\n+y\n";
        let changes = patch_changes(diff).unwrap();
        assert_eq!(changes[0].new_path.as_deref(), Some("tests/test_calc.py"));
        assert_eq!(check(&allowed("calc.py"), &changes).unwrap().len(), 1);
    }

    #[test]
    fn a_new_symlink_is_refused_even_in_scope() {
        let diff = "diff --git a/calc.py b/calc.py\nnew file mode 120000\n--- /dev/null\n+++ b/calc.py\n@@ -0,0 +1 @@\n+/proc/self/environ\n\\ No newline at end of file\n";
        let changes = patch_changes(diff).unwrap();
        assert_eq!(changes[0].kind, ChangeKind::Added);
        let v = check(&allowed("calc.py"), &changes).unwrap();
        assert_eq!(v[0].reason, ViolationReason::Symlink);
    }
}
