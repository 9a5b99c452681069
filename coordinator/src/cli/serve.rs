//! Server bootstrap: the coordinator and the worker (each dependency checked, with a bounded
//! wait, before anything is served or consumed), and the embedded run.

use super::args::{startup_wait, Backends, CoordinatorArgs, RunArgs, WorkerArgs};
use super::startup::{
    docker_address, explain_store_error, store_address, store_name, tcp_probe, Dependency,
};
use crate::driver::Coordinator;
use crate::embedded::{self, SandboxChoice};
use crate::metrics::CoordinatorMetrics;
use crate::store::redis::RedisRunStore;
use serde_json::Value;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::info;
use worker::blobs::Blobs;
use worker::rabbitmq::RabbitBroker;
use worker::runner::{Runner, WorkerConfig};
use worker::sandbox::docker::DockerSandbox;
use worker::sandbox::warm::WarmPool;
use worker::sandbox::Sandbox;

/// RabbitMQ, waited for.
async fn connect_broker(b: &Backends, wait: Duration) -> anyhow::Result<RabbitBroker> {
    Dependency::new("RabbitMQ", &b.amqp)
        .wait_for(wait, || RabbitBroker::connect(&b.amqp, &b.namespace))
        .await
}

/// The object store, opened and probed with a list under the namespace (a bucket that does
/// not exist fails here, not at the first job).
async fn open_store(b: &Backends, wait: Duration) -> anyhow::Result<Blobs> {
    let blobs = Blobs::open(&b.store, &b.namespace)
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", store_name(&b.store)))?;
    let mut dep = Dependency::new(store_name(&b.store), &store_address(&b.store));
    dep.verb = "cannot use";
    dep.wait_for(wait, || async {
        blobs
            .list(".fleet-startup-probe/")
            .await
            .map_err(|e| explain_store_error(&e.to_string()))
    })
    .await?;
    Ok(blobs)
}

/// Docker and, when named, the agent image, waited for.
async fn connect_docker(
    config: &WorkerConfig,
    image: &str,
    warm: usize,
    metrics: &worker::metrics::Metrics,
    wait: Duration,
) -> anyhow::Result<Arc<dyn Sandbox>> {
    let address = docker_address();
    let docker = Dependency::new("Docker", &address)
        .wait_for(wait, || {
            DockerSandbox::connect(config.limits.clone(), config.sandbox_user.clone())
        })
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "{e}; jobs run in Docker (`--sandbox local-process` runs them as host processes, \
                 without isolation)"
            )
        })?;
    if !image.is_empty() {
        let mut dep = Dependency::new(format!("the agent image `{image}`"), &address);
        dep.verb = "cannot find";
        dep.wait_for(wait, || async {
            if docker.has_image(image).await {
                Ok(())
            } else {
                Err(format!(
                    "image `{image}` is not present (build it with scripts/build-image.sh, \
                         or set FLEET_AGENT_IMAGE)"
                ))
            }
        })
        .await?;
    }
    if warm > 0 {
        let root = config.work_dir.join("warm");
        info!(per_kind = warm, "warm containers kept ahead");
        let pool = WarmPool::new(docker, root, warm, &config.id, metrics.clone());
        return Ok(Arc::new(pool));
    }
    Ok(Arc::new(docker))
}

pub async fn coordinator(a: CoordinatorArgs) -> anyhow::Result<i32> {
    let wait = startup_wait()?;
    let id = a.id.clone().unwrap_or_else(crate::driver::unique_id);
    let ns = &a.backends.namespace;
    let store = Dependency::new("Redis", &a.redis)
        .wait_for(wait, || async {
            tcp_probe(&a.redis, 6379).await?;
            RedisRunStore::connect(&a.redis, ns)
                .await
                .map_err(|e| e.to_string())
        })
        .await?;
    let ledger = connect_ledger(&a.redis, ns, wait).await?;
    let broker = connect_broker(&a.backends, wait).await?;
    let blobs = open_store(&a.backends, wait).await?;
    let mut coord = Coordinator::new(
        id.clone(),
        Arc::new(store),
        Arc::new(broker),
        blobs,
        CoordinatorMetrics::new(),
    );
    coord.open_api = a.open_api;
    coord.ledger = Arc::new(ledger);
    if a.open_api {
        tracing::warn!("the API is open: no token is asked for (--open-api, for local use)");
    }
    let coord = Arc::new(coord);
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn(coord.clone().serve(shutdown.clone()));
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", a.listen))?;
    // The open API has no tokens: served on loopback only, unless the operator says so.
    let bound = listener.local_addr()?;
    if a.open_api && !bound.ip().is_loopback() && !a.open_api_any_address {
        anyhow::bail!(
            "the open API (no tokens) is served on a loopback address only, not {bound}: \
             listen on 127.0.0.1, or pass --open-api-any-address (FLEET_OPEN_API_ANY_ADDRESS=1)"
        );
    }
    info!(coordinator = %id, listen = %bound, "coordinator ready");
    // Whoever started us may have closed stdout; the address is in the log line above too.
    let _ = writeln!(
        std::io::stdout(),
        "listening on http://{}",
        listener.local_addr()?
    );
    let token = shutdown.clone();
    axum::serve(listener, crate::api::router(coord))
        .with_graceful_shutdown(async move {
            stop_signal().await;
            token.cancel();
        })
        .await?;
    let _ = serving.await;
    Ok(0)
}

/// SIGINT or SIGTERM (what a container runtime sends to stop its process).
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    info!("stopping");
}

/// The fleet's quota ledger in Redis, waited for like the other dependencies.
async fn connect_ledger(
    url: &str,
    ns: &str,
    wait: Duration,
) -> anyhow::Result<worker::quota::redis_ledger::RedisLedger> {
    // The operator's ceilings over every team's limits, the same on coordinators and workers.
    let ceilings = shared::ceilings::Ceilings::parse(
        &std::env::var("FLEET_TEAM_CEILINGS").unwrap_or_default(),
    )
    .map_err(|e| anyhow::anyhow!("FLEET_TEAM_CEILINGS: {e}"))?;
    let ledger = Dependency::new("Redis", url)
        .wait_for(wait, || async {
            tcp_probe(url, 6379).await?;
            worker::quota::redis_ledger::RedisLedger::connect(url, ns)
                .await
                .map_err(|e| e.to_string())
        })
        .await?;
    Ok(ledger.with_ceilings(ceilings))
}

pub async fn worker_main(a: WorkerArgs) -> anyhow::Result<i32> {
    // A fleet worker runs every team's jobs: never as host processes beside its own keys.
    if !matches!(a.worker.sandbox, SandboxChoice::Docker) {
        anyhow::bail!(
            "a fleet worker runs jobs in Docker only: `--sandbox local-process` runs them as \
             host processes, without isolation from the worker and other teams' jobs, and is \
             for `fleet run` on your own machine"
        );
    }
    let wait = startup_wait()?;
    let mut config = a.worker.config()?;
    let ledger = connect_ledger(&a.redis, &a.backends.namespace, wait).await?;
    // `FLEET_LLM_RATE` holds over every worker of the namespace, through the ledger.
    let fleet_rate = std::env::var("FLEET_LLM_RATE")
        .ok()
        .filter(|v| !v.is_empty())
        .map(|spec| shared::quota::Rate::parse(&spec))
        .transpose()
        .map_err(|e| anyhow::anyhow!(e))?;
    config.llm.gate = Some(worker::quota::FleetGate::new(Arc::new(ledger), fleet_rate));
    let affinity = Duration::from_millis(a.image_affinity_wait_ms);
    let broker = Arc::new(
        connect_broker(&a.backends, wait)
            .await?
            .with_affinity_wait(Some(affinity)),
    );
    let blobs = open_store(&a.backends, wait).await?;
    let metrics = worker::metrics::Metrics::new();
    let sandbox = match a.worker.sandbox {
        SandboxChoice::Docker => {
            let warm = a.warm_containers;
            connect_docker(&config, &a.agent_image, warm, &metrics, wait).await?
        }
        choice => {
            embedded::connect_sandbox(choice, config.limits.clone(), config.sandbox_user.clone())
                .await?
        }
    };
    let runner = Arc::new(Runner::new(config, blobs, sandbox, metrics.clone())?);
    let listener = tokio::net::TcpListener::bind(&a.metrics_listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", a.metrics_listen))?;
    info!(metrics = %listener.local_addr()?, "worker metrics");
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let m = metrics.clone();
            async move { m.render() }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    tokio::spawn(async move {
        stop_signal().await;
        token.cancel();
    });
    let sandbox = runner.sandbox.clone();
    worker::consumer::serve(runner, broker, shutdown).await;
    sandbox.shutdown().await;
    Ok(0)
}

pub async fn run_embedded(a: RunArgs) -> anyhow::Result<i32> {
    let req = a.spec.request()?;
    let config = a.worker.config()?;
    let config = WorkerConfig {
        work_dir: a
            .worker
            .work_dir
            .clone()
            .unwrap_or_else(|| a.out.join("work")),
        ..config
    };
    let sandbox = embedded::connect_sandbox(
        a.worker.sandbox,
        config.limits.clone(),
        config.sandbox_user.clone(),
    )
    .await?;
    let state = embedded::run(req, &a.out, sandbox, config).await?;
    let out = a.out.canonicalize()?;
    let result = state.result.clone().unwrap_or(Value::Null);
    let verdict = result["verdict"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("{:?}", state.status).to_uppercase());
    let dir = out.join("runs").join(state.run_id.as_str());
    let summary = dir.join("run_summary.json");
    let shown = if summary.exists() {
        summary
    } else {
        dir.join("result.json")
    };
    // A closed stdout (`| head -1`) does not change the run's exit code.
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "run {}: {}", state.run_id, verdict)
        .and_then(|()| writeln!(stdout, "{}", shown.display()));
    Ok(if state.status == shared::engine::RunStatus::Succeeded {
        0
    } else {
        1
    })
}
