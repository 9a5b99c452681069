//! The `fleet` command line: servers (coordinator, worker), a client of the HTTP API, the
//! embedded mode and the graph tools.

use crate::driver::Coordinator;
use crate::embedded::{self, SandboxChoice};
use crate::metrics::CoordinatorMetrics;
use crate::store::redis::RedisRunStore;
use crate::submit::SubmitRequest;
use anyhow::{anyhow, bail, Context};
use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};
use shared::graph::{load_bundle, GraphBundle, NodeKind};
use shared::messages::{AgentConfig, LlmConfig, ScriptStep};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::info;
use worker::agent::{LlmSettings, PriceTable};
use worker::blobs::Blobs;
use worker::rabbitmq::RabbitBroker;
use worker::runner::{Runner, WorkerConfig};
use worker::sandbox::Limits;

#[derive(Parser)]
#[command(
    name = "fleet",
    version,
    about = "run adversarial coding-agent graphs on a fleet"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Start a coordinator (HTTP API, engine driver, outbox relay, result consumers).
    Coordinator(CoordinatorArgs),
    /// Start a worker.
    Worker(WorkerArgs),
    /// Submit a run to a coordinator; prints the run id.
    Submit(SubmitArgs),
    /// Show a run's status.
    Status(RunRef),
    /// Wait for a run to finish, with a progress display; exits 0 on success.
    Wait(WaitArgs),
    /// Show a run's job history.
    Logs(RunRef),
    /// List a run's artifacts, or fetch one with --get.
    Artifacts(ArtifactsArgs),
    /// Cancel a run.
    Cancel(RunRef),
    /// Approve (or reject) a run's approval node.
    Approve(ApproveArgs),
    /// List runs.
    List(ServerArg),
    /// Run a graph to the end in this process (embedded mode: no RabbitMQ, Redis or S3).
    Run(RunArgs),
    /// Graph tools.
    Graph {
        #[command(subcommand)]
        cmd: GraphCmd,
    },
}

#[derive(Subcommand)]
pub enum GraphCmd {
    /// Run the static checker on a graph file.
    Check { file: PathBuf },
    /// Print the graph as a Mermaid flowchart; with --run, coloured by the run's node states.
    Show {
        file: PathBuf,
        #[arg(long)]
        run: Option<String>,
        #[command(flatten)]
        server: ServerArg,
    },
}

#[derive(Args, Clone)]
pub struct Backends {
    #[arg(long, env = "FLEET_AMQP", default_value = "amqp://127.0.0.1:5672/%2f")]
    pub amqp: String,
    /// `s3://bucket` (endpoint from AWS_ENDPOINT_URL) or `file:///path`.
    #[arg(long, env = "FLEET_STORE", default_value = "s3://fleet")]
    pub store: String,
    /// Prefix of queues, Redis keys and object keys, so deployments can share servers.
    #[arg(long, env = "FLEET_NAMESPACE", default_value = "fleet")]
    pub namespace: String,
}

#[derive(Args)]
pub struct CoordinatorArgs {
    #[command(flatten)]
    pub backends: Backends,
    #[arg(long, env = "FLEET_REDIS", default_value = "redis://127.0.0.1:6379")]
    pub redis: String,
    #[arg(long, env = "FLEET_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Owner id of this coordinator's outbox claims (unique per process).
    #[arg(long, env = "FLEET_COORDINATOR_ID")]
    pub id: Option<String>,
}

#[derive(Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub backends: Backends,
    #[command(flatten)]
    pub worker: WorkerSettings,
    /// Where `/metrics` is served.
    #[arg(long, env = "FLEET_METRICS_LISTEN", default_value = "127.0.0.1:0")]
    pub metrics_listen: String,
}

#[derive(Args, Clone)]
pub struct WorkerSettings {
    /// Stable id: containers are labelled with it and reaped by it after a restart
    /// (default: the host name).
    #[arg(long, env = "FLEET_WORKER_ID")]
    pub id: Option<String>,
    #[arg(long, env = "FLEET_CONCURRENCY", default_value_t = 2)]
    pub concurrency: usize,
    #[arg(long, env = "FLEET_WORK_DIR")]
    pub work_dir: Option<PathBuf>,
    #[arg(long, value_enum, env = "FLEET_SANDBOX", default_value = "docker")]
    pub sandbox: SandboxChoice,
    /// uid:gid of containers (never root).
    #[arg(long, env = "FLEET_SANDBOX_USER", default_value = "10001:10001")]
    pub sandbox_user: String,
    #[arg(long, env = "FLEET_MEMORY_MB", default_value_t = 1024)]
    pub memory_mb: i64,
    #[arg(long, env = "FLEET_CPUS", default_value_t = 1.0)]
    pub cpus: f64,
    #[arg(long, env = "FLEET_PIDS", default_value_t = 256)]
    pub pids: i64,
}

impl WorkerSettings {
    pub fn id(&self) -> String {
        self.id.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_string())
                .ok()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "worker".to_string())
        })
    }

    pub fn config(&self) -> anyhow::Result<WorkerConfig> {
        let mut prices = PriceTable::with_defaults();
        if let Ok(extra) = std::env::var("FLEET_PRICES") {
            prices.extend_from_json(&extra).map_err(|e| anyhow!(e))?;
        }
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let defaults = LlmSettings::default();
        let llm = LlmSettings {
            anthropic_base_url: env("FLEET_ANTHROPIC_BASE_URL")
                .unwrap_or(defaults.anthropic_base_url),
            anthropic_api_key: env("ANTHROPIC_API_KEY"),
            openai_base_url: env("FLEET_OPENAI_BASE_URL").unwrap_or(defaults.openai_base_url),
            openai_api_key: env("OPENAI_API_KEY"),
            prices,
            ..defaults
        };
        Ok(WorkerConfig {
            id: self.id(),
            work_dir: self.work_dir.clone().unwrap_or_else(|| {
                std::env::temp_dir().join(format!("fleet-worker-{}", self.id()))
            }),
            concurrency: self.concurrency,
            sandbox_user: self.sandbox_user.clone(),
            llm,
            limits: Limits {
                memory_bytes: self.memory_mb * 1024 * 1024,
                nano_cpus: (self.cpus * 1e9) as i64,
                pids: self.pids,
                ..Limits::default()
            },
        })
    }
}

#[derive(Args, Clone)]
pub struct ServerArg {
    #[arg(long, env = "FLEET_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
}

#[derive(Args)]
pub struct RunRef {
    pub run_id: String,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args)]
pub struct ApproveArgs {
    pub run_id: String,
    pub node: String,
    #[command(flatten)]
    pub server: ServerArg,
    /// Reject instead of approving.
    #[arg(long)]
    pub reject: bool,
    #[arg(long, default_value = "")]
    pub comment: String,
    /// Who decides (default: $USER).
    #[arg(long, env = "USER", default_value = "unknown")]
    pub by: String,
}

#[derive(Args)]
pub struct WaitArgs {
    pub run_id: String,
    #[command(flatten)]
    pub server: ServerArg,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
}

#[derive(Args)]
pub struct ArtifactsArgs {
    pub run_id: String,
    #[command(flatten)]
    pub server: ServerArg,
    /// Key of one artifact to fetch (as listed).
    #[arg(long)]
    pub get: Option<String>,
    /// Where to write the fetched artifact (stdout when absent).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// What a run is made of, for `submit` and `run`.
#[derive(Args, Clone)]
pub struct RunSpec {
    #[arg(long, default_value = "graphs/factory/graph.yaml")]
    pub graph: PathBuf,
    /// The product repository (a git repo with a clean working tree).
    #[arg(long)]
    pub repo: PathBuf,
    #[arg(long = "ref", default_value = "HEAD")]
    pub git_ref: String,
    /// Factory graph: the work order JSON.
    #[arg(long)]
    pub work_order: Option<PathBuf>,
    /// Any graph: the input JSON (instead of --work-order).
    #[arg(long)]
    pub input: Option<PathBuf>,
    #[arg(long)]
    pub max_attempts: Option<u32>,
    #[arg(long)]
    pub llm_temperature: Option<f64>,
    #[arg(long)]
    pub timeout_seconds: Option<u64>,
    /// Scripted agent: JSON {node: [{files, output}, ...]}.
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// Built-in agent loop: `anthropic` or `openai`.
    #[arg(long)]
    pub llm_api: Option<String>,
    #[arg(long)]
    pub llm_model: Option<String>,
}

#[derive(Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub spec: RunSpec,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub spec: RunSpec,
    /// Where the run's artifacts and run_summary.json go.
    #[arg(long, default_value = "fleet-out")]
    pub out: PathBuf,
    #[command(flatten)]
    pub worker: WorkerSettings,
}

fn read_json(path: &Path, what: &str) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {what} `{}`", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| anyhow!("{what} `{}` is not valid json: {e}", path.display()))
}

/// Loads a graph file with its templates and schemas and runs the static checker.
pub fn load_graph(path: &Path) -> anyhow::Result<GraphBundle> {
    let yaml = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read graph `{}`", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    load_bundle(&path.display().to_string(), &yaml, |rel| {
        std::fs::read_to_string(dir.join(rel)).map_err(|e| e.to_string())
    })
    .map_err(|errs| {
        anyhow!(
            "the graph is invalid:\n{}",
            errs.iter()
                .map(|e| format!("  {e}"))
                .collect::<Vec<_>>()
                .join("\n")
        )
    })
}

impl RunSpec {
    pub fn request(&self) -> anyhow::Result<SubmitRequest> {
        let graph = load_graph(&self.graph)?;
        let input = match (&self.work_order, &self.input) {
            (Some(wo), None) => {
                let mut options = serde_json::Map::new();
                if let Some(n) = self.max_attempts {
                    options.insert("max_attempts".into(), json!(n));
                }
                if let Some(t) = self.llm_temperature {
                    options.insert("temperature".into(), json!(t));
                }
                if let Some(t) = self.timeout_seconds {
                    options.insert("timeout_seconds".into(), json!(t));
                }
                json!({
                    "work_order": read_json(wo, "work order")?,
                    "work_order_path": wo.display().to_string(),
                    "options": options,
                })
            }
            (None, Some(input)) => read_json(input, "input")?,
            (None, None) => bail!("give --work-order (factory graph) or --input"),
            (Some(_), Some(_)) => bail!("give either --work-order or --input, not both"),
        };
        let agent = match (&self.script, &self.llm_api) {
            (Some(script), None) => {
                let value = read_json(script, "script")?;
                let script: BTreeMap<String, Vec<ScriptStep>> = serde_json::from_value(value)
                    .map_err(|e| anyhow!("script `{}` is malformed: {e}", script.display()))?;
                AgentConfig::Scripted { script }
            }
            (None, Some(api)) => {
                let model = self
                    .llm_model
                    .clone()
                    .ok_or_else(|| anyhow!("--llm-model is required with --llm-api"))?;
                let cfg = LlmConfig {
                    model,
                    temperature: self.llm_temperature.unwrap_or(0.0),
                    max_tokens: 4096,
                    max_turns: 20,
                };
                match api.as_str() {
                    "anthropic" => AgentConfig::Anthropic(cfg),
                    "openai" => AgentConfig::Openai(cfg),
                    other => bail!("unknown --llm-api `{other}` (anthropic or openai)"),
                }
            }
            (None, None) => bail!("give --script (scripted agent) or --llm-api and --llm-model"),
            (Some(_), Some(_)) => bail!("give either --script or --llm-api, not both"),
        };
        let repo = self
            .repo
            .canonicalize()
            .with_context(|| format!("repository `{}` not found", self.repo.display()))?;
        Ok(SubmitRequest {
            graph,
            input,
            repo: repo.display().to_string(),
            git_ref: self.git_ref.clone(),
            agent,
        })
    }
}

pub async fn main(cli: Cli) -> anyhow::Result<i32> {
    match cli.cmd {
        Cmd::Coordinator(a) => coordinator(a).await,
        Cmd::Worker(a) => worker_main(a).await,
        Cmd::Submit(a) => {
            let req = a.spec.request()?;
            let resp =
                client_post(&a.server.server, "/v1/runs", &serde_json::to_value(req)?).await?;
            println!("{}", resp["run_id"].as_str().unwrap_or_default());
            if resp["created"] == json!(false) {
                eprintln!("(a run with the same inputs exists; returning it)");
            }
            Ok(0)
        }
        Cmd::Status(r) => {
            let v = client_get(&r.server.server, &format!("/v1/runs/{}", r.run_id)).await?;
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(0)
        }
        Cmd::Wait(w) => wait(&w.server.server, &w.run_id, Duration::from_secs(w.timeout)).await,
        Cmd::Logs(r) => {
            let v = client_get(&r.server.server, &format!("/v1/runs/{}/logs", r.run_id)).await?;
            for e in v.as_array().cloned().unwrap_or_default() {
                println!(
                    "{} {:>10} {} visit {} on {}{}",
                    e["finished_at"].as_str().unwrap_or(""),
                    e["status"].as_str().unwrap_or(""),
                    e["node"].as_str().unwrap_or(""),
                    e["visit"],
                    e["worker"].as_str().unwrap_or(""),
                    e["error"]
                        .as_str()
                        .map(|s| format!(": {s}"))
                        .unwrap_or_default()
                );
                for (name, key) in e["artifacts"].as_object().cloned().unwrap_or_default() {
                    println!("    {name}: {}", key.as_str().unwrap_or(""));
                }
            }
            Ok(0)
        }
        Cmd::Artifacts(a) => {
            match &a.get {
                None => {
                    let v = client_get(
                        &a.server.server,
                        &format!("/v1/runs/{}/artifacts", a.run_id),
                    )
                    .await?;
                    for k in v.as_array().cloned().unwrap_or_default() {
                        println!("{}", k.as_str().unwrap_or(""));
                    }
                }
                Some(key) => {
                    let bytes =
                        client_bytes(&a.server.server, &format!("/v1/artifacts/{key}")).await?;
                    match &a.out {
                        Some(p) => std::fs::write(p, bytes)?,
                        None => {
                            use std::io::Write;
                            std::io::stdout().write_all(&bytes)?;
                        }
                    }
                }
            }
            Ok(0)
        }
        Cmd::Cancel(r) => {
            let v = client_post(
                &r.server.server,
                &format!("/v1/runs/{}/cancel", r.run_id),
                &json!({}),
            )
            .await?;
            println!("{}", v["status"].as_str().unwrap_or_default());
            Ok(0)
        }
        Cmd::Approve(a) => {
            let v = client_post(
                &a.server.server,
                &format!("/v1/runs/{}/approvals/{}", a.run_id, a.node),
                &json!({"approved": !a.reject, "by": a.by, "comment": a.comment}),
            )
            .await?;
            println!("{}: {}", a.node, v["applied"].as_str().unwrap_or_default());
            Ok(0)
        }
        Cmd::List(s) => {
            let v = client_get(&s.server, "/v1/runs").await?;
            for r in v.as_array().cloned().unwrap_or_default() {
                println!(
                    "{}  {:<10} {:<10} {}",
                    r["run_id"].as_str().unwrap_or(""),
                    r["graph"].as_str().unwrap_or(""),
                    r["status"].as_str().unwrap_or(""),
                    r["created_at"].as_str().unwrap_or("")
                );
            }
            Ok(0)
        }
        Cmd::Run(a) => run_embedded(a).await,
        Cmd::Graph { cmd } => match cmd {
            GraphCmd::Check { file } => {
                let b = load_graph(&file)?;
                println!("{}: ok ({} nodes)", file.display(), b.graph.nodes.len());
                Ok(0)
            }
            GraphCmd::Show { file, run, server } => {
                let b = load_graph(&file)?;
                let mut chart = mermaid(&b);
                if let Some(run) = run {
                    let v = client_get(&server.server, &format!("/v1/runs/{run}")).await?;
                    chart.push_str(&live_states(&b, &v));
                }
                use std::io::Write;
                // A closed pipe (`| head`) is not an error worth a panic.
                let _ = std::io::stdout().write_all(chart.as_bytes());
                Ok(0)
            }
        },
    }
}

fn mermaid(b: &GraphBundle) -> String {
    let mut out = String::from("flowchart TD\n");
    for (id, n) in &b.graph.nodes {
        let shape = match n.kind {
            NodeKind::Exit => format!("{id}((\"{id}\"))"),
            NodeKind::Agent => format!("{id}[\"{id} (agent)\"]"),
            NodeKind::Harness => {
                format!("{id}{{{{\"{id} ({})\"}}}}", n.op.as_deref().unwrap_or(""))
            }
            NodeKind::Command => format!("{id}[/\"{id} (command)\"/]"),
            NodeKind::Join => format!("{id}{{\"{id} (join)\"}}"),
            NodeKind::Fanout => format!("{id}[[\"{id} (fan-out)\"]]"),
            NodeKind::Approval => format!("{id}>\"{id} (approval)\"]"),
            NodeKind::Git => format!("{id}[(\"{id} (git {})\")]", n.op.as_deref().unwrap_or("")),
        };
        out.push_str(&format!("  {shape}\n"));
        for r in &n.routes {
            match &r.when {
                Some(w) => out.push_str(&format!(
                    "  {id} -->|\"{}\"| {}\n",
                    w.replace('"', "'"),
                    r.to
                )),
                None => out.push_str(&format!("  {id} --> {}\n", r.to)),
            }
        }
    }
    out
}

/// Mermaid classes for a run's node states: done, failed, running, waiting, not reached.
fn live_states(b: &GraphBundle, status: &Value) -> String {
    let mut out = String::from(
        "  classDef done fill:#c8f7c5,stroke:#2e7d32\n  classDef failed fill:#f7c5c5,stroke:#c62828\n  \
         classDef running fill:#fff3b0,stroke:#f9a825\n  classDef waiting fill:#d0e0ff,stroke:#1565c0\n",
    );
    let jobs = status["jobs"].as_array().cloned().unwrap_or_default();
    let awaiting: Vec<String> = status["awaiting_approval"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for id in b.graph.nodes.keys() {
        let mine: Vec<&Value> = jobs.iter().filter(|j| j["node"] == id.as_str()).collect();
        let class = if awaiting.contains(&id.to_string()) {
            Some("waiting")
        } else if mine.iter().any(|j| j["state"] == "pending") {
            Some("running")
        } else if let Some(last) = mine.last() {
            Some(if last["status"] == "ok" {
                "done"
            } else {
                "failed"
            })
        } else if status["visits"][id.as_str()].as_u64().unwrap_or(0) > 0 {
            Some("done")
        } else {
            None
        };
        if let Some(c) = class {
            out.push_str(&format!("  class {id} {c}\n"));
        }
    }
    out
}

async fn coordinator(a: CoordinatorArgs) -> anyhow::Result<i32> {
    let id =
        a.id.clone()
            .unwrap_or_else(|| format!("coordinator-{}", std::process::id()));
    let store = Arc::new(RedisRunStore::connect(&a.redis, &a.backends.namespace).await?);
    let broker = Arc::new(RabbitBroker::connect(&a.backends.amqp, &a.backends.namespace).await?);
    let blobs = Blobs::open(&a.backends.store, &a.backends.namespace)?;
    let coord = Arc::new(Coordinator::new(
        id.clone(),
        store,
        broker,
        blobs,
        CoordinatorMetrics::new(),
    ));
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn(coord.clone().serve(shutdown.clone()));
    let listener = tokio::net::TcpListener::bind(&a.listen).await?;
    info!(coordinator = %id, listen = %listener.local_addr()?, "coordinator ready");
    println!("listening on http://{}", listener.local_addr()?);
    let token = shutdown.clone();
    axum::serve(listener, crate::api::router(coord))
        .with_graceful_shutdown(async move {
            let _ = tokio::signal::ctrl_c().await;
            token.cancel();
        })
        .await?;
    let _ = serving.await;
    Ok(0)
}

async fn worker_main(a: WorkerArgs) -> anyhow::Result<i32> {
    let config = a.worker.config()?;
    let sandbox = embedded::connect_sandbox(
        a.worker.sandbox,
        config.limits.clone(),
        config.sandbox_user.clone(),
    )
    .await?;
    let broker = Arc::new(RabbitBroker::connect(&a.backends.amqp, &a.backends.namespace).await?);
    let blobs = Blobs::open(&a.backends.store, &a.backends.namespace)?;
    let metrics = worker::metrics::Metrics::new();
    let runner = Arc::new(Runner::new(config, blobs, sandbox, metrics.clone())?);
    let listener = tokio::net::TcpListener::bind(&a.metrics_listen).await?;
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
        let _ = tokio::signal::ctrl_c().await;
        token.cancel();
    });
    worker::consumer::serve(runner, broker, shutdown).await;
    Ok(0)
}

async fn run_embedded(a: RunArgs) -> anyhow::Result<i32> {
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
    println!("run {}: {}", state.run_id, verdict);
    let summary = out
        .join("runs")
        .join(state.run_id.as_str())
        .join("run_summary.json");
    if summary.exists() {
        println!("{}", summary.display());
    } else {
        println!(
            "{}",
            out.join("runs")
                .join(state.run_id.as_str())
                .join("result.json")
                .display()
        );
    }
    Ok(if state.status == shared::engine::RunStatus::Succeeded {
        0
    } else {
        1
    })
}

async fn client_get(server: &str, path: &str) -> anyhow::Result<Value> {
    let resp = reqwest::get(format!("{}{path}", server.trim_end_matches('/')))
        .await
        .with_context(|| format!("cannot reach the coordinator at {server}"))?;
    decode(resp).await
}

async fn client_bytes(server: &str, path: &str) -> anyhow::Result<Vec<u8>> {
    let resp = reqwest::get(format!("{}{path}", server.trim_end_matches('/')))
        .await
        .with_context(|| format!("cannot reach the coordinator at {server}"))?;
    if !resp.status().is_success() {
        let v = decode(resp).await;
        return Err(v.err().unwrap_or_else(|| anyhow!("request failed")));
    }
    Ok(resp.bytes().await?.to_vec())
}

async fn client_post(server: &str, path: &str, body: &Value) -> anyhow::Result<Value> {
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", server.trim_end_matches('/')))
        .json(body)
        .send()
        .await
        .with_context(|| format!("cannot reach the coordinator at {server}"))?;
    decode(resp).await
}

async fn decode(resp: reqwest::Response) -> anyhow::Result<Value> {
    let status = resp.status();
    let v: Value = resp.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let mut msg = v["error"].as_str().unwrap_or("request failed").to_string();
        for d in v["details"].as_array().cloned().unwrap_or_default() {
            msg.push_str(&format!("\n  {}", d.as_str().unwrap_or("")));
        }
        bail!("{status}: {msg}");
    }
    Ok(v)
}

async fn wait(server: &str, run: &str, timeout: Duration) -> anyhow::Result<i32> {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(120));
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let v = client_get(server, &format!("/v1/runs/{run}/summary")).await?;
        let status = v["status"].as_str().unwrap_or("").to_string();
        let visits: Vec<String> = v["visits"]
            .as_object()
            .map(|m| m.iter().map(|(k, n)| format!("{k}×{n}")).collect())
            .unwrap_or_default();
        let pending = v["jobs_pending"].as_u64().unwrap_or(0);
        bar.set_message(format!(
            "run {run}: {status} — {} — {pending} job(s) in flight",
            visits.join(" ")
        ));
        if matches!(status.as_str(), "succeeded" | "failed" | "cancelled") {
            bar.finish_and_clear();
            let r = client_get(server, &format!("/v1/runs/{run}/result")).await?;
            let verdict = r["result"]["verdict"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| status.to_uppercase());
            println!("run {run}: {verdict}");
            if let Some(stage) = r["result"]["ended_stage"].as_str() {
                println!("ended stage: {stage}");
            }
            println!(
                "cost: ${:.4} ({} llm calls)",
                r["usage"]["cost_usd"].as_f64().unwrap_or(0.0),
                r["usage"]["llm_calls"]
            );
            return Ok(if status == "succeeded" { 0 } else { 1 });
        }
        if std::time::Instant::now() > deadline {
            bar.finish_and_clear();
            bail!("run {run} still {status} after {}s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
