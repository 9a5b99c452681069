//! Argument structs of the `fleet` subcommands and the configuration read from the environment.

use super::graph_tools::load_graph;
use crate::embedded::SandboxChoice;
use crate::submit::SubmitRequest;
use anyhow::{anyhow, bail, Context};
use clap::Args;
use serde_json::{json, Value};
use shared::messages::{AgentConfig, LlmConfig, ScriptStep};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use worker::agent::{LlmSettings, PriceTable};
use worker::runner::WorkerConfig;
use worker::sandbox::Limits;

/// Environment variable: how long a server waits for each dependency at startup.
pub const STARTUP_WAIT_ENV: &str = "FLEET_STARTUP_WAIT_SECONDS";
/// Seconds a server waits for each dependency at startup when the variable is not set.
pub const DEFAULT_STARTUP_WAIT_SECONDS: u64 = 30;

/// The startup wait from the variable's value: whole or fractional seconds, the default when
/// absent or empty.
pub fn parse_startup_wait(value: Option<&str>) -> anyhow::Result<Duration> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(Duration::from_secs(DEFAULT_STARTUP_WAIT_SECONDS)),
        Some(v) => v
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 86_400.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                anyhow!("{STARTUP_WAIT_ENV}=`{v}` is not a number of seconds (0 to 86400)")
            }),
    }
}

/// `FLEET_STARTUP_WAIT_SECONDS` of this process.
pub fn startup_wait() -> anyhow::Result<Duration> {
    parse_startup_wait(std::env::var(STARTUP_WAIT_ENV).ok().as_deref())
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
    /// Serve the API without tokens, one admin over every team: for local use only (the
    /// default needs a token on every route but /healthz, /metrics and /v1/openapi.json).
    #[arg(
        long,
        env = "FLEET_OPEN_API",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub open_api: bool,
    /// Serve the open API on an address other than loopback (every host that reaches it is
    /// an admin over every team).
    #[arg(
        long,
        env = "FLEET_OPEN_API_ANY_ADDRESS",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub open_api_any_address: bool,
}

#[derive(Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub backends: Backends,
    /// The fleet's quota ledger: team budgets and call rates, `FLEET_LLM_RATE` over every
    /// worker, the back-off on a provider's 429s.
    #[arg(long, env = "FLEET_REDIS", default_value = "redis://127.0.0.1:6379")]
    pub redis: String,
    #[command(flatten)]
    pub worker: WorkerSettings,
    /// Where `/metrics` is served.
    #[arg(long, env = "FLEET_METRICS_LISTEN", default_value = "127.0.0.1:0")]
    pub metrics_listen: String,
    /// Image checked at startup with the Docker sandbox (empty: no check).
    #[arg(long, env = "FLEET_AGENT_IMAGE", default_value = "fleet-agent-py:1")]
    pub agent_image: String,
    /// Containers kept started ahead per kind of job (image, worktree mode, mounts), each
    /// handed to one job only (0: every container is created for its job).
    #[arg(long, env = "FLEET_WARM_CONTAINERS", default_value_t = 0)]
    pub warm_containers: usize,
    /// Image affinity: once this worker has run a container of an image, it takes that image's
    /// jobs first; a job no holder takes within this many milliseconds goes to any worker.
    /// Every worker of a namespace that turns it on must give the same wait (0: off).
    #[arg(long, env = "FLEET_IMAGE_AFFINITY_WAIT_MS", default_value_t = 0)]
    pub image_affinity_wait_ms: u64,
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
        // Refused before any dependency is waited for.
        worker::sandbox::check_user(&self.sandbox_user).map_err(|e| anyhow!(e))?;
        let prices = PriceTable::from_env().map_err(|e| anyhow!(e))?;
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let defaults = LlmSettings::default();
        // One limit per provider, each over every agent of this worker.
        let rate = || -> anyhow::Result<_> {
            env("FLEET_LLM_RATE")
                .map(|spec| worker::agent::rate::RateLimit::parse(&spec).map(std::sync::Arc::new))
                .transpose()
                .map_err(|e| anyhow!(e))
        };
        let llm = LlmSettings {
            anthropic_base_url: env("FLEET_ANTHROPIC_BASE_URL")
                .unwrap_or(defaults.anthropic_base_url),
            anthropic_api_key: env("ANTHROPIC_API_KEY"),
            openai_base_url: env("FLEET_OPENAI_BASE_URL").unwrap_or(defaults.openai_base_url),
            openai_api_key: env("OPENAI_API_KEY"),
            prices,
            anthropic_rate: rate()?,
            openai_rate: rate()?,
            gateway: worker::agent::gateway_policy::GatewayLimits::from_env(env)
                .map_err(|e| anyhow!(e))?,
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
            images: shared::images::ImageAllow::parse(
                &env("FLEET_TEAM_IMAGES").unwrap_or_default(),
            )
            .map_err(|e| anyhow!("FLEET_TEAM_IMAGES: {e}"))?,
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
pub struct StatusArgs {
    pub run_id: String,
    /// Print the run and every child run below it, one per line, indented by depth.
    #[arg(long)]
    pub tree: bool,
    /// The status view as JSON, also for a run that has a dashboard.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args)]
pub struct EventsArgs {
    pub run_id: String,
    /// Only events of this type (`claim`, `gate_fail`, `verification`, `budget_warning`...).
    #[arg(long = "type")]
    pub event_type: Option<String>,
    /// Only events of this session (a job id).
    #[arg(long)]
    pub session: Option<String>,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args)]
pub struct BudgetArgs {
    pub run_id: String,
    /// The new limit in dollars (above what the run spent).
    #[arg(long)]
    pub usd: f64,
    /// Who raised it (kept with the budget's marks).
    #[arg(long, default_value = "")]
    pub by: String,
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
    /// A JSON file of edits sent with the approval, for a node that takes them (the hardened
    /// coder's `approve_features`: the feature list as the person wants it).
    #[arg(long, conflicts_with = "reject")]
    pub edits: Option<std::path::PathBuf>,
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
    /// Built-in agent loop (or, with --agent-command, the API the command agent speaks through
    /// the worker's gateway): `anthropic` or `openai`.
    #[arg(long)]
    pub llm_api: Option<String>,
    #[arg(long)]
    pub llm_model: Option<String>,
    /// A command agent installed in the node's image: the program and its arguments, split on
    /// whitespace (needs --llm-api and --llm-model).
    #[arg(long)]
    pub agent_command: Option<String>,
    /// A command agent's budget per run: calls through the gateways (default 50).
    #[arg(long)]
    pub agent_max_calls: Option<u32>,
    /// A command agent's budget per run: input plus output tokens (default 1,000,000).
    #[arg(long)]
    pub agent_max_tokens: Option<u64>,
    /// The run's budget in dollars: a warning event at 80%, paused at 100% (`fleet budget`
    /// raises it and the run goes on).
    #[arg(long)]
    pub budget_usd: Option<f64>,
    /// A webhook for the run's notices (budget, approvals, quarantine, its end), signed with
    /// the coordinator's `FLEET_WEBHOOK_SECRET`.
    #[arg(long)]
    pub webhook: Option<String>,
}

#[derive(Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub spec: RunSpec,
    /// Name the repository by its path on the coordinator's disk (beneath a root its admin
    /// allows) instead of uploading it from here.
    #[arg(long)]
    pub repo_on_server: bool,
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
            (None, Some(api)) if self.agent_command.is_some() => {
                let model = self
                    .llm_model
                    .clone()
                    .ok_or_else(|| anyhow!("--llm-model is required with --agent-command"))?;
                let argv: Vec<String> = self
                    .agent_command
                    .iter()
                    .flat_map(|c| c.split_whitespace())
                    .map(str::to_string)
                    .collect();
                let mut agent =
                    json!({"backend": "command", "argv": argv, "api": api, "model": model});
                if let Some(n) = self.agent_max_calls {
                    agent["max_calls"] = json!(n);
                }
                if let Some(n) = self.agent_max_tokens {
                    agent["max_tokens"] = json!(n);
                }
                serde_json::from_value(agent).map_err(|e| {
                    anyhow!("bad command agent (--llm-api is anthropic or openai): {e}")
                })?
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
            (None, None) if self.agent_command.is_some() => {
                bail!("--agent-command needs --llm-api and --llm-model")
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
            budget_usd: self.budget_usd,
            webhook: self.webhook.clone(),
            team: None,
            upload: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_startup_wait_defaults_to_thirty_seconds_and_takes_fractions() {
        assert_eq!(parse_startup_wait(None).unwrap(), Duration::from_secs(30));
        assert_eq!(
            parse_startup_wait(Some("")).unwrap(),
            Duration::from_secs(30)
        );
        assert_eq!(
            parse_startup_wait(Some(" 2 ")).unwrap(),
            Duration::from_secs(2)
        );
        assert_eq!(parse_startup_wait(Some("0")).unwrap(), Duration::ZERO);
        assert_eq!(
            parse_startup_wait(Some("0.5")).unwrap(),
            Duration::from_millis(500)
        );
        for bad in ["-1", "soon", "NaN", "inf", "1e9"] {
            let e = parse_startup_wait(Some(bad)).unwrap_err().to_string();
            assert!(e.contains(STARTUP_WAIT_ENV) && e.contains(bad), "{e}");
        }
    }
}
