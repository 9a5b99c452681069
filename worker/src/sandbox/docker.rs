//! Docker adapter (bollard). Every container is locked down: no network unless asked, a
//! non-root user, all capabilities dropped, no new privileges, read-only root with a small
//! `/tmp` and `/dev/shm` (tmpfs, capped), limits on memory, CPU and pids, no Docker socket, and a
//! lifetime after which its own `sleep` ends it. Only this module knows bollard.
//!
//! Docker's init (`docker-init`, tini) is the container's PID 1: it reaps the zombies a job's
//! daemons leave and forwards signals. Its child, the `sleep` that keeps the container up, runs
//! as a *keeper* user that is not the job's: every command of the job is exec'd as the sandbox
//! user, so `kill -9 -1` from a job command (how strays are killed) reaches every process of
//! the job and neither the init (PID 1 is never signalled that way) nor the `sleep` (another
//! user), whose end would end the container with it.
use super::{
    check_user, ExecOutput, Limits, PrunedImages, Sandbox, SandboxError, SandboxSpec, Session,
    TailBuffer,
};
use async_trait::async_trait;
use bollard::container::{
    Config, CreateContainerOptions, ListContainersOptions, LogOutput, RemoveContainerOptions,
    RenameContainerOptions,
};
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::image::{ListImagesOptions, PruneImagesOptions};
use bollard::models::HostConfig;
use bollard::Docker;
use futures::StreamExt;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tracing::debug;

/// Whether another try of a failed Docker call may pass: the daemon unreachable or busy, a
/// container that vanished, a conflict, a timeout or a rate limit may; a request Docker refuses
/// as malformed (any other 4xx) does not.
pub(crate) fn transient(e: &bollard::errors::Error) -> bool {
    match e {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => {
            !(400..500).contains(status_code) || matches!(status_code, 404 | 408 | 409 | 429)
        }
        _ => true,
    }
}

/// Docker's errors become the sandbox port's own kind here, the only place that knows them.
impl From<bollard::errors::Error> for SandboxError {
    fn from(e: bollard::errors::Error) -> Self {
        SandboxError::Engine {
            transient: transient(&e),
            message: e.to_string(),
        }
    }
}

pub const MOUNT: &str = "/work";
pub const HARNESS_MOUNT: &str = "/fleet";
pub const WORKER_LABEL: &str = "fleet.worker";

/// The user of the container's own processes (its init and `sleep`): a non-root user that is
/// never the job's, so the job's `kill -9 -1` cannot end the container.
pub fn keeper_user(job_uid: u32) -> String {
    let uid = if job_uid == 65534 { 65533 } else { 65534 };
    format!("{uid}:{uid}")
}

/// Options of the container's `/tmp`: a tmpfs of at most `bytes`, and a bounded inode count.
pub fn tmp_options(bytes: i64) -> String {
    let bytes = bytes.max(1024 * 1024);
    // One inode per 4 KiB of size at most: enough for any sane use, bounded anyway.
    let inodes = (bytes / 4096).clamp(1024, 1 << 20);
    format!("rw,nosuid,nodev,size={bytes},nr_inodes={inodes},mode=1777")
}

pub struct DockerSandbox {
    docker: Docker,
    limits: Limits,
    user: String,
    /// Docker's data root as this process sees it (asked once): none when it is not visible
    /// here (a worker in a container of its own).
    image_root: tokio::sync::OnceCell<Option<PathBuf>>,
}

impl DockerSandbox {
    pub async fn connect(limits: Limits, user: String) -> Result<Self, SandboxError> {
        let docker = Docker::connect_with_local_defaults()?;
        docker.ping().await?;
        Ok(Self {
            docker,
            limits,
            user,
            image_root: tokio::sync::OnceCell::new(),
        })
    }

    pub async fn has_image(&self, image: &str) -> bool {
        self.docker.inspect_image(image).await.is_ok()
    }

    /// Creates and starts the container of `spec` (what `start` boxes; the warm pool keeps it).
    pub(crate) async fn launch(&self, spec: &SandboxSpec) -> Result<DockerSession, SandboxError> {
        // Checked at the worker's start too; a container never runs as root whoever calls.
        let (uid, _) = check_user(&self.user).map_err(SandboxError::Refused)?;
        if spec.shared_worktree && spec.writable {
            return Err(SandboxError::Refused(
                "a checkout shared by read-only jobs is never mounted writable".into(),
            ));
        }
        if !self.has_image(&spec.image).await {
            return Err(SandboxError::MissingImage(spec.image.clone()));
        }
        let labels: HashMap<String, String> = spec.labels.iter().cloned().collect();
        let mode = if spec.writable { "rw" } else { "ro" };
        let host = HostConfig {
            binds: Some({
                let mut binds = vec![format!("{}:{MOUNT}:{mode}", spec.worktree.display())];
                if let Some(h) = &spec.harness_dir {
                    binds.push(format!("{}:{HARNESS_MOUNT}:rw", h.display()));
                }
                if let Some(g) = &spec.gateway_dir {
                    binds.push(format!("{}:{}:rw", g.display(), super::GATEWAY_MOUNT));
                }
                binds
            }),
            network_mode: Some(if spec.network { "bridge" } else { "none" }.to_string()),
            cap_drop: Some(vec!["ALL".to_string()]),
            security_opt: Some(vec!["no-new-privileges".to_string()]),
            memory: Some(self.limits.memory_bytes),
            memory_swap: Some(self.limits.memory_bytes),
            nano_cpus: Some(self.limits.nano_cpus),
            pids_limit: Some(self.limits.pids),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_string(),
                tmp_options(self.limits.tmp_bytes),
            )])),
            shm_size: Some(self.limits.shm_bytes.max(1024 * 1024)),
            // docker-init as PID 1: zombies reaped, signals forwarded.
            init: Some(true),
            ..Default::default()
        };
        let config = Config {
            image: Some(spec.image.clone()),
            cmd: Some(vec![
                "sleep".to_string(),
                spec.lifetime.as_secs().max(1).to_string(),
            ]),
            // The init and the `sleep`; every command of the job is exec'd as `self.user`.
            user: Some(keeper_user(uid)),
            working_dir: Some(MOUNT.to_string()),
            env: Some(vec![
                "HOME=/tmp".to_string(),
                "PYTHONDONTWRITEBYTECODE=1".to_string(),
                "TZ=UTC".to_string(),
            ]),
            labels: Some(labels),
            network_disabled: Some(!spec.network),
            host_config: Some(host),
            ..Default::default()
        };
        let options = CreateContainerOptions {
            name: spec.name.clone(),
            platform: None,
        };
        let created = match self.docker.create_container(Some(options), config).await {
            Ok(c) => c,
            // Names are unique per execution: a taken name is a bug, and the container that holds
            // it may be another execution still running, so it is never removed to make room.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409,
                message,
            }) => {
                let name = &spec.name;
                return Err(SandboxError::Other(format!(
                    "a container named `{name}` already exists ({message}): executions never share a name"
                )));
            }
            Err(e) => return Err(e.into()),
        };
        let session = DockerSession {
            docker: self.docker.clone(),
            id: created.id,
            limits: self.limits.clone(),
            harness: spec.harness_dir.is_some(),
            gateway: spec.gateway_dir.is_some(),
            user: self.user.clone(),
        };
        crate::faults::point("docker.after_create").await;
        if let Err(e) = self
            .docker
            .start_container::<String>(&session.id, None)
            .await
        {
            let _ = session.remove().await;
            return Err(e.into());
        }
        debug!(container = %spec.name, "container started");
        Ok(session)
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    fn name(&self) -> &'static str {
        "docker"
    }

    async fn image_id(&self, image: &str) -> Result<Option<String>, SandboxError> {
        Ok(self.docker.inspect_image(image).await?.id)
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn Session>, SandboxError> {
        Ok(Box::new(self.launch(spec).await?))
    }

    async fn image_store(&self) -> Option<PathBuf> {
        let root = self.image_root.get_or_init(|| async {
            match self.docker.info().await {
                Ok(info) => info
                    .docker_root_dir
                    .map(PathBuf::from)
                    .filter(|p| p.is_dir()),
                Err(e) => {
                    debug!(error = %e, "docker's data root not known");
                    None
                }
            }
        });
        root.await.clone()
    }

    async fn prune_unused_images(&self) -> Result<PrunedImages, SandboxError> {
        // `dangling`: untagged, and Docker itself keeps every image a container uses. The
        // prune names the layers it deleted beside the images: the images are those listed.
        let dangling = || HashMap::from([("dangling", vec!["true"])]);
        let listed = self
            .docker
            .list_images(Some(ListImagesOptions {
                filters: dangling(),
                ..Default::default()
            }))
            .await?;
        let pruned = self
            .docker
            .prune_images(Some(PruneImagesOptions {
                filters: dangling(),
            }))
            .await?;
        let deleted: std::collections::HashSet<String> =
            (pruned.images_deleted.unwrap_or_default().into_iter())
                .filter_map(|d| d.deleted)
                .collect();
        let removed = (listed.into_iter())
            .map(|i| i.id)
            .filter(|id| deleted.contains(id))
            .collect();
        Ok(PrunedImages {
            removed,
            bytes: pruned.space_reclaimed.unwrap_or(0).max(0) as u64,
        })
    }

    async fn reap(&self, worker_id: &str) -> Result<usize, SandboxError> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{WORKER_LABEL}={worker_id}")],
        )]);
        let found = self
            .docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters,
                ..Default::default()
            }))
            .await?;
        let mut removed = 0;
        for c in found {
            if let Some(id) = c.id {
                self.docker.remove_container(&id, Some(force())).await?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    async fn remove_named(&self, name: &str) -> Result<(), SandboxError> {
        match self.docker.remove_container(name, Some(force())).await {
            Ok(()) => {
                debug!(container = %name, "container removed by name");
                Ok(())
            }
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

fn force() -> RemoveContainerOptions {
    RemoveContainerOptions {
        force: true,
        v: true,
        ..Default::default()
    }
}

#[derive(Clone)]
pub(crate) struct DockerSession {
    docker: Docker,
    id: String,
    limits: Limits,
    harness: bool,
    gateway: bool,
    /// The sandbox user: every exec runs as it, never as the keeper.
    user: String,
}

impl DockerSession {
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Kills the container and waits until it has stopped (Docker's kill without a signal:
    /// SIGKILL, then the wait): every process of the job is gone, the container is not yet
    /// removed.
    pub(crate) async fn stop(&self) -> Result<(), SandboxError> {
        match self.docker.kill_container::<String>(&self.id, None).await {
            Ok(()) => Ok(()),
            // Gone already, or no longer running.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404 | 409,
                ..
            }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Gives the container the name of the execution it now serves (a warm container is
    /// created under a name of the pool's).
    pub(crate) async fn rename(&self, name: &str) -> Result<(), SandboxError> {
        let options = RenameContainerOptions { name };
        Ok(self.docker.rename_container(&self.id, options).await?)
    }
}

impl DockerSession {
    /// An exec's end is the command's only while its container still runs: a container that
    /// stopped under it (killed, removed, the daemon restarted) ended the command, and what the
    /// command left (an exit code of 137, a cut output) is an infrastructure failure to retry,
    /// never a verdict (issue 43: one was kept by the step cache).
    async fn still_running(&self) -> Result<(), SandboxError> {
        let running = match self.docker.inspect_container(&self.id, None).await {
            Ok(c) => c.state.and_then(|s| s.running).unwrap_or(false),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => false,
            Err(e) => return Err(e.into()),
        };
        if running {
            return Ok(());
        }
        Err(SandboxError::Engine {
            message: "the container stopped during the exec".into(),
            transient: true,
        })
    }
}

#[async_trait]
impl Session for DockerSession {
    async fn exec(
        &self,
        argv: &[String],
        stdin: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<ExecOutput, SandboxError> {
        let started = Instant::now();
        crate::faults::point("docker.before_exec").await;
        let exec = self
            .docker
            .create_exec(
                &self.id,
                CreateExecOptions {
                    cmd: Some(argv.to_vec()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    attach_stdin: Some(stdin.is_some()),
                    working_dir: Some(MOUNT.to_string()),
                    user: Some(self.user.clone()),
                    ..Default::default()
                },
            )
            .await?;
        let mut stdout = TailBuffer::new(self.limits.output_bytes);
        let mut stderr = TailBuffer::new(self.limits.output_bytes);
        let run = async {
            match self.docker.start_exec(&exec.id, None).await? {
                StartExecResults::Attached {
                    mut output,
                    mut input,
                } => {
                    crate::faults::point("docker.in_exec").await;
                    if let Some(bytes) = stdin {
                        input.write_all(&bytes).await?;
                        input.shutdown().await?;
                    }
                    drop(input);
                    while let Some(chunk) = output.next().await {
                        match chunk? {
                            LogOutput::StdOut { message } | LogOutput::Console { message } => {
                                stdout.push(&message)
                            }
                            LogOutput::StdErr { message } => stderr.push(&message),
                            LogOutput::StdIn { .. } => {}
                        }
                    }
                }
                StartExecResults::Detached => {}
            }
            Ok::<(), SandboxError>(())
        };
        let timed_out = match tokio::time::timeout(timeout, run).await {
            Ok(r) => {
                r?;
                false
            }
            Err(_) => true,
        };
        let exit_code = if timed_out {
            // An exec cannot be killed on its own: the job's container goes, and the job with it.
            let _ = self.docker.kill_container::<String>(&self.id, None).await;
            124
        } else {
            let code = self.docker.inspect_exec(&exec.id).await?.exit_code;
            self.still_running().await?;
            code.unwrap_or(-1)
        };
        Ok(ExecOutput {
            exit_code,
            truncated: stdout.truncated || stderr.truncated,
            stdout: stdout.bytes,
            stderr: stderr.bytes,
            timed_out,
            duration: started.elapsed(),
        })
    }

    fn mounts(&self) -> super::Mounts {
        super::Mounts {
            work: MOUNT.into(),
            harness: self.harness.then(|| HARNESS_MOUNT.into()),
            gateway: self.gateway.then(|| super::GATEWAY_MOUNT.into()),
        }
    }

    fn isolated(&self) -> bool {
        true
    }

    async fn kill_strays(&self) -> Result<(), SandboxError> {
        // kill(-1) reaches every process of the sandbox user but the caller: the init (PID 1)
        // and the `sleep` (the keeper user's) stay, so the container does. The shell's builtin,
        // so nothing else is needed.
        let argv = ["sh", "-c", "kill -9 -1 2>/dev/null; true"].map(String::from);
        self.exec(&argv, None, Duration::from_secs(30)).await?;
        Ok(())
    }

    async fn remove(&self) -> Result<(), SandboxError> {
        match self.docker.remove_container(&self.id, Some(force())).await {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn docker_errors_know_whether_a_retry_can_help() {
        use super::SandboxError;
        let server = |status_code: u16| -> SandboxError {
            bollard::errors::Error::DockerResponseServerError {
                status_code,
                message: "x".into(),
            }
            .into()
        };
        assert!(server(500).is_transient());
        assert!(server(503).is_transient());
        assert!(server(404).is_transient(), "a container that vanished");
        assert!(server(409).is_transient(), "a container that stopped");
        assert!(server(408).is_transient());
        assert!(server(429).is_transient());
        assert!(!server(400).is_transient(), "a request docker refuses");
        assert!(!server(403).is_transient());
        let e: SandboxError = bollard::errors::Error::RequestTimeoutError.into();
        assert!(e.is_transient(), "{e}");
        assert!(
            server(400).to_string().starts_with("docker: "),
            "{}",
            server(400)
        );
    }

    use super::{keeper_user, tmp_options};

    #[test]
    fn the_keeper_is_never_the_job_user_nor_root() {
        assert_eq!(keeper_user(10001), "65534:65534");
        assert_eq!(keeper_user(65534), "65533:65533");
        for uid in [1, 1000, 10001, 65533, 65534, 65535] {
            let k = keeper_user(uid);
            let (ku, kg) = k.split_once(':').unwrap();
            assert_ne!(ku.parse::<u32>().unwrap(), uid);
            assert_ne!(ku, "0");
            assert_ne!(kg, "0");
        }
    }

    #[test]
    fn tmp_is_bounded_in_size_and_inodes() {
        assert_eq!(
            tmp_options(256 << 20),
            "rw,nosuid,nodev,size=268435456,nr_inodes=65536,mode=1777"
        );
        assert!(tmp_options(0).contains("size=1048576,nr_inodes=1024"));
        assert!(tmp_options(1 << 40).contains("nr_inodes=1048576"));
    }
}
