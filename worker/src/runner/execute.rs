//! The execution proper: the worktree materialised and handed to the container's user, the
//! container started (the `worker.before_container` and `worker.mid_run` fault points), the step
//! run under its timeout, the stop token and the job folder's disk quota, the container removed,
//! then the commit handed on (`commit.rs`).

use super::{RunError, Runner};
use crate::agent::gateway::Gateway;
use crate::harness::{Artifacts, StepOutcome};
use crate::metrics::JobPhase;
use crate::sandbox::disk;
use crate::sandbox::{SandboxError, SandboxSpec, Session};
use serde_json::{json, Value};
use shared::graph::{NodeBody, NodeKind, WorktreeMode};
use shared::messages::{AgentConfig, JobSpec, JobStatus, LlmBudget, Usage};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::execution::Execution;

/// What an execution produced: the step's outcome and usage, the commit and pack it hands on
/// (none unless the step passed and its node commits), and how long its container ran.
pub(super) struct Executed {
    pub(super) step: StepOutcome,
    pub(super) usage: Usage,
    pub(super) commit: Option<String>,
    pub(super) pack: Option<String>,
    pub(super) container_seconds: f64,
}

impl Executed {
    /// An outcome that hands no commit on.
    pub(super) fn uncommitted(step: StepOutcome, usage: Usage, container_seconds: f64) -> Self {
        Self {
            step,
            usage,
            commit: None,
            pack: None,
            container_seconds,
        }
    }
}

impl Runner {
    pub(super) async fn execute(
        &self,
        spec: &JobSpec,
        exec: &Execution,
        stop: &CancellationToken,
        art: &mut Artifacts<'_>,
    ) -> Result<Executed, RunError> {
        let dir = exec.dir.as_path();
        let bundle = self.bundle(&spec.graph_ref).await?;
        let node = bundle.graph.node(&spec.node).ok_or_else(|| {
            RunError::Permanent(format!(
                "node `{}` is not in the job's graph `{}`",
                spec.node, spec.graph_ref
            ))
        })?;

        let worktree_timer = spec
            .worktree
            .is_some()
            .then(|| self.metrics.time(JobPhase::Worktree));
        if spec.worktree.is_some() {
            // A low disk first gives back what no job is using (this job's worktree needs room).
            self.relieve_disk_pressure().await;
        }
        // Held until the execution ends: the shared checkout stays while this job reads it,
        // and the mirror whose objects its git directory reads.
        let mut _checkout_lease = None;
        let mut _mirror_hold = None;
        let worktree = match &spec.worktree {
            Some(w) => {
                _mirror_hold = Some(self.git.hold().await);
                self.git.ensure_packs(&self.blobs, &w.packs).await?;
                let (wt, lease) = match self.checkout_use(w, &node.body).await? {
                    CheckoutUse::Shared => {
                        let (wt, lease) = self.git.materialize_shared(&w.commit, dir).await?;
                        (wt, Some(lease))
                    }
                    CheckoutUse::Layered => {
                        let (wt, lease) = self.git.materialize_layered(&w.commit, dir).await?;
                        (wt, Some(lease))
                    }
                    CheckoutUse::Private => (self.git.materialize(&w.commit, dir).await?, None),
                };
                let how = match (&lease, wt.is_shared()) {
                    (None, _) => "private",
                    (Some(l), true) if l.created() => "shared_new",
                    (Some(_), true) => "shared",
                    (Some(l), false) if l.created() => "layered_new",
                    (Some(_), false) => "layered",
                };
                self.metrics.worktrees.with_label_values(&[how]).inc();
                _checkout_lease = lease;
                if let Some(branches) = &w.git {
                    self.git.expose(&wt, branches.clone()).await?;
                }
                Some(wt)
            }
            None => None,
        };
        drop(worktree_timer);
        let shared_worktree = worktree.as_ref().is_some_and(|wt| wt.is_shared());
        let layered_worktree = worktree.as_ref().is_some_and(|wt| wt.is_layered());
        let needs_container = node.needs_container();
        // A step in the worker's own process without a worktree (a no-op, a tally) has no job
        // folder (`run_as` made none): nothing to mount, give away or watch.
        let folderless = !super::needs_job_folder(spec, Some(&node.body));
        let mount = match &worktree {
            Some(wt) => wt.dir.clone(),
            None => {
                let empty = dir.join("wt");
                if !folderless {
                    std::fs::create_dir_all(&empty)
                        .map_err(|e| RunError::Transient(e.to_string()))?;
                }
                empty
            }
        };
        let writable = spec
            .worktree
            .as_ref()
            .is_some_and(|w| w.mode == WorktreeMode::Rw);
        // A shared checkout is only read (its files readable by all); nothing to give away. A
        // layered worktree's files are its checkout's, the sandbox user's already: only its root
        // and what the worker wrote into it (a git directory of its own) are given away (a
        // change of owner of every file through the overlay would copy each one up).
        if !shared_worktree && !folderless {
            let _timer = self.metrics.time(JobPhase::HandOver);
            let (mount, user) = (mount.clone(), self.config.sandbox_user.clone());
            crate::safe_fs::blocking(move || {
                if layered_worktree {
                    hand_over_layered(&mount, &user)
                } else {
                    hand_over(&mount, &user)
                }
            })
            .await;
        }

        let timeout = Duration::from_secs(spec.timeout_seconds);
        let container_started = Instant::now();
        // A command agent's way to the model: its gateway, on a socket only its container
        // mounts.
        let gateway = match (&spec.agent, &node.body) {
            (AgentConfig::Command(c), NodeBody::Agent(_)) => Some(
                Gateway::start(
                    &gateway_dir(&self.config.work_dir, dir),
                    c,
                    spec.llm_budget
                        .unwrap_or(LlmBudget::left(c, &Usage::default())),
                    spec.llm_usd_left,
                    &self
                        .config
                        .llm
                        .for_job(spec.run_id.as_str(), spec.team.as_deref()),
                    &self.http,
                )
                .map_err(|e| RunError::Transient(format!("cannot start the llm gateway: {e}")))?,
            ),
            _ => None,
        };
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
                shared_worktree,
                layered_worktree,
                harness_dir: (spec.kind == NodeKind::Harness)
                    .then(|| harness_folder(dir, &self.config.sandbox_user))
                    .transpose()
                    .map_err(|e| RunError::Transient(e.to_string()))?,
                network: false,
                gateway_dir: gateway.as_ref().map(|g| g.dir().to_path_buf()),
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
            if let Some(step) = self.image_refused(spec, &sandbox_spec.image).await {
                return Ok(Executed::uncommitted(step, Usage::default(), 0.0));
            }
            crate::faults::point("worker.before_container").await;
            match self.sandbox.start(&sandbox_spec).await {
                Ok(s) => {
                    self.holdings.hold(&sandbox_spec.image);
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
                    return Ok(Executed::uncommitted(step, Usage::default(), 0.0));
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
            super::step::Place {
                wt: worktree.as_ref(),
                session: session.as_deref(),
                gateway,
            },
            art,
        );
        // The job folder's quota is watched while the step runs: the container writes the
        // worktree (and the harness folder) through bind mounts its own limits do not bound.
        let quota = self.resources.disk_quota.filter(|_| !folderless);
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
            let life = container_started.elapsed();
            self.metrics.job_phase(JobPhase::Container, life);
            life.as_secs_f64()
        } else {
            0.0
        };
        // The last disk measure and the commit handed on, whichever way the job ends.
        let _after = self.metrics.time(JobPhase::AfterContainer);
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
                return Ok(Executed::uncommitted(
                    quota_exceeded(over, settled),
                    Usage::default(),
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

        match (&worktree, &spec.worktree) {
            (Some(wt), Some(w)) if w.commit_out && step.status == JobStatus::Ok => {
                self.commit_out(spec, wt, step, usage, container_seconds, art)
                    .await
            }
            _ => Ok(Executed::uncommitted(step, usage, container_seconds)),
        }
    }
}

/// With a warm pool, a job of a commit of fewer files than this checks out a worktree of its
/// own and takes a warm container (which saves more than the checkout costs); of more, it
/// shares the commit's checkout (or layers over it) and starts its container cold.
pub const SHARE_OVER_WARM_FILES: usize = 2_000;

impl Runner {
    /// The job's error when its team may not run `image` (the operator's allow-list by image
    /// id); never a container of it.
    async fn image_refused(&self, spec: &JobSpec, image: &str) -> Option<StepOutcome> {
        if !self.config.images.is_set() || spec.team.is_none() {
            return None;
        }
        let id = self.sandbox.image_id(image).await.ok().flatten();
        let why = self
            .config
            .images
            .refused(spec.team.as_deref(), image, id.as_deref())?;
        warn!(job = %spec.job_id, team = spec.team.as_deref().unwrap_or("-"), image, "image refused");
        Some(StepOutcome {
            status: JobStatus::Error,
            output: Value::Null,
            error: Some(why),
        })
    }

    /// How a job's worktree is made: on its commit's shared checkout when the job only reads it
    /// (`may_share_checkout`), else layered over that checkout when this worker layers; else
    /// checked out. With a warm pool, a commit of fewer than `SHARE_OVER_WARM_FILES` files is
    /// checked out (a warm container takes only a folder it can move).
    async fn checkout_use(
        &self,
        w: &shared::messages::WorktreeSpec,
        body: &NodeBody,
    ) -> Result<CheckoutUse, RunError> {
        let wanted = if !self.git.shares_checkouts() {
            CheckoutUse::Private
        } else if may_share_checkout(w, body) {
            CheckoutUse::Shared
        } else if self.git.layers_worktrees() {
            CheckoutUse::Layered
        } else {
            CheckoutUse::Private
        };
        if wanted == CheckoutUse::Private
            || !self.sandbox.keeps_warm()
            || self.git.file_count(&w.commit).await? >= SHARE_OVER_WARM_FILES
        {
            return Ok(wanted);
        }
        Ok(CheckoutUse::Private)
    }
}

/// How a job's worktree is made (`Runner::checkout_use`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CheckoutUse {
    /// The commit's checkout its read-only jobs share, mounted read-only.
    Shared,
    /// An overlay of the job's own on that checkout.
    Layered,
    /// A checkout of the job's own.
    Private,
}

/// Whether a job may read the checkout its commit's read-only jobs share: a read-only worktree
/// without a git directory of its own, for a step the worker never writes from its side (an
/// agent, whose tools act inside its container; commands). Harness steps may restore tests,
/// apply mutants or render files into a read-only worktree from the worker's side: never shared.
pub(super) fn may_share_checkout(w: &shared::messages::WorktreeSpec, body: &NodeBody) -> bool {
    w.mode == WorktreeMode::Ro
        && !w.commit_out
        && w.git.is_none()
        && matches!(body, NodeBody::Agent(_) | NodeBody::Command { .. })
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
pub(super) fn quota_exceeded(over: disk::Exceeded, settled: disk::DiskUsage) -> StepOutcome {
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

/// The job's harness folder (`/fleet` in its container): owned by the worker, so the job cannot
/// replace the configuration or canary the harness lays there; only `out/`, where the runner
/// writes its report, belongs to the container's user.
/// The folder of a job's gateway socket: short and of its own under the worker's folder
/// (`<work>/gw/<16 hex>`: a unix socket's path is at most 107 bytes, which a job folder named
/// after a long run and node would pass; and the worker's folder is the one a deployment shares
/// with the Docker host at the same path, so the container's bind mount finds it), named after
/// the job folder so that two executions never share one.
fn gateway_dir(work_dir: &Path, job_dir: &Path) -> PathBuf {
    let tag = shared::hashing::sha256_hex(job_dir.as_os_str().as_encoded_bytes());
    work_dir.join("gw").join(&tag[..16])
}

fn harness_folder(dir: &Path, user: &str) -> std::io::Result<PathBuf> {
    let h = dir.join("harness");
    std::fs::create_dir_all(h.join("out"))?;
    std::fs::create_dir_all(h.join("canary"))?;
    hand_over(&h.join("out"), user);
    Ok(h)
}

/// Gives the worktree to the container's user (the worker may run as root; containers never do).
fn hand_over(dir: &Path, user: &str) {
    if let Ok((uid, gid)) = crate::sandbox::check_user(user) {
        let _ = crate::sandbox::give_tree(dir, uid, gid);
    }
}

/// `hand_over` for a layered worktree: its root, and its `.git` if the worker wrote one (every
/// other file is its checkout's, the sandbox user's already).
fn hand_over_layered(dir: &Path, user: &str) {
    if let Ok((uid, gid)) = crate::sandbox::check_user(user) {
        let _ = std::os::unix::fs::lchown(dir, Some(uid), Some(gid));
    }
    let dot_git = dir.join(".git");
    if std::fs::symlink_metadata(&dot_git).is_ok_and(|m| m.is_dir()) {
        hand_over(&dot_git, user);
    }
}
