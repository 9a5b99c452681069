//! Checkouts shared by a commit's read-only jobs (issue 13, item 5): the first read-only job of
//! a commit on this worker checks it out once into `<cache>/checkouts/<commit>`; every later
//! one mounts that folder read-only instead of writing the whole tree again, and gets a git
//! directory of its own (alternates to the mirror, a copy of the checkout's index, so that its
//! status reads reuse the checkout's stat cache).
//!
//! Who may share, and why nothing changes a shared checkout:
//! - only jobs whose worktree is read-only and whose step never writes it from the worker's
//!   side (the runner decides: agents and commands, without `worktree.git`); their container
//!   mounts it read-only;
//! - a shared `Worktree` refuses every mutating operation (`GitError::SharedCheckout`);
//! - a checkout is published (renamed into place) only when complete, and removed only when no
//!   job holds a lease on it; at most `keep` are kept, the least recently used go first; the
//!   folder is emptied at start (`open`), so nothing from an earlier process is trusted.

use super::worktree::PendingGitDir;
use super::{GitError, Worktree};
use git2::Oid;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tracing::warn;

/// The default count of checkouts kept per worker (`FLEET_SHARED_CHECKOUTS`; 0 turns sharing
/// off).
pub const DEFAULT_KEEP: usize = 8;
pub const SHARED_CHECKOUTS_ENV: &str = "FLEET_SHARED_CHECKOUTS";

/// How many shared checkouts this worker keeps (`FLEET_SHARED_CHECKOUTS`); unreadable values
/// fall back to the default, with a warning.
pub fn keep_from_env() -> usize {
    match std::env::var(SHARED_CHECKOUTS_ENV) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            warn!(value = %v, "FLEET_SHARED_CHECKOUTS is not a count; using the default");
            DEFAULT_KEEP
        }),
        Err(_) => DEFAULT_KEEP,
    }
}

struct Entry {
    users: usize,
    used: u64,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    tick: u64,
}

/// The worker's shared checkouts.
pub struct SharedCheckouts {
    root: PathBuf,
    keep: usize,
    /// Who owns a checkout's files: the sandbox user, so that a job may change any of them in the
    /// overlay of a layered worktree (`layered.rs`; read-only jobs mount the checkout read-only).
    owner: Option<(u32, u32)>,
    state: Arc<Mutex<State>>,
    /// Creation is rare (once per commit per worker) and serialised: two jobs of a new commit
    /// wait for one checkout rather than write two.
    create: tokio::sync::Mutex<()>,
}

/// A job's hold on a shared checkout: the checkout is not removed while a lease on it lives.
pub struct Lease {
    commit: String,
    state: Arc<Mutex<State>>,
    created: bool,
}

impl Lease {
    /// Whether the checkout was made for this job (the commit's first read-only job here).
    pub fn created(&self) -> bool {
        self.created
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut st = self.state.lock().expect("checkouts lock");
        if let Some(e) = st.entries.get_mut(&self.commit) {
            e.users = e.users.saturating_sub(1);
        }
    }
}

impl SharedCheckouts {
    /// Empties `root` (checkouts of an earlier process are not trusted) and keeps at most
    /// `keep` checkouts there from now on.
    pub fn open(root: &Path, keep: usize, owner: Option<(u32, u32)>) -> Result<Self, GitError> {
        if root.exists() {
            std::fs::remove_dir_all(root)?;
        }
        std::fs::create_dir_all(root)?;
        Ok(Self {
            root: root.to_path_buf(),
            keep,
            owner,
            state: Arc::default(),
            create: tokio::sync::Mutex::new(()),
        })
    }

    pub fn enabled(&self) -> bool {
        self.keep > 0
    }

    fn lease(&self, commit: &str) -> Option<Lease> {
        let mut st = self.state.lock().expect("checkouts lock");
        st.tick += 1;
        let tick = st.tick;
        let e = st.entries.get_mut(commit)?;
        e.users += 1;
        e.used = tick;
        Some(Lease {
            commit: commit.to_string(),
            state: self.state.clone(),
            created: false,
        })
    }

    /// A lease on the checkout of `commit` (its objects in `mirror`), made first if this
    /// worker has none; returns the commit's full id too.
    async fn hold(&self, mirror: &Path, commit: &str) -> Result<(String, Lease), GitError> {
        // The folder's name: the commit's full id as git spells it, never the bytes given.
        let commit = Oid::from_str(commit)?.to_string();
        if let Some(l) = self.lease(&commit) {
            return Ok((commit, l));
        }
        let _creating = self.create.lock().await;
        if let Some(l) = self.lease(&commit) {
            return Ok((commit, l));
        }
        let (mirror, root, c, owner) = (
            mirror.to_path_buf(),
            self.root.clone(),
            commit.clone(),
            self.owner,
        );
        crate::safe_fs::blocking(move || check_out(&mirror, &root, &c, owner)).await?;
        let lease = self.publish(&commit);
        Ok((commit, lease))
    }

    /// A read-only worktree of `commit` (its objects in `mirror`) whose files are the shared
    /// checkout's and whose git directory is `dest/git`, with the lease that keeps the
    /// checkout.
    pub async fn worktree(
        &self,
        mirror: &Path,
        commit: &str,
        dest: &Path,
    ) -> Result<(Worktree, Lease), GitError> {
        self.on_checkout(mirror, commit, dest, false).await
    }

    /// A worktree of `commit` of the job's own, layered over the shared checkout
    /// (`layered.rs`): an overlay mounted at `dest/wt`, its git directory at `dest/git`, with
    /// the lease that keeps the checkout (its lower layer) while the job runs.
    pub async fn layered(
        &self,
        mirror: &Path,
        commit: &str,
        dest: &Path,
    ) -> Result<(Worktree, Lease), GitError> {
        self.on_checkout(mirror, commit, dest, true).await
    }

    async fn on_checkout(
        &self,
        mirror: &Path,
        commit: &str,
        dest: &Path,
        layered: bool,
    ) -> Result<(Worktree, Lease), GitError> {
        let (commit, lease) = self.hold(mirror, commit).await?;
        let checkout = self.root.join(&commit);
        let (mirror, dest) = (mirror.to_path_buf(), dest.to_owned());
        let wt = crate::safe_fs::blocking(move || {
            let files = if layered {
                Files::Layered(super::layered::mount(&checkout.join("wt"), &dest)?)
            } else {
                Files::Shared(checkout.join("wt"))
            };
            job_worktree(&mirror, &checkout, &commit, &dest, files)
        })
        .await?;
        Ok((wt, lease))
    }

    /// Records a new checkout with this job's lease on it, then removes the least recently
    /// used ones beyond `keep` that no job holds (off the job's path).
    fn publish(&self, commit: &str) -> Lease {
        let trash = {
            let mut st = self.state.lock().expect("checkouts lock");
            st.tick += 1;
            let tick = st.tick;
            st.entries.insert(
                commit.to_string(),
                Entry {
                    users: 1,
                    used: tick,
                },
            );
            self.set_aside(&mut st, self.keep)
        };
        if !trash.is_empty() {
            tokio::task::spawn_blocking(move || remove_all(&trash));
        }
        Lease {
            commit: commit.to_string(),
            state: self.state.clone(),
            created: true,
        }
    }

    /// Removes every checkout no job holds (the disk is low); how many went.
    pub async fn evict_idle(&self) -> usize {
        let trash = {
            let mut st = self.state.lock().expect("checkouts lock");
            self.set_aside(&mut st, 0)
        };
        let n = trash.len();
        crate::safe_fs::blocking(move || remove_all(&trash)).await;
        n
    }

    /// Forgets the least recently used checkouts no job holds until at most `keep` are left
    /// (or only held ones), and renames their folders aside, with the state locked: a checkout
    /// made again for the same commit never meets the old folder, nor loses its own to a late
    /// rename. Returns the folders to remove.
    fn set_aside(&self, st: &mut State, keep: usize) -> Vec<PathBuf> {
        let mut idle: Vec<(u64, String)> = st
            .entries
            .iter()
            .filter(|(_, e)| e.users == 0)
            .map(|(c, e)| (e.used, c.clone()))
            .collect();
        idle.sort();
        let over = st.entries.len().saturating_sub(keep);
        let mut trash = Vec::new();
        for (used, c) in idle.into_iter().take(over) {
            st.entries.remove(&c);
            let aside = self.root.join(format!(".gone-{c}-{used}"));
            match std::fs::rename(self.root.join(&c), &aside) {
                Ok(()) => trash.push(aside),
                Err(e) => warn!(commit = %c, error = %e, "could not remove a shared checkout"),
            }
        }
        trash
    }
}

fn remove_all(folders: &[PathBuf]) {
    for f in folders {
        if let Err(e) = std::fs::remove_dir_all(f) {
            warn!(folder = %f.display(), error = %e, "could not remove a shared checkout");
        }
    }
}

/// Checks `commit` out into `root/.new-<commit>` and renames it to `root/<commit>` once
/// complete (its files at `wt/`, owned by `owner`; its index at `git/index`, whose stat data
/// is the files' as they are published).
fn check_out(
    mirror: &Path,
    root: &Path,
    commit: &str,
    owner: Option<(u32, u32)>,
) -> Result<(), GitError> {
    let building = root.join(format!(".new-{commit}"));
    if building.exists() {
        std::fs::remove_dir_all(&building)?;
    }
    let wt = super::mirror::materialize_at(mirror, commit, &building)?;
    if let Some((uid, gid)) = owner {
        crate::sandbox::give_tree(&wt.dir, uid, gid)?;
        wt.restat_index()?;
    }
    let target = root.join(commit);
    if target.exists() {
        std::fs::remove_dir_all(&target)?;
    }
    std::fs::rename(&building, &target)?;
    Ok(())
}

/// Where a job on a commit's checkout finds its files.
enum Files {
    /// The checkout itself, read-only.
    Shared(PathBuf),
    /// An overlay on it, the job's own.
    Layered(PathBuf),
}

/// The job's worktree on the checkout, its git directory at `dest/git` made on first use
/// (`PendingGitDir`: the mirror's objects by alternates, the checkout's index copied).
fn job_worktree(
    mirror: &Path,
    checkout: &Path,
    commit: &str,
    dest: &Path,
    files: Files,
) -> Result<Worktree, GitError> {
    let oid = Oid::from_str(commit)?;
    let (dir, shared, layered) = match files {
        Files::Shared(dir) => (dir, true, false),
        Files::Layered(dir) => (dir, false, true),
    };
    let pending = PendingGitDir::new(mirror.to_path_buf(), checkout.join("git/index"));
    Ok(Worktree {
        shared,
        layered,
        ..Worktree::with_pending_git(dir, dest.join("git"), oid, pending)
    })
}

#[cfg(test)]
mod tests {
    use super::super::own_checkout::tests::mirror_with_a_commit;
    use super::*;
    use git2::Repository;

    #[test]
    fn a_job_on_a_shared_checkout_gets_its_git_directory_only_when_it_reads_git() {
        let tmp = tempfile::tempdir().unwrap();
        let mirror = tmp.path().join("mirror");
        let commit = mirror_with_a_commit(&mirror);
        let root = tmp.path().join("checkouts");
        std::fs::create_dir_all(&root).unwrap();
        check_out(&mirror, &root, &commit, None).unwrap();
        let checkout = root.join(&commit);
        let dest = tmp.path().join("job");
        std::fs::create_dir_all(&dest).unwrap();
        let files = Files::Shared(checkout.join("wt"));
        let wt = job_worktree(&mirror, &checkout, &commit, &dest, files).unwrap();
        assert!(!dest.join("git").exists(), "made before any git read");
        assert_eq!(
            std::fs::read_to_string(wt.dir.join("file.txt")).unwrap(),
            "hello\n"
        );

        // A handle on the same worktree reads git: the directory is made once, at the base, and
        // reads the commit through the mirror's objects; the first handle uses it too.
        let other = wt.clone();
        assert!(other.changed_files(None).unwrap().is_empty());
        assert!(dest.join("git/index").exists());
        let job_git = Repository::open_bare(dest.join("git")).unwrap();
        assert_eq!(
            job_git.head().unwrap().target().unwrap().to_string(),
            commit
        );
        assert!(wt.changes(&commit, &commit).unwrap().is_empty());
        // The checkout's own index is never the job's.
        assert_ne!(
            std::fs::canonicalize(checkout.join("git/index")).unwrap(),
            std::fs::canonicalize(dest.join("git/index")).unwrap()
        );
    }
}
