//! fleet-bench's default mode: the container cycle and the fleet's per-job overhead, each
//! side by side in one run.
//!
//! 1. The cycle `start → exec true → remove` three ways, interleaved one for one: a container
//!    created for the job through bollard (cold), one handed from the warm pool (the pool
//!    refills in the background while the job runs, as on a worker), and `docker run --rm`
//!    from the CLI.
//! 2. One trivial command job per run (`graphs/bench/noop-command.yaml`), sequential, on a
//!    stack without the pool and on one with it: submit to result, minus the worker's own
//!    measure of the container's life; then the same jobs submitted at once.

use super::{chrono_secs, stats, IMAGE};
use fleet_tests::stack::{make_calc_repo, sum_samples, workspace_root, Stack};
use fleet_tests::submit::submit_with_script;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use worker::metrics::{JobPhase, Metrics};
use worker::sandbox::docker::DockerSandbox;
use worker::sandbox::warm::WarmPool;
use worker::sandbox::{Limits, Sandbox, SandboxSpec};

const USER: &str = "10001:10001";

pub async fn run(cycles: usize, jobs: usize) -> anyhow::Result<()> {
    println!("# fleet-bench: {cycles} container cycles, {jobs} fleet jobs\n");
    cycle(cycles).await?;
    let only_cycle = std::env::args().any(|a| a == "--cycle-only");
    for warm in [0, 2] {
        if !only_cycle {
            per_job(jobs, warm).await?;
        }
    }
    Ok(())
}

fn spec(tag: &str, i: usize, worktree: PathBuf) -> SandboxSpec {
    SandboxSpec {
        name: format!("fleet-bench-{}-{tag}-{i}", std::process::id()),
        image: IMAGE.into(),
        worktree,
        writable: false,
        shared_worktree: false,
        layered_worktree: false,
        harness_dir: None,
        network: false,
        gateway_dir: None,
        lifetime: Duration::from_secs(60),
        labels: vec![("fleet.worker".into(), "bench".into())],
    }
}

/// `start → exec true → remove` through `sandbox`, timed: the whole and each of the three.
async fn one(sandbox: &dyn Sandbox, spec: &SandboxSpec) -> anyhow::Result<Phases> {
    let t = Instant::now();
    let s = sandbox.start(spec).await?;
    let started = t.elapsed().as_secs_f64();
    let out = s
        .exec(&["true".into()], None, Duration::from_secs(30))
        .await?;
    anyhow::ensure!(out.exit_code == 0, "`true` failed: {out:?}");
    let execd = t.elapsed().as_secs_f64();
    s.remove().await?;
    let total = t.elapsed().as_secs_f64();
    Ok(Phases {
        total,
        parts: [started, execd - started, total - execd],
    })
}

/// One cycle's time, and its start, exec and remove.
struct Phases {
    total: f64,
    parts: [f64; 3],
}

/// The mean of each phase, in ms.
fn phase_means(xs: &[Phases]) -> String {
    let n = xs.len() as f64;
    let m = |i: usize| xs.iter().map(|p| p.parts[i]).sum::<f64>() / n * 1e3;
    format!("start {:.1} / exec {:.1} / remove {:.1}", m(0), m(1), m(2))
}

async fn wait_ready(pool: &WarmPool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while pool.ready() == 0 {
        anyhow::ensure!(Instant::now() < deadline, "the warm pool never refilled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn cycle(cycles: usize) -> anyhow::Result<()> {
    let cold = DockerSandbox::connect(Limits::default(), USER.into()).await?;
    let dir = tempfile::tempdir()?;
    let metrics = Metrics::new();
    let pool = WarmPool::new(
        DockerSandbox::connect(Limits::default(), USER.into()).await?,
        dir.path().join("warm"),
        1,
        "bench",
        metrics.clone(),
    );
    // The pool's first container of this kind: the pool fills from here.
    let first = dir.path().join("wt-first");
    std::fs::create_dir(&first)?;
    one(&pool, &spec("prime", 0, first)).await?;
    let handed_before = metrics.containers.with_label_values(&["warm"]).get();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty)?;
    let (mut cold_p, mut warm_p, mut cli_t) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..cycles {
        wait_ready(&pool).await?;
        let wt = dir.path().join(format!("wt-{i}"));
        std::fs::create_dir(&wt)?;
        warm_p.push(one(&pool, &spec("warm", i, wt)).await?);
        // The refill it started is done before the other two are timed.
        wait_ready(&pool).await?;
        cold_p.push(one(&cold, &spec("cold", i, empty.clone())).await?);
        let t = Instant::now();
        let st = Command::new("docker")
            .args(["run", "--rm", "--network", "none", IMAGE, "true"])
            .status()?;
        anyhow::ensure!(st.success(), "docker run failed");
        cli_t.push(t.elapsed().as_secs_f64());
    }
    let handed =
        (metrics.containers.with_label_values(&["warm"]).get() - handed_before).to_string();
    pool.shutdown().await;
    anyhow::ensure!(
        handed == cycles.to_string(),
        "only {handed} of {cycles} warm starts were handed a warm container"
    );
    let mut cold_t: Vec<f64> = cold_p.iter().map(|p| p.total).collect();
    let mut warm_t: Vec<f64> = warm_p.iter().map(|p| p.total).collect();
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let (cold_mean, warm_mean, cli_mean) = (mean(&cold_t), mean(&warm_t), mean(&cli_t));
    println!("## Container cycle (ms)\n");
    println!("| path | n | mean | p50 | p95 | min |\n|---|---|---|---|---|---|");
    println!(
        "{}",
        stats("bollard, cold: create+start+exec+remove", &mut cold_t)
    );
    println!(
        "{}",
        stats("bollard, warm pool: hand-out+exec+remove", &mut warm_t)
    );
    println!("{}", stats("docker run --rm (CLI)", &mut cli_t));
    println!(
        "\nratio to the CLI (mean): cold {:.2}, warm {:.2}",
        cold_mean / cli_mean,
        warm_mean / cli_mean
    );
    println!(
        "phases (mean ms): cold {}; warm {} (the warm remove is Docker's kill and its wait; the removal goes on after)\n",
        phase_means(&cold_p),
        phase_means(&warm_p)
    );
    let part = |xs: &[Phases], i: usize| {
        xs.iter().map(|p| p.parts[i]).sum::<f64>() * 1e3 / xs.len() as f64
    };
    println!(
        "{}\n",
        serde_json::json!({"bench": "cycle", "n": cycles, "cold_ms": cold_mean * 1e3,
            "warm_ms": warm_mean * 1e3, "cli_ms": cli_mean * 1e3,
            "cold_ratio": cold_mean / cli_mean, "warm_ratio": warm_mean / cli_mean,
            "warm_phases_ms": {"hand_out": part(&warm_p, 0), "exec": part(&warm_p, 1),
                "kill": part(&warm_p, 2)},
            "cold_phases_ms": {"start": part(&cold_p, 0), "exec": part(&cold_p, 1),
                "remove": part(&cold_p, 2)}})
    );
    Ok(())
}

/// Sequential trivial command jobs on a stack whose workers keep `warm` containers per kind
/// (0: none), then the same number submitted at once.
async fn per_job(jobs: usize, warm: usize) -> anyhow::Result<()> {
    let warm_env = warm.to_string();
    // The step cache off: every job runs its container (the same command on the same tree
    // would otherwise be reused from the first).
    let env = [
        ("FLEET_WARM_CONTAINERS", warm_env.as_str()),
        ("FLEET_STEP_CACHE", "off"),
    ];
    let stack = Stack::start("bench", 2, &env).await?;
    let repo = make_calc_repo(stack.dir.path())?;
    let graph = workspace_root().join("graphs/bench/noop-command.yaml");
    let script = stack.dir.path().join("script.json");
    std::fs::write(&script, "{}")?;
    let submit = |i: usize, tag: &str| -> anyhow::Result<String> {
        let input = stack.dir.path().join(format!("input-{tag}-{i}.json"));
        std::fs::write(&input, format!("{{\"i\": {i}, \"tag\": \"{tag}\"}}"))?;
        submit_with_script(&stack, &graph, &repo, &input, &script)
    };
    // Warm the workers' git caches and the image (and fill the pools: one job per worker).
    for i in 0..2 {
        let first = submit(i, "first")?;
        stack.wait_run(&first, Duration::from_secs(60)).await?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (mut wall, mut overhead, mut container) = (Vec::new(), Vec::new(), Vec::new());
    // Where the overhead goes, from the clocks of this machine: the `fleet submit` process,
    // its start to the job's start on a worker, the worker's time outside the container, and
    // the job's end to its result seen here.
    let (mut cli, mut to_start, mut worker_rest, mut to_seen) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    };
    let http = reqwest::Client::new();
    let phases_before = worker_phases(&stack).await?;
    let mut processes = crate::bench_cpu::fleet_processes(&stack);
    processes.extend(crate::bench_cpu::docker_processes());
    processes.push(("bench".into(), std::process::id()));
    let meter = crate::bench_cpu::CpuMeter::start(processes);
    for i in 0..jobs {
        let t = Instant::now();
        let t0 = now();
        let run = submit(i, "seq")?;
        cli.push(t.elapsed().as_secs_f64());
        // Told when the run ends (the result read waits for its last commit), not polled.
        let answer = http
            .get(format!(
                "{}/v1/runs/{run}/result?wait_seconds=60",
                stack.server
            ))
            .send()
            .await?;
        let w = t.elapsed().as_secs_f64();
        let seen = now();
        let outcome: serde_json::Value = answer.json().await?;
        anyhow::ensure!(outcome["status"] == "succeeded", "{outcome}");
        let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
        let started = chrono_secs(logs[0]["started_at"].as_str().unwrap_or_default());
        let finished = chrono_secs(logs[0]["finished_at"].as_str().unwrap_or_default());
        let c = container_seconds(&stack, &logs)
            .await
            .unwrap_or(finished - started);
        wall.push(w);
        container.push(c);
        overhead.push(w - c);
        to_start.push(started - t0);
        worker_rest.push(finished - started - c);
        to_seen.push(seen - finished);
    }
    // The `fleet submit` processes are this bench's children (`bench` is its own HTTP reads);
    // the rest is what the machine spent beyond every process named: Docker's shims and runc,
    // the containers, the kernel.
    let cpu_ms: std::collections::BTreeMap<String, f64> = meter
        .seconds(Some("submit"), Some("rest"))
        .into_iter()
        .map(|(k, v)| (k, v * 1e3 / jobs as f64))
        .collect();
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64 * 1e3;
    let means = (mean(&wall), mean(&container), mean(&overhead));
    let how = if warm == 0 {
        "without the warm pool".to_string()
    } else {
        format!("with the warm pool ({warm} per kind of job)")
    };
    println!("## Fleet: one trivial command job per run, sequential, {how} (ms)\n");
    println!("submit (a `fleet submit` process: graph load, repo pack, upload) → result seen (`GET /v1/runs/{{id}}/result?wait_seconds=60`, answered when the run ends).\n");
    table(
        "measure",
        [
            ("submit → result (wall)", &mut wall),
            ("container start → remove (worker)", &mut container),
            ("fleet overhead = wall − container", &mut overhead),
        ],
    );
    println!("\nwhere the overhead goes (from this machine's clocks, to the millisecond):\n");
    table(
        "part",
        [
            ("the `fleet submit` process", &mut cli),
            ("submit → the job's start on a worker", &mut to_start),
            ("the worker outside the container", &mut worker_rest),
            ("the job's end → its result seen", &mut to_seen),
        ],
    );
    let phases = worker_phase_means(&phases_before, &worker_phases(&stack).await?);
    println!("\nthe workers' own account of a job (`fleet_worker_job_phase_seconds`, mean ms per job that had the phase):\n");
    println!("| phase | jobs | mean ms |\n|---|---|---|");
    for (phase, (n, ms)) in &phases {
        println!("| {phase} | {n} | {ms:.2} |");
    }
    println!("\nwhere the machine's CPU went (`/proc`, ms per job; `rest`: Docker's shims and runc, the containers, the kernel):\n");
    println!("| process | ms CPU per job |\n|---|---|");
    for (name, ms) in &cpu_ms {
        println!("| {name} | {ms:.1} |");
    }
    if warm > 0 {
        let (mut handed, mut cold) = (0.0, 0.0);
        for w in stack.worker_ids() {
            let total = "fleet_worker_containers_total";
            handed += stack.worker_metric(&w, total, &[("start", "warm")]).await?;
            cold += stack.worker_metric(&w, total, &[("start", "cold")]).await?;
        }
        println!("\ncontainers handed from the pool: {handed}, created for their job: {cold}");
    }

    let t = Instant::now();
    let runs: Vec<String> = (0..jobs)
        .map(|i| submit(i, "par"))
        .collect::<Result<_, _>>()?;
    for r in &runs {
        stack.wait_run(r, Duration::from_secs(300)).await?;
    }
    let total = t.elapsed().as_secs_f64();
    println!(
        "\n## Fleet: {jobs} runs submitted at once, 2 workers × concurrency 2, {how}\n\ntotal {:.2} s, {:.1} jobs/s\n",
        total,
        jobs as f64 / total
    );
    println!(
        "{}\n",
        serde_json::json!({"bench": "per_job", "warm": warm, "n": jobs, "wall_ms": means.0,
            "container_ms": means.1, "overhead_ms": means.2,
            "parts_ms": {"submit_process": mean(&cli), "to_job_start": mean(&to_start),
                "worker_outside_container": mean(&worker_rest), "end_to_seen": mean(&to_seen)},
            "worker_phases_ms": phases.iter().map(|(p, (_, ms))| (p.to_string(), serde_json::json!(ms))).collect::<serde_json::Map<_, _>>(),
            "cpu_ms_per_job": cpu_ms, "parallel_jobs_per_second": jobs as f64 / total})
    );
    Ok(())
}

/// The workers' phase sums and counts (`fleet_worker_job_phase_seconds`), added over workers,
/// in the order of `JobPhase::ALL`.
async fn worker_phases(stack: &Stack) -> anyhow::Result<Vec<(f64, f64)>> {
    let mut out = vec![(0.0, 0.0); JobPhase::ALL.len()];
    for w in stack.worker_ids() {
        let text = stack.worker_metrics_text(&w).await?;
        for (i, phase) in JobPhase::ALL.iter().enumerate() {
            let labels = [("phase", phase.label())];
            out[i].0 += sum_samples(&text, "fleet_worker_job_phase_seconds_sum", &labels);
            out[i].1 += sum_samples(&text, "fleet_worker_job_phase_seconds_count", &labels);
        }
    }
    Ok(out)
}

/// Per phase, the jobs that had it between two reads and their mean in ms.
fn worker_phase_means(
    before: &[(f64, f64)],
    after: &[(f64, f64)],
) -> Vec<(&'static str, (f64, f64))> {
    JobPhase::ALL
        .iter()
        .zip(before.iter().zip(after))
        .filter_map(|(p, ((s0, n0), (s1, n1)))| {
            let n = n1 - n0;
            (n > 0.0).then(|| (p.label(), (n, (s1 - s0) / n * 1e3)))
        })
        .collect()
}

/// A table of `stats` rows under a header whose first column is `first`.
fn table<const N: usize>(first: &str, rows: [(&str, &mut Vec<f64>); N]) {
    println!("| {first} | n | mean | p50 | p95 | min |\n|---|---|---|---|---|---|");
    for (name, xs) in rows {
        println!("{}", stats(name, xs));
    }
}

/// The worker's own measure of the container's life, from the run's status view.
async fn container_seconds(stack: &Stack, logs: &serde_json::Value) -> Option<f64> {
    let job = logs[0]["job_id"].as_str()?;
    let run = job.split('.').next()?;
    let view = stack.get(&format!("/v1/runs/{run}")).await.ok()?;
    view["jobs"][0]["container_seconds"].as_f64()
}
