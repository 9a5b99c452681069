//! Server faults seen through a TCP proxy (tests/support/fault_proxy.rs) between the fleet and
//! one server: RabbitMQ or S3 taken away while a job runs and brought back, every connection
//! to every server dropped mid-run, and (ignored by default: `--ignored`, as scripts/bench-faults.sh runs them) each server paused or
//! reachable only through 500 ms of latency each way. Each test asserts the verdict, that each
//! node was run and accepted once (no result accepted twice), that the run ended (nothing
//! stranded), and prints a `fault-figure` line: the time from the fault's end to the run
//! moving again (its next job published), the jobs published beyond the run's own, and what
//! `/healthz` said meanwhile (scripts/bench-faults.sh collects them).
//!
//! Only the fleet processes of the test go through the proxy: the shared servers and the
//! other tests on this machine see nothing of the fault.

use fleet_tests::fault_proxy::FaultProxy;
use fleet_tests::stack::{make_calc_repo, sum_samples, wait_for_container, Stack, StackConfig};
use fleet_tests::submit::submit_with_script;
use serde_json::json;
use std::time::{Duration, Instant};

/// `first` runs 3 s (the fault lands inside it); `second` is published only once `first`'s
/// result is stored (S3), delivered (RabbitMQ) and committed (Redis).
const TWO_STEPS: &str = r#"
name: two-steps
start: first
defaults: {image: "fleet-agent-py:1", timeout_seconds: 60}
nodes:
  first:
    kind: command
    commands: ["sleep 3"]
    worktree: {from: base, mode: ro}
    routes: [{to: second}]
  second:
    kind: command
    commands: ["true"]
    worktree: {from: base, mode: ro}
    routes: [{to: done}]
  done: {kind: exit, status: first.ok and second.ok}
"#;

/// The goal: the run moves again within this long of the server answering.
const RECOVERY_GOAL: Duration = Duration::from_secs(5);
/// How long a server is away (longer than what is left of `first`: its result comes back while
/// the server is away).
const OUTAGE: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug)]
enum Server {
    Rabbitmq,
    S3,
    Redis,
}

impl Server {
    fn upstream(self) -> String {
        match self {
            Server::Rabbitmq => "127.0.0.1:5672".into(),
            Server::S3 => fleet_tests::stack::s3_endpoint()
                .trim_start_matches("http://")
                .to_string(),
            Server::Redis => "127.0.0.1:6379".into(),
        }
    }

    /// The environment that points a fleet process at `proxy` instead of the server.
    fn env(self, proxy: &FaultProxy) -> (&'static str, String) {
        let at = proxy.address();
        match self {
            Server::Rabbitmq => ("FLEET_AMQP", format!("amqp://{at}/%2f")),
            Server::S3 => ("AWS_ENDPOINT_URL", format!("http://{at}")),
            Server::Redis => ("FLEET_REDIS", format!("redis://{at}")),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Server::Rabbitmq => "rabbitmq",
            Server::S3 => "s3",
            Server::Redis => "redis",
        }
    }
}

/// A stack whose processes reach each of `servers` only through a proxy of its own.
async fn stack_behind(tag: &str, servers: &[Server]) -> anyhow::Result<(Stack, Vec<FaultProxy>)> {
    let mut proxies = Vec::new();
    let mut env = Vec::new();
    for s in servers {
        let proxy = FaultProxy::start(&s.upstream()).await?;
        env.push(s.env(&proxy));
        proxies.push(proxy);
    }
    let common: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let stack = Stack::start_config(StackConfig {
        tag,
        workers: 1,
        concurrency: 2,
        common_env: &common,
        ..StackConfig::default()
    })
    .await?;
    Ok((stack, proxies))
}

fn submit(stack: &Stack) -> anyhow::Result<String> {
    let dir = stack.dir.path().join("run");
    std::fs::create_dir_all(&dir)?;
    let graph = dir.join("graph.yaml");
    std::fs::write(&graph, TWO_STEPS)?;
    let repo = make_calc_repo(&dir)?;
    let input = dir.join("input.json");
    std::fs::write(&input, serde_json::to_vec(&json!({"name": "faults"}))?)?;
    let script = dir.join("script.json");
    std::fs::write(&script, "{}")?;
    submit_with_script(stack, &graph, &repo, &input, &script)
}

async fn published(stack: &Stack) -> f64 {
    match stack.get_text("/metrics").await {
        Ok(text) => sum_samples(&text, "fleet_jobs_published_total", &[]),
        Err(_) => -1.0,
    }
}

async fn healthz(stack: &Stack) -> String {
    match stack.get_text("/healthz").await {
        Ok(text) => text,
        Err(e) => format!("no answer: {e}"),
    }
}

/// Waits until the run's second job is published: the time it took from `since`.
async fn moved_again(stack: &Stack, since: Instant, limit: Duration) -> anyhow::Result<Duration> {
    loop {
        if published(stack).await >= 2.0 {
            return Ok(since.elapsed());
        }
        anyhow::ensure!(
            since.elapsed() < limit,
            "the run did not move within {limit:?} of the fault's end\ncoordinator log:\n{}",
            stack.log("coordinator")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The run ended right, each node run and accepted once: returns the jobs published beyond
/// the run's two (work redone).
async fn ended_right(stack: &Stack, run: &str) -> anyhow::Result<f64> {
    let status = stack.wait_run(run, Duration::from_secs(180)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    for node in ["first", "second"] {
        assert_eq!(status["visits"][node], 1, "{node} ran one visit: {status}");
    }
    let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
    let nodes: Vec<&str> = (logs.as_array().into_iter().flatten())
        .filter_map(|e| e["node"].as_str())
        .collect();
    assert_eq!(
        nodes,
        vec!["first", "second"],
        "one accepted result per node"
    );
    Ok(published(stack).await - 2.0)
}

fn figure(fault: &str, recovered: Duration, redone: f64, seen: &str) {
    println!(
        "fault-figure fault={fault} recovered_ms={} redone_jobs={redone} healthz=\"{seen}\"",
        recovered.as_millis()
    );
}

/// `server` taken away (every connection reset, new ones refused) while `first` runs, for
/// [`OUTAGE`], then back.
async fn server_away_while_a_job_runs(server: Server) -> anyhow::Result<()> {
    let (stack, proxies) = stack_behind(&format!("away{}", server.name()), &[server]).await?;
    let run = submit(&stack)?;
    wait_for_container(&format!("fleet.job={run}.first.1")).await?;
    proxies[0].down();
    tokio::time::sleep(OUTAGE / 2).await;
    let seen = healthz(&stack).await;
    tokio::time::sleep(OUTAGE / 2).await;
    let back = proxies[0].up();
    let moved = moved_again(&stack, back, Duration::from_secs(60)).await?;
    let redone = ended_right(&stack, &run).await?;
    figure(&format!("{}_away_5s", server.name()), moved, redone, &seen);
    assert!(
        moved <= RECOVERY_GOAL,
        "{} back: the run moved again only {moved:?} after",
        server.name()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_away_while_a_job_runs_the_run_moves_within_seconds_of_its_return(
) -> anyhow::Result<()> {
    server_away_while_a_job_runs(Server::Rabbitmq).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_away_while_a_job_runs_the_run_moves_within_seconds_of_its_return() -> anyhow::Result<()>
{
    server_away_while_a_job_runs(Server::S3).await
}

/// While RabbitMQ is away the coordinator says so (its consumers lost their connection):
/// `/healthz` degraded and `fleet_dependency_up{dependency="rabbitmq"}` 0; both back after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_rabbitmq_is_away_healthz_and_the_metric_say_so() -> anyhow::Result<()> {
    let (stack, proxies) = stack_behind("amqphealth", &[Server::Rabbitmq]).await?;
    let up = |text: &str| sum_samples(text, "fleet_dependency_up", &[("dependency", "rabbitmq")]);
    assert_eq!(healthz(&stack).await, "ok");
    assert_eq!(up(&stack.get_text("/metrics").await?), 1.0);
    proxies[0].down();
    let gone = Instant::now();
    while healthz(&stack).await != "degraded: rabbitmq unreachable" {
        anyhow::ensure!(
            gone.elapsed() < RECOVERY_GOAL,
            "healthz: {}",
            healthz(&stack).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let noticed = gone.elapsed();
    assert_eq!(up(&stack.get_text("/metrics").await?), 0.0);
    let back = proxies[0].up();
    while healthz(&stack).await != "ok" {
        anyhow::ensure!(back.elapsed() < RECOVERY_GOAL, "healthz after its return");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let healthy = back.elapsed();
    assert_eq!(up(&stack.get_text("/metrics").await?), 1.0);
    println!("rabbitmq away: degraded {noticed:?} after, ok {healthy:?} after its return");
    Ok(())
}

/// Every connection to every server dropped twice while `first` runs (a network blip): each
/// side reconnects and the run ends right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_dropped_mid_run_the_run_ends_right_with_nothing_twice(
) -> anyhow::Result<()> {
    let all = [Server::Rabbitmq, Server::S3, Server::Redis];
    let (stack, proxies) = stack_behind("dropped", &all).await?;
    let run = submit(&stack)?;
    wait_for_container(&format!("fleet.job={run}.first.1")).await?;
    for p in &proxies {
        p.cut();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = healthz(&stack).await;
    for p in &proxies {
        p.cut();
    }
    let cut = Instant::now();
    let moved = moved_again(&stack, cut, Duration::from_secs(60)).await?;
    let redone = ended_right(&stack, &run).await?;
    figure("every_connection_dropped", moved, redone, &seen);
    Ok(())
}

/// `server` frozen (nothing moves, connections held open) while `first` runs, for
/// [`OUTAGE`], then thawed.
async fn server_paused_while_a_job_runs(server: Server) -> anyhow::Result<()> {
    let (stack, proxies) = stack_behind(&format!("pause{}", server.name()), &[server]).await?;
    let run = submit(&stack)?;
    wait_for_container(&format!("fleet.job={run}.first.1")).await?;
    proxies[0].pause();
    tokio::time::sleep(OUTAGE / 2).await;
    let seen = healthz(&stack).await;
    tokio::time::sleep(OUTAGE / 2).await;
    proxies[0].resume();
    let back = Instant::now();
    let moved = moved_again(&stack, back, Duration::from_secs(120)).await?;
    let redone = ended_right(&stack, &run).await?;
    figure(
        &format!("{}_paused_5s", server.name()),
        moved,
        redone,
        &seen,
    );
    assert!(moved <= RECOVERY_GOAL, "{server:?} thawed: moved {moved:?}");
    Ok(())
}

/// The whole run with `server` reachable only through 500 ms of latency each way.
async fn server_slow_for_a_whole_run(server: Server, latency: Duration) -> anyhow::Result<()> {
    let (stack, proxies) = stack_behind(&format!("slow{}", server.name()), &[server]).await?;
    proxies[0].set_latency(latency);
    let started = Instant::now();
    let run = submit(&stack)?;
    let redone = ended_right(&stack, &run).await?;
    let seen = healthz(&stack).await;
    figure(
        &format!("{}_latency_{}ms_run", server.name(), latency.as_millis()),
        started.elapsed(),
        redone,
        &seen,
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the slow fault matrix: run with --ignored (scripts/bench-faults.sh does)"]
async fn fault_matrix_each_server_paused_while_a_job_runs() -> anyhow::Result<()> {
    for server in [Server::Rabbitmq, Server::S3, Server::Redis] {
        server_paused_while_a_job_runs(server).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the slow fault matrix: run with --ignored (scripts/bench-faults.sh does)"]
async fn fault_matrix_each_server_behind_500ms_of_latency() -> anyhow::Result<()> {
    // The same run through a proxy that adds nothing: the baseline.
    server_slow_for_a_whole_run(Server::Redis, Duration::ZERO).await?;
    for server in [Server::Rabbitmq, Server::S3, Server::Redis] {
        server_slow_for_a_whole_run(server, Duration::from_millis(500)).await?;
    }
    Ok(())
}
