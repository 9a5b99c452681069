//! `fleet batch`: submit a dataset as a batch, follow it, cancel it, list batches, write its
//! reports (JSON, JUnit XML and a self-contained HTML page).

use super::args::ServerArg;
use super::graph_tools::load_graph;
use super::{Client, Out};
use crate::batches::BatchRequest;
use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use shared::batch::BatchSpec;
use shared::messages::{AgentConfig, ScriptStep};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Subcommand)]
pub enum BatchCmd {
    /// Submit a dataset (JSONL: one item per line) as a batch; prints the batch id.
    Submit(BatchSubmitArgs),
    /// Show a batch's counts.
    Status(BatchRef),
    /// Wait for a batch to finish with a progress bar (done, running, queued, pass rate and
    /// cost so far, ETA); exits 0 when every item has a verdict (none errored, cancelled or
    /// flaky).
    Wait(BatchRef),
    /// Cancel a batch: queued items never start, running runs are cancelled.
    Cancel(BatchRef),
    /// List batches.
    List(ServerArg),
    /// Make a new batch of the chosen items of this one; prints its id.
    Rerun(BatchRerunArgs),
    /// Compare two batches item by item: improved, regressed, flipped, cost deltas (JSON).
    Compare(BatchCompareArgs),
    /// Write the batch's reports: `report.json`, `junit.xml` and `report.html` in `--out`.
    Report(BatchReportArgs),
}

/// How a batch's items run: shared by `fleet batch submit` and `fleet schedule add`.
#[derive(Args)]
pub struct BatchRunArgs {
    /// Scripted agent of items without a script of their own: JSON {node: [steps]}.
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// Runs per item.
    #[arg(long, default_value_t = 1)]
    pub trials: u32,
    /// Runs of the batch at once.
    #[arg(long, default_value_t = 8)]
    pub max_running: u32,
    /// New runs of an item after infrastructure errors (never counted as verdicts).
    #[arg(long, default_value_t = 2)]
    pub max_infra_retries: u32,
    /// The batch's part of the fleet's batch slots against the other unfinished batches
    /// (1 to 1000): weight 2 gets twice the runs of weight 1 when both want more.
    #[arg(long, default_value_t = 1)]
    pub weight: u32,
    /// Labels, `key=value` (repeatable).
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// Factory graphs: attempts per item.
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// Where SWE-bench lines' repositories are: `owner/name` is the git repository
    /// DIR/owner__name (a path the coordinator can open).
    #[arg(long)]
    pub mirror_dir: Option<PathBuf>,
}

impl BatchRunArgs {
    /// `--mirror-dir` as an absolute path (it must exist here).
    pub(super) fn mirror_dir(&self) -> anyhow::Result<Option<String>> {
        self.mirror_dir
            .as_ref()
            .map(|d| {
                d.canonicalize()
                    .with_context(|| format!("the mirror directory `{}`", d.display()))
                    .map(|p| p.display().to_string())
            })
            .transpose()
    }

    /// The agent of items without a script of their own.
    pub(super) fn agent(&self) -> anyhow::Result<AgentConfig> {
        read_agent(self.script.as_deref())
    }

    /// The batch's spec with `labels` added to the given ones.
    pub(super) fn spec(&self) -> anyhow::Result<BatchSpec> {
        Ok(BatchSpec {
            trials: self.trials,
            max_running: self.max_running,
            max_infra_retries: self.max_infra_retries,
            labels: parse_labels(&self.labels)?,
            weight: self.weight,
        })
    }

    /// The run options every item's run gets (factory graphs: attempts per item).
    pub(super) fn options(&self) -> serde_json::Value {
        match self.max_attempts {
            Some(n) => json!({"max_attempts": n}),
            None => json!({}),
        }
    }
}

#[derive(Args)]
pub struct BatchSubmitArgs {
    /// The dataset: one JSON object per line (`id`, `repo`, `ref`, `input` or `work_order`,
    /// `script`); relative repo paths are read from the dataset file's folder.
    pub dataset: PathBuf,
    #[arg(long, default_value = "graphs/factory/graph.yaml")]
    pub graph: PathBuf,
    #[command(flatten)]
    pub run: BatchRunArgs,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args)]
pub struct BatchRerunArgs {
    pub batch_id: String,
    /// Rerun the items with a failing verdict.
    #[arg(long, group = "which")]
    pub failed: bool,
    /// Rerun the items that ended on an infrastructure error.
    #[arg(long, group = "which")]
    pub errored: bool,
    /// Rerun every item that did not pass.
    #[arg(long, group = "which")]
    pub not_passed: bool,
    /// Rerun every item (harness and command steps whose inputs did not change are reused
    /// from the step cache).
    #[arg(long, group = "which")]
    pub all: bool,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args)]
pub struct BatchCompareArgs {
    /// The batch before.
    pub before: String,
    /// The batch after.
    pub after: String,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args)]
pub struct BatchRef {
    pub batch_id: String,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args)]
pub struct BatchReportArgs {
    pub batch_id: String,
    #[arg(long, default_value = "fleet-report")]
    pub out: PathBuf,
    #[command(flatten)]
    pub server: ServerArg,
}

/// The dataset with relative repo paths made absolute against the dataset's folder.
pub(super) fn read_dataset(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the dataset `{}`", path.display()))?;
    let base = path
        .parent()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .unwrap_or(Path::new("."))
        .canonicalize()?;
    let mut out = String::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut item: Value = serde_json::from_str(line)
            .map_err(|e| anyhow!("{}:{}: not JSON: {e}", path.display(), i + 1))?;
        // SWE-bench lines (and items with `mirror`) name `owner/name` in the mirror directory.
        let mirrored = item.get("instance_id").is_some() || item["mirror"] == true;
        if let Some(repo) = item.get("repo").and_then(Value::as_str) {
            if Path::new(repo).is_relative() && !mirrored {
                item["repo"] = json!(base.join(repo).display().to_string());
            }
        }
        out.push_str(&serde_json::to_string(&item)?);
        out.push('\n');
    }
    Ok(out)
}

/// The agent of items without a script of their own: the scripted agent of `script` (JSON
/// `{node: [steps]}`), else the default.
fn read_agent(script: Option<&Path>) -> anyhow::Result<AgentConfig> {
    let Some(p) = script else {
        return Ok(AgentConfig::default());
    };
    let text = std::fs::read_to_string(p)
        .with_context(|| format!("cannot read the script `{}`", p.display()))?;
    let script: BTreeMap<String, Vec<ScriptStep>> = serde_json::from_str(&text)
        .map_err(|e| anyhow!("script `{}` is malformed: {e}", p.display()))?;
    Ok(AgentConfig::Scripted { script })
}

/// `key=value` labels.
fn parse_labels(labels: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    labels
        .iter()
        .map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| anyhow!("label `{l}`: write key=value"))
        })
        .collect()
}

impl BatchSubmitArgs {
    fn request(&self) -> anyhow::Result<BatchRequest> {
        Ok(BatchRequest {
            graph: load_graph(&self.graph)?,
            dataset: read_dataset(&self.dataset)?,
            agent: self.run.agent()?,
            options: self.run.options(),
            spec: self.run.spec()?,
            mirror_dir: self.run.mirror_dir()?,
            team: None,
        })
    }
}

/// One line of a batch's progress: `batch <id>: 3 of 10 done (passed 2, failed 1, flaky 0,
/// errored 0, cancelled 0), 2 running, 5 queued, pass rate 67%, $0.1200, eta 40s`.
fn counts_line(id: &str, v: &Value) -> String {
    let c = &v["counts"];
    format!(
        "batch {id}: {} of {} done (passed {}, failed {}, flaky {}, errored {}, cancelled {}), {}",
        c["passed"].as_u64().unwrap_or(0)
            + c["failed"].as_u64().unwrap_or(0)
            + c["flaky"].as_u64().unwrap_or(0)
            + c["errored"].as_u64().unwrap_or(0)
            + c["cancelled"].as_u64().unwrap_or(0),
        c["total"],
        c["passed"],
        c["failed"],
        c["flaky"].as_u64().unwrap_or(0),
        c["errored"],
        c["cancelled"],
        progress_tail(v),
    )
}

/// `2 running, 5 queued, pass rate 67%, $0.1200, eta 40s` from the view's `progress`.
fn progress_tail(v: &Value) -> String {
    let p = &v["progress"];
    let mut tail = format!("{} running, {} queued", p["running"], p["queued"]);
    if let Some(rate) = p["pass_rate"].as_f64() {
        tail.push_str(&format!(", pass rate {:.0}%", rate * 100.0));
    }
    tail.push_str(&format!(", ${:.4}", p["cost_usd"].as_f64().unwrap_or(0.0)));
    if let Some(eta) = p["eta_seconds"].as_f64() {
        tail.push_str(&format!(", eta {}", short_duration(eta)));
    }
    tail
}

/// `45s`, `3m05s`, `2h10m`.
fn short_duration(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// Follows a batch to its end: a progress bar (done of total, with the tail of
/// [`counts_line`]) on a terminal, one line per change otherwise.
async fn wait(client: &Client, id: &str, out: &mut Out) -> anyhow::Result<i32> {
    let bar = std::io::stdout().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("batch {id}"));
        bar
    });
    let mut last = String::new();
    loop {
        let v: Value = client.get(&format!("/v1/batches/{id}/summary")).await?;
        match &bar {
            Some(bar) => {
                bar.set_length(v["progress"]["total"].as_u64().unwrap_or(0));
                bar.set_position(v["progress"]["done"].as_u64().unwrap_or(0));
                bar.set_message(progress_tail(&v));
            }
            None => {
                let line = counts_line(id, &v);
                if line != last {
                    out.line(&line)?;
                    last = line;
                }
            }
        }
        if finished(&v) {
            if let Some(bar) = &bar {
                bar.finish_and_clear();
                out.line(counts_line(id, &v))?;
            }
            // Every item with a verdict: none errored, cancelled or flaky (no verdict).
            let c = &v["counts"];
            let clean =
                c["errored"] == 0 && c["cancelled"] == 0 && c["flaky"].as_u64().unwrap_or(0) == 0;
            return Ok(if clean { 0 } else { 1 });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn finished(v: &Value) -> bool {
    v["batch"]["finished_at"].is_string()
}

/// The batch id of a submit or rerun answer.
fn batch_id_of(answer: &Value) -> anyhow::Result<&str> {
    answer["batch_id"]
        .as_str()
        .ok_or_else(|| anyhow!("the coordinator answered without a batch id: {answer}"))
}

pub async fn run(cmd: BatchCmd, out: &mut Out) -> anyhow::Result<i32> {
    match cmd {
        BatchCmd::Submit(a) => {
            let req = a.request()?;
            let answer: Value = Client::new(&a.server.server)
                .post("/v1/batches", &req)
                .await?;
            out.line(batch_id_of(&answer)?)?;
            Ok(0)
        }
        BatchCmd::Status(b) => {
            let v: Value = Client::new(&b.server.server)
                .get(&format!("/v1/batches/{}/summary", b.batch_id))
                .await?;
            out.line(counts_line(&b.batch_id, &v))?;
            Ok(0)
        }
        BatchCmd::Wait(b) => wait(&Client::new(&b.server.server), &b.batch_id, out).await,
        BatchCmd::Cancel(b) => {
            let v: Value = Client::new(&b.server.server)
                .post(&format!("/v1/batches/{}/cancel", b.batch_id), &json!({}))
                .await?;
            out.line(counts_line(&b.batch_id, &v))?;
            Ok(0)
        }
        BatchCmd::List(s) => {
            let list: Value = Client::new(&s.server).get("/v1/batches").await?;
            for b in list.as_array().into_iter().flatten() {
                let id = b["batch_id"].as_str().unwrap_or_default();
                out.line(format!(
                    "{id}  {:<12} {}",
                    b["graph"].as_str().unwrap_or_default(),
                    if b["finished"] == true {
                        "finished"
                    } else {
                        "running"
                    }
                ))?;
            }
            Ok(0)
        }
        BatchCmd::Rerun(r) => {
            let which = match (r.failed, r.errored, r.not_passed, r.all) {
                (true, false, false, false) => "failed",
                (false, true, false, false) => "errored",
                (false, false, true, false) => "not_passed",
                (false, false, false, true) => "all",
                _ => bail!("say which items: --failed, --errored, --not-passed or --all"),
            };
            let answer: Value = Client::new(&r.server.server)
                .post(
                    &format!("/v1/batches/{}/rerun", r.batch_id),
                    &json!({ "which": which }),
                )
                .await?;
            out.line(batch_id_of(&answer)?)?;
            Ok(0)
        }
        BatchCmd::Compare(c) => {
            let v: Value = Client::new(&c.server.server)
                .get(&format!("/v1/batches/{}/compare/{}", c.before, c.after))
                .await?;
            out.line(serde_json::to_string_pretty(&v)?)?;
            Ok(0)
        }
        BatchCmd::Report(r) => {
            let client = Client::new(&r.server.server);
            let report: Value = client
                .get(&format!("/v1/batches/{}/report", r.batch_id))
                .await?;
            let junit = client
                .text(&format!("/v1/batches/{}/junit", r.batch_id))
                .await?;
            let html = client
                .text(&format!("/v1/batches/{}/html", r.batch_id))
                .await?;
            std::fs::create_dir_all(&r.out)
                .with_context(|| format!("cannot create {}", r.out.display()))?;
            let json_path = r.out.join("report.json");
            std::fs::write(&json_path, serde_json::to_vec_pretty(&report)?)?;
            let xml_path = r.out.join("junit.xml");
            std::fs::write(&xml_path, junit)?;
            let html_path = r.out.join("report.html");
            std::fs::write(&html_path, html)?;
            out.line(json_path.display())?;
            out.line(xml_path.display())?;
            out.line(html_path.display())?;
            if report.is_null() {
                bail!("empty report");
            }
            Ok(0)
        }
    }
}
