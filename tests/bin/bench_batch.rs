//! `fleet-bench batch`: batches side by side in one run.
//!
//! 1. Throughput: a batch of N trivial items (one no-op harness job each, step cache off) on
//!    1, 2 and 4 worker processes; items per second and the scaling efficiency against one
//!    worker.
//! 2. Size: a batch of 1,000 trivial items and one of the largest size a batch may have
//!    (`MAX_BATCH_ITEMS`, 100,000), each on one worker: submit time, the coordinator's resident
//!    memory, the summary's latency, items per second over the first items, and the time a
//!    cancel takes to settle every queued item.
//! 3. The step cache: a batch of factory items (scripted agents) run, then rerun with nothing
//!    changed (`fleet batch rerun --all`): wall time and steps reused.

use fleet_tests::stack::{example, make_calc_repo, workspace_root, Stack, StackConfig};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn rss_mib(pid: Option<u32>) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

fn submit(stack: &Stack, args: &[&str]) -> anyhow::Result<String> {
    let out = stack.cli(args)?;
    anyhow::ensure!(out.code == 0, "{args:?} failed: {}", out.stderr);
    Ok(out.stdout.trim().to_string())
}

/// A dataset of `n` trivial items: the fan-out graph over one item each.
fn trivial_dataset(stack: &Stack, repo: &str, n: usize, tag: &str) -> anyhow::Result<String> {
    let lines: Vec<String> = (0..n)
        .map(|i| {
            json!({"id": format!("{tag}{i}"), "repo": repo, "input": {"items": [i]}}).to_string()
        })
        .collect();
    let path = stack.dir.path().join(format!("{tag}.jsonl"));
    std::fs::write(&path, lines.join("\n") + "\n")?;
    Ok(path.display().to_string())
}

/// A stack of `workers` workers (the step cache off) and `slots` batch slots, and a batch of
/// `size` trivial items submitted to it with `--max-running slots`: the stack, the batch's id
/// and when its submit began.
async fn trivial_batch(
    tag: &'static str,
    workers: usize,
    slots: usize,
    graph: &str,
    size: usize,
    prefix: &str,
) -> anyhow::Result<(Stack, String, Instant)> {
    let slots_s = slots.to_string();
    let stack = Stack::start_config(StackConfig {
        tag,
        workers,
        concurrency: 8,
        worker_env: &[("FLEET_STEP_CACHE", "off")],
        coordinator_env: &[("FLEET_BATCH_SLOTS", &slots_s)],
        ..Default::default()
    })
    .await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let data = trivial_dataset(&stack, &repo, size, prefix)?;
    let t = Instant::now();
    let args = [
        "batch",
        "submit",
        &data,
        "--graph",
        graph,
        "--max-running",
        &slots_s,
    ];
    let id = submit(&stack, &args)?;
    Ok((stack, id, t))
}

/// Items settled before the rate of a large batch is read.
const FIRST: u64 = 300;

/// One row of the size table: submit a batch of `size` trivial items, read its summary, let
/// its first [`FIRST`] items settle, then cancel it and wait for the rest to be cancelled.
async fn size_row(graph: &str, size: usize, slots: usize) -> anyhow::Result<()> {
    let (stack, id, t) = trivial_batch("bsize", 1, slots, graph, size, "s").await?;
    let submit_secs = t.elapsed().as_secs_f64();
    let summary_path = format!("/v1/batches/{id}/summary");
    let t = Instant::now();
    for _ in 0..20 {
        stack.get(&summary_path).await?;
    }
    let summary_ms = t.elapsed().as_secs_f64() * 1000.0 / 20.0;
    let t = Instant::now();
    let done_at_start = stack.get(&summary_path).await?["progress"]["done"]
        .as_u64()
        .unwrap_or(0);
    loop {
        let v = stack.get(&summary_path).await?;
        if v["progress"]["done"].as_u64().unwrap_or(0) >= FIRST {
            break;
        }
        anyhow::ensure!(t.elapsed() < Duration::from_secs(600), "too slow: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rate = (FIRST - done_at_start.min(FIRST)) as f64 / t.elapsed().as_secs_f64();
    let rss = rss_mib(stack.coordinator_pid());
    let t = Instant::now();
    submit(&stack, &["batch", "cancel", &id])?;
    loop {
        let v = stack.get(&summary_path).await?;
        if v["batch"]["finished_at"].is_string() {
            break;
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(600),
            "cancel too slow: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "| {size} items | {submit_secs:.2} | {:.0} | {summary_ms:.1} | {rate:.1} | {:.1} |",
        rss.unwrap_or(f64::NAN),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

pub async fn run(n: usize, slots: usize) -> anyhow::Result<()> {
    let graph = workspace_root()
        .join("graphs/bench/fanout.yaml")
        .display()
        .to_string();
    let mut base_rate = None;
    println!("| workers | items | seconds | items/s | efficiency |\n|---|---|---|---|---|");
    for workers in [1usize, 2, 4] {
        let (stack, id, t) =
            trivial_batch("bbatch", workers, slots, &graph, n, &format!("w{workers}-")).await?;
        let v = stack.wait_batch(&id, Duration::from_secs(1800)).await?;
        let secs = t.elapsed().as_secs_f64();
        anyhow::ensure!(v["counts"]["passed"] == n, "{}", v["counts"]);
        let rate = n as f64 / secs;
        let base = *base_rate.get_or_insert(rate);
        println!(
            "| {workers} | {n} | {secs:.1} | {rate:.1} | {:.2} |",
            rate / (base * workers as f64)
        );
    }

    // Size: a small batch and the largest a batch may have, side by side on one worker.
    println!(
        "\n| batch | submit s | coordinator RSS after (MiB) | summary ms | items/s (first {FIRST}) | cancel drain s |\n|---|---|---|---|---|---|"
    );
    for size in [1000, shared::batch::MAX_BATCH_ITEMS] {
        size_row(&graph, size, slots).await?;
    }

    // The step cache: a factory batch, then the same items again.
    let stack = Stack::start_with("bcache", 2, 2, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let order: Value = serde_json::from_str(&std::fs::read_to_string(example(
        "factory-calc/work_order.json",
    ))?)?;
    let script: Value = serde_json::from_str(&std::fs::read_to_string(example(
        "factory-calc/script-pass.json",
    ))?)?;
    let items = 10;
    let lines: Vec<String> = (0..items)
        .map(|i| {
            // Each item its own work order (a distinct title), so items do not share steps.
            let mut o = order.clone();
            o["title"] = json!(format!("item {i}"));
            json!({"id": format!("f{i}"), "repo": repo, "work_order": o, "script": script})
                .to_string()
        })
        .collect();
    let path = stack.dir.path().join("factory.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n")?;
    let t = Instant::now();
    let first = submit(
        &stack,
        &[
            "batch",
            "submit",
            &path.display().to_string(),
            "--max-attempts",
            "1",
        ],
    )?;
    stack.wait_batch(&first, Duration::from_secs(900)).await?;
    let first_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let again = submit(&stack, &["batch", "rerun", &first, "--all"])?;
    stack.wait_batch(&again, Duration::from_secs(900)).await?;
    let again_secs = t.elapsed().as_secs_f64();
    let report = stack.get(&format!("/v1/batches/{again}/report")).await?;
    let first_report = stack.get(&format!("/v1/batches/{first}/report")).await?;
    println!(
        "\n| factory batch ({items} items) | seconds | steps | reused |\n|---|---|---|---|\n\
         | first run | {first_secs:.1} | {} | {} |\n| unchanged rerun | {again_secs:.1} | {} | {} |",
        first_report["step_cache"]["steps"],
        first_report["step_cache"]["hits"],
        report["step_cache"]["steps"],
        report["step_cache"]["hits"],
    );
    Ok(())
}
