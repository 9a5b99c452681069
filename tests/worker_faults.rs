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
        .wait_for_metric(
            &worker,
            "fleet_worker_duplicate_deliveries_total",
            &[("state", "running")],
            1.0,
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
        .node_artifact_json(&run, "po", 1, "verify_result.json")
        .await?;
    let acceptance = stack
        .node_artifact_json(&run, "po", 1, "acceptance_result.json")
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
    // Four deliveries acked: se, tr, po, and the held copy of po once po's result was reported.
    stack
        .wait_for_metric(
            &worker,
            "fleet_worker_deliveries_total",
            &[("settled", "acked")],
            4.0,
            Duration::from_secs(10),
        )
        .await?;
    let ran = stack
        .worker_metric(&worker, "fleet_worker_jobs_total", &[])
        .await?;
    assert_eq!(ran, 3.0, "se, tr and po each ran once");

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

/// Issue 7, item 7: a duplicate execution of an attempt on another worker runs to the end beside
/// the first, and each writes its artifacts in a folder of its own; the run points to the
/// accepted execution's, and the other's are listed apart, never read by the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_execution_on_another_worker_never_overwrites_the_accepted_artifacts(
) -> anyhow::Result<()> {
    // One job at a time per worker: while the first runs the PO job, the broker can hand the
    // second copy only to the other worker.
    let stack = Stack::start_with("dupx", 2, 1, &[]).await?;
    let queue = format!("{}.jobs", stack.ns);
    let conn = Connection::connect(AMQP_URL, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;

    let order_path = slow_po_work_order(stack.dir.path(), 6)?;
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
    publish(&ch, &queue, &po_envelope).await?;
    // The second execution starts on the other worker while the first still runs.
    let deadline = Instant::now() + Duration::from_secs(30);
    while containers(&label).len() < 2 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "no second execution of the PO job started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let workers: std::collections::BTreeSet<String> = containers(&label)
        .iter()
        .filter_map(|c| fleet_tests::stack::container_label(c, "fleet.worker"))
        .collect();
    assert_eq!(workers.len(), 2, "the two executions ran on two workers");
    assert!(running(&first), "the first execution is untouched");

    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?;
    assert_eq!(result["result"]["verdict"], "PASS", "{result}");
    // Both executions reported; the run accepted one result for the node.
    let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
    let po: Vec<&Value> = logs
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["node"] == "po")
        .collect();
    assert_eq!(po.len(), 1, "{logs}");
    let accepted = po[0]["execution"].as_str().unwrap_or_default().to_string();
    assert!(!accepted.is_empty(), "{}", po[0]);
    let pointed: Vec<String> = po[0]["artifacts"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(|k| k.as_str().map(str::to_string))
        .collect();
    assert!(!pointed.is_empty());
    for key in &pointed {
        assert!(
            key.starts_with(&format!("runs/{run}/attempt_1/exec-{accepted}/")),
            "the run points to the accepted execution's artifact: {key}"
        );
    }
    // The other execution's artifacts exist under its own folder, listed apart.
    let deadline = Instant::now() + Duration::from_secs(30);
    let superseded = loop {
        let listing = stack.get(&format!("/v1/runs/{run}/artifacts")).await?;
        let superseded: Vec<String> = serde_json::from_value(listing["superseded"].clone())?;
        let keys: Vec<String> = serde_json::from_value(listing["keys"].clone())?;
        for key in &pointed {
            assert!(keys.contains(key), "{key} listed as the run's: {listing}");
        }
        if superseded
            .iter()
            .any(|k| k.ends_with("/verify_result.json"))
        {
            break superseded;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the duplicate execution's artifacts never appeared: {listing}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for key in &superseded {
        assert!(
            key.starts_with(&format!("runs/{run}/attempt_1/exec-"))
                && !key.contains(&format!("/exec-{accepted}/")),
            "a superseded key is another execution's: {key}"
        );
        assert!(!pointed.contains(key));
    }
    // What the run points to is whole: the accepted execution's checks all ran and passed.
    let verify = stack
        .node_artifact_json(&run, "po", 1, "verify_result.json")
        .await?;
    let acceptance = stack
        .node_artifact_json(&run, "po", 1, "acceptance_result.json")
        .await?;
    assert!(exit_codes(&verify).iter().all(|c| *c == 0), "{verify}");
    assert_eq!(exit_codes(&acceptance), vec![0, 0, 0], "{acceptance}");
    let summary = stack
        .artifact_json(&format!("runs/{run}/run_summary.json"))
        .await?;
    let log = summary["attempts"][0]["acceptance"][0]["stdout_path"]
        .as_str()
        .unwrap_or_default();
    assert!(
        log.contains(&format!("/exec-{accepted}/")),
        "the summary names the accepted execution's acceptance log: {summary}"
    );
    let _ = conn.close(200, "done").await;
    Ok(())
}
