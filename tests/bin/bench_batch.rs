//! `fleet-bench batch`: batches side by side in one run.
//!
//! 1. Throughput: a batch of N trivial items (one no-op harness job each, step cache off) on
//!    1, 2 and 4 worker processes; items per second and the scaling efficiency against one
//!    worker.
//! 2. Submit: the time to submit a batch of the largest size a batch may have
//!    (`MAX_BATCH_ITEMS`) and the coordinator's resident memory before and after.
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

pub async fn run(n: usize, slots: usize) -> anyhow::Result<()> {
    let graph = workspace_root()
        .join("graphs/bench/fanout.yaml")
        .display()
        .to_string();
    let slots_s = slots.to_string();
    let mut base_rate = None;
    println!("| workers | items | seconds | items/s | efficiency |\n|---|---|---|---|---|");
    for workers in [1usize, 2, 4] {
        let stack = Stack::start_config(StackConfig {
            tag: "bbatch",
            workers,
            concurrency: 8,
            worker_env: &[("FLEET_STEP_CACHE", "off")],
            coordinator_env: &[("FLEET_BATCH_SLOTS", &slots_s)],
            ..Default::default()
        })
        .await?;
        let repo = make_calc_repo(stack.dir.path())?.display().to_string();
        let data = trivial_dataset(&stack, &repo, n, &format!("w{workers}-"))?;
        let t = Instant::now();
        let id = submit(
            &stack,
            &[
                "batch",
                "submit",
                &data,
                "--graph",
                &graph,
                "--max-running",
                &slots_s,
            ],
        )?;
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

    // Submit the largest batch a batch may have; nothing needs to run for the measure.
    let max = shared::batch::MAX_BATCH_ITEMS;
    let stack = Stack::start("bsubmit", 0, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let data = trivial_dataset(&stack, &repo, max, "s")?;
    let before = rss_mib(stack.coordinator_pid());
    let t = Instant::now();
    let id = submit(&stack, &["batch", "submit", &data, "--graph", &graph])?;
    let submit_secs = t.elapsed().as_secs_f64();
    // Let the driver start its first slots and settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = stack.get(&format!("/v1/batches/{id}")).await?;
    let after = rss_mib(stack.coordinator_pid());
    println!(
        "\n| batch submit | items | seconds | coordinator RSS before → after (MiB) |\n|---|---|---|---|\n\
         | {max}-item batch | {} | {submit_secs:.2} | {:.0} → {:.0} |",
        v["counts"]["total"],
        before.unwrap_or(f64::NAN),
        after.unwrap_or(f64::NAN)
    );
    drop(stack);

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
