//! `fleet schedule`: add a schedule (a batch fired on a cron expression, its report sent to a
//! webhook), list, show (with each firing's delivery log), remove, run now.
//!
//! The webhook's secret is read from the environment variable `--webhook-secret-env` names,
//! here on the client: it never appears on a command line (where `ps` shows it) and is sent
//! once, with the schedule.

use super::args::ServerArg;
use super::batch::{read_dataset, BatchRunArgs};
use super::graph_tools::load_graph;
use super::{Client, Out};
use crate::schedules::{ScheduleRequest, WebhookRequest};
use anyhow::anyhow;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum ScheduleCmd {
    /// Add a schedule: the dataset (read now, kept as it is) run as a batch on each tick.
    Add(Box<ScheduleAddArgs>),
    /// List schedules: cron, next tick, last firing and its delivery.
    List(ServerArg),
    /// Show a schedule and its firings, with each delivery's attempts (JSON).
    Show(ScheduleRef),
    /// Remove a schedule (batches it fired go on).
    Remove(ScheduleRef),
    /// Fire a schedule now, as a batch of its own; prints the batch id.
    RunNow(ScheduleRef),
}

#[derive(Args)]
pub struct ScheduleRef {
    pub name: String,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args)]
pub struct ScheduleAddArgs {
    /// 1 to 64 of `[A-Za-z0-9_.-]`, starting with a letter or digit.
    pub name: String,
    /// 5 fields (`0 2 * * *`: 02:00 UTC daily), or 6 with seconds first (`*/30 * * * * *`).
    #[arg(long)]
    pub cron: String,
    /// The dataset (JSONL, as for `fleet batch submit`); relative repo paths are read from
    /// its folder.
    #[arg(long)]
    pub dataset: PathBuf,
    #[arg(long, default_value = "graphs/factory/graph.yaml")]
    pub graph: PathBuf,
    /// How each fired batch runs (`schedule` and `scheduled_for` labels are set by the
    /// schedule).
    #[command(flatten)]
    pub run: BatchRunArgs,
    /// Where each finished firing's report is POSTed (http or https).
    #[arg(long, requires = "webhook_secret_env")]
    pub webhook: Option<String>,
    /// The environment variable holding the webhook's HMAC key (16 bytes at least).
    #[arg(long, requires = "webhook")]
    pub webhook_secret_env: Option<String>,
    #[command(flatten)]
    pub server: ServerArg,
}

impl ScheduleAddArgs {
    fn request(&self) -> anyhow::Result<ScheduleRequest> {
        let webhook = match (&self.webhook, &self.webhook_secret_env) {
            (Some(url), Some(var)) => {
                let secret = std::env::var(var)
                    .ok()
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| {
                        anyhow!("--webhook-secret-env {var}: the variable is not set (or empty)")
                    })?;
                Some(WebhookRequest {
                    url: url.clone(),
                    secret,
                })
            }
            _ => None,
        };
        Ok(ScheduleRequest {
            name: self.name.clone(),
            cron: self.cron.clone(),
            graph: load_graph(&self.graph)?,
            dataset: read_dataset(&self.dataset)?,
            agent: self.run.agent()?,
            options: self.run.options(),
            spec: self.run.spec()?,
            webhook,
            mirror_dir: self.run.mirror_dir()?,
            team: None,
        })
    }
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("-")
}

pub async fn run(cmd: ScheduleCmd, out: &mut Out) -> anyhow::Result<i32> {
    match cmd {
        ScheduleCmd::Add(a) => {
            let req = a.request()?;
            let v: Value = Client::new(&a.server.server)
                .post("/v1/schedules", &req)
                .await?;
            out.line(format!(
                "schedule {} added (dataset sha256 {}); next firing at {}",
                text(&v, "name"),
                text(&v, "dataset_sha256"),
                text(&v, "next_fire_at")
            ))?;
            Ok(0)
        }
        ScheduleCmd::List(s) => {
            let list: Value = Client::new(&s.server).get("/v1/schedules").await?;
            for v in list.as_array().into_iter().flatten() {
                let hook = match &v["webhook"] {
                    Value::Null => "no webhook".to_string(),
                    h => format!(
                        "webhook {} ({})",
                        text(h, "url"),
                        v["last_delivery"].as_str().unwrap_or("nothing sent")
                    ),
                };
                out.line(format!(
                    "{}  {:<16} {:<10} next {}  last {}  {hook}",
                    text(v, "name"),
                    text(v, "cron"),
                    text(v, "graph"),
                    text(v, "next_fire_at"),
                    text(v, "last_batch_id"),
                ))?;
            }
            Ok(0)
        }
        ScheduleCmd::Show(r) => {
            shared::schedule::check_name(&r.name)?;
            let v: Value = Client::new(&r.server.server)
                .get(&format!("/v1/schedules/{}", r.name))
                .await?;
            out.line(serde_json::to_string_pretty(&v)?)?;
            Ok(0)
        }
        ScheduleCmd::Remove(r) => {
            shared::schedule::check_name(&r.name)?;
            let _: Value = Client::new(&r.server.server)
                .post(&format!("/v1/schedules/{}/remove", r.name), &json!({}))
                .await?;
            out.line(format!("schedule {} removed", r.name))?;
            Ok(0)
        }
        ScheduleCmd::RunNow(r) => {
            shared::schedule::check_name(&r.name)?;
            let v: Value = Client::new(&r.server.server)
                .post(&format!("/v1/schedules/{}/run", r.name), &json!({}))
                .await?;
            let id = v["batch_id"]
                .as_str()
                .ok_or_else(|| anyhow!("the coordinator answered without a batch id: {v}"))?;
            out.line(id)?;
            Ok(0)
        }
    }
}
