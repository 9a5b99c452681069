//! Seed 004's hardened coder (`graphs/hardened-coder`) on a ten-feature to-do product
//! (`bench_hardened_app.rs`), every agent through the built-in loop against the fake LLM
//! server, which waits a fixed delay before each answer. The approval gate is approved as soon
//! as the run waits there. Measures the wall time against the critical path (the hybrid
//! bench's chain: each job follows the job that finished last before it was published), the
//! time spent waiting for the approval, and what verification costs per feature: the verifier
//! jobs' total time over the features, the verification stages' wall time (the fan-out entered
//! at the gates' end, to the settling's end) over the features, and the stage's share of the
//! critical path (the chains recomputed with the verification nodes at zero cost).
//!
//! Usage: fleet-bench hardened [--delay-ms D] [--sessions S] [--workers W] [--concurrency C]
//!                             [--verifier-image IMAGE]

use crate::bench_hardened_app as app;
use crate::chrono_secs;
use fleet_tests::fake_llm::FakeLlm;
use fleet_tests::stack::{workspace_root, Stack};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// The nodes of the verification stage (the fan-out's body, its verdicts and the settling).
const VERIFICATION: [&str; 5] = [
    "verify",
    "verify_again",
    "verdict_one",
    "verdict_two",
    "settle",
];

pub struct Options {
    pub delay_ms: usize,
    pub sessions: usize,
    pub workers: usize,
    pub concurrency: usize,
    pub verifier_image: Option<String>,
}

/// One job of the run: node, visit, published, started, ended (seconds since the epoch).
struct Job {
    node: String,
    visit: u64,
    published: f64,
    started: f64,
    ended: f64,
    container: f64,
}

impl Job {
    fn secs(&self) -> f64 {
        self.ended - self.started
    }
}

/// The longest chain of jobs ending at each job (each job follows the job that finished last
/// before it was published), with the jobs `free` says count as costing nothing.
fn chains(jobs: &[Job], free: impl Fn(&str) -> bool) -> Vec<f64> {
    let mut chain: Vec<f64> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let pred = (0..i)
            .filter(|k| jobs[*k].ended <= job.published + 0.001)
            .max_by(|a, b| jobs[*a].ended.total_cmp(&jobs[*b].ended));
        let own = if free(&job.node) { 0.0 } else { job.secs() };
        chain.push(own + pred.map(|k| chain[k]).unwrap_or(0.0));
    }
    chain
}

fn longest(chain: &[f64]) -> f64 {
    chain.iter().cloned().fold(0.0, f64::max)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn image_exists(image: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", image])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Polls until the run waits at `node`; fails if it ends first.
async fn awaiting(stack: &Stack, run: &str, node: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let s = stack.get(&format!("/v1/runs/{run}")).await?;
        if s["awaiting_approval"]
            .as_array()
            .is_some_and(|a| a.iter().any(|n| n == node))
        {
            return Ok(());
        }
        anyhow::ensure!(
            !matches!(
                s["status"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            ),
            "the run ended before waiting at {node}: {s}"
        );
        anyhow::ensure!(Instant::now() < deadline, "never waited at {node}: {s}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn run(opts: Options) -> anyhow::Result<()> {
    let delay = Duration::from_millis(opts.delay_ms as u64);
    let verifier_image = opts.verifier_image.clone().unwrap_or_else(|| {
        if image_exists("fleet-agent-web:1") {
            "fleet-agent-web:1".into()
        } else {
            "fleet-agent-py:1".into()
        }
    });
    anyhow::ensure!(
        image_exists(&verifier_image),
        "the verifier's image {verifier_image} is not built (scripts/provision.sh)"
    );
    let load_before = loadavg();
    let llm = FakeLlm::start_conversations(app::conversations(opts.sessions), delay).await?;
    let stack = Stack::start_with(
        "hardbench",
        opts.workers,
        opts.concurrency,
        &[
            ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
            ("ANTHROPIC_API_KEY", "bench-key"),
            ("FLEET_PRICES", r#"{"claude-haiku-4-5": [3.0, 15.0]}"#),
        ],
    )
    .await?;
    let repo = stack.dir.path().join("todo-repo");
    let made = Command::new(workspace_root().join("examples/hardened-coder/make-repo.sh"))
        .arg(&repo)
        .output()?;
    anyhow::ensure!(
        made.status.success(),
        "make-repo failed: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let input = stack.dir.path().join("input.json");
    std::fs::write(
        &input,
        serde_json::to_vec_pretty(&app::input(&verifier_image))?,
    )?;

    let t = Instant::now();
    let out = stack.cli(&[
        "submit",
        "--graph",
        &workspace_root()
            .join("graphs/hardened-coder/graph.yaml")
            .display()
            .to_string(),
        "--repo",
        &repo.display().to_string(),
        "--input",
        &input.display().to_string(),
        "--llm-api",
        "anthropic",
        "--llm-model",
        "claude-haiku-4-5",
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let run = out.stdout.trim().to_string();
    awaiting(&stack, &run, "approve_features").await?;
    let approve = stack.cli(&["approve", &run, "approve_features", "--by", "bench"])?;
    anyhow::ensure!(approve.code == 0, "approve failed: {}", approve.stderr);
    let status = stack
        .wait_run_every(&run, Duration::from_secs(1200), Duration::from_millis(10))
        .await?;
    let wall = t.elapsed().as_secs_f64();
    let load_after = loadavg();
    anyhow::ensure!(status["status"] == "succeeded", "{status}");
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?;
    anyhow::ensure!(result["result"]["exit"] == "done", "{result}");
    let metrics = &result["result"]["outputs"]["settle"]["output"]["metrics"];
    let features = app::FEATURES.len();
    anyhow::ensure!(
        metrics["verified"].as_u64() == Some(features as u64),
        "every feature verified: {metrics}"
    );

    let ts = |v: &Value| v.as_str().map(chrono_secs);
    let mut jobs: Vec<Job> = status["jobs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|j| {
            Some(Job {
                node: j["node"].as_str()?.to_string(),
                visit: j["visit"].as_u64().unwrap_or(0),
                published: ts(&j["published_at"])?,
                started: ts(&j["started_at"])?,
                ended: ts(&j["ended_at"])?,
                container: j["container_seconds"].as_f64().unwrap_or(0.0),
            })
        })
        .collect();
    jobs.sort_by(|a, b| a.published.total_cmp(&b.published));

    // Every verifier's browser call really ran in its own container (the verdict is scripted),
    // and its timeline: job start → first LLM request → (answer) → the browser → second request
    // → (answer) → job end, from the fake's arrival times.
    let verifiers: Vec<&Job> = jobs.iter().filter(|j| j.node == "verify").collect();
    anyhow::ensure!(
        verifiers.len() == features,
        "one verifier per feature, {} ran",
        verifiers.len()
    );
    let requests = llm.requests();
    let mut timeline = [0.0f64; 3];
    for v in &verifiers {
        let transcript = stack
            .node_artifact_json(&run, "verify", v.visit as u32, "transcript.json")
            .await?
            .to_string();
        // Its browser call ran in its container and kept a screenshot per step (the harness
        // checked them against its answer).
        let feature = app::FEATURES.iter().find(|f| {
            let quoted = serde_json::to_string(f.description).unwrap_or_default();
            transcript.contains(quoted.trim_matches('"'))
        });
        let feature = match feature {
            Some(f) if transcript.contains("screenshots/1-step_1.png") => f,
            _ => anyhow::bail!(
                "verifier {} did not check its feature in the browser: {transcript}",
                v.visit
            ),
        };
        let at: Vec<f64> = requests
            .iter()
            .filter(|r| r.conversation.as_deref() == Some(feature.description))
            .filter_map(|r| r.received_at.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs_f64())
            .collect();
        anyhow::ensure!(
            at.len() == 2,
            "two LLM calls by the verifier of {}",
            feature.description
        );
        let d = delay.as_secs_f64();
        timeline[0] += at[0] - v.started;
        timeline[1] += at[1] - (at[0] + d);
        timeline[2] += v.ended - (at[1] + d);
    }

    // The approval: from the gate's request to the decision (the run's own clock).
    let approval = &status["approvals"]["approve_features"];
    let asked = ts(&approval["requested_at"]).unwrap_or(0.0);
    let decided = ts(&approval["decision"]["at"]).unwrap_or(asked);
    let waited = decided - asked;

    let critical = longest(&chains(&jobs, |_| false));
    let critical_bare = longest(&chains(&jobs, |n| VERIFICATION.contains(&n)));
    let sequential: f64 = jobs.iter().map(Job::secs).sum();

    // The verification stages: per round, from the gates' end (the fan-out entered) to the
    // settling's end.
    let end_of = |node: &str, visit: u64| {
        jobs.iter()
            .filter(|j| j.node == node && j.visit == visit)
            .map(|j| j.ended)
            .fold(f64::NAN, f64::max)
    };
    let rounds = status["visits"]["settle"].as_u64().unwrap_or(0);
    let mut stages: Vec<(u64, usize, f64)> = Vec::new();
    for r in 1..=rounds {
        let (from, to) = (end_of("gates", r), end_of("settle", r));
        let n = verifiers
            .iter()
            .filter(|v| v.published >= from - 0.001 && v.ended <= to + 0.001)
            .count();
        stages.push((r, n, to - from));
    }
    let stage_total: f64 = stages.iter().map(|s| s.2).sum();
    let verifier_total: f64 = jobs
        .iter()
        .filter(|j| j.node == "verify" || j.node == "verify_again")
        .map(Job::secs)
        .sum();
    let verifier_llm: usize = llm
        .requests()
        .iter()
        .filter(|r| {
            r.conversation
                .as_deref()
                .is_some_and(|c| app::FEATURES.iter().any(|f| f.description == c))
        })
        .count();
    let usage = &result["usage"];

    println!(
        "## Seed 004's hardened coder: {features} features, wall time against the critical path\n"
    );
    println!(
        "fake LLM delay {} ms per call; {} LLM calls ({} by the verifiers); built-in agent (Anthropic wire format); {} coding sessions; {} workers × concurrency {}; verifier image {verifier_image}; load average {load_before} before, {load_after} after\n",
        delay.as_millis(),
        usage["llm_calls"],
        verifier_llm,
        app::shares(opts.sessions).len(),
        opts.workers,
        opts.concurrency,
    );
    let mut per_node: BTreeMap<&str, Vec<&Job>> = BTreeMap::new();
    for j in &jobs {
        per_node.entry(j.node.as_str()).or_default().push(j);
    }
    let mut order: Vec<(&str, f64)> = per_node
        .iter()
        .map(|(n, js)| (*n, js.iter().map(|j| j.published).fold(f64::MAX, f64::min)))
        .collect();
    order.sort_by(|a, b| a.1.total_cmp(&b.1));
    println!("| node | jobs | mean s | max s | sum s | mean queue wait s | mean container s |");
    println!("|---|---|---|---|---|---|---|");
    for (node, _) in &order {
        let js = &per_node[node];
        let n = js.len() as f64;
        let secs: Vec<f64> = js.iter().map(|j| j.secs()).collect();
        let sum: f64 = secs.iter().sum();
        println!(
            "| {node} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            js.len(),
            sum / n,
            secs.iter().cloned().fold(0.0, f64::max),
            sum,
            js.iter().map(|j| j.started - j.published).sum::<f64>() / n,
            js.iter().map(|j| j.container).sum::<f64>() / n,
        );
    }
    println!("\n| measure | seconds |\n|---|---|");
    println!("| wall (submit → finished) | {wall:.2} |");
    println!("| waiting at the approval gate (requested → approved) | {waited:.2} |");
    println!("| wall without the approval wait | {:.2} |", wall - waited);
    println!("| critical path (longest chain of its jobs) | {critical:.2} |");
    println!("| critical path with verification at zero cost | {critical_bare:.2} |");
    println!("| all jobs one after another | {sequential:.2} |");

    println!(
        "\n| verification round | claims verified | stage wall s (gates' end → settle's end) |"
    );
    println!("|---|---|---|");
    for (r, n, secs) in &stages {
        println!("| {r} | {n} | {secs:.2} |");
    }
    let f = features as f64;
    let verify_mean = verifier_total / verifiers.len().max(1) as f64;
    let llm_per_verifier = verifier_llm as f64 / verifiers.len().max(1) as f64;
    println!("\n| verification overhead per feature | seconds |\n|---|---|");
    println!(
        "| (a) verifier jobs' total / features | {:.2} |",
        verifier_total / f
    );
    println!(
        "| of which the fake LLM's delay ({llm_per_verifier:.1} calls × {} ms) | {:.2} |",
        delay.as_millis(),
        llm_per_verifier * delay.as_secs_f64()
    );
    let n = verifiers.len() as f64;
    println!(
        "| before its first LLM call (container, checkout, pre-flight, the harness starting the app, prompt) | {:.2} |",
        timeline[0] / n
    );
    println!(
        "| the browser check (a screenshot per step) between its calls | {:.2} |",
        timeline[1] / n
    );
    println!(
        "| after its last answer (output checked, artifacts stored, container removed) | {:.2} |",
        timeline[2] / n
    );
    println!(
        "| (b) verification stages' wall / features | {:.2} |",
        stage_total / f
    );
    println!(
        "| verification on the critical path / features | {:.2} |",
        (critical - critical_bare) / f
    );
    println!(
        "\nverification stages: {stage_total:.2} s of wall ({:.0}% of the wall without the approval wait); on the critical path {:.2} s ({:.0}% of it); a verifier job takes {verify_mean:.2} s on average, {:.2} s beyond its LLM calls",
        100.0 * stage_total / (wall - waited),
        critical - critical_bare,
        100.0 * (critical - critical_bare) / critical.max(0.001),
        verify_mean - llm_per_verifier * delay.as_secs_f64(),
    );
    println!(
        "\nwall without the approval wait / critical path: {:.2}; sequential / wall without the wait: {:.2}",
        (wall - waited) / critical,
        sequential / (wall - waited)
    );
    Ok(())
}
