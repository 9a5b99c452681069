//! Poison jobs and a broker restart, on the real stack. These tests touch the shared RabbitMQ
//! server (the restart stops it for a moment), so they live in their own test binary, which
//! cargo runs after the others, one test at a time.

use fleet_tests::stack::{
    example, make_calc_repo, slow_po_work_order, wait_for_container, Stack, StackConfig, AMQP_URL,
};
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde_json::{json, Value};
use std::process::Command;
use std::time::Duration;

/// One test at a time in this binary: a broker restart must not hit another test's stack.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn publish_raw(queue: &str, body: &[u8]) -> anyhow::Result<()> {
    let conn = Connection::connect(AMQP_URL, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    ch.basic_publish(
        "",
        queue,
        BasicPublishOptions::default(),
        body,
        BasicProperties::default().with_delivery_mode(2),
    )
    .await?
    .await?;
    conn.close(200, "done").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_jobs_are_dead_lettered_and_fail_their_run_with_a_clear_reason() -> anyhow::Result<()>
{
    let _serial = SERIAL.lock().await;
    let stack = Stack::start("poison", 1, &[]).await?;
    let jobs = format!("{}.jobs", stack.ns);

    // Not even an envelope: the worker dead-letters it, the coordinator drops it, nothing breaks.
    publish_raw(&jobs, b"this is not json").await?;
    stack
        .wait_for_metric(
            &format!("{}-w1", stack.ns),
            "fleet_worker_deliveries_total",
            &[("settled", "rejected")],
            1.0,
            Duration::from_secs(20),
        )
        .await?;
    stack
        .wait_for_coordinator_metric("fleet_poison_messages_total", 1.0, Duration::from_secs(20))
        .await?;

    // An envelope for a real pending job whose spec cannot be read.
    let run = stack.submit_slow_factory(3.0)?;
    wait_for_container(&format!("fleet.job={run}.se.1")).await?;
    let forged = json!({"v": 1, "job_id": format!("{run}.se.1"), "run_id": run, "attempt": 1,
        "spec_ref": format!("blobs/{}", "0".repeat(64))});
    publish_raw(&jobs, &serde_json::to_vec(&forged)?).await?;
    let status = stack.wait_run(&run, Duration::from_secs(60)).await?;
    assert_eq!(status["status"], "failed", "{status}");
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?;
    assert_eq!(result["result"]["reason"], "job_dead_lettered", "{result}");
    assert_eq!(result["result"]["node"], "se");
    assert!(stack
        .log(&format!("{}-w1", stack.ns))
        .contains("poison job"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_run_is_survived_by_coordinator_and_workers() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let stack = Stack::start("restart", 2, &[]).await?;
    let run = stack.submit_slow_factory(3.0)?;
    wait_for_container(&format!("fleet.job={run}.se.1")).await?;

    let ctl = |args: &[&str]| -> anyhow::Result<()> {
        let out = Command::new("rabbitmqctl").args(args).output()?;
        anyhow::ensure!(
            out.status.success(),
            "rabbitmqctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    ctl(&["stop_app"])?;
    tokio::time::sleep(Duration::from_secs(4)).await; // the job finishes while the broker is down
    ctl(&["start_app"])?;
    ctl(&["await_startup"])?;

    let status = stack.wait_run(&run, Duration::from_secs(120)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
    let nodes: Vec<&str> = logs
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["node"].as_str())
        .collect();
    assert_eq!(
        nodes,
        vec!["se", "tr", "po"],
        "each node has exactly one result"
    );
    // Both sides went through their own reconnect loop.
    assert!(stack.log("coordinator").contains("reconnecting"));
    assert!(stack
        .worker_ids()
        .iter()
        .any(|w| stack.log(w).contains("reconnecting")));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_redis_lost_is_restored_from_object_storage_and_finishes() -> anyhow::Result<()>
{
    let _serial = SERIAL.lock().await;
    let stack = Stack::start("lost", 2, &[]).await?;
    let run = stack.submit_slow_factory(3.0)?;
    wait_for_container(&format!("fleet.job={run}.se.1")).await?;
    // Redis loses the run (as after a failover that dropped acknowledged writes).
    let client = redis::Client::open(fleet_tests::stack::REDIS_URL)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let deleted: i64 = redis::cmd("DEL")
        .arg(format!("{}:run:{run}", stack.ns))
        .query_async(&mut conn)
        .await?;
    assert_eq!(deleted, 1);
    let status = stack.wait_run(&run, Duration::from_secs(60)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let metrics = stack.get_text("/metrics").await?;
    assert!(metrics.contains("fleet_runs_restored_total 1"), "{metrics}");
    Ok(())
}

fn rabbitmqctl(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("rabbitmqctl").args(args).output()?;
    anyhow::ensure!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Stops the broker's application for `down`, then starts it and waits until it serves.
fn blip(down: Duration) -> anyhow::Result<()> {
    rabbitmqctl(&["stop_app"])?;
    std::thread::sleep(down);
    rabbitmqctl(&["start_app"])?;
    rabbitmqctl(&["await_startup"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_publish_of_a_1000_job_fan_out_fires_the_join_once(
) -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let faults = tempfile::tempdir()?;
    let fault_dir = faults.path().display().to_string();
    let stack = Stack::start_config(StackConfig {
        tag: "fanblip",
        workers: 2,
        concurrency: 8,
        coordinator_env: &[
            // The relay stops after the broker confirmed its first batch of 256, before it
            // forgets them: the rest of the fan-out is still to be published.
            ("FLEET_FAULT_PAUSE", "coordinator.after_publish"),
            ("FLEET_FAULT_DIR", &fault_dir),
        ],
        ..StackConfig::default()
    })
    .await?;
    let dir = stack.dir.path();
    let repo = make_calc_repo(dir)?.display().to_string();
    let input = dir.join("fan.json");
    let items: Vec<u32> = (0..1000).collect();
    std::fs::write(&input, serde_json::to_vec(&json!({ "items": items }))?)?;
    let script = dir.join("script.json");
    std::fs::write(&script, "{}")?;
    let graph = fleet_tests::stack::workspace_root().join("graphs/bench/fanout.yaml");
    let out = stack.cli(&[
        "submit",
        "--graph",
        &graph.display().to_string(),
        "--repo",
        &repo,
        "--input",
        &input.display().to_string(),
        "--script",
        &script.display().to_string(),
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let run = out.stdout.trim().to_string();
    let reached = faults.path().join("coordinator.after_publish.reached");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !reached.exists() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the relay never published"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rabbitmqctl(&["stop_app"])?;
    // The relay goes on into a broker that is down: it retries the next batches.
    std::fs::write(faults.path().join("coordinator.after_publish.resume"), b"")?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    rabbitmqctl(&["start_app"])?;
    rabbitmqctl(&["await_startup"])?;

    let status = stack.wait_run(&run, Duration::from_secs(300)).await?;
    assert_eq!(status["status"], "succeeded", "{}", status["status"]);
    assert_eq!(status["joins"]["gather"]["fired"], 1);
    // The graph's exit status is `gather.output.count == (input.items | length)`: the run
    // succeeds only if the join counted 1,000 arrivals.
    assert_eq!(status["visits"]["gather"], 1);
    let done = status["jobs"]
        .as_array()
        .map(|jobs| jobs.iter().filter(|j| j["state"] == "done").count())
        .unwrap_or(0);
    assert_eq!(done, 1000, "every branch's result applied exactly once");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_blip_during_a_slow_verification_on_one_worker_leaves_the_gold_patch_passing(
) -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let stack = Stack::start("poblip", 1, &[]).await?;
    // The factory example with a PO step that takes a while (its first acceptance command).
    let order_path = slow_po_work_order(stack.dir.path(), 8)?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let out = stack.cli(&[
        "submit",
        "--repo",
        &repo,
        "--work-order",
        &order_path.display().to_string(),
        "--script",
        &example("factory-calc/script-pass.json"),
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let run = out.stdout.trim().to_string();
    wait_for_container(&format!("fleet.job={run}.po.1")).await?;
    // The worker's connection drops with the PO job unacked: the broker redelivers it to the
    // same (only) worker while the first execution still runs.
    blip(Duration::from_secs(2))?;

    let status = stack.wait_run(&run, Duration::from_secs(180)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?;
    assert_eq!(result["result"]["verdict"], "PASS", "{result}");
    let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
    let nodes: Vec<&str> = logs
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["node"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(nodes, vec!["se", "tr", "po"], "each node has one result");
    // The artifacts the run points to are there and readable.
    let po = logs
        .as_array()
        .and_then(|a| a.iter().find(|e| e["node"] == "po"))
        .cloned()
        .unwrap_or(Value::Null);
    let artifacts = po["artifacts"].as_object().cloned().unwrap_or_default();
    assert!(!artifacts.is_empty(), "po has artifacts: {po}");
    for key in artifacts.values().filter_map(Value::as_str) {
        let got = stack.cli(&["artifacts", &run, "--get", key])?;
        assert_eq!(got.code, 0, "artifact {key} readable: {}", got.stderr);
    }
    Ok(())
}
