//! Runs one job: worktree in, container up, the node's step, commit and pack out, container
//! gone, job folder gone. Infrastructure failures that may pass are `Transient` (the job is
//! requeued); everything else becomes a `JobResult` (the engine decides what it means).
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
}

impl From<BlobError> for RunError {
    fn from(e: BlobError) -> Self {
        RunError::Transient(e.to_string())
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

/// The job folder, removed whenever the execution ends: a result, an error, a panic.
struct JobFolder {
    dir: PathBuf,
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
            dir: dir.to_path_buf(),
            job: job.to_string(),
        })
    }
}

impl Drop for JobFolder {
    fn drop(&mut self) {
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(job = %self.job, dir = %self.dir.display(), error = %e, "could not remove the job folder")
            }
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

/// The result of an execution that panicked: an infrastructure error of this attempt, routed by
/// the engine like any other.
pub fn panicked_result(
    spec: &JobSpec,
    worker: &str,
    started_at: String,
    message: &str,
) -> JobResult {
    JobResult {
        v: WIRE_VERSION,
        job_id: spec.job_id.clone(),
        run_id: spec.run_id.clone(),
        attempt: spec.attempt,
        status: JobStatus::Error,
        output: Value::Null,
        error: Some(format!(
            "the worker panicked running this job: {}",
            shared::text::head(message, 2000)
        )),
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
    pub fn new(
        config: WorkerConfig,
        blobs: Blobs,
        sandbox: Arc<dyn Sandbox>,
        metrics: Metrics,
    ) -> Result<Self, GitError> {
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
            git,
            http: reqwest::Client::new(),
            graphs: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            executions: AtomicU64::new(0),
            nonce: process_nonce(),
        })
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
                drop(folder);
                self.metrics.observe_job(
                    spec.kind,
                    result.status,
                    started.elapsed(),
                    &result.usage,
                );
                info!(job = %spec.job_id, attempt = spec.attempt, execution = %exec.tag, status = ?result.status, seconds = started.elapsed().as_secs_f64(), "job finished");
                Ok(result)
            }
            Ok(Err(e)) => Err(e),
            Err(payload) => {
                let message = panic_message(payload.as_ref());
                error!(job = %spec.job_id, attempt = spec.attempt, execution = %exec.tag, panic = %message, "the job panicked; removing its container and folder and reporting it as an error");
                // The session went down with the job's future: remove its container by name.
                if let Err(e) = self.sandbox.remove_named(&exec.container).await {
                    warn!(job = %spec.job_id, container = %exec.container, error = %e, "could not remove the container of a panicked job");
                }
                drop(folder);
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
            output: step.output,
            error: step.error,
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
        let node = bundle
            .graph
            .node(&spec.node)
            .ok_or_else(|| RunError::Transient(format!("node `{}` not in graph", spec.node)))?;

        let worktree = match &spec.worktree {
            Some(w) => {
                self.git
                    .ensure_packs(&self.blobs, &w.packs)
                    .await
                    .map_err(|e| RunError::Transient(e.to_string()))?;
                let wt = self
                    .git
                    .materialize(&w.commit, dir)
                    .map_err(|e| RunError::Transient(e.to_string()))?;
                Some(wt)
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
        hand_over(&mount, &self.config.sandbox_user);

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
                .ok_or_else(|| RunError::Transient(format!("node `{}` has no image", spec.node)))?;
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
                Err(e) => return Err(RunError::Transient(e.to_string())),
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
        let stepped = tokio::select! {
            r = tokio::time::timeout(timeout, work) => Some(r),
            _ = stop.cancelled() => None,
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
        let (step, usage) = match stepped {
            None => {
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
            Some(Ok(r)) => r?,
            Some(Err(_)) => (
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
                let made = match wt.commit_all(&message) {
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
                    Err(e) => return Err(RunError::Transient(e.to_string())),
                };
                let id = made.unwrap_or_else(|| wt.head());
                if spec.kind != NodeKind::Git {
                    if let Some(refused) = enforce_scope(spec, wt, &id)? {
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
                    let bytes = wt
                        .pack_since_base(&id)
                        .map_err(|e| RunError::Transient(e.to_string()))?;
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
        let no_worktree = || RunError::Transient(format!("node `{}` needs a worktree", spec.node));
        match spec.kind {
            NodeKind::Agent => {
                let session = session.expect("agents run in a container");
                let template_path = node.template.as_deref().unwrap_or_default();
                let schema_path = node.output_schema.as_deref().unwrap_or_default();
                let schema: Value = serde_json::from_str(bundle.file(schema_path).unwrap_or("{}"))
                    .map_err(|e| RunError::Transient(e.to_string()))?;
                let mut ctx = spec.vars.clone();
                ctx["params"] = spec.params.clone();
                ctx["context_files"] = match wt {
                    Some(wt) => read_context(&wt.dir, &spec.context_files),
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
                        check_claims(claims, wt, since, &mut out);
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
                        let step =
                            mutation::generate(&spec.params, &wt.ok_or_else(no_worktree)?.dir);
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
                let step = harness::git_step(op, &spec.params, spec, wt)
                    .map_err(|e| RunError::Transient(e.to_string()))?;
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

/// The write scope, checked on git's own deltas between the job's start and its commit. `Some`
/// is the refusal: the commit is not handed on.
fn enforce_scope(
    spec: &JobSpec,
    wt: &Worktree,
    commit: &str,
) -> Result<Option<StepOutcome>, RunError> {
    let changes = if commit == wt.base() {
        Vec::new()
    } else {
        wt.changes(&wt.base(), commit)
            .map_err(|e| RunError::Transient(e.to_string()))?
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

#[cfg(test)]
mod tests {
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
}
