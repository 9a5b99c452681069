//! Host processes as a sandbox, for the embedded mode on machines without Docker, and only when
//! the user names it. It isolates nothing beyond a cleared environment and the working directory.

use super::{ExecOutput, Limits, Sandbox, SandboxError, SandboxSpec, Session, TailBuffer};
use async_trait::async_trait;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

pub struct LocalProcessSandbox {
    pub limits: Limits,
}

#[async_trait]
impl Sandbox for LocalProcessSandbox {
    fn name(&self) -> &'static str {
        "local-process"
    }

    /// Host processes run whatever the host has: nothing names it, so their steps are never
    /// cached.
    async fn image_id(&self, _image: &str) -> Result<Option<String>, SandboxError> {
        Ok(None)
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn Session>, SandboxError> {
        Ok(Box::new(LocalSession {
            dir: spec.worktree.clone(),
            harness: spec.harness_dir.clone(),
            gateway: spec.gateway_dir.clone(),
            limits: self.limits.clone(),
        }))
    }

    async fn reap(&self, _worker_id: &str) -> Result<usize, SandboxError> {
        Ok(0)
    }

    /// Host processes have no container: nothing to remove.
    async fn remove_named(&self, _name: &str) -> Result<(), SandboxError> {
        Ok(())
    }
}

struct LocalSession {
    dir: PathBuf,
    harness: Option<PathBuf>,
    gateway: Option<PathBuf>,
    limits: Limits,
}

#[async_trait]
impl Session for LocalSession {
    async fn exec(
        &self,
        argv: &[String],
        stdin: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<ExecOutput, SandboxError> {
        let started = Instant::now();
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| SandboxError::Other("empty command".into()))?;
        let mut child = Command::new(program)
            .args(args)
            .current_dir(&self.dir)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", std::env::temp_dir())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("TZ", "UTC")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(&bytes).await?;
        }
        let mut out_pipe = child.stdout.take().expect("piped stdout");
        let mut err_pipe = child.stderr.take().expect("piped stderr");
        let limit = self.limits.output_bytes;
        let read_all = |mut pipe: Box<dyn tokio::io::AsyncRead + Unpin + Send>| async move {
            let mut tail = TailBuffer::new(limit);
            let mut buf = [0u8; 8192];
            loop {
                let n = pipe.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                tail.push(&buf[..n]);
            }
            Ok::<_, std::io::Error>(tail)
        };
        let work = async {
            let (o, e) = tokio::join!(
                read_all(Box::new(
                    &mut out_pipe as &mut (dyn tokio::io::AsyncRead + Unpin + Send)
                )),
                read_all(Box::new(
                    &mut err_pipe as &mut (dyn tokio::io::AsyncRead + Unpin + Send)
                ))
            );
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((o?, e?, status))
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(r) => {
                let (o, e, status) = r?;
                Ok(ExecOutput {
                    exit_code: status.code().unwrap_or(-1) as i64,
                    truncated: o.truncated || e.truncated,
                    stdout: o.bytes,
                    stderr: e.bytes,
                    timed_out: false,
                    duration: started.elapsed(),
                })
            }
            Err(_) => Ok(ExecOutput {
                exit_code: 124,
                timed_out: true,
                duration: started.elapsed(),
                ..Default::default()
            }),
        }
    }

    async fn remove(&self) -> Result<(), SandboxError> {
        Ok(())
    }

    fn mounts(&self) -> super::Mounts {
        super::Mounts {
            work: self.dir.display().to_string(),
            harness: self.harness.as_ref().map(|h| h.display().to_string()),
            gateway: self.gateway.as_ref().map(|g| g.display().to_string()),
        }
    }

    /// Host processes share the user's whole session: nothing is killed (this sandbox isolates
    /// nothing, which is why it must be asked for by name).
    fn isolated(&self) -> bool {
        false
    }

    async fn kill_strays(&self) -> Result<(), SandboxError> {
        Ok(())
    }
}
