//! Seed 004's status dashboard drawn for a terminal (`fleet status RUN` for a run with a
//! feature list), and the tracking commands: `fleet events RUN` (the JSON lines of its event
//! log) and `fleet budget RUN --usd X` (a new limit; a paused run resumes).

use super::client::Client;
use super::Out;
use shared::tracking::dashboard::{Dashboard, Tally};
use std::fmt::Write;

const WIDTH: usize = 50;

fn bar(t: &Tally) -> String {
    let filled = (t.passing as usize * WIDTH)
        .checked_div(t.total as usize)
        .unwrap_or(0);
    format!(
        "{}{}  {}/{} ({}%)",
        "━".repeat(filled),
        "░".repeat(WIDTH - filled),
        t.passing,
        t.total,
        (t.passing * 100).checked_div(t.total).unwrap_or(0)
    )
}

/// The dashboard's lines.
pub fn render(d: &Dashboard) -> Vec<String> {
    let mut out = Vec::new();
    let rule = "═".repeat(WIDTH + 20);
    out.push(format!("╔{rule}"));
    out.push(format!("║ RUN: {} ({})", d.run_id, d.graph));
    out.push(format!(
        "║ Status: {} | Model: {}",
        serde_json::to_value(d.status)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        d.model
    ));
    out.push(format!("╠{rule}"));
    if let Some(p) = &d.progress {
        out.push("║ PROGRESS".into());
        out.push(format!("║   {}", bar(&p.overall)));
        out.push("║   By category:".into());
        for (cat, t) in &p.by_category {
            out.push(format!("║     {cat:<12} {}/{}", t.passing, t.total));
        }
        out.push(format!("╠{rule}"));
    }
    let s = &d.sessions;
    let total: u32 = s.completed.values().sum();
    let by: Vec<String> = s
        .completed
        .iter()
        .map(|(n, c)| format!("{c} {n}"))
        .collect();
    out.push("║ SESSIONS".into());
    out.push(format!("║   Completed: {total} ({})", by.join(", ")));
    out.push(format!("║   Total runtime: {:.0} s", s.runtime_seconds));
    if let Some(l) = &s.last {
        out.push(format!(
            "║   Last: {} ({}) {} at {}",
            l.session_id,
            l.node,
            if l.ok { "ok" } else { "failed" },
            shared::time::rfc3339(&l.finished_at)
        ));
    }
    out.push(format!("╠{rule}"));
    out.push("║ COSTS".into());
    out.push(format!("║   Total: ${:.4}", d.costs.total_usd));
    if let Some(b) = &d.budget {
        let mut line = format!(
            "║   Budget: ${:.4} ({:.1}% used)",
            b.limit_usd,
            d.costs.total_usd * 100.0 / b.limit_usd
        );
        if b.paused {
            let _ = write!(
                line,
                " PAUSED: budget_exhausted, {} job(s) held (`fleet budget RUN --usd X` resumes)",
                d.held_jobs
            );
        }
        out.push(line);
    }
    let by: Vec<String> = d
        .costs
        .by_node
        .iter()
        .map(|(n, c)| format!("{n} ${c:.4}"))
        .collect();
    if !by.is_empty() {
        out.push(format!("║   By agent: {}", by.join(" | ")));
    }
    if let Some(m) = &d.metrics {
        if let Some(per) = m.cost_per_verified_test {
            out.push(format!("║   Per verified test: ${per:.4}"));
        }
        out.push(format!("╠{rule}"));
        out.push("║ METRICS".into());
        out.push(format!(
            "║   Claims {} | verified {} | revert rate {:.0}% | quarantine rate {:.0}% | human intervention {:.0}%",
            m.claims,
            m.verified,
            m.revert_rate * 100.0,
            m.quarantine_rate * 100.0,
            m.human_intervention_rate * 100.0
        ));
    }
    if !d.gates.is_empty() {
        out.push(format!("╠{rule}"));
        out.push("║ QUALITY GATES".into());
        let gates: Vec<String> = d
            .gates
            .iter()
            .map(|g| format!("{} {}", if g.passed { "✓" } else { "✗" }, g.name))
            .collect();
        out.push(format!("║   {}", gates.join("   ")));
    }
    if !d.quarantine_pending.is_empty() {
        out.push(format!(
            "║ QUARANTINE: {} item(s) pending review (`fleet quarantine list {}`)",
            d.quarantine_pending.len(),
            d.run_id
        ));
    }
    out.push(format!("╚{rule}"));
    out
}

/// `fleet events RUN`: the run's event log, one JSON line per event.
pub async fn events(
    server: &str,
    run: &str,
    event_type: Option<&str>,
    session: Option<&str>,
    out: &mut Out,
) -> anyhow::Result<i32> {
    let mut query = Vec::new();
    if let Some(t) = event_type {
        query.push(format!("type={t}"));
    }
    if let Some(s) = session {
        query.push(format!("session={s}"));
    }
    let path = format!("/v1/runs/{run}/events?{}", query.join("&"));
    let body = Client::new(server).text(&path).await?;
    for line in body.lines() {
        out.line(line)?;
    }
    Ok(0)
}

/// `fleet budget RUN --usd X`: the run's new limit.
pub async fn budget(
    server: &str,
    run: &str,
    usd: f64,
    by: &str,
    out: &mut Out,
) -> anyhow::Result<i32> {
    let b: serde_json::Value = Client::new(server)
        .post(
            &format!("/v1/runs/{run}/budget"),
            &serde_json::json!({"limit_usd": usd, "by": by}),
        )
        .await?;
    out.line(format!(
        "run {run}: budget ${:.4}{}",
        b["limit_usd"].as_f64().unwrap_or(usd),
        if b["paused"].as_bool() == Some(true) {
            " (still paused)"
        } else {
            ""
        }
    ))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_dashboard_draws_progress_costs_budget_and_the_metrics() {
        let d: Dashboard = serde_json::from_value(json!({
            "run_id": "r1", "graph": "hardened-coder", "model": "scripted:abc", "status": "running",
            "progress": {"overall": {"passing": 3, "total": 5},
                         "by_category": {"functional": {"passing": 3, "total": 4}, "style": {"passing": 0, "total": 1}}},
            "sessions": {"completed": {"coder": 2, "verify": 3}, "runtime_seconds": 12.0, "last": null},
            "costs": {"total_usd": 0.9, "sessions": [], "by_node": {"coder": 0.6, "verify": 0.3}, "by_model": {}},
            "budget": {"limit_usd": 1.0, "paused": true, "marks": []},
            "held_jobs": 2,
            "gates": [{"name": "build", "passed": true}, {"name": "lint", "passed": false}],
            "quarantine_pending": [5],
            "metrics": {"claims": 4, "verified": 3, "revert_rate": 0.25, "quarantine_rate": 0.0,
                        "human_intervention_rate": 0.0, "cost_per_verified_test": 0.3}
        }))
        .unwrap();
        let text = render(&d).join("\n");
        for want in [
            "3/5 (60%)",
            "functional   3/4",
            "Completed: 5 (2 coder, 3 verify)",
            "Budget: $1.0000 (90.0% used) PAUSED: budget_exhausted, 2 job(s) held",
            "Per verified test: $0.3000",
            "revert rate 25%",
            "✓ build   ✗ lint",
            "QUARANTINE: 1 item(s)",
        ] {
            assert!(text.contains(want), "{want:?} missing from\n{text}");
        }
    }
}
