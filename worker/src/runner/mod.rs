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
//!
//! Here: `Runner`, `run`/`run_as` (the supervision: folder, stop registry, panic) and the result
//! of an attempt. `execution.rs`: execution names, the job folder and registry guards, stops;
//! `execute.rs`: worktree, container, the step under its timeout, stop and quota; `step.rs`: the
//! node's step by kind; `commit.rs`: commit, write scope and pack out; `cleanup.rs`: sweeps of
//! the jobs folder; `disk_pressure.rs`: what a low disk gives back (checkouts, the mirror, job
//! folders, unused images); `resources.rs`: quota and folder age from the environment;
//! `holdings.rs`: the images held here (a container of them started); `results.rs`: results
//! the runner makes itself; `error.rs`: `RunError` and `StartError`; `cache.rs`: the
//! step cache's lookups and keeps (`shared::step_cache`).

mod cache;
mod cleanup;
mod commit;
mod disk_pressure;
mod error;
mod evidence;
mod execute;
mod execution;
mod holdings;
mod incremental;
mod preflight;
mod resources;
mod results;
mod step;
#[cfg(test)]
mod tests;
mod verifier;

pub use cache::STEP_CACHE_ENV;
pub use error::{RunError, StartError};
pub use execution::Execution;
pub use resources::{JobResources, DEFAULT_JOB_DIR_MAX_AGE_SECONDS, DEFAULT_JOB_DISK_MB};
pub use results::{error_result, panic_message, panicked_result, permanent_result, Ran};

use crate::agent::LlmSettings;
use crate::blobs::Blobs;
use crate::git::GitCache;
use crate::harness::Artifacts;
use crate::metrics::{JobPhase, Metrics};
use crate::sandbox::{Limits, Sandbox};
use chrono::{DateTime, Utc};
use execute::Executed;
pub(crate) use execution::process_nonce;
use execution::{unpoisoned, JobFolder, Registered, StopRegistry};
use futures::FutureExt;
use results::without_host_paths;
use shared::graph::GraphBundle;
use shared::messages::{JobResult, JobSpec, WIRE_VERSION};
use shared::time::{Clock, SystemClock};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    pub id: String,
    pub work_dir: PathBuf,
    pub concurrency: usize,
    /// `uid:gid` the containers run as (never root).
    pub sandbox_user: String,
    pub llm: LlmSettings,
    pub limits: Limits,
    /// The images each team's jobs may run, by id (`FLEET_TEAM_IMAGES`; empty: any).
    pub images: shared::images::ImageAllow,
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
    running: StopRegistry,
    /// Executions started by this process; with `nonce`, the execution tags.
    executions: AtomicU64,
    /// Random per process: tags stay unique across restarts of a worker with the same id.
    nonce: String,
    /// Where the times of results come from (`SystemClock` by default).
    pub clock: Arc<dyn Clock>,
    /// Whether steps are looked up in and kept in the step cache (`FLEET_STEP_CACHE`).
    pub cache_enabled: bool,
    /// The inboxes of the incremental sessions running here, and messages that came before
    /// their session did.
    mailroom: Mutex<incremental::Mailroom>,
    /// Where progress notices go (set by the consumer that serves this runner).
    notices: std::sync::OnceLock<Arc<dyn crate::queue::Broker>>,
    /// When unused images were last pruned under disk pressure; locked while one is.
    image_prune: tokio::sync::Mutex<Option<Instant>>,
    /// The images a container of was started here, announced to the consumer.
    holdings: holdings::Holdings,
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
        // Overlays a killed process left mounted go before anything under them is removed.
        let unmounted = crate::git::layered::unmount_within(&config.work_dir);
        if unmounted > 0 {
            info!(
                count = unmounted,
                "unmounted the worktree overlays an earlier process left"
            );
        }
        let layered = crate::git::layered::decide(
            crate::git::layered::Mode::from_env().map_err(StartError::Config)?,
            &config.work_dir.join("layered-probe"),
        )
        .map_err(StartError::Config)?;
        let owner = crate::sandbox::check_user(&config.sandbox_user).ok();
        let git = GitCache::open(&config.work_dir.join("git"), owner, layered)?;
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
            clock: Arc::new(SystemClock),
            cache_enabled: cache::enabled_from_env(),
            mailroom: Mutex::new(incremental::Mailroom::default()),
            notices: std::sync::OnceLock::new(),
            image_prune: tokio::sync::Mutex::new(None),
            holdings: holdings::Holdings::default(),
        })
    }

    /// The images this worker holds (has started a container of), each announced once: those
    /// held already at once, the rest as they come. For the first caller only.
    pub fn held_images(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        self.holdings.listen()
    }

    /// Replaces the system clock (tests, embedders).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Replaces the job resources read from the environment (tests, embedders).
    pub fn with_resources(mut self, resources: JobResources) -> Self {
        self.resources = resources;
        self
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

    /// Runs the job and always cleans up its folder and container. A panic in the job is caught:
    /// logged, cleaned up, and returned as an `Error` result of this attempt.
    pub async fn run(&self, spec: &JobSpec) -> Result<JobResult, RunError> {
        self.run_as(spec, &self.execution(spec)).await
    }

    /// `run` with the execution's names chosen by the caller.
    pub async fn run_as(&self, spec: &JobSpec, exec: &Execution) -> Result<JobResult, RunError> {
        let started_at = self.clock.now();
        let started = Instant::now();
        let folder = if self.needs_folder(spec).await {
            let _timer = self.metrics.time(JobPhase::Folder);
            let folder = JobFolder::create(&exec.dir, spec.job_id.as_str()).map_err(|e| {
                RunError::Transient(format!("job folder {}: {e}", exec.dir.display()))
            })?;
            Some(folder)
        } else {
            None
        };
        // Known as running from the start, so a stop that comes while it sets up still counts.
        let stop = CancellationToken::new();
        unpoisoned(&self.running).insert(exec.tag.clone(), (spec.job_id.clone(), stop.clone()));
        let registered = Registered {
            running: &self.running,
            tag: exec.tag.clone(),
        };
        let supervised = AssertUnwindSafe(self.attempt(spec, exec, &stop, started_at))
            .catch_unwind()
            .await;
        drop(registered);
        match supervised {
            Ok(Ok(result)) => {
                if folder.is_some() {
                    let _timer = self.metrics.time(JobPhase::FolderRemoval);
                    JobFolder::remove_if_made(folder).await;
                }
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
                JobFolder::remove_if_made(folder).await;
                Err(e)
            }
            Err(payload) => {
                let message = panic_message(payload.as_ref());
                error!(job = %spec.job_id, attempt = spec.attempt, execution = %exec.tag, panic = %message, "the job panicked; removing its container and folder and reporting it as an error");
                // The session went down with the job's future: remove its container by name.
                if let Err(e) = self.sandbox.remove_named(&exec.container).await {
                    warn!(job = %spec.job_id, container = %exec.container, error = %e, "could not remove the container of a panicked job");
                }
                JobFolder::remove_if_made(folder).await;
                let ran = Ran {
                    started_at,
                    finished_at: self.clock.now(),
                };
                let result = panicked_result(spec, &self.config.id, &exec.tag, ran, &message);
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

    /// Whether an execution of the job needs a job folder: a worktree, or a container (its
    /// mounts, its harness folder). A step in the worker's own process without a worktree writes
    /// nothing to disk, and a job folder costs it more than the step (a directory made and
    /// removed, given away and watched). When unsure (the graph unreadable), it gets one.
    async fn needs_folder(&self, spec: &JobSpec) -> bool {
        match self.bundle(&spec.graph_ref).await {
            Ok(b) => needs_job_folder(spec, b.graph.node(&spec.node).map(|n| &n.body)),
            Err(_) => true,
        }
    }

    /// The execution proper: the step cache looked up (a hit is the result), else step and
    /// commit, the result kept in the cache when it is a verdict.
    async fn attempt(
        &self,
        spec: &JobSpec,
        exec: &Execution,
        stop: &CancellationToken,
        started_at: DateTime<Utc>,
    ) -> Result<JobResult, RunError> {
        let key = match self.step_key(spec).await {
            Ok(k) => k,
            Err(e) => {
                warn!(job = %spec.job_id, error = %e, "cannot compute the step's cache key; running it");
                None
            }
        };
        if let Some(key) = &key {
            if let Some(hit) = self.reuse(spec, exec, key).await {
                return Ok(hit);
            }
        }
        let prefix = exec.artifact_prefix(spec);
        let mut art = Artifacts {
            blobs: &self.blobs,
            prefix: &prefix,
            written: Default::default(),
            events: Vec::new(),
        };
        let Executed {
            step,
            usage,
            commit,
            pack,
            container_seconds,
        } = self.execute(spec, exec, stop, &mut art).await?;
        let result = JobResult {
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
            execution: exec.tag.clone(),
            started_at,
            finished_at: self.clock.now(),
            container_seconds,
            cached_from: None,
            events: shared::tracking::events::bounded(art.events),
        };
        if let Some(key) = &key {
            self.keep(spec, exec, key, &result).await;
        }
        Ok(result)
    }
}

/// Whether an execution needs a job folder: a worktree, a container, or a node the graph does
/// not have (the step fails, and the folder costs nothing next to being sure).
pub(super) fn needs_job_folder(spec: &JobSpec, node: Option<&shared::graph::NodeBody>) -> bool {
    spec.worktree.is_some() || node.is_none_or(|body| body.needs_container())
}
