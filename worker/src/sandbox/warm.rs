//! A warm pool in front of the Docker adapter (`--warm-containers N`): per *shape* (image,
//! worktree mode, which folders are mounted, network), up to N containers created and started
//! ahead, each bound to empty folders of its own under the worker's `warm/` folder. A job's
//! start takes one of its shape and moves its folders' contents into them (renames on one file
//! system, then the bound folder renamed over the job's), so the job's paths stay and the
//! container sees them; a shape's pool is refilled in the background after every start.
//!
//! What holds: one container per execution. A warm container has run nothing but its keeper's
//! `sleep`; it is never handed out twice, never returned to the pool, and removed with its
//! job. Its lock-down is the cold path's (one `launch`). Its keeper's `sleep` bounds its life
//! ([`WARM_LIFETIME`], also when its worker dies), and a container too old to serve the job's
//! whole lifetime is not handed out (the job starts cold). (A watchdog bounding it to the job's
//! lifetime was one more `exec`, ~50 ms of the job's path here.) A job's container is killed
//! (and waited for) when the job ends; its removal goes on off the job's path.

use super::docker::{DockerSandbox, DockerSession, WORKER_LABEL};
use super::{ExecOutput, Mounts, Sandbox, SandboxError, SandboxSpec, Session};
use crate::metrics::Metrics;
use async_trait::async_trait;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// How long a warm container's keeper sleeps: the most any container of the pool lives.
/// Jobs of the default timeout (600 s, a lifetime of 660 s) are served by containers up to
/// 9 minutes old; a container whose worker died ends by itself within this.
pub const WARM_LIFETIME: Duration = Duration::from_secs(20 * 60);
/// A warm container idle this long is removed rather than handed out (and replaced).
pub const IDLE_LIMIT: Duration = Duration::from_secs(5 * 60);
/// The label every warm container carries besides the worker's.
pub const WARM_LABEL: &str = "fleet.warm";

/// What a container is created with beyond the pool-wide limits and user: two jobs may share
/// a warm container's kind only if all of these are equal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub image: String,
    pub writable: bool,
    pub harness: bool,
    pub gateway: bool,
    pub network: bool,
}

impl Shape {
    pub fn of(spec: &SandboxSpec) -> Self {
        Self {
            image: spec.image.clone(),
            writable: spec.writable,
            harness: spec.harness_dir.is_some(),
            gateway: spec.gateway_dir.is_some(),
            network: spec.network,
        }
    }
}

/// Whether a container born `age` ago may serve a job that needs it for `needed`: young
/// enough to be kept, and its keeper's `sleep` outlasts the job.
pub fn may_serve(age: Duration, needed: Duration) -> bool {
    age < IDLE_LIMIT && age + needed <= WARM_LIFETIME
}

/// A container name from the worker's id (Docker allows `[a-zA-Z0-9_.-]`).
pub fn container_name(worker: &str, n: u64, nonce: &str) -> String {
    let worker: String = worker
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("fleet-warm-{worker}-{n}-{nonce}")
}

/// A started container waiting for a job, and the folder holding what it mounts.
struct Warm {
    session: DockerSession,
    dir: PathBuf,
    born: Instant,
}

#[derive(Default)]
struct Pool {
    ready: HashMap<Shape, VecDeque<Warm>>,
    /// Containers being created, per shape (counted against the pool's size).
    filling: HashMap<Shape, usize>,
    /// Handed-out containers by the name of the execution they serve (for `remove_named`).
    handed: HashMap<String, String>,
    closed: bool,
}

struct Inner {
    docker: DockerSandbox,
    root: PathBuf,
    size: usize,
    worker: String,
    nonce: String,
    made: AtomicU64,
    pool: Mutex<Pool>,
    metrics: Metrics,
}

impl Inner {
    fn pool(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The gauge of ready containers, set from the pool as it is now.
    fn count(&self, pool: &Pool) {
        let ready: usize = pool.ready.values().map(VecDeque::len).sum();
        self.metrics.warm_ready.set(ready as i64);
    }
}

pub struct WarmPool {
    inner: Arc<Inner>,
}

impl WarmPool {
    /// `size` containers per shape at most, their folders under `root` (on the file system of
    /// the worker's job folders: they are moved by rename).
    pub fn new(
        docker: DockerSandbox,
        root: PathBuf,
        size: usize,
        worker: &str,
        metrics: Metrics,
    ) -> Self {
        let nonce = crate::runner::process_nonce();
        Self {
            inner: Arc::new(Inner {
                docker,
                root,
                size,
                worker: worker.to_string(),
                nonce,
                made: AtomicU64::new(0),
                pool: Mutex::new(Pool::default()),
                metrics,
            }),
        }
    }

    /// Warm containers ready now, over every shape.
    pub fn ready(&self) -> usize {
        self.inner.pool().ready.values().map(VecDeque::len).sum()
    }
}

/// Creates containers of `shape` until the pool holds `size` of them (ready or being created),
/// one at a time, in the background.
fn refill(inner: Arc<Inner>, shape: Shape) {
    tokio::spawn(async move {
        loop {
            {
                let mut pool = inner.pool();
                let have = pool.ready.get(&shape).map_or(0, VecDeque::len)
                    + pool.filling.get(&shape).copied().unwrap_or(0);
                if pool.closed || have >= inner.size {
                    return;
                }
                *pool.filling.entry(shape.clone()).or_default() += 1;
            }
            let made = create(&inner, &shape).await;
            // Kept when the pool is open; otherwise handed back to be removed.
            let left = {
                let mut pool = inner.pool();
                if let Some(n) = pool.filling.get_mut(&shape) {
                    *n = n.saturating_sub(1);
                }
                match made {
                    Ok(warm) if !pool.closed => {
                        pool.ready.entry(shape.clone()).or_default().push_back(warm);
                        inner.count(&pool);
                        None
                    }
                    other => Some(other),
                }
            };
            match left {
                None => {}
                Some(Ok(warm)) => {
                    discard(warm).await;
                    return;
                }
                Some(Err(e)) => {
                    warn!(image = %shape.image, error = %e, "could not create a warm container");
                    return;
                }
            }
        }
    });
}

impl WarmPool {
    /// A ready container of the shape that may serve `needed`; stale ones met on the way are
    /// removed.
    async fn take(&self, shape: &Shape, needed: Duration) -> Option<Warm> {
        let mut stale = Vec::new();
        let found = {
            let mut pool = self.inner.pool();
            let queue = pool.ready.get_mut(shape)?;
            let mut found = None;
            while let Some(w) = queue.pop_front() {
                if may_serve(w.born.elapsed(), needed) {
                    found = Some(w);
                    break;
                }
                stale.push(w);
            }
            self.inner.count(&pool);
            found
        };
        for w in stale {
            discard(w).await;
        }
        found
    }

    /// Hands a warm container to `spec`: its folders' contents moved into the container's.
    async fn hand_out(
        &self,
        warm: Warm,
        spec: &SandboxSpec,
        shape: Shape,
    ) -> Result<WarmSession, Warm> {
        let moves = [
            Some((spec.worktree.clone(), warm.dir.join(WT_FOLDER))),
            spec.harness_dir
                .clone()
                .map(|h| (h, warm.dir.join(HARNESS_FOLDER))),
            spec.gateway_dir
                .clone()
                .map(|g| (g, warm.dir.join(GATEWAY_FOLDER))),
        ];
        let moves: Vec<(PathBuf, PathBuf)> = moves.into_iter().flatten().collect();
        let swapped = crate::safe_fs::blocking(move || {
            for (job, bound) in &moves {
                move_into(job, bound)?;
            }
            Ok::<(), std::io::Error>(())
        })
        .await;
        if let Err(e) = swapped {
            warn!(container = %spec.name, error = %e, "could not hand a warm container its job's folders; starting one cold");
            return Err(warm);
        }
        let _ = std::fs::remove_dir(&warm.dir);
        self.inner
            .pool()
            .handed
            .insert(spec.name.clone(), warm.session.id().to_string());
        // The job's name for whoever looks, off the job's path (a container removed meanwhile
        // makes it fail, which is fine).
        let (session, name) = (warm.session.clone(), spec.name.clone());
        tokio::spawn(async move {
            if let Err(e) = session.rename(&name).await {
                debug!(container = %name, error = %e, "could not rename a warm container");
            }
        });
        Ok(WarmSession {
            session: warm.session,
            name: spec.name.clone(),
            shape,
            inner: self.inner.clone(),
        })
    }
}

/// The folders a warm container mounts, under its own folder: the worktree, the harness's and
/// the gateway's; a job's are moved into them when it is handed the container.
const WT_FOLDER: &str = "wt";
const HARNESS_FOLDER: &str = "harness";
const GATEWAY_FOLDER: &str = "gw";

/// Creates and starts one container of `shape` on empty folders of its own.
async fn create(inner: &Inner, shape: &Shape) -> Result<Warm, SandboxError> {
    let n = inner.made.fetch_add(1, Ordering::Relaxed) + 1;
    let name = container_name(&inner.worker, n, &inner.nonce);
    let dir = inner.root.join(&name);
    let folders = {
        let dir = dir.clone();
        let shape = shape.clone();
        crate::safe_fs::blocking(move || {
            std::fs::create_dir_all(dir.join(WT_FOLDER))?;
            let harness = dir.join(HARNESS_FOLDER);
            let gateway = dir.join(GATEWAY_FOLDER);
            if shape.harness {
                std::fs::create_dir(&harness)?;
            }
            if shape.gateway {
                std::fs::create_dir(&gateway)?;
            }
            Ok::<_, std::io::Error>((
                shape.harness.then_some(harness),
                shape.gateway.then_some(gateway),
            ))
        })
        .await
    };
    let (harness_dir, gateway_dir) = folders?;
    let spec = SandboxSpec {
        name,
        image: shape.image.clone(),
        worktree: dir.join(WT_FOLDER),
        writable: shape.writable,
        shared_worktree: false,
        layered_worktree: false,
        harness_dir,
        network: shape.network,
        gateway_dir,
        lifetime: WARM_LIFETIME,
        labels: vec![
            (WORKER_LABEL.into(), inner.worker.clone()),
            (WARM_LABEL.into(), "1".into()),
        ],
    };
    match inner.docker.launch(&spec).await {
        Ok(session) => Ok(Warm {
            session,
            dir,
            born: Instant::now(),
        }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            Err(e)
        }
    }
}

async fn discard(warm: Warm) {
    if let Err(e) = warm.session.remove().await {
        warn!(error = %e, "could not remove a warm container");
    }
    let dir = warm.dir;
    crate::safe_fs::blocking(move || {
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

/// Moves the contents of `job` into the empty folder `bound`, then `bound` over `job`: the
/// job's path names the bound folder, with the job's contents, owner and mode. On an error
/// everything moved is moved back and `job` is as it was.
fn move_into(job: &Path, bound: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(job)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a folder",
            job.display()
        )));
    }
    // Unchanged when the worker may not give it away (it then owns both).
    let _ = std::os::unix::fs::chown(bound, Some(meta.uid()), Some(meta.gid()));
    std::fs::set_permissions(bound, meta.permissions())?;
    let mut moved = Vec::new();
    let outcome = (|| {
        for entry in std::fs::read_dir(job)? {
            let name = entry?.file_name();
            std::fs::rename(job.join(&name), bound.join(&name))?;
            moved.push(name);
        }
        std::fs::rename(bound, job)
    })();
    if outcome.is_err() {
        for name in &moved {
            let _ = std::fs::rename(bound.join(name), job.join(name));
        }
    }
    outcome
}

#[async_trait]
impl Sandbox for WarmPool {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn keeps_warm(&self) -> bool {
        self.inner.size > 0
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn Session>, SandboxError> {
        let shape = Shape::of(spec);
        // A shared checkout or an overlay cannot be moved into a warm container's folder: such a
        // job starts cold and takes nothing from its kind's pool.
        if !spec.shared_worktree && !spec.layered_worktree {
            // A warm container's kind is refilled once its job has ended (so the creation does
            // not compete with the job); a kind with none ready, at once.
            if let Some(warm) = self.take(&shape, spec.lifetime).await {
                match self.hand_out(warm, spec, shape.clone()).await {
                    Ok(session) => {
                        debug!(container = %spec.name, "warm container handed out");
                        let started = &self.inner.metrics.containers;
                        started.with_label_values(&["warm"]).inc();
                        return Ok(Box::new(session));
                    }
                    Err(warm) => discard(warm).await,
                }
            }
            refill(self.inner.clone(), shape);
        }
        let started = &self.inner.metrics.containers;
        started.with_label_values(&["cold"]).inc();
        self.inner.docker.start(spec).await
    }

    async fn reap(&self, worker_id: &str) -> Result<usize, SandboxError> {
        let removed = self.inner.docker.reap(worker_id).await?;
        let root = self.inner.root.clone();
        // Folders of a previous process's warm containers (all gone with them).
        crate::safe_fs::blocking(move || {
            let _ = std::fs::remove_dir_all(&root);
        })
        .await;
        Ok(removed)
    }

    async fn remove_named(&self, name: &str) -> Result<(), SandboxError> {
        let id = self.inner.pool().handed.remove(name);
        self.inner
            .docker
            .remove_named(id.as_deref().unwrap_or(name))
            .await
    }

    async fn image_id(&self, image: &str) -> Result<Option<String>, SandboxError> {
        self.inner.docker.image_id(image).await
    }

    async fn image_store(&self) -> Option<std::path::PathBuf> {
        self.inner.docker.image_store().await
    }

    async fn prune_unused_images(&self) -> Result<super::PrunedImages, SandboxError> {
        self.inner.docker.prune_unused_images().await
    }

    async fn shutdown(&self) {
        let ready: Vec<Warm> = {
            let mut pool = self.inner.pool();
            pool.closed = true;
            let ready = pool.ready.drain().flat_map(|(_, q)| q).collect();
            self.inner.count(&pool);
            ready
        };
        for warm in ready {
            discard(warm).await;
        }
    }
}

/// A handed-out warm container: the cold session's behaviour, and forgotten by the pool once
/// removed.
struct WarmSession {
    session: DockerSession,
    name: String,
    /// Its kind, refilled once it is gone.
    shape: Shape,
    inner: Arc<Inner>,
}

#[async_trait]
impl Session for WarmSession {
    async fn exec(
        &self,
        argv: &[String],
        stdin: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<ExecOutput, SandboxError> {
        self.session.exec(argv, stdin, timeout).await
    }

    /// The container is killed and waited for (nothing of the job runs once this returns);
    /// its removal, the slow part of Docker's cycle, goes on in the background.
    async fn remove(&self) -> Result<(), SandboxError> {
        if let Err(e) = self.session.stop().await {
            warn!(container = %self.name, error = %e, "could not kill a container; removing it");
            let removed = self.session.remove().await;
            self.inner.pool().handed.remove(&self.name);
            refill(self.inner.clone(), self.shape.clone());
            return removed;
        }
        let (session, inner, name) = (self.session.clone(), self.inner.clone(), self.name.clone());
        let shape = self.shape.clone();
        tokio::spawn(async move {
            if let Err(e) = session.remove().await {
                warn!(container = %name, error = %e, "could not remove a stopped container");
            }
            inner.pool().handed.remove(&name);
            refill(inner, shape);
        });
        Ok(())
    }

    fn mounts(&self) -> Mounts {
        self.session.mounts()
    }

    async fn kill_strays(&self) -> Result<(), SandboxError> {
        self.session.kill_strays().await
    }

    fn isolated(&self) -> bool {
        self.session.isolated()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxSpec {
        SandboxSpec {
            name: "x".into(),
            image: "img:1".into(),
            worktree: "/w".into(),
            writable: false,
            shared_worktree: false,
            layered_worktree: false,
            harness_dir: None,
            network: false,
            gateway_dir: None,
            lifetime: Duration::from_secs(60),
            labels: vec![],
        }
    }

    #[test]
    fn a_read_only_job_never_shares_a_shape_with_a_writing_one() {
        let ro = spec();
        let rw = SandboxSpec {
            writable: true,
            shared_worktree: false,
            ..spec()
        };
        assert_ne!(Shape::of(&ro), Shape::of(&rw));
        let harness = SandboxSpec {
            harness_dir: Some("/h".into()),
            ..spec()
        };
        assert_ne!(Shape::of(&ro), Shape::of(&harness));
        let gateway = SandboxSpec {
            gateway_dir: Some("/g".into()),
            ..spec()
        };
        assert_ne!(Shape::of(&ro), Shape::of(&gateway));
        let net = SandboxSpec {
            network: true,
            ..spec()
        };
        assert_ne!(Shape::of(&ro), Shape::of(&net));
        let other = SandboxSpec {
            image: "img:2".into(),
            ..spec()
        };
        assert_ne!(Shape::of(&ro), Shape::of(&other));
        // Names, paths, labels and lifetimes are the job's, not the container's kind.
        let same = SandboxSpec {
            name: "y".into(),
            worktree: "/elsewhere".into(),
            lifetime: Duration::from_secs(5),
            labels: vec![("a".into(), "b".into())],
            ..spec()
        };
        assert_eq!(Shape::of(&ro), Shape::of(&same));
    }

    #[test]
    fn a_warm_container_serves_only_jobs_its_keeper_outlives() {
        let min = Duration::from_secs(60);
        assert!(may_serve(Duration::ZERO, min));
        assert!(may_serve(Duration::from_secs(200), min));
        let default_job = Duration::from_secs(660);
        assert!(
            may_serve(Duration::from_secs(299), default_job),
            "a job of the default timeout"
        );
        assert!(!may_serve(IDLE_LIMIT, min), "idle too long");
        assert!(
            !may_serve(Duration::from_secs(10), WARM_LIFETIME),
            "the keeper would end before the job"
        );
        assert!(may_serve(Duration::ZERO, WARM_LIFETIME));
    }

    #[test]
    fn warm_names_are_docker_names() {
        assert_eq!(
            container_name("host/1 a", 7, "abc"),
            "fleet-warm-host_1_a-7-abc"
        );
    }
}
