//! One job's round trip (issue 13, item 3), sequential, N times, side by side in one run:
//!
//! 1. **The broker's own round trip**: what one job needs from RabbitMQ and nothing else. A
//!    persistent job message published with a confirm to a quorum queue, consumed, its result
//!    published with a confirm, the job acked, the result consumed and acked.
//! 2. **The fleet**: `POST /v1/runs` of `graphs/bench/one-noop.yaml` (one harness no-op job),
//!    then `GET /v1/runs/{id}/result?wait_seconds=30`, answered when the run's last commit
//!    lands (no polling). The coordinator's commit phases per run say where the time goes.
//!
//! Celery's single task (`noop.delay(i).get()`, its result backend's pub/sub) is measured by
//! `scripts/bench-roundtrip.sh` in the same run.
//!
//! Usage: fleet-bench roundtrip [--n N]

use super::bench_limit::{channel, persistent, quorum};
use fleet_tests::stack::{make_calc_repo, workspace_root, Stack, AMQP_URL};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use serde_json::{json, Value};
use std::time::Instant;

/// p50 and p95 of `xs` in milliseconds (seconds in).
fn percentiles(xs: &mut [f64]) -> Value {
    xs.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let at = |q: f64| xs[((xs.len() as f64 - 1.0) * q).round() as usize] * 1e3;
    json!({"n": xs.len(), "p50_ms": at(0.5), "p95_ms": at(0.95), "min_ms": at(0.0)})
}

/// N sequential jobs through the broker: publish + confirm, consume, result publish +
/// confirm, ack, result consumed and acked. Seconds each.
async fn broker_round_trips(n: usize) -> anyhow::Result<Vec<f64>> {
    let tag = format!("bench-rt-{}", std::process::id());
    let (jobs, results) = (format!("{tag}.jobs"), format!("{tag}.results"));
    let conn = Connection::connect(AMQP_URL, ConnectionProperties::default()).await?;
    let ch = channel(&conn).await?;
    quorum(&ch, &jobs).await?;
    quorum(&ch, &results).await?;
    let wch = channel(&conn).await?;
    let mut incoming = wch
        .basic_consume(
            &jobs,
            "rt-worker",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut answers = ch
        .basic_consume(
            &results,
            "rt-coord",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let body = json!({"v": 1, "job": "r.noop.1", "spec": "x".repeat(200)}).to_string();
    let mut times = Vec::with_capacity(n);
    for _ in 0..n + 10 {
        let t = Instant::now();
        ch.basic_publish(
            "",
            &jobs,
            BasicPublishOptions::default(),
            body.as_bytes(),
            persistent(),
        )
        .await?
        .await?;
        let job = incoming
            .next()
            .await
            .ok_or_else(|| anyhow::anyhow!("job consumer ended"))??;
        wch.basic_publish(
            "",
            &results,
            BasicPublishOptions::default(),
            &job.data,
            persistent(),
        )
        .await?
        .await?;
        job.ack(BasicAckOptions::default()).await?;
        let result = answers
            .next()
            .await
            .ok_or_else(|| anyhow::anyhow!("result consumer ended"))??;
        result.ack(BasicAckOptions::default()).await?;
        times.push(t.elapsed().as_secs_f64());
    }
    for q in [&jobs, &results] {
        let _ = ch.queue_delete(q, QueueDeleteOptions::default()).await;
    }
    // The first ten warm the connection and the queues.
    Ok(times.split_off(10))
}

/// The coordinator's commit time per phase, in seconds, summed so far.
async fn commit_phases(server: &str) -> anyhow::Result<Vec<(String, f64)>> {
    let text = reqwest::get(format!("{server}/metrics"))
        .await?
        .text()
        .await?;
    Ok(["load", "engine", "outbox", "store", "mirror", "after"]
        .iter()
        .map(|phase| {
            let sum = fleet_tests::stack::sum_samples(
                &text,
                "fleet_commit_phase_seconds_sum",
                &[("phase", phase)],
            );
            (phase.to_string(), sum)
        })
        .collect())
}

pub async fn run(n: usize) -> anyhow::Result<()> {
    let broker = percentiles(&mut broker_round_trips(n).await?);
    eprintln!("broker round trip: {broker}");

    let stack = Stack::start_with("roundtrip", 1, 2, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let path = workspace_root().join("graphs/bench/one-noop.yaml");
    let yaml = std::fs::read_to_string(&path)?;
    let bundle = shared::graph::load_bundle(&path.display().to_string(), &yaml, |f| {
        Err(format!("no file {f}"))
    })
    .map_err(|e| anyhow::anyhow!("graph: {e:?}"))?;
    let http = reqwest::Client::new();
    let (mut submit, mut total) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut before = Vec::new();
    // Ten runs first: connections, the graph's bundle and the repository's pack stored once.
    for i in 0..n + 10 {
        if i == 10 {
            before = commit_phases(&stack.server).await?;
        }
        let body = json!({"graph": bundle, "input": {"i": i}, "repo": repo});
        let t = Instant::now();
        let created: Value = http
            .post(format!("{}/v1/runs", stack.server))
            .json(&body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let submitted = t.elapsed().as_secs_f64();
        let run = created["run_id"].as_str().unwrap_or_default().to_string();
        let answer = http
            .get(format!(
                "{}/v1/runs/{run}/result?wait_seconds=30",
                stack.server
            ))
            .send()
            .await?;
        let took = t.elapsed().as_secs_f64();
        let status = answer.status();
        let outcome: Value = answer.json().await?;
        anyhow::ensure!(
            status.is_success() && outcome["status"] == "succeeded",
            "run {run}: {status} {outcome}"
        );
        if i >= 10 {
            submit.push(submitted);
            total.push(took);
        }
    }
    let after = commit_phases(&stack.server).await?;
    let phases: serde_json::Map<String, Value> = before
        .iter()
        .zip(&after)
        .map(|((k, b), (_, a))| (k.clone(), json!((a - b) * 1e3 / n as f64)))
        .collect();
    let fleet = percentiles(&mut total);
    let submit = percentiles(&mut submit);
    eprintln!("fleet round trip: {fleet}");
    println!(
        "{}",
        json!({"bench": "roundtrip", "n": n, "broker_round_trip": broker,
            "fleet_round_trip": fleet, "fleet_submit": submit,
            "coordinator_commit_ms_per_run": phases})
    );
    Ok(())
}
