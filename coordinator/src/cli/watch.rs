//! Watching and steering a run: `fleet wait` (a spinner on a terminal, one line per change
//! otherwise) and `fleet cancel` (which refuses a run that already finished).

use super::client::{status_name, Client, RunSummary};
use super::Out;
use anyhow::bail;
use shared::engine::RunStatus;
use shared::http::CancelEffect;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// One progress line of a run: `run <id>: running (jobs done 2/5, 3 in flight)`, with the
/// nodes awaiting a human decision when there are any.
pub fn progress_line(run: &str, s: &RunSummary) -> String {
    let done = s.jobs_total.saturating_sub(s.jobs_pending);
    let mut line = format!(
        "run {run}: {} (jobs done {done}/{}, {} in flight",
        status_name(s.status),
        s.jobs_total,
        s.jobs_pending
    );
    if !s.awaiting_approval.is_empty() {
        line.push_str(&format!(
            ", awaiting approval: {}",
            s.awaiting_approval.join(", ")
        ));
    }
    line.push(')');
    line
}

/// The spinner's message: the progress line with the visits per node.
fn spinner_message(run: &str, s: &RunSummary) -> String {
    let visits: Vec<String> = s.visits.iter().map(|(k, n)| format!("{k}×{n}")).collect();
    format!("{} — {}", progress_line(run, s), visits.join(" "))
}

/// The exit code of a finished run: 0 when it succeeded.
pub fn exit_code(status: RunStatus) -> i32 {
    if status == RunStatus::Succeeded {
        0
    } else {
        1
    }
}

/// Waits for the run to finish, then prints its verdict, stage and cost; the exit code is the
/// run's. A closed stdout only silences the output.
pub async fn wait(
    server: &str,
    run: &str,
    timeout: Duration,
    out: &mut Out,
) -> anyhow::Result<i32> {
    let client = Client::new(server);
    let spinner = std::io::stdout().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    });
    let deadline = Instant::now() + timeout;
    let mut last_line = String::new();
    loop {
        let s = client.summary(run).await?;
        match &spinner {
            Some(bar) => bar.set_message(spinner_message(run, &s)),
            None => {
                let line = progress_line(run, &s);
                if line != last_line {
                    out.line(&line)?;
                    last_line = line;
                }
            }
        }
        if s.status.is_terminal() {
            if let Some(bar) = &spinner {
                bar.finish_and_clear();
            }
            let r = client.result(run).await?;
            out.line(format!("run {run}: {}", r.verdict()))?;
            if let Some(stage) = r.ended_stage() {
                out.line(format!("ended stage: {stage}"))?;
            }
            out.line(format!(
                "cost: ${:.4} ({} llm calls)",
                r.usage.cost_usd, r.usage.llm_calls
            ))?;
            return Ok(exit_code(r.status));
        }
        if s.stopped_on_budget() {
            if let Some(bar) = &spinner {
                bar.finish_and_clear();
            }
            let limit = s.budget.as_ref().map_or(0.0, |b| b.limit_usd);
            out.line(format!(
                "run {run}: paused: budget_exhausted (${:.4} of ${limit:.4} spent, {} job(s) held); \
                 `fleet budget {run} --usd X` resumes it",
                s.usage.cost_usd, s.jobs_held
            ))?;
            return Ok(BUDGET_EXIT);
        }
        if Instant::now() > deadline {
            if let Some(bar) = &spinner {
                bar.finish_and_clear();
            }
            bail!(
                "run {run} still {} after {}s",
                status_name(s.status),
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// `fleet wait`'s exit code for a run paused on its budget (neither success nor failure).
pub const BUDGET_EXIT: i32 = 3;

/// Why a cancel of a run in `status` has nothing to do (`None`: the run can be cancelled).
pub fn nothing_to_cancel(run: &str, status: RunStatus) -> Option<String> {
    status.is_terminal().then(|| {
        format!(
            "run {run} already finished: {}; nothing to cancel",
            status_name(status)
        )
    })
}

/// Cancels a run that is still going; prints `cancelled`. A run that already finished is
/// refused with exit code 1 (its status stays what it was).
pub async fn cancel(server: &str, run: &str, out: &mut Out) -> anyhow::Result<i32> {
    let answer = Client::new(server).cancel(run).await?;
    // The server says what the cancel did; a body without it (an older server) is read by
    // its status.
    let finished_before = match answer.applied {
        Some(applied) => applied == CancelEffect::AlreadyFinished,
        None => answer.status != RunStatus::Cancelled,
    };
    if finished_before {
        if let Some(why) = nothing_to_cancel(run, answer.status) {
            eprintln!("{why}");
        }
        return Ok(1);
    }
    out.line(status_name(answer.status))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::messages::Usage;

    fn summary(status: RunStatus, total: u64, pending: u64) -> RunSummary {
        RunSummary {
            run_id: "r1".into(),
            status,
            awaiting_approval: vec![],
            visits: [("se".to_string(), 2)].into_iter().collect(),
            usage: Usage::default(),
            jobs_total: total,
            jobs_pending: pending,
            v: shared::http::API_VERSION,
            graph: "g".into(),
            created_at: None,
            updated_at: None,
            finished_at: None,
            budget: None,
            jobs_held: 0,
        }
    }

    #[test]
    fn a_progress_line_says_status_and_jobs() {
        assert_eq!(
            progress_line("r1", &summary(RunStatus::Running, 5, 3)),
            "run r1: running (jobs done 2/5, 3 in flight)"
        );
        let mut s = summary(RunStatus::Running, 0, 0);
        s.awaiting_approval = vec!["review".into()];
        assert_eq!(
            progress_line("r1", &s),
            "run r1: running (jobs done 0/0, 0 in flight, awaiting approval: review)"
        );
        // Inconsistent counts never underflow.
        assert!(progress_line("r1", &summary(RunStatus::Running, 1, 4)).contains("done 0/1"));
        assert!(spinner_message("r1", &s).ends_with("se×2"));
    }

    #[test]
    fn only_a_running_run_can_be_cancelled() {
        assert_eq!(nothing_to_cancel("r1", RunStatus::Running), None);
        assert_eq!(nothing_to_cancel("r1", RunStatus::Pending), None);
        assert_eq!(
            nothing_to_cancel("r1", RunStatus::Succeeded).unwrap(),
            "run r1 already finished: succeeded; nothing to cancel"
        );
        assert!(nothing_to_cancel("r1", RunStatus::Cancelled)
            .unwrap()
            .contains("already finished: cancelled"));
        assert_eq!(exit_code(RunStatus::Succeeded), 0);
        assert_eq!(exit_code(RunStatus::Failed), 1);
        assert_eq!(exit_code(RunStatus::Cancelled), 1);
    }
}
