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
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Subcommand)]
pub enum BatchCmd {
    /// Submit a dataset (JSONL: one item per line) as a batch; prints the batch id.
    Submit(BatchSubmitArgs),
    /// Show a batch's counts.
    Status(BatchRef),
    /// Wait for a batch to finish, printing progress; exits 0 when every item has a verdict.
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

#[derive(Args)]
pub struct BatchSubmitArgs {
    /// The dataset: one JSON object per line (`id`, `repo`, `ref`, `input` or `work_order`,
    /// `script`); relative repo paths are read from the dataset file's folder.
    pub dataset: PathBuf,
    #[arg(long, default_value = "graphs/factory/graph.yaml")]
    pub graph: PathBuf,
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
    /// Labels, `key=value` (repeatable).
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// Factory graphs: attempts per item.
    #[arg(long)]
    pub max_attempts: Option<u32>,
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
fn read_dataset(path: &Path) -> anyhow::Result<String> {
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
        if let Some(repo) = item.get("repo").and_then(Value::as_str) {
            if Path::new(repo).is_relative() {
                item["repo"] = json!(base.join(repo).display().to_string());
            }
        }
        out.push_str(&serde_json::to_string(&item)?);
        out.push('\n');
    }
    Ok(out)
}

impl BatchSubmitArgs {
    fn request(&self) -> anyhow::Result<BatchRequest> {
        let agent = match &self.script {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read the script `{}`", p.display()))?;
                let script: BTreeMap<String, Vec<ScriptStep>> = serde_json::from_str(&text)
                    .map_err(|e| anyhow!("script `{}` is malformed: {e}", p.display()))?;
                AgentConfig::Scripted { script }
            }
            None => AgentConfig::default(),
        };
        let mut labels = BTreeMap::new();
        for l in &self.labels {
            let (k, v) = l
                .split_once('=')
                .ok_or_else(|| anyhow!("label `{l}`: write key=value"))?;
            labels.insert(k.to_string(), v.to_string());
        }
        let options = match self.max_attempts {
            Some(n) => json!({"max_attempts": n}),
            None => json!({}),
        };
        Ok(BatchRequest {
            graph: load_graph(&self.graph)?,
            dataset: read_dataset(&self.dataset)?,
            agent,
            options,
            spec: BatchSpec {
                trials: self.trials,
                max_running: self.max_running,
                max_infra_retries: self.max_infra_retries,
                labels,
            },
        })
    }
}

fn counts_line(id: &str, v: &Value) -> String {
    let c = &v["counts"];
    format!(
        "batch {id}: {} of {} done (passed {}, failed {}, errored {}, cancelled {}), {} running, {} queued",
        c["passed"].as_u64().unwrap_or(0)
            + c["failed"].as_u64().unwrap_or(0)
            + c["errored"].as_u64().unwrap_or(0)
            + c["cancelled"].as_u64().unwrap_or(0),
        c["total"],
        c["passed"],
        c["failed"],
        c["errored"],
        c["cancelled"],
        c["running"],
        c["queued"],
    )
}

fn finished(v: &Value) -> bool {
    v["batch"]["finished_at"].is_string()
}

pub async fn run(cmd: BatchCmd, out: &mut Out) -> anyhow::Result<i32> {
    match cmd {
        BatchCmd::Submit(a) => {
            let req = a.request()?;
            let answer: Value = Client::new(&a.server.server)
                .post("/v1/batches", &req)
                .await?;
            let id = answer["batch_id"]
                .as_str()
                .ok_or_else(|| anyhow!("the coordinator answered without a batch id: {answer}"))?;
            out.line(id)?;
            Ok(0)
        }
        BatchCmd::Status(b) => {
            let v: Value = Client::new(&b.server.server)
                .get(&format!("/v1/batches/{}", b.batch_id))
                .await?;
            out.line(counts_line(&b.batch_id, &v))?;
            Ok(0)
        }
        BatchCmd::Wait(b) => {
            let client = Client::new(&b.server.server);
            let mut last = String::new();
            loop {
                let v: Value = client.get(&format!("/v1/batches/{}", b.batch_id)).await?;
                let line = counts_line(&b.batch_id, &v);
                if line != last {
                    out.line(&line)?;
                    last = line;
                }
                if finished(&v) {
                    let c = &v["counts"];
                    let clean = c["errored"] == 0 && c["cancelled"] == 0;
                    return Ok(if clean { 0 } else { 1 });
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
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
            let which = match (r.failed, r.errored, r.not_passed) {
                (true, false, false) => "failed",
                (false, true, false) => "errored",
                (false, false, true) => "not_passed",
                _ => bail!("say which items: --failed, --errored or --not-passed"),
            };
            let answer: Value = Client::new(&r.server.server)
                .post(
                    &format!("/v1/batches/{}/rerun", r.batch_id),
                    &json!({ "which": which }),
                )
                .await?;
            let id = answer["batch_id"]
                .as_str()
                .ok_or_else(|| anyhow!("the coordinator answered without a batch id: {answer}"))?;
            out.line(id)?;
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
