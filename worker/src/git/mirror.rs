//! The worker's bare mirror: packs from object storage indexed into it once each, and a fresh
//! worktree per job checked out of it, whose git directory lives outside the mounted folder.
//!
//! Jobs' git directories read the mirror's objects (alternates), so each job holds the mirror
//! (`GitCache::hold`) from before its packs are fetched until it ends; under disk pressure the
//! mirror is emptied only when no job holds it (`GitCache::evict_idle_mirror`), and its packs
//! are fetched again as jobs need them.

use super::shared_checkout::{keep_from_env, Lease, SharedCheckouts};
use super::{GitError, Worktree};
use crate::blobs::Blobs;
use git2::{build::CheckoutBuilder, Oid, Repository};
use shared::hashing::sha256_hex;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::{Mutex, OwnedRwLockReadGuard, RwLock};

/// A job's hold on the mirror: it is not emptied while any hold lasts.
pub struct MirrorHold {
    _held: OwnedRwLockReadGuard<()>,
}

/// The per-worker cache: one bare mirror holding every pack the worker has seen.
pub struct GitCache {
    mirror: PathBuf,
    lock: Mutex<()>,
    /// Read by every job that holds the mirror; written only to empty it.
    holders: Arc<RwLock<()>>,
    checkouts: SharedCheckouts,
    /// Jobs' own worktrees are overlays on the shared checkouts.
    layered: bool,
    /// Files per commit's tree, for the choice between a shared checkout and a warm container.
    counts: Mutex<std::collections::HashMap<String, usize>>,
}

impl GitCache {
    /// Opens the cache at `root`: checkouts' files are owned by `owner` (the sandbox user);
    /// `layered` says whether jobs' own worktrees are overlays on them (`layered::decide`).
    pub fn open(root: &Path, owner: Option<(u32, u32)>, layered: bool) -> Result<Self, GitError> {
        let mirror = root.join("mirror.git");
        if !mirror.join("objects").exists() {
            std::fs::create_dir_all(&mirror)?;
            Repository::init_bare(&mirror)?;
        }
        std::fs::create_dir_all(root.join("packs-indexed"))?;
        let checkouts = SharedCheckouts::open(&root.join("checkouts"), keep_from_env(), owner)?;
        Ok(Self {
            mirror,
            lock: Mutex::new(()),
            holders: Arc::default(),
            layered: layered && checkouts.enabled(),
            checkouts,
            counts: Mutex::default(),
        })
    }

    /// Whether jobs' own worktrees are overlays on their commit's shared checkout here.
    pub fn layers_worktrees(&self) -> bool {
        self.layered
    }

    /// A worktree of `commit` of the job's own, layered over the commit's shared checkout
    /// (`layered.rs`): an overlay at `dest/wt`, its git directory at `dest/git`; the lease
    /// keeps the checkout while the job runs. Only when `layers_worktrees`.
    pub async fn materialize_layered(
        &self,
        commit: &str,
        dest: &Path,
    ) -> Result<(Worktree, Lease), GitError> {
        self.checkouts.layered(&self.mirror, commit, dest).await
    }

    /// How many files `commit`'s tree holds (its objects must be in the mirror); counted once
    /// per commit.
    pub async fn file_count(&self, commit: &str) -> Result<usize, GitError> {
        if let Some(n) = self.counts.lock().await.get(commit) {
            return Ok(*n);
        }
        let (mirror, c) = (self.mirror.clone(), commit.to_string());
        let n = crate::safe_fs::blocking(move || {
            let repo = Repository::open_bare(&mirror)?;
            let tree = repo.find_commit(Oid::from_str(&c)?)?.tree()?;
            let mut n = 0usize;
            tree.walk(git2::TreeWalkMode::PreOrder, |_, e| {
                if e.kind() == Some(git2::ObjectType::Blob) {
                    n += 1;
                }
                git2::TreeWalkResult::Ok
            })?;
            Ok::<usize, GitError>(n)
        })
        .await?;
        let mut counts = self.counts.lock().await;
        if counts.len() >= 4096 {
            counts.clear();
        }
        counts.insert(commit.to_string(), n);
        Ok(n)
    }

    /// Removes every shared checkout no job holds (disk pressure); how many went.
    pub async fn evict_idle_checkouts(&self) -> usize {
        self.checkouts.evict_idle().await
    }

    /// Holds the mirror for a job: from before its packs are fetched until its worktree is
    /// gone (its git directory reads the mirror's objects).
    pub async fn hold(&self) -> MirrorHold {
        MirrorHold {
            _held: self.holders.clone().read_owned().await,
        }
    }

    /// Empties the mirror when no job holds it and it holds any pack (disk pressure): the
    /// packs are fetched again when a job needs them. Whether it was emptied.
    pub async fn evict_idle_mirror(&self) -> Result<bool, GitError> {
        let Ok(_alone) = self.holders.clone().try_write_owned() else {
            return Ok(false);
        };
        let _indexing = self.lock.lock().await;
        let (mirror, markers) = (self.mirror.clone(), self.markers_dir());
        let emptied = crate::safe_fs::blocking(move || empty_mirror(&mirror, &markers)).await?;
        if emptied {
            self.counts.lock().await.clear();
        }
        Ok(emptied)
    }

    fn markers_dir(&self) -> PathBuf {
        (self.mirror.parent().expect("mirror has a parent")).join("packs-indexed")
    }

    /// Whether read-only jobs may share a commit's checkout here (`FLEET_SHARED_CHECKOUTS`).
    pub fn shares_checkouts(&self) -> bool {
        self.checkouts.enabled()
    }

    /// A read-only worktree of `commit` on the checkout its read-only jobs share
    /// (`shared_checkout.rs`), its git directory at `dest/git`; the lease keeps the checkout
    /// while the job runs.
    pub async fn materialize_shared(
        &self,
        commit: &str,
        dest: &Path,
    ) -> Result<(Worktree, Lease), GitError> {
        self.checkouts.worktree(&self.mirror, commit, dest).await
    }

    fn marker(&self, key: &str) -> PathBuf {
        self.markers_dir().join(sha256_hex(key.as_bytes()))
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

    /// The id of `commit`'s tree (the commit's objects must be in the mirror).
    pub async fn tree_of(&self, commit: &str) -> Result<String, GitError> {
        let (mirror, commit) = (self.mirror.clone(), commit.to_string());
        crate::safe_fs::blocking(move || {
            let repo = Repository::open_bare(&mirror)?;
            let tree = repo.find_commit(Oid::from_str(&commit)?)?.tree_id();
            Ok(tree.to_string())
        })
        .await
    }

    /// Gives `wt` a git directory of its own with `branches` (`worktree.git`; the commits'
    /// objects must be in the mirror).
    pub async fn expose(
        &self,
        wt: &Worktree,
        branches: std::collections::BTreeMap<String, String>,
    ) -> Result<(), GitError> {
        if wt.is_shared() {
            return Err(GitError::SharedCheckout("expose"));
        }
        let (mirror, dir, start) = (self.mirror.clone(), wt.dir.clone(), wt.head());
        crate::safe_fs::blocking(move || super::exposed::expose(&mirror, &dir, &start, &branches))
            .await
    }

    /// A fresh worktree of `commit` of the job's own at `dest/wt`, its git directory at
    /// `dest/git` made on first read (`check_out_own`; checked out on the blocking pool).
    pub async fn materialize(&self, commit: &str, dest: &Path) -> Result<Worktree, GitError> {
        let (mirror, commit, dest) = (self.mirror.clone(), commit.to_string(), dest.to_path_buf());
        crate::safe_fs::blocking(move || {
            super::own_checkout::check_out_own(&mirror, &commit, &dest)
        })
        .await
    }
}

/// A bare git directory at `git_dir` that reads its objects from the mirror (alternates).
pub(super) fn init_with_alternates(mirror: &Path, git_dir: &Path) -> Result<(), GitError> {
    Repository::init_bare(git_dir)?;
    let alternates = git_dir.join("objects/info/alternates");
    std::fs::create_dir_all(alternates.parent().expect("has parent"))?;
    std::fs::write(
        &alternates,
        format!("{}\n", mirror.join("objects").display()),
    )?;
    Ok(())
}

/// A worktree of `commit` at `dest/wt` with its git directory made at `dest/git` (a commit's
/// shared checkout, whose index its jobs' git directories copy).
pub(super) fn materialize_at(
    mirror: &Path,
    commit: &str,
    dest: &Path,
) -> Result<Worktree, GitError> {
    let git_dir = dest.join("git");
    let dir = dest.join("wt");
    std::fs::create_dir_all(&dir)?;
    init_with_alternates(mirror, &git_dir)?;
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
        shared: false,
        layered: false,
        pending_git: None,
    })
}

/// Empties the mirror if any pack is marked indexed: the markers go first (a mirror without
/// a pack its marker names would never fetch it again), then the mirror is made anew.
fn empty_mirror(mirror: &Path, markers: &Path) -> Result<bool, GitError> {
    if std::fs::read_dir(markers)?.next().is_none() {
        return Ok(false);
    }
    std::fs::remove_dir_all(markers)?;
    std::fs::create_dir_all(markers)?;
    std::fs::remove_dir_all(mirror)?;
    std::fs::create_dir_all(mirror)?;
    Repository::init_bare(mirror)?;
    Ok(true)
}

fn index_pack(mirror: &Path, bytes: &[u8]) -> Result<(), GitError> {
    let repo = Repository::open_bare(mirror)?;
    let odb = repo.odb()?;
    let mut writer = odb.packwriter()?;
    writer.write_all(bytes)?;
    writer.commit()?;
    Ok(())
}
