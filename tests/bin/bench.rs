//! Side-by-side benchmarks, in one run on this machine:
//!
//! 1. the bare container cycle (create, start, exec `true`, remove) through bollard against
//!    `docker run --rm IMAGE true` from the CLI;
//! 2. the fleet's per-job overhead for trivial command jobs: submit to result (coordinator,
//!    RabbitMQ, Redis, S3, a worker, a worktree, a container), minus the container's own time.
//!
//! Usage: fleet-bench [--jobs N] [--cycles N]   (services from scripts/provision.sh)

use fleet_tests::stack::{make_calc_repo, workspace_root, Stack};
use std::process::Command;
use std::time::{Duration, Instant};
use worker::sandbox::docker::DockerSandbox;
use worker::sandbox::{Limits, Sandbox, SandboxSpec};

const IMAGE: &str = "fleet-agent-py:1";

fn stats(name: &str, xs: &mut [f64]) -> String {
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
    if std::env::args().nth(1).as_deref() == Some("fanout") {
        return fanout().await;
    }
    let cycles = arg("--cycles", 20);
    let jobs = arg("--jobs", 30);
    println!("# fleet-bench: {cycles} container cycles, {jobs} fleet jobs\n");

    // 1. Container cycle: bollard vs docker CLI, interleaved so both see the same machine.
    let sandbox = DockerSandbox::connect(Limits::default(), "10001:10001".into()).await?;
    let dir = tempfile::tempdir()?;
    let (mut bollard_t, mut cli_t) = (Vec::new(), Vec::new());
    for i in 0..cycles {
        let t = Instant::now();
        let s = sandbox
            .start(&SandboxSpec {
                name: format!("fleet-bench-{}-{i}", std::process::id()),
                image: IMAGE.into(),
                worktree: dir.path().to_path_buf(),
                writable: false,
                network: false,
                lifetime: Duration::from_secs(60),
                labels: vec![("fleet.worker".into(), "bench".into())],
            })
            .await?;
        let out = s
            .exec(&["true".into()], None, Duration::from_secs(30))
            .await?;
        assert_eq!(out.exit_code, 0);
        s.remove().await?;
        bollard_t.push(t.elapsed().as_secs_f64());

        let t = Instant::now();
        let st = Command::new("docker")
            .args(["run", "--rm", "--network", "none", IMAGE, "true"])
            .status()?;
        assert!(st.success());
        cli_t.push(t.elapsed().as_secs_f64());
    }
    println!("## Container cycle (ms)\n");
    println!("| path | n | mean | p50 | p95 | min |\n|---|---|---|---|---|---|");
    let b_mean = bollard_t.iter().sum::<f64>() / cycles as f64;
    let c_mean = cli_t.iter().sum::<f64>() / cycles as f64;
    println!(
        "{}",
        stats("bollard create+start+exec+remove", &mut bollard_t)
    );
    println!("{}", stats("docker run --rm (CLI)", &mut cli_t));
    println!("\nratio bollard / CLI (mean): {:.2}\n", b_mean / c_mean);

    // 2. Fleet per-job overhead, sequential (latency) then all at once (throughput).
    let stack = Stack::start("bench", 2, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let graph = workspace_root()
        .join("graphs/bench/noop-command.yaml")
        .display()
        .to_string();
    let script = stack.dir.path().join("script.json");
    std::fs::write(&script, "{}")?;
    let script = script.display().to_string();
    let submit = |i: usize, tag: &str| -> anyhow::Result<String> {
        let input = stack.dir.path().join(format!("input-{tag}-{i}.json"));
        std::fs::write(&input, format!("{{\"i\": {i}, \"tag\": \"{tag}\"}}"))?;
        let out = stack.cli(&[
            "submit",
            "--graph",
            &graph,
            "--repo",
            &repo,
            "--input",
            &input.display().to_string(),
            "--script",
            &script,
        ])?;
        anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
        Ok(out.stdout.trim().to_string())
    };
    // Warm the worker's git cache and the image.
    let warm = submit(0, "warm")?;
    stack.wait_run(&warm, Duration::from_secs(60)).await?;

    let (mut wall, mut overhead, mut container) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..jobs {
        let t = Instant::now();
        let run = submit(i, "seq")?;
        let st = stack
            .wait_run_every(&run, Duration::from_secs(60), Duration::from_millis(5))
            .await?;
        let w = t.elapsed().as_secs_f64();
        anyhow::ensure!(st["status"] == "succeeded", "{st}");
        let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
        let started = chrono_secs(logs[0]["started_at"].as_str().unwrap_or_default());
        let finished = chrono_secs(logs[0]["finished_at"].as_str().unwrap_or_default());
        let c = container_seconds(&stack, &logs)
            .await
            .unwrap_or(finished - started);
        wall.push(w);
        container.push(c);
        overhead.push(w - c);
    }
    println!("## Fleet: one trivial command job per run, sequential (ms)\n");
    println!("submit (a `fleet submit` process: graph load, repo pack, upload) → result seen by polling the API every 5 ms.\n");
    println!("| measure | n | mean | p50 | p95 | min |\n|---|---|---|---|---|---|");
    println!("{}", stats("submit → result (wall)", &mut wall));
    println!(
        "{}",
        stats("container create → remove (worker)", &mut container)
    );
    println!(
        "{}",
        stats("fleet overhead = wall − container", &mut overhead)
    );

    let t = Instant::now();
    let runs: Vec<String> = (0..jobs)
        .map(|i| submit(i, "par"))
        .collect::<Result<_, _>>()?;
    for r in &runs {
        stack.wait_run(r, Duration::from_secs(300)).await?;
    }
    let total = t.elapsed().as_secs_f64();
    println!(
        "\n## Fleet: {jobs} runs submitted at once, 2 workers × concurrency 2\n\ntotal {:.2} s, {:.1} jobs/s\n",
        total,
        jobs as f64 / total
    );
    Ok(())
}

/// A fan-out of N no-op harness jobs into one join (`graphs/bench/fanout.yaml`), timed from
/// the submission (a `fleet submit` process) to the run's end seen through the API. Prints one
/// JSON line, in the shape `scripts/bench-fanout.sh` compares with the Celery chord.
async fn fanout() -> anyhow::Result<()> {
    let n = arg("--n", 1000);
    let repeat = arg("--repeat", 3);
    let workers = arg("--workers", 2);
    let concurrency = arg("--concurrency", 8);
    let stack = Stack::start_with("fan", workers, concurrency, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let graph = workspace_root()
        .join("graphs/bench/fanout.yaml")
        .display()
        .to_string();
    let script = stack.dir.path().join("script.json");
    std::fs::write(&script, "{}")?;
    let script = script.display().to_string();
    let mut runs = Vec::new();
    for r in 0..repeat {
        let input = stack.dir.path().join(format!("fan-{r}.json"));
        let items: Vec<usize> = (0..n).collect();
        std::fs::write(
            &input,
            serde_json::to_vec(&serde_json::json!({"items": items, "round": r}))?,
        )?;
        let t = Instant::now();
        let out = stack.cli(&[
            "submit",
            "--graph",
            &graph,
            "--repo",
            &repo,
            "--input",
            &input.display().to_string(),
            "--script",
            &script,
        ])?;
        anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
        let run = out.stdout.trim().to_string();
        let st = stack
            .wait_run_every(&run, Duration::from_secs(600), Duration::from_millis(10))
            .await?;
        let secs = t.elapsed().as_secs_f64();
        anyhow::ensure!(st["status"] == "succeeded", "{st}");
        anyhow::ensure!(
            st["joins"]["gather"]["fired"] == 1,
            "the join fired once: {st}"
        );
        runs.push(secs);
    }
    let mut sorted = runs.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let median = sorted[sorted.len() / 2];
    println!(
        "{}",
        serde_json::json!({"system": "fleet-fanout-join", "n": n, "runs": runs, "median": median,
            "workers": workers, "concurrency": concurrency})
    );
    Ok(())
}

fn chrono_secs(ts: &str) -> f64 {
    chrono::DateTime::parse_from_rfc3339(ts)
        .map(|d| d.timestamp_millis() as f64 / 1e3)
        .unwrap_or(0.0)
}

/// The worker's own measure of the container's life, from the run's status view.
async fn container_seconds(stack: &Stack, logs: &serde_json::Value) -> Option<f64> {
    let job = logs[0]["job_id"].as_str()?;
    let run = job.split('.').next()?;
    let view = stack.get(&format!("/v1/runs/{run}")).await.ok()?;
    view["jobs"][0]["container_seconds"].as_f64()
}
