//! Side-by-side benchmarks, in one run on this machine:
//!
//! 1. the container cycle (create, start, exec `true`, remove) through bollard, cold and from
//!    the warm pool, against `docker run --rm IMAGE true` from the CLI;
//! 2. the fleet's per-job overhead for trivial command jobs: submit to result (coordinator,
//!    RabbitMQ, Redis, S3, a worker, a worktree, a container), minus the container's own time,
//!    without and with the warm pool (`bench_cycle.rs`).
//!
//! Usage: fleet-bench [--jobs N] [--cycles N]   (services from scripts/provision.sh)
//!        fleet-bench batch [--n N] [--slots S]  (batches: `bench_batch.rs`)
//!        fleet-bench tree [--delay-ms D] [--concurrency C]  (child runs: `bench_tree.rs`)
//!        fleet-bench hardened [--delay-ms D] [--sessions S] [--workers W] [--concurrency C]
//!            [--verifier-image IMAGE]  (seed 004's hardened coder: `bench_hardened.rs`)
//!        fleet-bench limit [--n N] [--prefetch P] [--workers W] [--concurrency C]
//!            [--coordinators K]  (the broker's and Redis's own limit per job against the
//!            fleet: `bench_limit.rs`)
//!        fleet-bench worktree [--files N] [--rounds R]  (a job's worktree against `git clone
//!            --local`: `bench_worktree.rs`)
//!        fleet-bench roundtrip [--n N]  (one job's round trip, submit to result, against the
//!            broker's own: `bench_roundtrip.rs`)
//!        fleet-bench service [--runs N] [--reads N] [--clients C] [--fan N]  (the team service:
//!            status reads with N runs stored, the dashboard's live updates: `bench_service.rs`)

#[path = "bench_batch.rs"]
mod bench_batch;
#[path = "bench_cpu.rs"]
mod bench_cpu;
#[path = "bench_cycle.rs"]
mod bench_cycle;
#[path = "bench_hardened.rs"]
mod bench_hardened;
#[path = "bench_hardened_app.rs"]
mod bench_hardened_app;
#[path = "bench_limit.rs"]
mod bench_limit;
#[path = "bench_roundtrip.rs"]
mod bench_roundtrip;
#[path = "bench_service.rs"]
mod bench_service;
#[path = "bench_tree.rs"]
mod bench_tree;
#[path = "bench_worktree.rs"]
mod bench_worktree;

use fleet_tests::stack::{make_calc_repo, workspace_root, Stack};
use std::time::{Duration, Instant};

const IMAGE: &str = "fleet-agent-py:1";

pub(crate) fn stats(name: &str, xs: &mut [f64]) -> String {
    xs.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let n = xs.len();
    let mean = xs.iter().sum::<f64>() / n as f64;
    let p = |q: f64| xs[((n as f64 - 1.0) * q).round() as usize];
    format!(
        "| {name} | {n} | {:.1} | {:.1} | {:.1} | {:.1} |",
        mean * 1e3,
        p(0.5) * 1e3,
        p(0.95) * 1e3,
        xs[0] * 1e3
    )
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    match std::env::args().nth(1).as_deref() {
        Some("fanout") => return fanout().await,
        Some("hybrid") => return hybrid().await,
        Some("mutation") => return mutation().await,
        Some("batch") => return bench_batch::run(arg("--n", 1000), arg("--slots", 32)).await,
        Some("tree") => {
            return bench_tree::run(arg("--delay-ms", 2000), arg("--concurrency", 6)).await
        }
        Some("limit") => {
            return bench_limit::run(bench_limit::Options {
                n: arg("--n", 10_000),
                prefetch: arg("--prefetch", 64) as u16,
                workers: arg("--workers", 2),
                concurrency: arg("--concurrency", 8),
                coordinators: arg("--coordinators", 1),
            })
            .await
        }
        Some("worktree") => {
            return bench_worktree::run(arg("--files", 10_000), arg("--rounds", 10)).await
        }
        Some("roundtrip") => return bench_roundtrip::run(arg("--n", 200)).await,
        Some("service") => {
            return bench_service::run(bench_service::Options {
                runs: arg("--runs", 1000),
                reads: arg("--reads", 2000),
                clients: arg("--clients", 8),
                fan: arg("--fan", 1000),
            })
            .await
        }
        Some("hardened") => {
            let args: Vec<String> = std::env::args().collect();
            let image = args
                .iter()
                .position(|a| a == "--verifier-image")
                .and_then(|i| args.get(i + 1).cloned());
            return bench_hardened::run(bench_hardened::Options {
                delay_ms: arg("--delay-ms", 1000),
                sessions: arg("--sessions", 2),
                workers: arg("--workers", 2),
                concurrency: arg("--concurrency", 3),
                verifier_image: image,
            })
            .await;
        }
        _ => {}
    }
    bench_cycle::run(arg("--cycles", 20), arg("--jobs", 30)).await
}

/// A fan-out of N no-op harness jobs into one join (`graphs/bench/fanout.yaml`), timed from
/// the submission (a `fleet submit` process) to the run's end, told by the API. Prints one
/// JSON line, in the shape `scripts/bench-fanout.sh` compares with the Celery chord.
async fn fanout() -> anyhow::Result<()> {
    let n = arg("--n", 1000);
    let repeat = arg("--repeat", 3);
    let workers = arg("--workers", 2);
    let concurrency = arg("--concurrency", 8);
    let stack = Stack::start_with("fan", workers, concurrency, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?;
    let graph = workspace_root().join("graphs/bench/fanout.yaml");
    let script = stack.dir.path().join("script.json");
    std::fs::write(&script, "{}")?;
    let mut runs: Vec<f64> = Vec::new();
    let mut run_only: Vec<f64> = Vec::new();
    let mut last = String::new();
    for r in 0..repeat {
        let input = stack.dir.path().join(format!("fan-{r}.json"));
        let items: Vec<usize> = (0..n).collect();
        std::fs::write(
            &input,
            serde_json::to_vec(&serde_json::json!({"items": items, "round": r}))?,
        )?;
        let t = Instant::now();
        let run = fleet_tests::submit::submit_with_script(&stack, &graph, &repo, &input, &script)?;
        let submitted = t.elapsed().as_secs_f64();
        // Told of the end (as the chord's client is, by its result backend), not polling.
        stack.wait_run_told(&run, Duration::from_secs(600)).await?;
        let secs = t.elapsed().as_secs_f64();
        let st = stack.get(&format!("/v1/runs/{run}")).await?;
        anyhow::ensure!(st["status"] == "succeeded", "{st}");
        anyhow::ensure!(
            st["joins"]["gather"]["fired"] == 1,
            "the join fired once: {st}"
        );
        runs.push(secs);
        eprintln!(
            "round {r}: submit {submitted:.3} s, then {:.3} s to the end",
            secs - submitted
        );
        let created = chrono_secs(st["created_at"].as_str().unwrap_or_default());
        let finished = chrono_secs(st["finished_at"].as_str().unwrap_or_default());
        run_only.push(finished - created);
        last = run;
    }
    let median = |xs: &[f64]| {
        let mut sorted = xs.to_vec();
        sorted.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
        sorted[sorted.len() / 2]
    };
    // What a status read of the last (finished) run costs: every job, one node's (the join's:
    // none), or the summary; 10 reads each, one at a time.
    let mut reads = serde_json::Map::new();
    for (what, path) in [
        ("all_jobs", format!("/v1/runs/{last}")),
        ("one_node", format!("/v1/runs/{last}?node=gather")),
        ("summary", format!("/v1/runs/{last}/summary")),
    ] {
        let mut took = Vec::new();
        for _ in 0..10 {
            let t = Instant::now();
            stack.get(&path).await?;
            took.push(t.elapsed().as_secs_f64() * 1e3);
        }
        reads.insert(what.into(), serde_json::json!(median(&took)));
    }
    println!(
        "{}",
        serde_json::json!({"bench": "status-read", "n": n, "median_ms": reads})
    );
    // With the `fleet submit` process (graph load, repo pack and upload) in the time...
    println!(
        "{}",
        serde_json::json!({"system": "fleet-fanout-join (with fleet submit)", "n": n, "runs": runs,
            "median": median(&runs), "workers": workers, "concurrency": concurrency})
    );
    // ...and from the run's creation to its end, as the chord is timed from its submission.
    println!(
        "{}",
        serde_json::json!({"system": "fleet-fanout-join (run)", "n": n, "runs": run_only,
            "median": median(&run_only), "workers": workers, "concurrency": concurrency})
    );
    Ok(())
}

/// The hybrid TDD graph with the built-in agent against the fake LLM server, which waits a
/// fixed delay before every answer. Compares the run's wall time with its critical path: the
/// longest chain of its own jobs (each job's predecessor is the job that finished last before
/// it was published), observers excluded.
async fn hybrid() -> anyhow::Result<()> {
    use fleet_tests::fake_llm::{Conversation, FakeLlm, ScriptedReply};
    let delay = Duration::from_millis(arg("--delay-ms", 1000) as u64);
    let examples = workspace_root().join("examples/hybrid-stack");
    let script: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        examples.join("script-happy.json"),
    )?)?;
    let agent_turns = |node: &str| -> Vec<ScriptedReply> {
        let step = &script[node][0];
        let mut replies: Vec<ScriptedReply> = step["files"]
            .as_object()
            .map(|files| {
                files
                    .iter()
                    .map(|(path, content)| {
                        ScriptedReply::tool_use(
                            "write_file",
                            serde_json::json!({"path": path, "content": content}),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        replies.push(ScriptedReply::tool_use("submit", step["output"].clone()));
        replies
    };
    let witness: Vec<ScriptedReply> = (0..3)
        .map(|_| ScriptedReply::tool_use("submit", script["witness"][0]["output"].clone()))
        .collect();
    let llm = FakeLlm::start_conversations(
        vec![
            Conversation::new("You are the TYPES agent", agent_turns("types")),
            Conversation::new("You are the TYPE ADVERSARY", agent_turns("type_adversary")),
            Conversation::new("You are the TESTS agent", agent_turns("tests")),
            Conversation::new("You are the IMPL agent", agent_turns("impl")),
            Conversation::new("You are the MUTATION ADVERSARY", agent_turns("mutation")),
            Conversation::new("You are the WITNESS", witness),
        ],
        delay,
    )
    .await?;
    let stack = Stack::start(
        "hybench",
        2,
        &[
            ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
            ("ANTHROPIC_API_KEY", "bench-key"),
            ("FLEET_PRICES", r#"{"claude-haiku-4-5": [3.0, 15.0]}"#),
        ],
    )
    .await?;
    let repo = stack.dir.path().join("stack-repo");
    let made = std::process::Command::new(examples.join("make-repo.sh"))
        .arg(&repo)
        .output()?;
    anyhow::ensure!(made.status.success(), "make-repo failed");
    let t = Instant::now();
    let out = stack.cli(&[
        "submit",
        "--graph",
        &workspace_root()
            .join("graphs/hybrid-tdd/graph.yaml")
            .display()
            .to_string(),
        "--repo",
        &repo.display().to_string(),
        "--input",
        &examples.join("input.json").display().to_string(),
        "--llm-api",
        "anthropic",
        "--llm-model",
        "claude-haiku-4-5",
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let run = out.stdout.trim().to_string();
    let status = stack
        .wait_run_every(&run, Duration::from_secs(600), Duration::from_millis(10))
        .await?;
    let wall = t.elapsed().as_secs_f64();
    anyhow::ensure!(status["status"] == "succeeded", "{status}");

    let ts = |v: &serde_json::Value| v.as_str().map(chrono_secs);
    let mut jobs: Vec<(String, f64, f64, f64)> = status["jobs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|j| j["node"] != "witness")
        .filter_map(|j| {
            Some((
                j["node"].as_str()?.to_string(),
                ts(&j["published_at"])?,
                ts(&j["started_at"])?,
                ts(&j["ended_at"])?,
            ))
        })
        .collect();
    jobs.sort_by(|a, b| a.1.partial_cmp(&b.1).expect("no NaN"));
    // Longest chain: each job follows the job that finished last before it was published.
    let mut chain: Vec<f64> = Vec::new();
    for (i, (_, published, start, end)) in jobs.iter().enumerate() {
        let pred = (0..i)
            .filter(|k| jobs[*k].3 <= *published + 0.001)
            .max_by(|a, b| jobs[*a].3.partial_cmp(&jobs[*b].3).expect("no NaN"));
        chain.push((end - start) + pred.map(|k| chain[k]).unwrap_or(0.0));
    }
    let critical = chain.iter().cloned().fold(0.0, f64::max);
    // The same chains with the harness's new checks (builds, mutants) costing nothing: what
    // the checks add to the critical path, measured in this one run.
    let checks = [
        "impl_build",
        "fix_build",
        "mutants",
        "mutant_run",
        "mutation_score",
    ];
    let mut bare: Vec<f64> = Vec::new();
    for (i, (node, published, start, end)) in jobs.iter().enumerate() {
        let pred = (0..i)
            .filter(|k| jobs[*k].3 <= *published + 0.001)
            .max_by(|a, b| jobs[*a].3.partial_cmp(&jobs[*b].3).expect("no NaN"));
        let own = if checks.contains(&node.as_str()) {
            0.0
        } else {
            end - start
        };
        bare.push(own + pred.map(|k| bare[k]).unwrap_or(0.0));
    }
    let critical_bare = bare.iter().cloned().fold(0.0, f64::max);
    let sequential: f64 = jobs.iter().map(|j| j.3 - j.2).sum();
    let usage = stack.get(&format!("/v1/runs/{run}/result")).await?["usage"].clone();
    println!("## Hybrid TDD graph: wall time against its critical path\n");
    println!(
        "fake LLM delay {} ms per call; {} LLM calls; built-in agent (Anthropic wire format)\n",
        delay.as_millis(),
        usage["llm_calls"]
    );
    println!("| node | duration s |\n|---|---|");
    for (node, _, start, end) in &jobs {
        println!("| {node} | {:.2} |", end - start);
    }
    println!("\n| measure | seconds |\n|---|---|");
    println!("| wall (submit → finished) | {wall:.2} |");
    println!("| critical path (longest chain of its jobs) | {critical:.2} |");
    println!("| all jobs one after another | {sequential:.2} |");
    println!(
        "| critical path with the harness's builds and mutants at zero cost | {critical_bare:.2} |"
    );
    println!(
        "\nthe new checks (impl_build, fix_build, mutants, mutant_run, mutation_score) add {:.2} s to the critical path ({:.0}%)",
        critical - critical_bare,
        100.0 * (critical - critical_bare) / critical_bare.max(0.001)
    );
    println!(
        "\nwall / critical path: {:.2}; sequential / wall: {:.2}",
        wall / critical,
        sequential / wall
    );
    Ok(())
}

/// Mutation testing of the example stack, executed by the harness: the same mutants fanned out
/// over 2 workers in batches, against one batch run one after another in one container. Two
/// runs of the scripted happy path on one stack; the mutation phase is timed from the
/// `mutants` job's publication to the `mutation_score` job's end.
async fn mutation() -> anyhow::Result<()> {
    let per_job = arg("--per-job", 3);
    let examples = workspace_root().join("examples/hybrid-stack");
    let stack = Stack::start("mutbench", 2, &[]).await?;
    let mut rows = Vec::new();
    for (label, batch) in [
        ("one container, one after another", 1000),
        ("fan-out over 2 workers", per_job),
    ] {
        let repo = stack.dir.path().join(format!("repo-{batch}"));
        let made = std::process::Command::new(examples.join("make-repo.sh"))
            .arg(&repo)
            .output()?;
        anyhow::ensure!(made.status.success(), "make-repo failed");
        let mut input: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(examples.join("input.json"))?)?;
        input["spec"]["strictness"]["mutants_per_job"] = serde_json::json!(batch);
        let input_path = stack.dir.path().join(format!("input-{batch}.json"));
        std::fs::write(&input_path, serde_json::to_vec(&input)?)?;
        let out = stack.cli(&[
            "submit",
            "--graph",
            &workspace_root()
                .join("graphs/hybrid-tdd/graph.yaml")
                .display()
                .to_string(),
            "--repo",
            &repo.display().to_string(),
            "--input",
            &input_path.display().to_string(),
            "--script",
            &examples.join("script-happy.json").display().to_string(),
        ])?;
        anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
        let run = out.stdout.trim().to_string();
        let status = stack
            .wait_run_every(&run, Duration::from_secs(900), Duration::from_millis(20))
            .await?;
        anyhow::ensure!(status["status"] == "succeeded", "{status}");
        let jobs = status["jobs"].as_array().cloned().unwrap_or_default();
        let ts = |j: &serde_json::Value, k: &str| j[k].as_str().map(chrono_secs);
        let start = jobs
            .iter()
            .filter(|j| j["node"] == "mutants")
            .filter_map(|j| ts(j, "published_at"))
            .fold(f64::MAX, f64::min);
        let end = jobs
            .iter()
            .filter(|j| j["node"] == "mutation_score")
            .filter_map(|j| ts(j, "ended_at"))
            .fold(0.0, f64::max);
        let runs: Vec<&serde_json::Value> =
            jobs.iter().filter(|j| j["node"] == "mutant_run").collect();
        let result = stack.get(&format!("/v1/runs/{run}/result")).await?["result"].clone();
        let m = &result["mutation_adversary"];
        rows.push((
            label,
            batch,
            runs.len(),
            m["tried"].as_u64().unwrap_or(0) + m["unviable"].as_u64().unwrap_or(0),
            m["killed"].clone(),
            m["survived"].clone(),
            end - start,
        ));
    }
    println!("## Mutation testing executed by the harness: fan-out against one container\n");
    println!(
        "| layout | mutants per job | jobs | mutants | killed | survived | mutation phase s |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (label, batch, jobs, n, killed, survived, secs) in &rows {
        println!("| {label} | {batch} | {jobs} | {n} | {killed} | {survived} | {secs:.2} |");
    }
    if let [seq, fan] = &rows[..] {
        println!("\nfan-out / sequential: {:.2}", fan.6 / seq.6);
    }
    Ok(())
}

pub(crate) fn chrono_secs(ts: &str) -> f64 {
    chrono::DateTime::parse_from_rfc3339(ts)
        .map(|d| d.timestamp_millis() as f64 / 1e3)
        .unwrap_or(0.0)
}
