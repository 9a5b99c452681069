//! Docker adapter (bollard). Every container is locked down: no network unless asked, a
//! non-root user, all capabilities dropped, no new privileges, read-only root with a small
//! `/tmp`, limits on memory, CPU and pids, no Docker socket, and a lifetime after which its own
//! `sleep` ends it. Only this module knows bollard.

use super::{ExecOutput, Limits, Sandbox, SandboxError, SandboxSpec, Session, TailBuffer};
use async_trait::async_trait;
use bollard::container::{
    Config, CreateContainerOptions, ListContainersOptions, LogOutput, RemoveContainerOptions,
};
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::HostConfig;
use bollard::Docker;
use futures::StreamExt;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tracing::debug;

pub const MOUNT: &str = "/work";
pub const HARNESS_MOUNT: &str = "/fleet";
pub const WORKER_LABEL: &str = "fleet.worker";

pub struct DockerSandbox {
    docker: Docker,
    limits: Limits,
    user: String,
}

impl DockerSandbox {
    pub async fn connect(limits: Limits, user: String) -> Result<Self, SandboxError> {
        let docker = Docker::connect_with_local_defaults()?;
        docker.ping().await?;
        Ok(Self {
            docker,
            limits,
            user,
        })
    }

    pub async fn has_image(&self, image: &str) -> bool {
        self.docker.inspect_image(image).await.is_ok()
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    fn name(&self) -> &'static str {
        "docker"
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn Session>, SandboxError> {
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
                "rw,nosuid,size=256m".to_string(),
            )])),
            ..Default::default()
        };
        let config = Config {
            image: Some(spec.image.clone()),
            cmd: Some(vec![
                "sleep".to_string(),
                spec.lifetime.as_secs().max(1).to_string(),
            ]),
            user: Some(self.user.clone()),
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
        };
        if let Err(e) = self
            .docker
            .start_container::<String>(&session.id, None)
            .await
        {
            let _ = session.remove().await;
            return Err(e.into());
        }
        debug!(container = %spec.name, "container started");
        Ok(Box::new(session))
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

struct DockerSession {
    docker: Docker,
    id: String,
    limits: Limits,
    harness: bool,
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
            self.docker
                .inspect_exec(&exec.id)
                .await?
                .exit_code
                .unwrap_or(-1)
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
        }
    }

    fn isolated(&self) -> bool {
        true
    }

    async fn kill_strays(&self) -> Result<(), SandboxError> {
        // kill(-1) reaches every process of the container's user but the caller and the
        // container's init (its `sleep`); the shell's builtin, so nothing else is needed.
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
