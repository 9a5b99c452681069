//! A job's worktree: its base and head, commits of what the job left, cherry-picks, squash-merges
//! and rebases of git steps, restores, patches, the files changed since a commit, and the pack
//! of the commits on top of the base.

use super::changes::delta_change;
use super::repo::paths_on_disk;
use super::GitError;
use git2::{
    build::CheckoutBuilder, IndexAddOption, ObjectType, Oid, Repository, Signature, Time,
    TreeWalkMode, TreeWalkResult,
};
use shared::scope::PathChange;
use std::path::PathBuf;

/// A job's worktree. `dir` is what the container sees. Clones are handles on the same worktree
/// (they share the head).
#[derive(Clone)]
pub struct Worktree {
    pub dir: PathBuf,
    pub(super) git_dir: PathBuf,
    pub(super) base: Oid,
    /// Moves when a git step adds commits on top of the base.
    pub(super) head: std::sync::Arc<std::sync::Mutex<Oid>>,
    /// The files are a checkout shared by a commit's read-only jobs: nothing may change them.
    pub(super) shared: bool,
    /// The files are an overlay on such a checkout, the job's own (`layered.rs`): `dir` is a
    /// mount point, never moved.
    pub(super) layered: bool,
    /// How `git_dir` is made on first use, for a worktree on a commit's checkout or checked
    /// out of the mirror for the job alone (`None`: it exists). A job that never reads git (a
    /// command on a read-only tree) never pays for one.
    pub(super) pending_git: Option<std::sync::Arc<PendingGitDir>>,
}

/// A job's git directory not made yet: the mirror's objects by alternates, and the index of
/// the checkout its files are (copied: the job's status reads may rewrite their copy, never
/// the checkout's, which its lease keeps while the job runs). The index was written when the
/// files were checked out, never since: made after a container ran, the git directory still
/// compares what the agent left with the commit (an index restatted then would hide changes).
pub(super) struct PendingGitDir {
    mirror: PathBuf,
    index: PathBuf,
    made: std::sync::Mutex<bool>,
}

impl PendingGitDir {
    pub(super) fn new(mirror: PathBuf, index: PathBuf) -> Self {
        Self {
            mirror,
            index,
            made: std::sync::Mutex::new(false),
        }
    }

    /// Makes `git_dir` at `base` once, whichever handle on the worktree asks first.
    fn make(&self, git_dir: &std::path::Path, base: Oid) -> Result<(), GitError> {
        let mut made = self.made.lock().expect("git dir lock");
        if *made {
            return Ok(());
        }
        super::mirror::init_with_alternates(&self.mirror, git_dir)?;
        std::fs::copy(&self.index, git_dir.join("index"))?;
        Repository::open_bare(git_dir)?.set_head_detached(base)?;
        *made = true;
        Ok(())
    }
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
    /// A job's worktree of `base` whose files are at `dir`, its git directory at `git_dir` made
    /// on first read (`pending`); its own to change (a shared or layered one says so after).
    pub(super) fn with_pending_git(
        dir: PathBuf,
        git_dir: PathBuf,
        base: Oid,
        pending: PendingGitDir,
    ) -> Self {
        Self {
            dir,
            git_dir,
            base,
            head: std::sync::Arc::new(std::sync::Mutex::new(base)),
            shared: false,
            layered: false,
            pending_git: Some(std::sync::Arc::new(pending)),
        }
    }

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
        if let Some(pending) = &self.pending_git {
            pending.make(&self.git_dir, self.base)?;
        }
        let repo = Repository::open_bare(&self.git_dir)?;
        repo.set_workdir(&self.dir, false)?;
        Ok(repo)
    }

    /// Refuses `op` on a shared checkout.
    fn mutable(&self, op: &'static str) -> Result<(), GitError> {
        if self.shared {
            return Err(GitError::SharedCheckout(op));
        }
        Ok(())
    }

    /// Whether the files are a checkout shared by a commit's read-only jobs.
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// Whether the files are an overlay on a commit's shared checkout (`layered.rs`).
    pub fn is_layered(&self) -> bool {
        self.layered
    }

    /// Rewrites the index's stat data from the files as they are now, without reading them:
    /// only for a checkout the worker just made and changed the owner of (their content is the
    /// index's; a change of owner changes their ctime, which would make every later status read
    /// hash every file).
    pub(super) fn restat_index(&self) -> Result<(), GitError> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::MetadataExt;
        let repo = self.repo()?;
        let mut index = repo.index()?;
        let entries: Vec<git2::IndexEntry> = index.iter().collect();
        for mut e in entries {
            let path = self.dir.join(std::ffi::OsStr::from_bytes(&e.path));
            let m = std::fs::symlink_metadata(&path)?;
            // The index keeps 32 bits of each, as git does.
            e.ctime = git2::IndexTime::new(m.ctime() as i32, m.ctime_nsec() as u32);
            e.mtime = git2::IndexTime::new(m.mtime() as i32, m.mtime_nsec() as u32);
            e.uid = m.uid();
            e.gid = m.gid();
            e.ino = m.ino() as u32;
            e.dev = m.dev() as u32;
            index.add(&e)?;
        }
        index.write()?;
        Ok(())
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
        self.mutable("cherry pick")?;
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
        // Through the index (the worker's own, outside the container): its stat data spares
        // hashing every unchanged file; a file whose stat differs (a write changes its ctime,
        // which no agent can set) is hashed and compared.
        let diff = repo.diff_tree_to_workdir_with_index(Some(&base_tree), Some(&mut opts))?;
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

    /// The hunks from commit `from` to commit `to`, without context lines: what each removed
    /// and added, binary files marked (`shared::mechanical`). At most `max` hunks.
    pub fn hunks(
        &self,
        from: &str,
        to: &str,
        max: usize,
    ) -> Result<Vec<shared::mechanical::Hunk>, GitError> {
        use shared::mechanical::Hunk;
        let repo = self.repo()?;
        let a = repo.find_commit(Oid::from_str(from)?)?.tree()?;
        let b = repo.find_commit(Oid::from_str(to)?)?.tree()?;
        let mut opts = git2::DiffOptions::new();
        opts.context_lines(0).include_typechange(true);
        let diff = repo.diff_tree_to_tree(Some(&a), Some(&b), Some(&mut opts))?;
        let path = |d: &git2::DiffDelta| {
            d.new_file()
                .path()
                .or(d.old_file().path())
                .map(|p| p.to_string_lossy().replace('\\', "/"))
                .unwrap_or_default()
        };
        let hunks = std::cell::RefCell::new(Vec::<Hunk>::new());
        let too_many = std::cell::Cell::new(false);
        let mut on_binary = |d: git2::DiffDelta, _: git2::DiffBinary| {
            hunks.borrow_mut().push(Hunk {
                file: path(&d),
                binary: true,
                ..Hunk::default()
            });
            true
        };
        let mut on_hunk = |d: git2::DiffDelta, h: git2::DiffHunk| {
            let mut hs = hunks.borrow_mut();
            if hs.len() >= max {
                too_many.set(true);
                return false;
            }
            hs.push(Hunk {
                file: path(&d),
                line: h.new_start(),
                ..Hunk::default()
            });
            true
        };
        let mut on_line = |_: git2::DiffDelta, _: Option<git2::DiffHunk>, l: git2::DiffLine| {
            let text = String::from_utf8_lossy(l.content())
                .trim_end_matches(['\n', '\r'])
                .to_string();
            if let Some(h) = hunks.borrow_mut().last_mut() {
                match l.origin() {
                    '-' => h.removed.push(text),
                    '+' => h.added.push(text),
                    _ => {}
                }
            }
            true
        };
        let walked = diff.foreach(
            &mut |_, _| true,
            Some(&mut on_binary),
            Some(&mut on_hunk),
            Some(&mut on_line),
        );
        if too_many.get() {
            return Err(GitError::TooLarge(format!("more than {max} hunks")));
        }
        walked?;
        Ok(hunks.into_inner())
    }

    /// Lays down, from `commit`, every regular file whose path `covers` accepts (replacing what
    /// is on disk, never following a link), and removes files it accepts that `commit` lacks.
    /// The frozen tests of a run, restored before the harness runs them. Returns the paths laid.
    pub fn restore_paths(
        &self,
        commit: &str,
        covers: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<String>, GitError> {
        self.mutable("restore paths")?;
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
        self.mutable("apply patch")?;
        let repo = self.repo()?;
        let parsed = git2::Diff::from_buffer(diff.as_bytes())
            .map_err(|e| GitError::Apply(e.message().to_string()))?;
        repo.apply(&parsed, git2::ApplyLocation::WorkDir, None)
            .map_err(|e| GitError::Apply(e.message().to_string()))
    }

    /// Commits every change of the working directory on top of the base. Deterministic: a fixed
    /// author and time, so the same change gives the same commit id. `None` when nothing changed.
    pub fn commit_all(&self, message: &str) -> Result<Option<String>, GitError> {
        self.mutable("commit all")?;
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

    /// Moves the worktree to `commit`, a descendant of the base whose objects are in the mirror
    /// (a resumed session's last checkpoint): files, index and head as that commit has them.
    pub fn advance_to(&self, commit: &str) -> Result<(), GitError> {
        self.mutable("advance to")?;
        let repo = self.repo()?;
        let oid = Oid::from_str(commit)?;
        if oid != self.base && !repo.graph_descendant_of(oid, self.base)? {
            return Err(GitError::Git(git2::Error::from_str(&format!(
                "{commit} does not descend from the job's base"
            ))));
        }
        let object = repo.find_commit(oid)?.into_object();
        repo.checkout_tree(
            &object,
            Some(CheckoutBuilder::new().force().remove_untracked(true)),
        )?;
        repo.set_head_detached(oid)?;
        *self.head.lock().expect("head lock") = oid;
        Ok(())
    }

    /// Replaces the commits since the base by one commit of the head's tree (an incremental
    /// session's invocations become its job's one commit). `None` when nothing was committed.
    pub fn squash_since_base(&self, message: &str) -> Result<Option<String>, GitError> {
        self.mutable("squash since base")?;
        let head = self.head_oid();
        if head == self.base {
            return Ok(None);
        }
        let repo = self.repo()?;
        let tree = repo.find_commit(head)?.tree()?;
        let parent = repo.find_commit(self.base)?;
        let sig = Signature::new("fleet", "fleet@localhost", &Time::new(0, 0))?;
        let oid = repo.commit(None, &sig, &sig, message, &tree, &[&parent])?;
        repo.set_head_detached(oid)?;
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
