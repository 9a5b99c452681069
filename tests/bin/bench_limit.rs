//! What one job must cost at least on this machine, and the fleet against it (issue 13, item 1):
//!
//! 1. **The broker's limit**: the messages one job needs and nothing else. A "coordinator" task
//!    publishes N persistent job messages with publisher confirms to a quorum queue (as the
//!    relay does: pipelined, every confirm awaited); a "worker" task consumes them with a
//!    prefetch, publishes a persistent result with a confirm for each and acks the job only
//!    then (as a worker does); the coordinator consumes the results and acks them.
//! 2. **Redis's limit**: the state writes one job needs, one script call per job (the job's
//!    record updated, its arrival added to the join's set, an outbox entry appended), N of them
//!    from 8 tasks at once.
//! 3. **The fleet**: an N-branch fan-out of no-op jobs into one join (`graphs/bench/fanout.yaml`),
//!    and the CPU each process spent on it (coordinator, workers, RabbitMQ, Redis: utime and
//!    stime from `/proc/<pid>/stat` before and after), per job.
//!
//! Usage: fleet-bench limit [--n N] [--prefetch P] [--workers W] [--concurrency C]

use crate::bench_cpu::{fleet_processes, peak_rss_mib, CpuMeter};
use fleet_tests::stack::{make_calc_repo, workspace_root, Stack, AMQP_URL, REDIS_URL};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

pub struct Options {
    pub n: usize,
    pub prefetch: u16,
    pub workers: usize,
    pub concurrency: usize,
    /// Coordinators side by side on the namespace (1 or more).
    pub coordinators: usize,
}

pub(crate) async fn quorum(ch: &Channel, name: &str) -> anyhow::Result<()> {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    ch.queue_declare(
        name,
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await?;
    Ok(())
}

pub(crate) async fn channel(conn: &Connection) -> anyhow::Result<Channel> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok(ch)
}

pub(crate) fn persistent() -> BasicProperties {
    BasicProperties::default().with_delivery_mode(2)
}

/// N jobs through the broker as the fleet moves them; jobs per second.
async fn broker_limit(n: usize, prefetch: u16) -> anyhow::Result<f64> {
    let tag = format!("bench-limit-{}", std::process::id());
    let (jobs, results) = (format!("{tag}.jobs"), format!("{tag}.results"));
    let conn = Connection::connect(AMQP_URL, ConnectionProperties::default()).await?;
    let setup = channel(&conn).await?;
    quorum(&setup, &jobs).await?;
    quorum(&setup, &results).await?;

    // The worker: a job in, its result published and confirmed, then the job acked.
    let worker_conn = Connection::connect(AMQP_URL, ConnectionProperties::default()).await?;
    let wch = channel(&worker_conn).await?;
    wch.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let mut incoming = wch
        .basic_consume(
            &jobs,
            "bench-worker",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let results_q = results.clone();
    let worker = tokio::spawn(async move {
        let mut inflight = futures::stream::FuturesUnordered::new();
        let mut done = 0usize;
        while done < n {
            tokio::select! {
                Some(delivery) = incoming.next(), if inflight.len() < usize::from(prefetch) => {
                    let delivery = delivery?;
                    let ch = wch.clone();
                    let q = results_q.clone();
                    inflight.push(async move {
                        ch.basic_publish("", &q, BasicPublishOptions::default(), &delivery.data, persistent())
                            .await?
                            .await?;
                        delivery.ack(BasicAckOptions::default()).await?;
                        Ok::<_, anyhow::Error>(())
                    });
                }
                Some(r) = inflight.next() => { r?; done += 1; }
            }
        }
        Ok::<_, anyhow::Error>(())
    });

    // The coordinator: results consumed and acked.
    let cch = channel(&conn).await?;
    cch.basic_qos(prefetch.saturating_mul(4), BasicQosOptions::default())
        .await?;
    let mut answers = cch
        .basic_consume(
            &results,
            "bench-coord",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let t = Instant::now();
    // Jobs published with confirms, pipelined in windows as the relay does.
    let pch = channel(&conn).await?;
    let body = json!({"v": 1, "job": "r.noop.1", "spec": "x".repeat(200)}).to_string();
    let publisher = tokio::spawn(async move {
        for chunk in (0..n).collect::<Vec<_>>().chunks(256) {
            let mut confirms = Vec::with_capacity(chunk.len());
            for _ in chunk {
                confirms.push(
                    pch.basic_publish(
                        "",
                        &jobs,
                        BasicPublishOptions::default(),
                        body.as_bytes(),
                        persistent(),
                    )
                    .await?,
                );
            }
            for c in confirms {
                c.await?;
            }
        }
        Ok::<_, anyhow::Error>(())
    });
    let mut got = 0;
    while got < n {
        let d = answers
            .next()
            .await
            .ok_or_else(|| anyhow::anyhow!("results consumer ended"))??;
        d.ack(BasicAckOptions::default()).await?;
        got += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    publisher.await??;
    worker.await??;
    for q in [format!("{tag}.jobs"), results] {
        let _ = setup.queue_delete(&q, QueueDeleteOptions::default()).await;
    }
    Ok(n as f64 / secs)
}

/// N jobs' state writes in Redis, 8 at a time; writes per second.
async fn redis_limit(n: usize) -> anyhow::Result<f64> {
    let client = redis::Client::open(REDIS_URL)?;
    let conn = redis::aio::ConnectionManager::new(client).await?;
    let ns = format!("bench-limit-{}", std::process::id());
    let script = redis::Script::new(
        r"
        redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
        redis.call('SADD', KEYS[2], ARGV[1])
        redis.call('RPUSH', KEYS[3], ARGV[2])
        return redis.call('INCR', KEYS[4])",
    );
    let record = "x".repeat(200);
    let t = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let (mut c, script, ns, record) =
                (conn.clone(), script.clone(), ns.clone(), record.clone());
            async move {
                let _: i64 = script
                    .key(format!("{ns}:jobs"))
                    .key(format!("{ns}:arrived"))
                    .key(format!("{ns}:outbox"))
                    .key(format!("{ns}:version"))
                    .arg(format!("job-{i}"))
                    .arg(record)
                    .invoke_async(&mut c)
                    .await?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let secs = t.elapsed().as_secs_f64();
    let mut c = conn.clone();
    let _: () = redis::cmd("DEL")
        .arg(format!("{ns}:jobs"))
        .arg(format!("{ns}:arrived"))
        .arg(format!("{ns}:outbox"))
        .arg(format!("{ns}:version"))
        .query_async(&mut c)
        .await?;
    Ok(n as f64 / secs)
}

pub async fn run(o: Options) -> anyhow::Result<()> {
    let broker = broker_limit(o.n, o.prefetch).await?;
    eprintln!("broker limit: {broker:.0} jobs/s");
    let redis = redis_limit(o.n).await?;
    eprintln!("redis limit: {redis:.0} job writes/s");

    let mut stack = Stack::start_with("limit", o.workers, o.concurrency, &[]).await?;
    for _ in 1..o.coordinators {
        stack.start_extra_coordinator()?;
    }
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let graph = workspace_root()
        .join("graphs/bench/fanout.yaml")
        .display()
        .to_string();
    let script = stack.dir.path().join("script.json");
    std::fs::write(&script, "{}")?;
    let input = stack.dir.path().join("fan.json");
    let items: Vec<usize> = (0..o.n).collect();
    std::fs::write(&input, serde_json::to_vec(&json!({"items": items}))?)?;
    let meter = CpuMeter::start(fleet_processes(&stack));
    let run = fleet_tests::submit::submit_with_script(
        &stack,
        Path::new(&graph),
        Path::new(&repo),
        &input,
        &script,
    )?;
    // Told of the end by the API, then the status read once; the run's own timestamps time it.
    stack.wait_run_told(&run, Duration::from_secs(1800)).await?;
    // The coordinator's peak memory while it ran the run (before the status read renders it).
    let coordinator_peak_rss_mib = stack.coordinator_pid().and_then(peak_rss_mib);
    let st = stack.get(&format!("/v1/runs/{run}")).await?;
    anyhow::ensure!(
        st["status"] == "succeeded" && st["joins"]["gather"]["fired"] == 1,
        "{st}"
    );
    let secs = |k: &str| {
        chrono::DateTime::parse_from_rfc3339(st[k].as_str().unwrap_or_default())
            .map(|t| t.timestamp_millis() as f64 / 1e3)
            .unwrap_or(0.0)
    };
    let run_secs = secs("finished_at") - secs("created_at");
    let cpu = meter.seconds(None, None);
    // Where the coordinator's time went, phase by phase of its group commits.
    let text = reqwest::get(format!("{}/metrics", stack.server))
        .await?
        .text()
        .await?;
    let mut phases = serde_json::Map::new();
    for phase in ["load", "engine", "outbox", "store", "mirror", "after"] {
        let sum = fleet_tests::stack::sum_samples(
            &text,
            "fleet_commit_phase_seconds_sum",
            &[("phase", phase)],
        );
        phases.insert(phase.into(), json!(sum * 1e3 / o.n as f64));
    }
    let commits = fleet_tests::stack::sum_samples(
        &text,
        "fleet_commit_phase_seconds_count",
        &[("phase", "store")],
    );
    let mut mirror = serde_json::Map::new();
    for kind in ["snapshot", "delta"] {
        let count =
            |metric: &str| fleet_tests::stack::sum_samples(&text, metric, &[("kind", kind)]);
        mirror.insert(
            kind.into(),
            json!({"writes": count("fleet_mirror_writes_total"),
                "mb": count("fleet_mirror_bytes_total") / 1e6}),
        );
    }
    let fleet = o.n as f64 / run_secs;
    let per_job_ms: serde_json::Map<String, serde_json::Value> = cpu
        .iter()
        .map(|(k, v)| (k.clone(), json!(v * 1e3 / o.n as f64)))
        .collect();
    println!(
        "{}",
        json!({"bench": "limit", "n": o.n, "prefetch": o.prefetch,
            "broker_jobs_per_second": broker, "redis_job_writes_per_second": redis,
            "fleet_jobs_per_second": fleet, "fleet_seconds": run_secs,
            "fleet_share_of_broker_limit": fleet / broker,
            "cpu_ms_per_job": per_job_ms,
            "coordinator_commit_ms_per_job": phases, "commits": commits,
            "mirror_writes": mirror, "coordinator_peak_rss_mib": coordinator_peak_rss_mib,
            "workers": o.workers, "concurrency": o.concurrency,
            "coordinators": o.coordinators})
    );
    Ok(())
}
