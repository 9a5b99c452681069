//! `fleet team`: the caller's team's quotas over the fleet: what it spent today against its
//! limits and its runs under way (`show`), its limits (`limits`, admins), its webhook, its
//! budget notices and their deliveries.

use super::args::ServerArg;
use super::{Client, Out};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use shared::quota::{Rate, TeamLimits, TeamView};

#[derive(Subcommand)]
pub enum TeamCmd {
    /// Today's spend against the team's limits, its runs under way, its webhook.
    Show(TeamArg),
    /// Replace the team's limits (admins); a limit not given is none.
    Limits(LimitsArgs),
    /// Set the team's webhook (admins): its budget notices and its runs' notices.
    Webhook(WebhookArgs),
    /// The team's budget notices, newest first, one JSON line each.
    Events(TeamArg),
    /// The team webhook's delivery log, newest first, one JSON line each.
    Deliveries(TeamArg),
}

#[derive(Args)]
pub struct TeamArg {
    /// Only with the open API: the team (a token's team is its own).
    #[arg(long)]
    pub team: Option<String>,
    /// Print the JSON the API answered.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArg,
}

impl TeamArg {
    fn query(&self) -> String {
        self.team
            .as_ref()
            .map(|t| format!("?team={t}"))
            .unwrap_or_default()
    }
}

#[derive(Args)]
pub struct LimitsArgs {
    #[command(flatten)]
    pub team: TeamArg,
    #[arg(long)]
    pub concurrent_runs: Option<u32>,
    /// Jobs of the team queued or running at once over the fleet; past it jobs wait in the
    /// team's line.
    #[arg(long)]
    pub concurrent_jobs: Option<u32>,
    #[arg(long)]
    pub daily_usd: Option<f64>,
    #[arg(long)]
    pub daily_tokens: Option<u64>,
    #[arg(long)]
    pub run_usd: Option<f64>,
    #[arg(long)]
    pub run_tokens: Option<u64>,
    /// `PROVIDER=N/S`: at most N calls to the provider per S seconds over the team's agents
    /// (repeat per provider).
    #[arg(long = "llm-rate")]
    pub llm_rate: Vec<String>,
}

#[derive(Args)]
pub struct WebhookArgs {
    #[command(flatten)]
    pub team: TeamArg,
    /// The webhook's URL; none removes it.
    pub url: Option<String>,
}

/// The team's quotas in one line (`fleet status` prints it beside a run of the team).
pub fn one_line(v: &TeamView) -> String {
    let l = &v.limits;
    let of = |limit: Option<u32>| limit.map(|m| format!(" of {m}")).unwrap_or_default();
    format!(
        "team {}: ${:.4}{} spent today, {} tokens; runs under way {}{}; jobs in flight {}{}, {} waiting",
        v.team,
        v.used_today.usd_micros as f64 / 1e6,
        l.daily_usd.map(|d| format!(" of ${d:.2}")).unwrap_or_default(),
        v.used_today.tokens,
        v.runs_under_way,
        of(l.concurrent_runs),
        v.jobs_in_flight,
        of(l.concurrent_jobs),
        v.jobs_waiting,
    )
}

fn percent(used: u64, limit: Option<u64>) -> String {
    match limit {
        Some(l) if l > 0 => format!(" ({:.0}%)", used as f64 * 100.0 / l as f64),
        _ => String::new(),
    }
}

/// `fleet team show` as lines.
pub fn render(v: &TeamView) -> Vec<String> {
    let l = &v.limits;
    let usd = v.used_today.usd_micros as f64 / 1e6;
    let mut lines = vec![
        format!("team {} · {} (UTC)", v.team, v.day),
        format!(
            "spent today   ${usd:.4}{}{}",
            l.daily_usd
                .map(|d| format!(" of ${d:.2}"))
                .unwrap_or_default(),
            percent(
                v.used_today.usd_micros,
                l.daily_usd.map(shared::quota::usd_micros)
            ),
        ),
        format!(
            "tokens today  {}{}{}",
            v.used_today.tokens,
            l.daily_tokens
                .map(|d| format!(" of {d}"))
                .unwrap_or_default(),
            percent(v.used_today.tokens, l.daily_tokens),
        ),
        format!("llm calls     {}", v.llm_calls_today),
        format!(
            "runs under way {}{}",
            v.runs_under_way,
            l.concurrent_runs
                .map(|m| format!(" of {m}"))
                .unwrap_or_default()
        ),
        format!(
            "jobs in flight {}{}, {} waiting",
            v.jobs_in_flight,
            l.concurrent_jobs
                .map(|m| format!(" of {m}"))
                .unwrap_or_default(),
            v.jobs_waiting
        ),
    ];
    if let Some(u) = l.run_usd {
        lines.push(format!("per run       ${u:.2}"));
    }
    if let Some(t) = l.run_tokens {
        lines.push(format!("per run       {t} tokens"));
    }
    for (p, r) in &l.llm_rate {
        lines.push(format!(
            "llm rate      {p}: {}/{} s",
            r.calls, r.per_seconds
        ));
    }
    lines.push(format!(
        "webhook       {}",
        v.webhook.as_deref().unwrap_or("none")
    ));
    lines
}

pub async fn run(cmd: TeamCmd, out: &mut Out) -> anyhow::Result<i32> {
    match cmd {
        TeamCmd::Show(t) => {
            let v: Value = Client::new(&t.server.server)
                .get(&format!("/v1/team{}", t.query()))
                .await?;
            if t.json {
                out.line(serde_json::to_string_pretty(&v)?)?;
            } else {
                for line in render(&serde_json::from_value(v)?) {
                    out.line(line)?;
                }
            }
        }
        TeamCmd::Limits(a) => {
            let mut limits = TeamLimits {
                concurrent_runs: a.concurrent_runs,
                concurrent_jobs: a.concurrent_jobs,
                daily_usd: a.daily_usd,
                daily_tokens: a.daily_tokens,
                run_usd: a.run_usd,
                run_tokens: a.run_tokens,
                ..TeamLimits::default()
            };
            for spec in &a.llm_rate {
                let (provider, rate) = spec
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--llm-rate `{spec}`: write PROVIDER=N/S"))?;
                limits.llm_rate.insert(
                    provider.trim().to_string(),
                    Rate::parse(rate).map_err(anyhow::Error::msg)?,
                );
            }
            limits.check().map_err(anyhow::Error::msg)?;
            let v: Value = Client::new(&a.team.server.server)
                .post(&format!("/v1/team/limits{}", a.team.query()), &limits)
                .await?;
            out.line(serde_json::to_string(&v)?)?;
        }
        TeamCmd::Webhook(a) => {
            let v: Value = Client::new(&a.team.server.server)
                .post(
                    &format!("/v1/team/webhook{}", a.team.query()),
                    &json!({"url": a.url}),
                )
                .await?;
            out.line(format!(
                "webhook {}",
                v["webhook"].as_str().unwrap_or("none")
            ))?;
        }
        TeamCmd::Events(t) => lines(out, &t, "events").await?,
        TeamCmd::Deliveries(t) => lines(out, &t, "deliveries").await?,
    }
    Ok(0)
}

async fn lines(out: &mut Out, t: &TeamArg, what: &str) -> anyhow::Result<()> {
    let v: Vec<Value> = Client::new(&t.server.server)
        .get(&format!("/v1/team/{what}{}", t.query()))
        .await?;
    for item in v {
        out.line(item.to_string())?;
    }
    Ok(())
}
