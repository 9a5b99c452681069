//! Poison jobs and a broker restart, on the real stack. These tests touch the shared RabbitMQ
//! server (the restart stops it for a moment), so they live in their own test binary, which
//! cargo runs after the others, one test at a time.

use fleet_tests::stack::{wait_for_container, Stack, AMQP_URL};
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde_json::json;
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
        .wait_for_log(
            &format!("{}-w1", stack.ns),
            "poison message",
            Duration::from_secs(20),
        )
        .await?;
    stack
        .wait_for_log(
            "coordinator",
            "dropping a poison message",
            Duration::from_secs(20),
        )
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
