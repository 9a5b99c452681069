//! Worker faults on the real stack: a second delivery of a job that is already running on the
//! worker (what a broker blip or a duplicate publish produces) must not disturb it.
//!
//! The panic path of issue 7 is tested in process (`worker::consumer::tests`, a sandbox whose
//! `start` panics): a real worker offers no way to make a job panic from outside.

use fleet_tests::stack::{
    containers, example, make_calc_repo, slow_po_work_order, wait_for_container, Stack, AMQP_URL,
};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

const RUN_TIMEOUT: Duration = Duration::from_secs(180);

async fn publish(ch: &Channel, queue: &str, body: &[u8]) -> anyhow::Result<()> {
    ch.basic_publish(
        "",
        queue,
        BasicPublishOptions::default(),
        body,
        BasicProperties::default().with_delivery_mode(2),
    )
    .await?
    .await?;
    Ok(())
}

/// Messages ready in the queue (not delivered to a consumer yet).
async fn ready(ch: &Channel, queue: &str) -> anyhow::Result<u32> {
    let q = ch
        .queue_declare(
            queue,
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    Ok(q.message_count())
}

/// Relays the namespace's jobs to the worker through a consumer of higher priority than the
/// worker's, until the job `<run>.<node>.1` passed: returns its envelope (the body the
/// coordinator published). Each job is held by the relay (prefetch 1, so the broker hands the
/// copy to the worker), copied, and acked once the worker took the copy.
async fn relay_until(ch: &Channel, queue: &str, node: &str) -> anyhow::Result<Vec<u8>> {
    ch.basic_qos(1, BasicQosOptions::default()).await?;
    let mut args = FieldTable::default();
    args.insert("x-priority".into(), AMQPValue::LongInt(10));
    let mut tap = ch
        .basic_consume(queue, "relay", BasicConsumeOptions::default(), args)
        .await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let delivery = tokio::time::timeout(left, tap.next())
            .await
            .map_err(|_| anyhow::anyhow!("no `{node}` job reached the relay"))?
            .ok_or_else(|| anyhow::anyhow!("the relay's consumer ended"))??;
        let env: Value = serde_json::from_slice(&delivery.data)?;
        let job = env["job_id"].as_str().unwrap_or_default().to_string();
        publish(ch, queue, &delivery.data).await?;
        let taken = Instant::now() + Duration::from_secs(30);
        while ready(ch, queue).await? > 0 {
            anyhow::ensure!(Instant::now() < taken, "the worker never took {job}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        delivery.acker.ack(BasicAckOptions::default()).await?;
        if job.ends_with(&format!(".{node}.1")) {
            ch.basic_cancel("relay", BasicCancelOptions::default())
                .await?;
            return Ok(delivery.data);
        }
    }
}

fn running(container: &str) -> bool {
    Command::new("docker")
        .args(["inspect", "-f", "{{.State.Running}}", container])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "true")
        .unwrap_or(false)
}

fn exit_codes(results: &Value) -> Vec<i64> {
    results
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["exit_code"].as_i64()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_delivery_of_a_running_job_does_not_disturb_it() -> anyhow::Result<()> {
    let stack = Stack::start("dup", 1, &[]).await?;
    let worker = stack.worker_ids()[0].clone();
    let queue = format!("{}.jobs", stack.ns);
    let conn = Connection::connect(AMQP_URL, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;

    // A factory run whose verification (PO) takes a while: its first acceptance command sleeps.
    let order_path = slow_po_work_order(stack.dir.path(), 8)?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let relay = {
        let (ch, queue) = (ch.clone(), queue.clone());
        tokio::spawn(async move { relay_until(&ch, &queue, "po").await })
    };
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
    let po_envelope = relay.await??;
    let label = format!("fleet.job={run}.po.1");
    let first = wait_for_container(&label).await?;

    // The same job, same attempt, delivered again while the first execution runs.
    publish(&ch, &queue, &po_envelope).await?;
    stack
        .wait_for_log(
            &worker,
            "a delivery of an attempt already running here",
            Duration::from_secs(20),
        )
        .await?;
    assert_eq!(
        containers(&label),
        vec![first.clone()],
        "no second container for the same attempt"
    );
    assert!(
        running(&first),
        "the first execution's container is untouched"
    );

    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?;
    assert_eq!(result["result"]["verdict"], "PASS", "{result}");
    // Verification and acceptance ran to the end in the first container: nothing was killed.
    let verify = stack
        .artifact_json(&format!("runs/{run}/attempt_1/verify_result.json"))
        .await?;
    let acceptance = stack
        .artifact_json(&format!("runs/{run}/attempt_1/acceptance_result.json"))
        .await?;
    for (what, results) in [("verify", &verify), ("acceptance", &acceptance)] {
        let codes = exit_codes(results);
        assert!(!codes.is_empty(), "{what}: {results}");
        assert!(
            codes.iter().all(|c| *c == 0),
            "{what} exit codes {codes:?} (137 is a killed container): {results}"
        );
    }
    assert_eq!(exit_codes(&acceptance).len(), 3);
    // One result per node: the held delivery was acked as a duplicate, never run.
    let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
    let nodes: Vec<&str> = logs
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["node"].as_str())
        .collect();
    assert_eq!(nodes, vec!["se", "tr", "po"], "{logs}");
    stack
        .wait_for_log(&worker, "acking a held delivery", Duration::from_secs(10))
        .await?;
    let log = stack.log(&worker);
    assert_eq!(
        log.matches("job started").count(),
        3,
        "se, tr and po each started once:\n{log}"
    );

    // Nothing is left: no container of the worker, no job folder, no message in the queue.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !containers(&format!("fleet.worker={worker}")).is_empty() {
        assert!(Instant::now() < deadline, "a container of {worker} is left");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let jobs_dir = stack.dir.path().join(format!("work-{worker}")).join("jobs");
    let left: Vec<_> = std::fs::read_dir(&jobs_dir)?
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "job folders left: {left:?}");
    assert_eq!(ready(&ch, &queue).await?, 0);
    let _ = conn.close(200, "done").await;
    Ok(())
}
