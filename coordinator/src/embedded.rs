//! The embedded mode: coordinator and worker in one process with an in-process queue, an
//! in-memory run store and local files as object storage. Same engine, same worker, same
//! harness; only the adapters differ.

use crate::driver::Coordinator;
use crate::metrics::CoordinatorMetrics;
use crate::store::memory::MemoryRunStore;
use crate::submit::{self, SubmitRequest};
use anyhow::{bail, Context};
use shared::engine::RunState;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use worker::blobs::Blobs;
use worker::memory_queue::MemoryBroker;
use worker::runner::{Runner, WorkerConfig};
use worker::sandbox::docker::DockerSandbox;
use worker::sandbox::local::LocalProcessSandbox;
use worker::sandbox::{Limits, Sandbox};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SandboxChoice {
    Docker,
    /// Host processes; no isolation. Only when asked for by name.
    LocalProcess,
}

pub async fn connect_sandbox(
    choice: SandboxChoice,
    limits: Limits,
    user: String,
) -> anyhow::Result<Arc<dyn Sandbox>> {
    Ok(match choice {
        SandboxChoice::Docker => match DockerSandbox::connect(limits, user).await {
            Ok(d) => Arc::new(d),
            Err(e) => bail!(
                "docker is not available ({e}); pass `--sandbox local-process` to run job commands \
                 as host processes without isolation"
            ),
        },
        SandboxChoice::LocalProcess => Arc::new(LocalProcessSandbox { limits }),
    })
}

/// `out` as it will be once created: the deepest part of it that exists, canonicalised (every
/// symlink on the way followed), with the rest joined lexically.
fn resolve_out_dir(out: &Path) -> anyhow::Result<PathBuf> {
    let abs = if out.is_absolute() {
        out.to_path_buf()
    } else {
        std::env::current_dir()?.join(out)
    };
    let parts: Vec<_> = abs.components().collect();
    for split in (0..=parts.len()).rev() {
        let existing: PathBuf = parts[..split].iter().collect();
        if let Ok(canonical) = existing.canonicalize() {
            let rest: PathBuf = parts[split..].iter().collect();
            return Ok(shared::factory::resolve_below(&canonical, &rest));
        }
    }
    bail!("cannot resolve the out dir `{}`", out.display())
}

/// The seed's preflight: the out dir may not lie inside the repository (both resolved, so a
/// symlink cannot hide it). Checked before anything is created.
fn refuse_out_dir_in_repo(out: &Path, resolved: &Path, repo: &str) -> anyhow::Result<()> {
    let repo = Path::new(repo)
        .canonicalize()
        .with_context(|| format!("repository `{repo}` not found"))?;
    shared::factory::check_out_dir(out, resolved, &repo)?;
    Ok(())
}

/// Runs one submission to the end in this process; artifacts land under `out`, which may not
/// lie inside the repository.
pub async fn run(
    req: SubmitRequest,
    out: &Path,
    sandbox: Arc<dyn Sandbox>,
    worker: WorkerConfig,
) -> anyhow::Result<RunState> {
    refuse_out_dir_in_repo(out, &resolve_out_dir(out)?, &req.repo)?;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let out = out.canonicalize()?;
    refuse_out_dir_in_repo(&out, &out, &req.repo)?;
    let blobs = Blobs::open(&format!("file://{}", out.display()), "")?;
    let broker = Arc::new(MemoryBroker::default());
    let coord = Arc::new(Coordinator::new(
        "embedded".into(),
        Arc::new(MemoryRunStore::default()),
        broker.clone(),
        blobs.clone(),
        CoordinatorMetrics::new(),
    ));
    let runner = Arc::new(Runner::new(
        worker,
        blobs,
        sandbox,
        worker::metrics::Metrics::new(),
    )?);
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn(coord.clone().serve(shutdown.clone()));
    let working = tokio::spawn(worker::consumer::serve(runner, broker, shutdown.clone()));

    let resp = submit::submit(&coord, req).await?;
    let state = loop {
        let s = coord.load(&resp.run_id).await?;
        if s.status.is_terminal() {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    shutdown.cancel();
    let _ = tokio::join!(serving, working);
    Ok(state)
}
