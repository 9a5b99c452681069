//! `fleet quarantine`: what a run holds for a person (seed 004's quarantine: claims the
//! verifier could not decide), and the decisions on them.

use super::args::ServerArg;
use super::{Client, Out};
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum QuarantineCmd {
    /// The items waiting for a person, with what the graph says about each.
    List(QuarantineRun),
    /// Accept an item in quarantine.
    Approve(QuarantineDecision),
    /// Reject an item in quarantine (the comment goes back to the agent).
    Reject(QuarantineDecision),
}

#[derive(Args)]
pub struct QuarantineRun {
    pub run_id: String,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args)]
pub struct QuarantineDecision {
    pub run_id: String,
    pub item: String,
    #[command(flatten)]
    pub server: ServerArg,
    #[arg(long, default_value = "")]
    pub comment: String,
    /// Who decides (default: $USER).
    #[arg(long, env = "USER", default_value = "unknown")]
    pub by: String,
}

pub async fn run(cmd: QuarantineCmd, out: &mut Out) -> anyhow::Result<i32> {
    match cmd {
        QuarantineCmd::List(r) => {
            let view = Client::new(&r.server.server).quarantine(&r.run_id).await?;
            if view.pending.is_empty() {
                out.line(format!("run {}: nothing in quarantine", view.run_id))?;
            }
            for p in &view.pending {
                out.line(format!("{}  {}", p.item, p.details))?;
            }
            Ok(0)
        }
        QuarantineCmd::Approve(d) => decide(d, true, out).await,
        QuarantineCmd::Reject(d) => decide(d, false, out).await,
    }
}

async fn decide(d: QuarantineDecision, approved: bool, out: &mut Out) -> anyhow::Result<i32> {
    let answer = Client::new(&d.server.server)
        .decide_quarantine(&d.run_id, &d.item, approved, &d.by, &d.comment)
        .await?;
    out.line(format!(
        "{}: {}",
        answer.item,
        if answer.approved {
            "approved"
        } else {
            "rejected"
        }
    ))?;
    Ok(0)
}
