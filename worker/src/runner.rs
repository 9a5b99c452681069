//! Runs one job: worktree in, container up, the node's step, commit and pack out, container
//! gone, job folder gone. A failure that stops the job before it has a result is a `RunError`,
//! classed once, where it is made: `Transient` when another try may pass (store or docker
//! unreachable; the job is requeued), `Permanent` when it cannot (a node not in the graph, a bad
//! git object, a malformed bundle; the consumer reports it as an `Error` result at once).
//! Everything else becomes a `JobResult` (the engine decides what it means).
//!
//! Resources beyond the container's own limits: the job folder has a disk quota, watched while
//! the job runs (`sandbox::disk`; over it, the container is removed and the job fails with
//! `disk_quota_exceeded`); job folders left by an earlier process of this worker are removed at
//! start, and folders older than a day that no execution owns periodically. libgit2 and walks of
//! the worktree run on the blocking pool.
//!
//! Each run is an *execution* with a tag of its own (`e<N>-<process nonce>`): its job folder and
//! container name carry the tag, so two executions of the same attempt (a redelivery that took
//! another path) can never share either. A panic in the job is caught here: the container is
//! removed by name, the folder by its drop guard, and the job becomes an `Error` result.

use crate::agent::{self, AgentJob, LlmSettings};
use crate::blobs::{BlobError, Blobs};
use crate::git::{GitCache, GitError, Worktree};
use crate::harness::{self, Artifacts, StepOutcome};
use crate::metrics::Metrics;
use crate::sandbox::disk;
use crate::sandbox::{Limits, Sandbox, SandboxError, SandboxSpec, Session};
use crate::tools::ToolBox;
use crate::{mutation, verify};
use futures::FutureExt;
use serde_json::{json, Value};
use shared::factory::{MAX_CONTEXT_BYTES, MAX_CONTEXT_FILES};
use shared::graph::{GraphBundle, NodeKind, WorktreeMode};
use shared::messages::{JobResult, JobSpec, JobStatus, Usage, WIRE_VERSION};
use shared::paths::normalize_relative;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

#[derive(Debug, Error)]
pub enum RunError {
    /// May pass on another try (store or docker unreachable): requeue.
    #[error("transient: {0}")]
    Transient(String),
    /// Cannot pass on another try (a node not in the graph, a bad git object, a malformed
    /// bundle): reported at once as an `Error` result of the attempt, never requeued.
    #[error("permanent: {0}")]
    Permanent(String),
}

impl RunError {
    /// The class, decided where the error was made.
    pub fn is_transient(&self) -> bool {
        matches!(self, RunError::Transient(_))
    }

    /// What went wrong, without the class.
    pub fn reason(&self) -> &str {
        match self {
            RunError::Transient(r) | RunError::Permanent(r) => r,
        }
    }

    fn classed(transient: bool, reason: String) -> Self {
        if transient {
            RunError::Transient(reason)
        } else {
            RunError::Permanent(reason)
        }
    }
}

impl From<BlobError> for RunError {
    fn from(e: BlobError) -> Self {
        RunError::classed(e.is_transient(), e.to_string())
    }
}

impl From<GitError> for RunError {
    fn from(e: GitError) -> Self {
        RunError::classed(e.is_transient(), e.to_string())
    }
}

impl From<SandboxError> for RunError {
    fn from(e: SandboxError) -> Self {
        RunError::classed(e.is_transient(), e.to_string())
    }
}

/// Why a worker cannot start.
#[derive(Debug, Error)]
pub enum StartError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Git(#[from] GitError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// The default disk quota of a job folder (`FLEET_JOB_DISK_MB`).
pub const DEFAULT_JOB_DISK_MB: u64 = 2048;
/// The default age after which a job folder no execution owns is removed
/// (`FLEET_JOB_DIR_MAX_AGE_SECONDS`).
pub const DEFAULT_JOB_DIR_MAX_AGE_SECONDS: u64 = 24 * 3600;

/// Resources of a job the worker enforces itself (the container's own limits are `Limits`).
/// Read from the environment (`from_env`) until the CLI has flags for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobResources {
    /// What a job folder (worktree, git directory, harness folder) may hold on disk; `None`: no
    /// quota (`FLEET_JOB_DISK_MB=0`).
    pub disk_quota: Option<disk::Quota>,
    /// Job folders older than this that no running execution owns are removed.
    pub dir_max_age: Duration,
}

impl Default for JobResources {
    fn default() -> Self {
        Self {
            disk_quota: Some(disk::Quota {
                limit_bytes: DEFAULT_JOB_DISK_MB * 1024 * 1024,
                every: Duration::from_millis(500),
            }),
            dir_max_age: Duration::from_secs(DEFAULT_JOB_DIR_MAX_AGE_SECONDS),
        }
    }
}

impl JobResources {
    /// `FLEET_JOB_DISK_MB` (default 2048; 0 turns the quota off) and
    /// `FLEET_JOB_DIR_MAX_AGE_SECONDS` (default 86400).
    pub fn from_env() -> Result<Self, StartError> {
        Self::from_lookup(|k| std::env::var(k).ok()).map_err(StartError::Config)
    }

    /// The same, over any source of variables.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let number = |key: &str| -> Result<Option<u64>, String> {
            match get(key).map(|v| v.trim().to_string()) {
                None => Ok(None),
                Some(v) if v.is_empty() => Ok(None),
                Some(v) => v
                    .parse::<u64>()
                    .map(Some)
                    .map_err(|_| format!("{key}=`{v}` is not a whole number")),
            }
        };
        let mut r = Self::default();
        match number("FLEET_JOB_DISK_MB")? {
            None => {}
            Some(0) => r.disk_quota = None,
            Some(mb) => {
                let limit_bytes = mb
                    .checked_mul(1024 * 1024)
                    .ok_or_else(|| format!("FLEET_JOB_DISK_MB={mb} is too large"))?;
                r.disk_quota = Some(disk::Quota {
                    limit_bytes,
                    every: Duration::from_millis(500),
                });
            }
        }
        match number("FLEET_JOB_DIR_MAX_AGE_SECONDS")? {
            None => {}
            Some(0) => return Err("FLEET_JOB_DIR_MAX_AGE_SECONDS must be above 0".into()),
            Some(s) => r.dir_max_age = Duration::from_secs(s),
        }
        Ok(r)
    }

    /// How often stale job folders are looked for: a quarter of their maximum age, between a
    /// second and an hour.
    pub fn sweep_every(&self) -> Duration {
        (self.dir_max_age / 4).clamp(Duration::from_secs(1), Duration::from_secs(3600))
    }
}

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    pub id: String,
    pub work_dir: PathBuf,
    pub concurrency: usize,
    /// `uid:gid` the containers run as (never root).
    pub sandbox_user: String,
    pub llm: LlmSettings,
    pub limits: Limits,
}

pub struct Runner {
    pub config: WorkerConfig,
    pub blobs: Blobs,
    pub sandbox: Arc<dyn Sandbox>,
    pub metrics: Metrics,
    /// Disk quota and job-folder age (`JobResources::from_env` by default).
    pub resources: JobResources,
    git: GitCache,
    http: reqwest::Client,
    graphs: Mutex<HashMap<String, Arc<GraphBundle>>>,
    /// Executions running here (by tag), so a stop from the coordinator reaches every
    /// execution of the job.
    running: Mutex<HashMap<String, (shared::ids::JobId, CancellationToken)>>,
    /// Executions started by this process; with `nonce`, the execution tags.
    executions: AtomicU64,
    /// Random per process: tags stay unique across restarts of a worker with the same id.
    nonce: String,
}

/// One execution of a job attempt in this worker: the names it alone uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Execution {
    /// `e<N>-<nonce>`, unique in this worker across restarts.
    pub tag: String,
    /// The job folder (worktree, harness folder), `jobs/<job>-a<attempt>-<tag>`.
    pub dir: PathBuf,
    /// The container name, `fleet-<worker>-<job>-a<attempt>-<tag>`.
    pub container: String,
}

/// The job folder, removed whenever the execution ends: a result, an error, a panic. `remove`
/// does it on the blocking pool; dropped without it (a panic on the way), it is removed where
/// it is dropped.
struct JobFolder {
    dir: Option<PathBuf>,
    job: String,
}

impl JobFolder {
    fn create(dir: &Path, job: &str) -> std::io::Result<Self> {
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // Not `create_dir_all`: a folder that exists belongs to another execution.
        std::fs::create_dir(dir)?;
        Ok(Self {
            dir: Some(dir.to_path_buf()),
            job: job.to_string(),
        })
    }

    /// Removes the folder on the blocking pool (a job folder may hold gigabytes).
    async fn remove(mut self) {
        let (Some(dir), job) = (self.dir.take(), std::mem::take(&mut self.job)) else {
            return;
        };
        crate::safe_fs::blocking(move || remove_job_dir(&dir, &job)).await;
    }
}

fn remove_job_dir(dir: &Path, job: &str) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            warn!(job = %job, dir = %dir.display(), error = %e, "could not remove the job folder")
        }
    }
}

impl Drop for JobFolder {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            remove_job_dir(&dir, &self.job);
        }
    }
}

/// An execution's entry in the stop registry, removed on every exit path.
struct Registered<'a> {
    running: &'a Mutex<HashMap<String, (shared::ids::JobId, CancellationToken)>>,
    tag: String,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        unpoisoned(self.running).remove(&self.tag);
    }
}

/// A lock that a panic elsewhere did not make unusable (the maps it guards stay consistent:
/// every update is a single insert or remove).
fn unpoisoned<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The message of a panic payload (`panic!` gives a `&str` or a `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// An `Error` result of the attempt, carrying `error`.
pub fn error_result(spec: &JobSpec, worker: &str, started_at: String, error: String) -> JobResult {
    JobResult {
        v: WIRE_VERSION,
        job_id: spec.job_id.clone(),
        run_id: spec.run_id.clone(),
        attempt: spec.attempt,
        status: JobStatus::Error,
        output: Value::Null,
        error: Some(error),
        commit: None,
        pack: None,
        artifacts: Default::default(),
        usage: Usage::default(),
        worker: worker.to_string(),
        started_at,
        finished_at: now(),
        container_seconds: 0.0,
    }
}

/// The result of an execution that panicked: an infrastructure error of this attempt, routed by
/// the engine like any other.
pub fn panicked_result(
    spec: &JobSpec,
    worker: &str,
    started_at: String,
    message: &str,
) -> JobResult {
    error_result(
        spec,
        worker,
        started_at,
        format!(
            "the worker panicked running this job: {}",
            shared::text::head(message, 2000)
        ),
    )
}

/// The result of an execution that failed for good (`RunError::Permanent`): an error of this
/// attempt, reported at once rather than requeued until the delivery limit.
pub fn permanent_result(
    spec: &JobSpec,
    worker: &str,
    started_at: String,
    reason: &str,
) -> JobResult {
    error_result(
        spec,
        worker,
        started_at,
        format!(
            "the job cannot run (a permanent failure, not retried): {}",
            shared::text::head(reason, 2000)
        ),
    )
}

/// Random enough to tell two processes of one worker id apart (std only: the hasher's keys are
/// random per process).
fn process_nonce() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    format!("{:06x}", h.finish() & 0xff_ffff)
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl Runner {
    /// Refuses a root sandbox user and bad resource settings (`JobResources::from_env`) before
    /// anything else.
    pub fn new(
        config: WorkerConfig,
        blobs: Blobs,
        sandbox: Arc<dyn Sandbox>,
        metrics: Metrics,
    ) -> Result<Self, StartError> {
        crate::sandbox::check_user(&config.sandbox_user).map_err(StartError::Config)?;
        let resources = JobResources::from_env()?;
        std::fs::create_dir_all(config.work_dir.join("jobs"))?;
        let git = GitCache::open(&config.work_dir.join("git"))?;
        let mut config = config;
        // A worker that is not root cannot give worktrees away: its containers run as itself
        // (never as root, since the worker is not).
        {
            use std::os::unix::fs::MetadataExt;
            let me = std::fs::metadata(config.work_dir.join("jobs"))?;
            if me.uid() != 0 {
                config.sandbox_user = format!("{}:{}", me.uid(), me.gid());
            }
        }
        Ok(Self {
            config,
            blobs,
            sandbox,
            metrics,
            resources,
            git,
            http: reqwest::Client::new(),
            graphs: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            executions: AtomicU64::new(0),
            nonce: process_nonce(),
        })
    }

    /// Replaces the job resources read from the environment (tests, embedders).
    pub fn with_resources(mut self, resources: JobResources) -> Self {
        self.resources = resources;
        self
    }

    fn jobs_dir(&self) -> PathBuf {
        self.config.work_dir.join("jobs")
    }

    /// Removes the job folders of this worker that no execution of this process made: what a
    /// killed process left (its containers are reaped by label). Called once at start, before
    /// any job is taken. Returns how many were removed.
    pub async fn remove_leftover_job_dirs(&self) -> usize {
        let (jobs, nonce) = (self.jobs_dir(), self.nonce.clone());
        let removed = crate::safe_fs::blocking(move || {
            sweep_job_dirs(&jobs, |name, _| left_by_another_process(name, &nonce))
        })
        .await;
        self.metrics
            .job_dirs_removed
            .with_label_values(&["start"])
            .inc_by(removed as u64);
        removed
    }

    /// Removes job folders older than `resources.dir_max_age` that no running execution owns
    /// (a folder whose removal failed when its job ended). Returns how many were removed.
    pub async fn remove_stale_job_dirs(&self) -> usize {
        // Taken before the listing: an execution that starts later has a fresh folder.
        let running: std::collections::HashSet<String> =
            unpoisoned(&self.running).keys().cloned().collect();
        let (jobs, max_age) = (self.jobs_dir(), self.resources.dir_max_age);
        let removed = crate::safe_fs::blocking(move || {
            sweep_job_dirs(&jobs, |name, age| stale(name, age, &running, max_age))
        })
        .await;
        self.metrics
            .job_dirs_removed
            .with_label_values(&["stale"])
            .inc_by(removed as u64);
        removed
    }

    async fn bundle(&self, key: &str) -> Result<Arc<GraphBundle>, RunError> {
        if let Some(b) = self.graphs.lock().expect("graph cache lock").get(key) {
            return Ok(b.clone());
        }
        let bundle: GraphBundle = self.blobs.get_json(key).await?;
        let bundle = Arc::new(bundle);
        self.graphs
            .lock()
            .expect("graph cache lock")
            .insert(key.to_string(), bundle.clone());
        Ok(bundle)
    }

    /// Stops every execution of a job running here (its run ended); false when none runs here.
    pub fn stop(&self, job: &shared::ids::JobId) -> bool {
        let running = unpoisoned(&self.running);
        let mut found = false;
        for (j, token) in running.values() {
            if j == job {
                token.cancel();
                found = true;
            }
        }
        found
    }

    /// The names of a new execution of the job's attempt.
    pub fn execution(&self, spec: &JobSpec) -> Execution {
        let n = self.executions.fetch_add(1, Ordering::Relaxed) + 1;
        let tag = format!("e{n}-{}", self.nonce);
        let dir = self.config.work_dir.join("jobs").join(format!(
            "{}-a{}-{tag}",
            spec.job_id.as_str().replace(['/', '\\'], "_"),
            spec.attempt
        ));
        Execution {
            container: container_name(&self.config.id, spec, &tag),
            tag,
            dir,
        }
    }

    /// Runs the job and always cleans up its folder and container. A panic in the job is caught:
    /// logged, cleaned up, and returned as an `Error` result of this attempt.
    pub async fn run(&self, spec: &JobSpec) -> Result<JobResult, RunError> {
        self.run_as(spec, &self.execution(spec)).await
    }

    /// `run` with the execution's names chosen by the caller.
    pub async fn run_as(&self, spec: &JobSpec, exec: &Execution) -> Result<JobResult, RunError> {
        let started_at = now();
        let started = Instant::now();
        let folder = JobFolder::create(&exec.dir, spec.job_id.as_str())
            .map_err(|e| RunError::Transient(format!("job folder {}: {e}", exec.dir.display())))?;
        // Known as running from the start, so a stop that comes while it sets up still counts.
        let stop = CancellationToken::new();
        unpoisoned(&self.running).insert(exec.tag.clone(), (spec.job_id.clone(), stop.clone()));
        let registered = Registered {
            running: &self.running,
            tag: exec.tag.clone(),
        };
        let supervised = AssertUnwindSafe(self.attempt(spec, exec, &stop, started_at.clone()))
            .catch_unwind()
            .await;
        drop(registered);
        match supervised {
            Ok(Ok(result)) => {
                folder.remove().await;
                self.metrics.observe_job(
                    spec.kind,
                    result.status,
                    started.elapsed(),
                    &result.usage,
                );
                info!(job = %spec.job_id, attempt = spec.attempt, execution = %exec.tag, status = ?result.status, seconds = started.elapsed().as_secs_f64(), "job finished");
                Ok(result)
            }
            Ok(Err(e)) => {
                folder.remove().await;
                Err(e)
            }
            Err(payload) => {
                let message = panic_message(payload.as_ref());
                error!(job = %spec.job_id, attempt = spec.attempt, execution = %exec.tag, panic = %message, "the job panicked; removing its container and folder and reporting it as an error");
                // The session went down with the job's future: remove its container by name.
                if let Err(e) = self.sandbox.remove_named(&exec.container).await {
                    warn!(job = %spec.job_id, container = %exec.container, error = %e, "could not remove the container of a panicked job");
                }
                folder.remove().await;
                let result = panicked_result(spec, &self.config.id, started_at, &message);
                self.metrics.job_panicked();
                self.metrics.observe_job(
                    spec.kind,
                    result.status,
                    started.elapsed(),
                    &result.usage,
                );
                Ok(result)
            }
        }
    }

    /// The execution proper: step, commit, the result.
    async fn attempt(
        &self,
        spec: &JobSpec,
        exec: &Execution,
        stop: &CancellationToken,
        started_at: String,
    ) -> Result<JobResult, RunError> {
        let mut art = Artifacts {
            blobs: &self.blobs,
            prefix: &spec.artifact_prefix,
            written: Default::default(),
        };
        let (step, usage, commit, pack, container_seconds) =
            self.execute(spec, exec, stop, &mut art).await?;
        Ok(JobResult {
            v: WIRE_VERSION,
            job_id: spec.job_id.clone(),
            run_id: spec.run_id.clone(),
            attempt: spec.attempt,
            status: step.status,
            // What a job reports may reach a later agent's prompt: no host path of this worker.
            output: without_host_paths(step.output),
            error: step.error.map(|e| shared::factory::strip_host_paths(&e)),
            commit,
            pack,
            artifacts: art.written,
            usage,
            worker: self.config.id.clone(),
            started_at,
            finished_at: now(),
            container_seconds,
        })
    }

    #[allow(clippy::type_complexity)]
    async fn execute(
        &self,
        spec: &JobSpec,
        exec: &Execution,
        stop: &CancellationToken,
        art: &mut Artifacts<'_>,
    ) -> Result<(StepOutcome, Usage, Option<String>, Option<String>, f64), RunError> {
        let dir = exec.dir.as_path();
        let bundle = self.bundle(&spec.graph_ref).await?;
        let node = bundle.graph.node(&spec.node).ok_or_else(|| {
            RunError::Permanent(format!(
                "node `{}` is not in the job's graph `{}`",
                spec.node, spec.graph_ref
            ))
        })?;

        let worktree = match &spec.worktree {
            Some(w) => {
                self.git.ensure_packs(&self.blobs, &w.packs).await?;
                Some(self.git.materialize(&w.commit, dir).await?)
            }
            None => None,
        };
        let mount = match &worktree {
            Some(wt) => wt.dir.clone(),
            None => {
                let empty = dir.join("wt");
                std::fs::create_dir_all(&empty).map_err(|e| RunError::Transient(e.to_string()))?;
                empty
            }
        };
        let writable = spec
            .worktree
            .as_ref()
            .is_some_and(|w| w.mode == WorktreeMode::Rw);
        {
            let (mount, user) = (mount.clone(), self.config.sandbox_user.clone());
            crate::safe_fs::blocking(move || hand_over(&mount, &user)).await;
        }

        let needs_container = match spec.kind {
            NodeKind::Agent | NodeKind::Command => true,
            NodeKind::Harness => matches!(
                node.op.as_deref(),
                Some(
                    "factory_verify"
                        | "run_tests"
                        | "check_skeleton"
                        | "check_build"
                        | "run_mutants"
                )
            ),
            _ => false,
        };
        let timeout = Duration::from_secs(spec.timeout_seconds);
        let container_started = Instant::now();
        let session: Option<Box<dyn Session>> = if needs_container {
            let image = spec
                .image
                .clone()
                .ok_or_else(|| RunError::Permanent(format!("node `{}` has no image", spec.node)))?;
            let sandbox_spec = SandboxSpec {
                name: exec.container.clone(),
                image,
                worktree: mount.clone(),
                writable,
                harness_dir: (spec.kind == NodeKind::Harness)
                    .then(|| harness_folder(dir, &self.config.sandbox_user))
                    .transpose()
                    .map_err(|e| RunError::Transient(e.to_string()))?,
                network: false,
                lifetime: timeout + Duration::from_secs(60),
                labels: vec![
                    (
                        crate::sandbox::docker::WORKER_LABEL.into(),
                        self.config.id.clone(),
                    ),
                    ("fleet.job".into(), spec.job_id.to_string()),
                    ("fleet.run".into(), spec.run_id.to_string()),
                ],
            };
            crate::faults::point("worker.before_container").await;
            match self.sandbox.start(&sandbox_spec).await {
                Ok(s) => {
                    crate::faults::point("worker.mid_run").await;
                    Some(s)
                }
                Err(SandboxError::MissingImage(image)) => {
                    let step = StepOutcome {
                        status: JobStatus::Error,
                        output: Value::Null,
                        error: Some(format!(
                            "image `{image}` is not present on worker `{}`",
                            self.config.id
                        )),
                    };
                    return Ok((step, Usage::default(), None, None, 0.0));
                }
                Err(e) => return Err(e.into()),
            }
        } else {
            None
        };

        let work = self.step(
            dir,
            spec,
            &bundle,
            worktree.as_ref(),
            session.as_deref(),
            art,
        );
        // The job folder's quota is watched while the step runs: the container writes the
        // worktree (and the harness folder) through bind mounts its own limits do not bound.
        let quota = self.resources.disk_quota;
        let watch = async {
            match quota {
                Some(q) => disk::watch(dir, q).await,
                None => std::future::pending().await,
            }
        };
        let stepped = tokio::select! {
            r = tokio::time::timeout(timeout, work) => Ended::Step(r),
            _ = stop.cancelled() => Ended::Stopped,
            over = watch => Ended::OverQuota(over),
        };
        if let Some(s) = &session {
            if let Err(e) = s.remove().await {
                warn!(job = %spec.job_id, error = %e, "could not remove the container");
            }
        }
        let container_seconds = if session.is_some() {
            container_started.elapsed().as_secs_f64()
        } else {
            0.0
        };
        // A writer quicker than the watch (between two walks) is caught here, once nothing
        // writes any more.
        let stepped = match (stepped, quota) {
            (Ended::Step(r), Some(q)) => match disk::over(disk::measure(dir).await, q) {
                Some(over) => Ended::OverQuota(over),
                None => Ended::Step(r),
            },
            (other, _) => other,
        };
        let (step, usage) = match stepped {
            Ended::Stopped => {
                info!(job = %spec.job_id, "job stopped: its run no longer needs it");
                (
                    StepOutcome {
                        status: JobStatus::Error,
                        output: Value::Null,
                        error: Some("stopped: the run ended".into()),
                    },
                    Usage::default(),
                )
            }
            Ended::OverQuota(over) => {
                // Measured again with the writer gone: how far past the quota it got.
                let settled = disk::measure(dir).await;
                warn!(job = %spec.job_id, used_bytes = over.used_bytes, limit_bytes = over.limit_bytes, after_kill_bytes = settled.bytes, "the job folder went over its disk quota; the job is ended");
                self.metrics.disk_quota_exceeded();
                return Ok((
                    quota_exceeded(over, settled),
                    Usage::default(),
                    None,
                    None,
                    container_seconds,
                ));
            }
            Ended::Step(Ok(r)) => r?,
            Ended::Step(Err(_)) => (
                StepOutcome {
                    status: JobStatus::TimedOut,
                    output: Value::Null,
                    error: Some(format!(
                        "the job ran past its {}s timeout",
                        spec.timeout_seconds
                    )),
                },
                Usage::default(),
            ),
        };

        let (mut commit, mut pack) = (None, None);

        if let (Some(wt), Some(w)) = (&worktree, &spec.worktree) {
            if w.commit_out && step.status == JobStatus::Ok {
                let message = commit_message(spec, &step.output, &usage);
                let made = match wt.blocking(move |wt| wt.commit_all(&message)).await {
                    Ok(made) => made,
                    // What the job left in the worktree cannot be committed (a nested
                    // repository, a path git refuses): the job's doing, never retried.
                    Err(e) if e.is_refused_content() => {
                        warn!(job = %spec.job_id, error = %e, "the worktree cannot be committed");
                        let refused = StepOutcome {
                            status: JobStatus::Failed,
                            output: json!({"scope_violation": {
                                "violations": [{"path": e.to_string(), "reason": "bad_path"}],
                                "scope": spec.write_scope,
                            }}),
                            error: Some(format!("the worktree cannot be committed: {e}")),
                        };
                        return Ok((
                            refused.merged_into(step),
                            usage,
                            None,
                            None,
                            container_seconds,
                        ));
                    }
                    Err(e) => return Err(e.into()),
                };
                let id = made.unwrap_or_else(|| wt.head());
                if spec.kind != NodeKind::Git {
                    if let Some(refused) = enforce_scope(spec, wt, &id).await? {
                        art.put_json("scope_violation.json", &refused.output["scope_violation"])
                            .await?;
                        return Ok((
                            refused.merged_into(step),
                            usage,
                            None,
                            None,
                            container_seconds,
                        ));
                    }
                }
                if id != wt.base() {
                    let commit_id = id.clone();
                    let bytes = wt
                        .blocking(move |wt| wt.pack_since_base(&commit_id))
                        .await?;
                    let key = format!("packs/{}.pack", shared::hashing::sha256_hex(&bytes));
                    self.blobs.put(&key, bytes).await?;
                    pack = Some(key);
                }
                commit = Some(id);
            }
        }
        Ok((step, usage, commit, pack, container_seconds))
    }

    async fn step(
        &self,
        dir: &Path,
        spec: &JobSpec,
        bundle: &GraphBundle,
        wt: Option<&Worktree>,
        session: Option<&dyn Session>,
        art: &mut Artifacts<'_>,
    ) -> Result<(StepOutcome, Usage), RunError> {
        let node = bundle.graph.node(&spec.node).expect("checked by execute");
        let timeout = Duration::from_secs(spec.timeout_seconds);
        let harness_dir = dir.join("harness");
        let seed = format!("{}:{}", spec.job_id, spec.attempt);
        let no_worktree = || RunError::Permanent(format!("node `{}` needs a worktree", spec.node));
        match spec.kind {
            NodeKind::Agent => {
                let session = session.expect("agents run in a container");
                let template_path = node.template.as_deref().unwrap_or_default();
                let schema_path = node.output_schema.as_deref().unwrap_or_default();
                let schema: Value = serde_json::from_str(bundle.file(schema_path).unwrap_or("{}"))
                    .map_err(|e| {
                        RunError::Permanent(format!(
                            "the output schema `{schema_path}` is not json: {e}"
                        ))
                    })?;
                let mut ctx = spec.vars.clone();
                ctx["params"] = spec.params.clone();
                ctx["context_files"] = match wt {
                    Some(wt) => {
                        let files = spec.context_files.clone();
                        wt.blocking(move |wt| read_context(&wt.dir, &files)).await
                    }
                    None => json!([]),
                };
                let prompt = match shared::expr::render(
                    template_path,
                    bundle.file(template_path).unwrap_or_default(),
                    &ctx,
                ) {
                    Ok(p) => p,
                    Err(e) => {
                        let step = StepOutcome {
                            status: JobStatus::Error,
                            output: Value::Null,
                            error: Some(e.to_string()),
                        };
                        return Ok((step, Usage::default()));
                    }
                };
                art.put("prompt.md", prompt.clone().into_bytes()).await?;
                let job = AgentJob {
                    node: spec.node.as_str(),
                    visit: spec.visit,
                    nudge_after: spec.nudge_after_seconds.map(Duration::from_secs),
                    prompt,
                    schema: &schema,
                    tools: ToolBox {
                        session,
                        allowed: &node.tools,
                        command_timeout: Duration::from_secs(120).min(timeout),
                    },
                };
                let prior = match &spec.continues {
                    Some(key) => Some(self.blobs.get_json::<Value>(key).await?),
                    None => None,
                };
                let mut out =
                    agent::run(job, &spec.agent, &self.config.llm, &self.http, prior).await;
                if out.status == JobStatus::Ok {
                    if let (Some(claims), Some(wt)) = (&node.claims, wt) {
                        let since = spec.worktree.as_ref().and_then(|w| w.run_base.as_deref());
                        let (claims, since) = (claims.clone(), since.map(str::to_string));
                        out = wt
                            .blocking(move |wt| {
                                check_claims(&claims, wt, since.as_deref(), &mut out);
                                out
                            })
                            .await;
                    }
                }
                art.put_json("transcript.json", &out.transcript).await?;
                art.put_json("output.json", &out.output).await?;
                Ok((
                    StepOutcome {
                        status: out.status,
                        output: out.output,
                        error: out.error,
                    },
                    out.usage,
                ))
            }
            NodeKind::Command => {
                let session = session.expect("commands run in a container");
                Ok((
                    harness::commands(&spec.commands, timeout, session, art).await?,
                    Usage::default(),
                ))
            }
            NodeKind::Harness => {
                let step = match node.op.as_deref() {
                    Some("apply_patch") => {
                        harness::apply_patch(
                            &spec.params,
                            spec.write_scope.as_ref(),
                            wt.ok_or_else(no_worktree)?,
                            art,
                        )
                        .await?
                    }
                    Some("factory_verify") => {
                        let session = session.expect("verification runs in a container");
                        harness::factory_verify(
                            &spec.params,
                            wt.ok_or_else(no_worktree)?,
                            session,
                            art,
                        )
                        .await?
                    }
                    Some("run_tests") => {
                        let place = verify::RunPlace {
                            session: session.expect("tests run in a container"),
                            wt: wt.ok_or_else(no_worktree)?,
                            harness_dir: &harness_dir,
                        };
                        verify::run_tests(&spec.params, &place, &seed, art).await?
                    }
                    Some("check_build") => {
                        let session = session.expect("the build runs in a container");
                        let root = wt.ok_or_else(no_worktree)?.dir.clone();
                        verify::check_build(&spec.params, &root, session, art).await?
                    }
                    Some("generate_mutants") => {
                        let params = spec.params.clone();
                        let step = wt
                            .ok_or_else(no_worktree)?
                            .blocking(move |wt| mutation::generate(&params, &wt.dir))
                            .await;
                        art.put_json("mutants.json", &step.output).await?;
                        step
                    }
                    Some("run_mutants") => {
                        let place = verify::RunPlace {
                            session: session.expect("mutants run in a container"),
                            wt: wt.ok_or_else(no_worktree)?,
                            harness_dir: &harness_dir,
                        };
                        mutation::run(&spec.params, &place, &seed, art).await?
                    }
                    Some("tally_mutants") => {
                        let step = mutation::tally(&spec.params);
                        art.put_json("mutation_tally.json", &step.output).await?;
                        step
                    }
                    Some("check_skeleton") => {
                        let session = session.expect("the build runs in a container");
                        harness::check_skeleton(
                            &spec.params,
                            wt.ok_or_else(no_worktree)?,
                            session,
                            art,
                        )
                        .await?
                    }
                    Some("noop") => StepOutcome {
                        status: JobStatus::Ok,
                        output: json!({}),
                        error: None,
                    },
                    other => StepOutcome {
                        status: JobStatus::Error,
                        output: Value::Null,
                        error: Some(format!("unknown harness op {other:?}")),
                    },
                };
                Ok((step, Usage::default()))
            }
            NodeKind::Git => {
                let op = node.op.as_deref().unwrap_or_default();
                let wt = wt.ok_or_else(no_worktree)?;
                let (op, job) = (op.to_string(), spec.clone());
                let step = wt
                    .blocking(move |wt| harness::git_step(&op, &job.params, &job, wt))
                    .await?;
                art.put_json("git_result.json", &step.output).await?;
                Ok((step, Usage::default()))
            }
            NodeKind::Exit | NodeKind::Join | NodeKind::Fanout | NodeKind::Approval => Ok((
                StepOutcome {
                    status: JobStatus::Error,
                    output: Value::Null,
                    error: Some(format!("{:?} nodes are not jobs", spec.kind).to_lowercase()),
                },
                Usage::default(),
            )),
        }
    }
}

/// How the step ended.
enum Ended {
    Step(Result<Result<(StepOutcome, Usage), RunError>, tokio::time::error::Elapsed>),
    /// The coordinator stopped the job (its run ended).
    Stopped,
    /// The job folder went over its disk quota.
    OverQuota(disk::Exceeded),
}

/// The outcome of a job whose folder went over its quota: a failure of the job's own doing
/// (like a scope violation), with both sizes; `settled` is the folder once the writer was gone.
fn quota_exceeded(over: disk::Exceeded, settled: disk::DiskUsage) -> StepOutcome {
    StepOutcome {
        status: JobStatus::Failed,
        output: json!({"disk_quota_exceeded": {
            "used_bytes": over.used_bytes,
            "limit_bytes": over.limit_bytes,
            "after_kill_bytes": settled.bytes,
        }}),
        error: Some(over.message()),
    }
}

/// The write scope, checked on git's own deltas between the job's start and its commit. `Some`
/// is the refusal: the commit is not handed on.
async fn enforce_scope(
    spec: &JobSpec,
    wt: &Worktree,
    commit: &str,
) -> Result<Option<StepOutcome>, RunError> {
    let changes = if commit == wt.base() {
        Vec::new()
    } else {
        let commit = commit.to_string();
        wt.blocking(move |wt| wt.changes(&wt.base(), &commit))
            .await?
    };
    let refuse = |violations: Vec<shared::scope::Violation>, error: String| {
        Some(StepOutcome {
            status: JobStatus::Failed,
            output: json!({"scope_violation": {
                "violations": violations,
                "scope": spec.write_scope,
                "changes": changes.len(),
            }}),
            error: Some(error),
        })
    };
    let Some(scope) = &spec.write_scope else {
        if changes.is_empty() {
            return Ok(None);
        }
        return Ok(refuse(
            Vec::new(),
            format!("node `{}` commits without a write scope", spec.node),
        ));
    };
    match shared::scope::check(scope, &changes) {
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => {
            warn!(job = %spec.job_id, violations = v.len(), "write scope violated");
            let error = shared::scope::describe(&v);
            Ok(refuse(v, error))
        }
        Err(e) => Ok(refuse(Vec::new(), e.to_string())),
    }
}

/// The commit convention: `<node>: <subject>`, a summary, and the Session, Node and Cost
/// trailers. The subject is the agent's `commit_msg` when it gives one.
fn commit_message(spec: &JobSpec, output: &Value, usage: &Usage) -> String {
    let subject = output
        .get("commit_msg")
        .and_then(Value::as_str)
        .map(|s| s.lines().next().unwrap_or_default().to_string())
        .unwrap_or_else(|| format!("visit {}", spec.visit));
    let summary = ["summary", "strategy", "design_notes"]
        .iter()
        .find_map(|k| output.get(*k).and_then(Value::as_str))
        .map(|s| format!("{}\n\n", shared::text::head(s, 500)))
        .unwrap_or_default();
    format!(
        "{}: {subject}\n\n{summary}Session: {}\nNode: {}\nCost: ${:.4}\n",
        spec.node, spec.run_id, spec.node, usage.cost_usd
    )
}

/// Checks the agent's claims against the files it changed; mismatches fail the job with
/// structured `claim_errors`.
fn check_claims(
    claims: &shared::graph::Claims,
    wt: &Worktree,
    since: Option<&str>,
    out: &mut agent::AgentOutcome,
) {
    let Some(lang) = crate::claims::language(&claims.language) else {
        return;
    };
    let ctx = serde_json::json!({"output": out.output});
    let names = |e: &Option<String>| -> Vec<Value> {
        e.as_deref()
            .and_then(|e| shared::expr::eval(e, &ctx).ok())
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
    };
    let defines: Vec<String> = names(&claims.defines)
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    let exercises: Vec<crate::claims::Exercise> = names(&claims.exercises)
        .iter()
        .filter_map(|v| {
            Some(crate::claims::Exercise {
                test: v.get(&claims.test_field)?.as_str()?.to_string(),
                calls: v
                    .get(&claims.calls_field)?
                    .as_array()?
                    .iter()
                    .filter_map(|c| c.as_str().map(str::to_string))
                    .collect(),
            })
        })
        .collect();
    let files = match wt.changed_files(since) {
        Ok(f) => f,
        Err(e) => {
            out.status = JobStatus::Error;
            out.error = Some(format!("cannot list changed files: {e}"));
            return;
        }
    };
    let mut declared = defines.clone();
    declared.extend(exercises.iter().map(|e| e.test.clone()));
    let undeclared = crate::claims::undeclared(lang.as_ref(), &files, &declared);
    if let Some(obj) = out.output.as_object_mut() {
        obj.insert(
            "undeclared_definitions".into(),
            serde_json::json!(undeclared),
        );
    }
    let errors = crate::claims::check(lang.as_ref(), &files, &defines, &exercises);
    if !errors.is_empty() {
        out.status = JobStatus::Failed;
        out.error = Some(format!(
            "claims do not match the files on disk: {}",
            errors
                .iter()
                .map(|e| e.detail.clone())
                .collect::<Vec<_>>()
                .join("; ")
        ));
        if let Some(obj) = out.output.as_object_mut() {
            obj.insert("claim_errors".into(), serde_json::json!(errors));
        }
    }
}

/// The execution tag at the end of a job folder's name (`<job>-a<attempt>-e<N>-<nonce>`).
fn folder_tag(name: &str) -> Option<&str> {
    let (rest, nonce) = name.rsplit_once('-')?;
    let (_, n) = rest.rsplit_once('-')?;
    let digits = n.strip_prefix('e')?;
    let plain = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric());
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || !plain(nonce) {
        return None;
    }
    Some(&name[name.len() - n.len() - 1 - nonce.len()..])
}

/// An entry of the jobs folder that no execution of the process with `nonce` made (anything
/// there that is not a job folder of this process counts too: the folder is the worker's).
fn left_by_another_process(name: &str, nonce: &str) -> bool {
    folder_tag(name)
        .and_then(|t| t.rsplit_once('-'))
        .map(|(_, n)| n)
        != Some(nonce)
}

/// A job folder older than `max_age` whose execution is not running.
fn stale(
    name: &str,
    age: Duration,
    running: &std::collections::HashSet<String>,
    max_age: Duration,
) -> bool {
    age > max_age && !folder_tag(name).is_some_and(|t| running.contains(t))
}

/// Removes the entries of `jobs` that `remove(name, age)` picks (age: since the entry last
/// changed); links are removed, never followed. Returns how many went.
fn sweep_job_dirs(jobs: &Path, remove: impl Fn(&str, Duration) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(jobs) else {
        return 0;
    };
    let now = std::time::SystemTime::now();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let age = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or_default();
        if !remove(&name, age) {
            continue;
        }
        let path = entry.path();
        let gone = if meta.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match gone {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(dir = %path.display(), error = %e, "could not remove a job folder")
            }
        }
    }
    removed
}

/// Container names are unique per worker, job, attempt and execution.
fn container_name(worker: &str, spec: &JobSpec, tag: &str) -> String {
    let raw = format!("fleet-{worker}-{}-a{}-{tag}", spec.job_id, spec.attempt);
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The prompt's context files, read by the harness: at most 10 files and 200 KB in all, cut
/// deterministically; paths that escape the worktree are refused.
fn read_context(root: &Path, files: &[String]) -> Value {
    let mut budget = MAX_CONTEXT_BYTES;
    let mut out = Vec::new();
    for f in files.iter().take(MAX_CONTEXT_FILES) {
        let Ok(rel) = normalize_relative(f) else {
            out.push(json!({"path": f, "content": "[refused: path escapes the worktree]", "truncated": false}));
            continue;
        };
        // Never through a link (a repo's `ctx.md -> /proc/self/environ` must not reach a prompt),
        // never more than the budget left.
        match crate::safe_fs::read_capped(root, &rel, budget) {
            Ok(read) => {
                budget -= read.bytes.len();
                out.push(json!({
                    "path": rel,
                    "content": String::from_utf8_lossy(&read.bytes),
                    "truncated": read.truncated,
                }));
            }
            Err(e) => out.push(json!({
                "path": rel,
                "content": format!("[refused: {e}]"),
                "truncated": false,
            })),
        }
    }
    Value::Array(out)
}

/// The job's harness folder (`/fleet` in its container): owned by the worker, so the job cannot
/// replace the configuration or canary the harness lays there; only `out/`, where the runner
/// writes its report, belongs to the container's user.
fn harness_folder(dir: &Path, user: &str) -> std::io::Result<PathBuf> {
    let h = dir.join("harness");
    std::fs::create_dir_all(h.join("out"))?;
    std::fs::create_dir_all(h.join("canary"))?;
    hand_over(&h.join("out"), user);
    Ok(h)
}

/// Gives the worktree to the container's user (the worker may run as root; containers never do).
fn hand_over(dir: &Path, user: &str) {
    let Some((uid, gid)) = user.split_once(':') else {
        return;
    };
    let (Ok(uid), Ok(gid)) = (uid.parse::<u32>(), gid.parse::<u32>()) else {
        return;
    };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let _ = std::os::unix::fs::lchown(&p, Some(uid), Some(gid));
        if let Ok(entries) = std::fs::read_dir(&p) {
            for e in entries.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    stack.push(e.path());
                } else {
                    let _ = std::os::unix::fs::lchown(e.path(), Some(uid), Some(gid));
                }
            }
        }
    }
}

/// `value` with the worker's host paths in every string made worktree-relative.
fn without_host_paths(value: Value) -> Value {
    match value {
        Value::String(s) => Value::String(shared::factory::strip_host_paths(&s)),
        Value::Array(items) => Value::Array(items.into_iter().map(without_host_paths).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, without_host_paths(v)))
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn no_host_path_of_the_worker_survives_in_a_reported_output() {
        let out = json!({
            "failures": [{"message": "/srv/fleet/w1/jobs/r1.fix.1-a1-e1-ab12/wt/src/x.py:3: boom"}],
            "n": 3,
        });
        let clean = without_host_paths(out);
        let text = clean.to_string();
        assert!(!text.contains("/srv/fleet"), "{text}");
        assert!(text.contains("src/x.py:3: boom"), "{text}");
        assert_eq!(clean["n"], 3);
    }
    use super::*;

    fn spec() -> JobSpec {
        serde_json::from_value(json!({
            "v": WIRE_VERSION, "job_id": "r1.po.1", "run_id": "r1", "node": "po", "visit": 1,
            "attempt": 2, "kind": "harness", "graph_ref": "g", "image": null,
            "timeout_seconds": 60, "params": {}, "context_files": [], "commands": [],
            "worktree": null, "artifact_prefix": "runs/r1/po_1/",
            "agent": shared::messages::AgentConfig::default(), "vars": null,
        }))
        .expect("a job spec")
    }

    #[test]
    fn the_panic_message_comes_from_str_and_string_payloads() {
        let caught = |f: fn()| std::panic::catch_unwind(f).expect_err("it panics");
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let literal = caught(|| panic!("a literal"));
        let formatted = caught(|| panic!("formatted {}", 42));
        let other = caught(|| std::panic::panic_any(7_u8));
        std::panic::set_hook(prev);
        assert_eq!(panic_message(literal.as_ref()), "a literal");
        assert_eq!(panic_message(formatted.as_ref()), "formatted 42");
        assert_eq!(panic_message(other.as_ref()), "a panic without a message");
    }

    #[test]
    fn a_panic_becomes_an_error_result_of_the_same_attempt() {
        let r = panicked_result(&spec(), "w1", "2024-01-01T00:00:00.000Z".into(), "boom");
        assert_eq!(r.status, JobStatus::Error);
        assert_eq!(
            r.error.as_deref(),
            Some("the worker panicked running this job: boom")
        );
        assert_eq!(r.attempt, 2);
        assert_eq!(r.job_id.as_str(), "r1.po.1");
        assert_eq!(r.run_id.as_str(), "r1");
        assert_eq!(r.worker, "w1");
        assert_eq!(r.output, Value::Null);
        assert!(r.commit.is_none() && r.pack.is_none() && r.artifacts.is_empty());
        // A huge message is cut, so the result stays small.
        let long = panicked_result(&spec(), "w1", String::new(), &"x".repeat(10_000));
        assert!(long.error.unwrap().len() < 2_200);
    }

    #[test]
    fn container_names_carry_the_execution_and_stay_docker_safe() {
        let name = container_name("w/1", &spec(), "e3-0abc12");
        assert_eq!(name, "fleet-w_1-r1.po.1-a2-e3-0abc12");
        assert_ne!(
            container_name("w1", &spec(), "e1-0abc12"),
            container_name("w1", &spec(), "e2-0abc12")
        );
    }

    #[test]
    fn job_folders_refuse_a_taken_path_and_go_when_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("jobs").join("r1.po.1-a2-e1-x");
        let folder = JobFolder::create(&dir, "r1.po.1").unwrap();
        std::fs::write(dir.join("file"), b"x").unwrap();
        assert!(
            JobFolder::create(&dir, "r1.po.1").is_err(),
            "two executions never share a folder"
        );
        assert!(dir.exists(), "the refused second one did not remove it");
        drop(folder);
        assert!(!dir.exists());
    }

    #[test]
    fn a_permanent_failure_becomes_an_error_result_of_the_same_attempt() {
        let r = permanent_result(
            &spec(),
            "w1",
            "2024-01-01T00:00:00.000Z".into(),
            "node `ghost` is not in the job's graph `g`",
        );
        assert_eq!(r.status, JobStatus::Error);
        assert_eq!(r.attempt, 2);
        assert_eq!(r.worker, "w1");
        let error = r.error.unwrap();
        assert!(error.contains("permanent"), "{error}");
        assert!(error.contains("node `ghost` is not in"), "{error}");
    }

    #[test]
    fn errors_are_classed_once_where_they_are_made() {
        let git = |code, class| GitError::Git(git2::Error::new(code, class, "x"));
        use git2::{ErrorClass, ErrorCode};
        // A commit that is not in the packs, an id that is not one: never on another try.
        let missing: RunError = git(ErrorCode::NotFound, ErrorClass::Odb).into();
        assert!(!missing.is_transient(), "{missing}");
        let bad_id: RunError = git(ErrorCode::GenericError, ErrorClass::Invalid).into();
        assert!(!bad_id.is_transient());
        // The disk, a lock, the store: maybe next time.
        let os: RunError = git(ErrorCode::GenericError, ErrorClass::Os).into();
        assert!(os.is_transient());
        let locked: RunError = git(ErrorCode::Locked, ErrorClass::Index).into();
        assert!(locked.is_transient());
        let io: RunError = GitError::Io(std::io::Error::other("disk full")).into();
        assert!(io.is_transient());
        let apply: RunError = GitError::Apply("hunk 1 failed".into()).into();
        assert!(!apply.is_transient());
        let store = |e| -> RunError { BlobError::Store(e).into() };
        assert!(!store(object_store::Error::NotFound {
            path: "graphs/g.json".into(),
            source: "gone".into()
        })
        .is_transient());
        assert!(store(object_store::Error::Generic {
            store: "S3",
            source: "connection reset".into()
        })
        .is_transient());
        let sandbox: RunError = SandboxError::Refused("root".into()).into();
        assert!(!sandbox.is_transient());
        assert_eq!(sandbox.reason(), "refused: root");
        let docker: RunError = SandboxError::Io(std::io::Error::other("socket")).into();
        assert!(docker.is_transient());
    }

    #[test]
    fn job_resources_come_from_the_environment_with_defaults() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let d = JobResources::from_lookup(env(&[])).unwrap();
        assert_eq!(d, JobResources::default());
        assert_eq!(d.disk_quota.unwrap().limit_bytes, DEFAULT_JOB_DISK_MB << 20);
        assert_eq!(d.dir_max_age, Duration::from_secs(86_400));
        assert_eq!(d.sweep_every(), Duration::from_secs(3600));
        let r = JobResources::from_lookup(env(&[
            ("FLEET_JOB_DISK_MB", "50"),
            ("FLEET_JOB_DIR_MAX_AGE_SECONDS", "2"),
        ]))
        .unwrap();
        assert_eq!(r.disk_quota.unwrap().limit_bytes, 50 << 20);
        assert_eq!(r.dir_max_age, Duration::from_secs(2));
        assert_eq!(r.sweep_every(), Duration::from_secs(1));
        let off = JobResources::from_lookup(env(&[("FLEET_JOB_DISK_MB", "0")])).unwrap();
        assert_eq!(off.disk_quota, None);
        for bad in [
            &[("FLEET_JOB_DISK_MB", "2G")][..],
            &[("FLEET_JOB_DISK_MB", "-1")],
            &[("FLEET_JOB_DISK_MB", "99999999999999999")],
            &[("FLEET_JOB_DIR_MAX_AGE_SECONDS", "0")],
            &[("FLEET_JOB_DIR_MAX_AGE_SECONDS", "1d")],
        ] {
            let bad: &'static [(&'static str, &'static str)] = bad;
            let e = JobResources::from_lookup(env(bad)).unwrap_err();
            assert!(e.contains(bad[0].0), "{e}");
        }
    }

    #[test]
    fn job_folder_names_end_with_their_execution_tag() {
        assert_eq!(folder_tag("r1.po.1-a2-e3-0abc12"), Some("e3-0abc12"));
        assert_eq!(folder_tag("r1.my-node.1-a1-e10-ff00aa"), Some("e10-ff00aa"));
        for odd in [
            "",
            "x",
            "r1.po.1",
            "r1-a1-ex-0abc12",
            "r1-a1-e1-",
            "r1-a1-e-0abc",
            "e1-0a",
        ] {
            assert_eq!(folder_tag(odd), None, "{odd}");
        }
        // Nonces are made so.
        let n = process_nonce();
        assert_eq!(
            folder_tag(&format!("j-a1-e1-{n}")),
            Some(&*format!("e1-{n}"))
        );
    }

    #[test]
    fn at_start_every_folder_but_this_processes_goes() {
        assert!(left_by_another_process("r1.po.1-a1-e4-aaaaaa", "bbbbbb"));
        assert!(!left_by_another_process("r1.po.1-a1-e4-bbbbbb", "bbbbbb"));
        assert!(left_by_another_process("stray-file", "bbbbbb"));
        assert!(left_by_another_process("x-a1-e1-abbbbbb", "bbbbbb"));
    }

    #[test]
    fn only_old_folders_of_executions_not_running_are_stale() {
        let day = Duration::from_secs(86_400);
        let running: std::collections::HashSet<String> = ["e1-aaaaaa".to_string()].into();
        let old = day + Duration::from_secs(1);
        assert!(!stale("r1.a.1-a1-e1-aaaaaa", old, &running, day), "running");
        assert!(stale("r1.a.1-a1-e2-aaaaaa", old, &running, day));
        assert!(
            !stale("r1.a.1-a1-e2-aaaaaa", day, &running, day),
            "not older"
        );
        assert!(stale("leftover", old, &running, day));
        assert!(!stale("leftover", Duration::ZERO, &running, day));
    }

    #[test]
    fn a_folder_over_its_quota_fails_the_job_with_both_sizes() {
        let step = quota_exceeded(
            disk::Exceeded {
                used_bytes: 60 << 20,
                limit_bytes: 50 << 20,
            },
            disk::DiskUsage {
                bytes: 70 << 20,
                entries: 3,
            },
        );
        assert_eq!(step.status, JobStatus::Failed);
        assert!(step
            .error
            .as_deref()
            .unwrap()
            .starts_with("disk_quota_exceeded: "));
        assert_eq!(
            step.output,
            json!({"disk_quota_exceeded": {
                "used_bytes": 60 << 20, "limit_bytes": 50 << 20, "after_kill_bytes": 70 << 20
            }})
        );
    }
}
