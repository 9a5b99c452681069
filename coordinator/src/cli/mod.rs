//! The `fleet` command line: servers (coordinator, worker), a client of the HTTP API, the
//! embedded mode and the graph tools.
//!
//! - `args`: argument structs and configuration from the environment;
//! - `serve`: coordinator and worker bootstrap (with `startup`'s dependency checks), `fleet run`;
//! - `client`: the typed HTTP client; `watch`: `wait` and `cancel`;
//! - `batch`: `fleet batch`; `schedule`: `fleet schedule`;
//! - `graph_tools`: loading and checking graphs, the Mermaid rendering.

mod args;
mod batch;
mod client;
mod dashboard;
mod graph_tools;
mod quarantine;
mod schedule;
mod serve;
mod startup;
mod team;
mod token;
mod upload;
mod watch;

pub use args::*;
pub use client::Client;
pub use graph_tools::{check_for_providers, live_states, load_graph, mermaid};
pub use startup::redact_url;

use anyhow::Context;
use clap::{Parser, Subcommand};
use shared::time::rfc3339;
use std::fmt::Display;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "fleet",
    version,
    about = "run adversarial coding-agent graphs on a fleet"
)]
pub struct Cli {
    /// Log as JSON lines (also with FLEET_LOG_FORMAT=json).
    #[arg(long, global = true)]
    pub log_json: bool,
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
    /// Show a run's status (JSON), or with --tree the run and its child runs as a tree.
    Status(StatusArgs),
    /// Wait for a run to finish, with a progress display; exits 0 on success.
    Wait(WaitArgs),
    /// Show a run's job history.
    Logs(RunRef),
    /// List a run's artifacts, or fetch one with --get.
    Artifacts(ArtifactsArgs),
    /// Cancel a run that is still going (exit code 1 when it already finished).
    Cancel(RunRef),
    /// Approve (or reject) a run's approval node.
    Approve(ApproveArgs),
    /// Items a run holds for a person (claims the verifier could not decide): list, approve,
    /// reject.
    Quarantine {
        #[command(subcommand)]
        cmd: quarantine::QuarantineCmd,
    },
    /// The team's quotas over the fleet: spend today, limits, runs under way, webhook, notices.
    Team {
        #[command(subcommand)]
        cmd: team::TeamCmd,
    },
    /// API tokens: create, list, revoke; `bootstrap` makes a team's first admin token.
    Token {
        #[command(subcommand)]
        cmd: token::TokenCmd,
    },
    /// A run's event log (seed 004's events), one JSON line per event.
    Events(EventsArgs),
    /// Set a run's budget in dollars: a run paused on its budget resumes.
    Budget(BudgetArgs),
    /// List runs.
    List(ServerArg),
    /// Run a graph to the end in this process (embedded mode: no RabbitMQ, Redis or S3).
    Run(RunArgs),
    /// Graph tools.
    Graph {
        #[command(subcommand)]
        cmd: GraphCmd,
    },
    /// Batches: a dataset run as one run per item and trial, with reports.
    Batch {
        #[command(subcommand)]
        cmd: batch::BatchCmd,
    },
    /// Schedules: a batch fired on a cron expression, its report sent to a webhook.
    Schedule {
        #[command(subcommand)]
        cmd: schedule::ScheduleCmd,
    },
}

#[derive(Subcommand)]
pub enum GraphCmd {
    /// Run the static checker on a graph file, and the LLM providers' rules on its agents'
    /// schemas: with --llm-api, that provider's rules are errors and the other's warnings;
    /// without it, both providers' rules are errors.
    Check {
        file: PathBuf,
        #[arg(long, value_parser = ["anthropic", "openai"])]
        llm_api: Option<String>,
    },
    /// Print the graph as a Mermaid flowchart; with --run, coloured by the run's node states.
    Show {
        file: PathBuf,
        #[arg(long)]
        run: Option<String>,
        #[command(flatten)]
        server: ServerArg,
    },
}

/// Whether logs are JSON lines: the `--log-json` flag or `FLEET_LOG_FORMAT=json`.
pub fn log_json(flag: bool, format_env: Option<&str>) -> bool {
    flag || format_env.is_some_and(|f| f.trim().eq_ignore_ascii_case("json"))
}

/// Lines on stdout that survive a closed pipe (`fleet wait RUN | head -1`): once the reader
/// is gone the rest is dropped, and the command still ends with its own exit code.
#[derive(Default)]
pub struct Out {
    closed: bool,
}

impl Out {
    pub fn line(&mut self, text: impl Display) -> std::io::Result<()> {
        self.bytes(format!("{text}\n").as_bytes())
    }

    pub fn bytes(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.closed {
            return Ok(());
        }
        let mut stdout = std::io::stdout().lock();
        match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            other => other,
        }
    }

    /// Whether the reader went away.
    pub fn closed(&self) -> bool {
        self.closed
    }
}

pub async fn main(cli: Cli) -> anyhow::Result<i32> {
    let mut out = Out::default();
    match cli.cmd {
        Cmd::Coordinator(a) => serve::coordinator(a).await,
        Cmd::Worker(a) => serve::worker_main(a).await,
        Cmd::Run(a) => serve::run_embedded(a).await,
        Cmd::Submit(a) => {
            let mut req = a.spec.request()?;
            let client = Client::new(&a.server.server);
            if !a.repo_on_server {
                let repo = PathBuf::from(&req.repo);
                let sent = upload::attach(&client, &mut req, &repo, &a.spec.git_ref).await?;
                eprintln!("{sent}");
            }
            let resp = client.submit(&req).await?;
            out.line(&resp.run_id)?;
            if !resp.created {
                eprintln!("(a run with the same inputs exists; returning it)");
            }
            Ok(0)
        }
        Cmd::Status(r) if r.tree => {
            let tree = Client::new(&r.server.server).tree(&r.run_id).await?;
            for line in tree.tree.lines() {
                out.line(line)?;
            }
            Ok(0)
        }
        Cmd::Status(r) => {
            let client = Client::new(&r.server.server);
            let v = client.status(&r.run_id).await?;
            if !r.json {
                // A run with a feature list (seed 004) gets the seed's dashboard.
                let d: serde_json::Value = client
                    .get(&format!("/v1/runs/{}/dashboard", r.run_id))
                    .await?;
                let d: shared::tracking::dashboard::Dashboard = serde_json::from_value(d)?;
                if d.progress.is_some() {
                    for line in dashboard::render(&d) {
                        out.line(line)?;
                    }
                    return Ok(0);
                }
            }
            out.line(serde_json::to_string_pretty(&v)?)?;
            // The team's quotas beside the run (on stderr: stdout stays the run's JSON).
            if let Some(team) = v["team"].as_str() {
                match client
                    .get::<serde_json::Value>(&format!("/v1/team?team={team}"))
                    .await
                {
                    Ok(t) => match serde_json::from_value(t) {
                        Ok(t) => eprintln!("{}", team::one_line(&t)),
                        Err(e) => eprintln!("(the team's quotas could not be read: {e})"),
                    },
                    Err(e) => eprintln!("(the team's quotas could not be read: {e})"),
                }
            }
            Ok(0)
        }
        Cmd::Events(e) => {
            dashboard::events(
                &e.server.server,
                &e.run_id,
                e.event_type.as_deref(),
                e.session.as_deref(),
                &mut out,
            )
            .await
        }
        Cmd::Budget(b) => {
            dashboard::budget(&b.server.server, &b.run_id, b.usd, &b.by, &mut out).await
        }
        Cmd::Wait(w) => {
            let timeout = Duration::from_secs(w.timeout);
            watch::wait(&w.server.server, &w.run_id, timeout, &mut out).await
        }
        Cmd::Cancel(r) => watch::cancel(&r.server.server, &r.run_id, &mut out).await,
        Cmd::Logs(r) => {
            for e in Client::new(&r.server.server).logs(&r.run_id).await? {
                let status = serde_json::to_value(e.status)?
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let error = e.error.map(|s| format!(": {s}")).unwrap_or_default();
                let finished = e.finished_at.as_ref().map(rfc3339).unwrap_or_default();
                let reused = e
                    .cached_from
                    .as_ref()
                    .map(|c| format!(" (cached from {})", c.job_id))
                    .unwrap_or_default();
                out.line(format!(
                    "{finished} {status:>10} {} visit {} on {}{reused}{error}",
                    e.node, e.visit, e.worker
                ))?;
                for (name, key) in &e.artifacts {
                    out.line(format!("    {name}: {key}"))?;
                }
            }
            Ok(0)
        }
        Cmd::Artifacts(a) => {
            let client = Client::new(&a.server.server);
            match &a.get {
                None => {
                    let listing = client.artifacts(&a.run_id).await?;
                    for k in listing.keys {
                        out.line(k)?;
                    }
                    if !listing.superseded.is_empty() {
                        out.line(format!(
                            "# {} artifacts of executions the run did not accept:",
                            listing.superseded.len()
                        ))?;
                        for k in listing.superseded {
                            out.line(format!("# {k}"))?;
                        }
                    }
                }
                Some(key) => {
                    let bytes = client.artifact(&a.run_id, key).await?;
                    match &a.out {
                        Some(p) => std::fs::write(p, bytes)?,
                        None => out.bytes(&bytes)?,
                    }
                }
            }
            Ok(0)
        }
        Cmd::Approve(a) => {
            let edits = match &a.edits {
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read {}", path.display()))?;
                    Some(
                        serde_json::from_str(&text)
                            .with_context(|| format!("{} is not JSON", path.display()))?,
                    )
                }
                None => None,
            };
            let d = Client::new(&a.server.server)
                .decide(&a.run_id, &a.node, !a.reject, &a.by, &a.comment, edits)
                .await?;
            out.line(format!("{}: {}", a.node, d.applied))?;
            Ok(0)
        }
        Cmd::List(s) => {
            for r in Client::new(&s.server).runs().await? {
                out.line(format!(
                    "{}  {:<10} {:<10} {}",
                    r.run_id,
                    r.graph,
                    client::status_name(r.status),
                    r.created_at.as_ref().map(rfc3339).unwrap_or_default()
                ))?;
            }
            Ok(0)
        }
        Cmd::Batch { cmd } => batch::run(cmd, &mut out).await,
        Cmd::Quarantine { cmd } => quarantine::run(cmd, &mut out).await,
        Cmd::Token { cmd } => token::run(cmd, &mut out).await,
        Cmd::Team { cmd } => team::run(cmd, &mut out).await,
        Cmd::Schedule { cmd } => schedule::run(cmd, &mut out).await,
        Cmd::Graph { cmd } => match cmd {
            GraphCmd::Check { file, llm_api } => {
                let b = load_graph(&file)?;
                let providers = match llm_api.as_deref() {
                    Some("openai") => vec![shared::providers::Provider::Openai],
                    Some(_) => vec![shared::providers::Provider::Anthropic],
                    None => shared::providers::Provider::ALL.to_vec(),
                };
                check_for_providers(&b, &providers)?;
                out.line(format!(
                    "{}: ok ({} nodes)",
                    file.display(),
                    b.graph.nodes.len()
                ))?;
                Ok(0)
            }
            GraphCmd::Show { file, run, server } => {
                let b = load_graph(&file)?;
                let mut chart = mermaid(&b);
                if let Some(run) = run {
                    let v = Client::new(&server.server).status(&run).await?;
                    chart.push_str(&live_states(&b, &v));
                }
                out.bytes(chart.as_bytes())?;
                Ok(0)
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn log_json_is_a_global_flag_or_the_environment() {
        let cli = Cli::try_parse_from(["fleet", "graph", "check", "g.yaml", "--log-json"]).unwrap();
        assert!(cli.log_json);
        let cli = Cli::try_parse_from(["fleet", "--log-json", "list"]).unwrap();
        assert!(cli.log_json);
        assert!(log_json(false, Some("json")));
        assert!(log_json(false, Some(" JSON ")));
        assert!(!log_json(false, Some("plain")));
        assert!(!log_json(false, None));
        assert!(log_json(true, None));
    }
}
