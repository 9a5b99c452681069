//! Faults survived in seconds. Redis shut down (`SHUTDOWN`, its append-only file kept) and
//! started again 3 s later, on a Redis of the test's own: the fleet works again within seconds
//! of Redis answering, without a restart of its own, and says what is missing while Redis is
//! away (`/healthz`, the `fleet_dependency_up` metric, 503 with `retry-after`); each of these
//! tests prints the time it took to recover (docs/reliability.md has the figures). And a run
//! that stops moving without ending is ended `run_stalled` by the watchdog.

use fleet_tests::private_redis::PrivateRedis;
use fleet_tests::stack::{make_calc_repo, sum_samples, Stack, StackConfig};
use fleet_tests::submit::submit_with_script;
use serde_json::json;
use std::time::{Duration, Instant};
use worker::quota::redis_ledger::RedisLedger;
use worker::quota::Ledger;

/// A first step that is still running when Redis goes away, a second one published only after
/// the first's result is committed (to Redis).
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

/// The goal: working again within this long of Redis answering.
const RECOVERY_GOAL: Duration = Duration::from_secs(5);
const OUTAGE: Duration = Duration::from_secs(3);

fn submit(stack: &Stack, name: &str) -> anyhow::Result<String> {
    let dir = stack.dir.path().join(name);
    std::fs::create_dir_all(&dir)?;
    let graph = dir.join("graph.yaml");
    std::fs::write(&graph, TWO_STEPS)?;
    let repo = make_calc_repo(&dir)?;
    let input = dir.join("input.json");
    std::fs::write(&input, serde_json::to_vec(&json!({"name": name}))?)?;
    let script = dir.join("script.json");
    std::fs::write(&script, "{}")?;
    submit_with_script(stack, &graph, &repo, &input, &script)
}

async fn stack_on(redis: &PrivateRedis, workers: usize) -> anyhow::Result<Stack> {
    let url = redis.url();
    Stack::start_config(StackConfig {
        tag: "rrestart",
        workers,
        concurrency: 2,
        common_env: &[("FLEET_REDIS", &url)],
        ..StackConfig::default()
    })
    .await
}

async fn coordinator_metric(stack: &Stack, metric: &str, labels: &[(&str, &str)]) -> f64 {
    match stack.get_text("/metrics").await {
        Ok(text) => sum_samples(&text, metric, labels),
        Err(_) => -1.0,
    }
}

/// Polls `ok` every 50 ms until it holds: the time from `since` it took, or an error when
/// `limit` passed since `since`.
async fn time_until<F, Fut>(
    what: &str,
    since: Instant,
    limit: Duration,
    mut ok: F,
) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        if ok().await {
            return Ok(since.elapsed());
        }
        anyhow::ensure!(
            since.elapsed() < limit,
            "{what}: not within {limit:?} of redis answering again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_works_again_within_seconds_of_a_restarted_redis_answering(
) -> anyhow::Result<()> {
    let mut redis = PrivateRedis::start()?;
    let stack = stack_on(&redis, 1).await?;
    let run = submit(&stack, "restart")?;
    stack
        .wait_for_coordinator_metric("fleet_jobs_published_total", 1.0, Duration::from_secs(30))
        .await?;
    // `first` is published (and runs for 3 s): Redis goes away under it.
    redis.shutdown().await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    // The coordinator's loops keep calling Redis while it is away, as in production.
    tokio::time::sleep(OUTAGE / 2).await;
    let seen = healthz(&http, &stack).await;
    tokio::time::sleep(OUTAGE / 2).await;
    let answering = redis.start_again().await?;

    let url = format!("{}/v1/runs/{run}", stack.server);
    let read = time_until("a GET of the run", answering, RECOVERY_GOAL, || async {
        matches!(http.get(&url).send().await, Ok(r) if r.status().is_success())
    })
    .await?;
    let moved = time_until(
        "the second job published",
        answering,
        RECOVERY_GOAL,
        || async { coordinator_metric(&stack, "fleet_jobs_published_total", &[]).await >= 2.0 },
    )
    .await?;
    println!(
        "time to recover from a redis restart ({OUTAGE:?} away): the API answered a read \
         {read:?} and the run moved on (its next job published) {moved:?} after redis answered"
    );
    let status = stack.wait_run(&run, Duration::from_secs(60)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    for node in ["first", "second"] {
        assert_eq!(status["visits"][node], 1, "{node} ran one visit: {status}");
    }
    let redone = coordinator_metric(&stack, "fleet_jobs_published_total", &[]).await - 2.0;
    println!(
        "fault-figure fault=redis_restart_3s recovered_ms={} redone_jobs={redone} \
         healthz=\"{seen}\"",
        moved.as_millis()
    );
    Ok(())
}

async fn healthz(http: &reqwest::Client, stack: &Stack) -> String {
    match http.get(format!("{}/healthz", stack.server)).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(e) => format!("no answer: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_away_the_coordinator_says_so_and_answers_503_with_retry_after(
) -> anyhow::Result<()> {
    let mut redis = PrivateRedis::start()?;
    let stack = stack_on(&redis, 0).await?;
    let run = submit(&stack, "away")?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let redis_up = [("dependency", "redis")];
    assert_eq!(healthz(&http, &stack).await, "ok");
    assert_eq!(
        coordinator_metric(&stack, "fleet_dependency_up", &redis_up).await,
        1.0
    );

    redis.shutdown().await?;
    let gone = Instant::now();
    // The coordinator's own loops call Redis every second: it notices without a request.
    let noticed = time_until("/healthz degraded", gone, RECOVERY_GOAL, || async {
        healthz(&http, &stack).await == "degraded: redis unreachable"
    })
    .await?;
    assert_eq!(
        coordinator_metric(&stack, "fleet_dependency_up", &redis_up).await,
        0.0
    );
    let asked = Instant::now();
    let answer = http
        .get(format!("{}/v1/runs/{run}", stack.server))
        .send()
        .await?;
    let took = asked.elapsed();
    assert_eq!(answer.status().as_u16(), 503);
    let retry_after = answer
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    assert!(
        matches!(retry_after, Some(1..=60)),
        "retry-after: {retry_after:?}"
    );
    let body: serde_json::Value = answer.json().await?;
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("try again"),
        "{body}"
    );
    // Refused at once, not after a call timeout.
    assert!(took < Duration::from_secs(2), "the 503 took {took:?}");

    let answering = redis.start_again().await?;
    let healthy = time_until("/healthz ok", answering, RECOVERY_GOAL, || async {
        healthz(&http, &stack).await == "ok"
    })
    .await?;
    assert_eq!(
        coordinator_metric(&stack, "fleet_dependency_up", &redis_up).await,
        1.0
    );
    let (status, view) = stack.get_answer(&format!("/v1/runs/{run}")).await?;
    assert_eq!(status, 200, "{view}");
    println!(
        "redis away: /healthz degraded {noticed:?} after the shutdown, a read refused in \
         {took:?}; healthy again {healthy:?} after redis answered"
    );
    Ok(())
}

/// The worker's quota ledger (every LLM call of every worker is admitted by it) on a Redis
/// restarted while calls keep coming: answered again within the goal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quota_ledger_answers_again_within_seconds_of_a_restarted_redis() -> anyhow::Result<()>
{
    let mut redis = PrivateRedis::start()?;
    let ns = fleet_tests::stack::unique_namespace("ledger-restart");
    let ledger = RedisLedger::connect(&redis.url(), &ns).await?;
    ledger.limits("team-a").await?;
    redis.shutdown().await?;
    // Calls keep coming while Redis is away (agents of running jobs), each failing.
    let away = Instant::now();
    while away.elapsed() < OUTAGE {
        let asked = Instant::now();
        assert!(ledger.limits("team-a").await.is_err());
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "a call while redis is away took {:?}",
            asked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answering = redis.start_again().await?;
    let back = time_until("the ledger's answer", answering, RECOVERY_GOAL, || async {
        ledger.limits("team-a").await.is_ok()
    })
    .await?;
    println!("quota ledger: answered again {back:?} after redis answered");
    Ok(())
}

/// `a`'s first route always matches: the join `both` waits for `b`, which never runs.
const JOIN_NEVER_FULL: &str = r#"
name: join-never-full
start: a
nodes:
  a:
    kind: harness
    op: noop
    routes:
      - {to: both, when: "true"}
      - {to: b}
  b: {kind: harness, op: noop, routes: [{to: both}]}
  both: {kind: join, wait_for: [a, b], routes: [{to: done}]}
  done: {kind: exit, status: a.ok}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_stops_moving_without_ending_is_ended_stalled_with_where_it_stuck(
) -> anyhow::Result<()> {
    let stack = Stack::start_config(StackConfig {
        tag: "stall",
        workers: 1,
        coordinator_env: &[("FLEET_STALL_GRACE_SECONDS", "2")],
        ..StackConfig::default()
    })
    .await?;
    let dir = stack.dir.path().join("stall");
    std::fs::create_dir_all(&dir)?;
    let graph = dir.join("graph.yaml");
    std::fs::write(&graph, JOIN_NEVER_FULL)?;
    let repo = make_calc_repo(&dir)?;
    let input = dir.join("input.json");
    std::fs::write(&input, "{}")?;
    let script = dir.join("script.json");
    std::fs::write(&script, "{}")?;
    let run = submit_with_script(&stack, &graph, &repo, &input, &script)?;
    let status = stack.wait_run(&run, Duration::from_secs(60)).await?;
    assert_eq!(status["status"], "failed", "{status}");
    assert_eq!(status["visits"]["a"], 1, "{status}");
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?;
    let text = result.to_string();
    assert!(text.contains("run_stalled"), "{text}");
    assert!(text.contains("joins_waiting"), "{text}");
    Ok(())
}
