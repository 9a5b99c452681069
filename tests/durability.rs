//! Faults at named points of the job path, on the real stack: a worker killed at four points,
//! Redis lost (`SHUTDOWN NOSAVE`, restarted empty) at three, a coordinator killed between
//! claiming outbox messages and the broker's confirm. Each process stops at its point
//! (`FLEET_FAULT_PAUSE`, see `worker::faults`) and the test acts when the point's marker
//! appears, so nothing here waits on a guess.

use fleet_tests::private_redis::PrivateRedis;
use fleet_tests::stack::{
    containers, make_calc_repo, s3_blobs, workspace_root, Stack, StackConfig,
};
use fleet_tests::submit::submit_with_script;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const TWO_STEPS: &str = r#"
name: two-steps
start: first
defaults: {image: "fleet-agent-py:1", timeout_seconds: 60}
nodes:
  first:
    kind: command
    commands: ["true"]
    worktree: {from: base, mode: ro}
    routes: [{to: second}]
  second:
    kind: command
    commands: ["true"]
    worktree: {from: base, mode: ro}
    routes: [{to: done}]
  done: {kind: exit, status: first.ok and second.ok}
"#;

const FORK: &str = r#"
name: fork
start: split
defaults: {image: "fleet-agent-py:1", timeout_seconds: 60}
nodes:
  split:
    kind: command
    commands: ["true"]
    worktree: {from: base, mode: ro}
    routes: [{to: [fast, slow]}]
  fast:
    kind: command
    commands: ["true"]
    worktree: {from: base, mode: ro}
    routes: [{to: both}]
  slow:
    kind: command
    commands: ["sleep 6"]
    worktree: {from: base, mode: ro}
    routes: [{to: both}]
  both:
    kind: join
    wait_for: [fast, slow]
    routes: [{to: done}]
  done: {kind: exit, status: fast.ok and slow.ok}
"#;

struct Faults {
    dir: tempfile::TempDir,
}

impl Faults {
    fn new() -> anyhow::Result<Self> {
        Ok(Faults {
            dir: tempfile::tempdir()?,
        })
    }

    fn dir(&self) -> String {
        self.dir.path().display().to_string()
    }

    /// Waits until a process reached the point `name` and stopped there.
    async fn reached(&self, name: &str, timeout: Duration) -> anyhow::Result<()> {
        let marker = self.dir.path().join(format!("{name}.reached"));
        let deadline = Instant::now() + timeout;
        while !marker.exists() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "fault point {name} not reached in {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    fn resume(&self, name: &str) -> anyhow::Result<()> {
        std::fs::write(self.dir.path().join(format!("{name}.resume")), b"")?;
        Ok(())
    }
}

fn write_graph(dir: &Path, name: &str, yaml: &str) -> anyhow::Result<String> {
    let d = dir.join(name);
    std::fs::create_dir_all(&d)?;
    std::fs::write(d.join("graph.yaml"), yaml)?;
    Ok(d.join("graph.yaml").display().to_string())
}

fn submit(stack: &Stack, yaml: &str, name: &str) -> anyhow::Result<String> {
    let dir = stack.dir.path();
    let graph = write_graph(dir, name, yaml)?;
    let repo = make_calc_repo(dir)?.display().to_string();
    let input = dir.join(format!("input-{name}.json"));
    std::fs::write(&input, serde_json::to_vec(&json!({"name": name}))?)?;
    let script = dir.join("empty-script.json");
    std::fs::write(&script, "{}")?;
    submit_with_script(stack, Path::new(&graph), Path::new(&repo), &input, &script)
}

/// The nodes with a result in the run's log, in order: each job's result applied once.
async fn applied_nodes(stack: &Stack, run: &str) -> anyhow::Result<Vec<String>> {
    let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
    Ok(logs
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["node"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

/// A submission of the graph `yaml` as the run `id` on `repo`: the same bytes each time it is
/// made.
fn run_body(yaml: &str, repo: &Path, id: &str) -> anyhow::Result<Value> {
    let bundle =
        shared::graph::load_bundle("graph.yaml", yaml, |rel| Err(format!("no file {rel}")))
            .map_err(|es| anyhow::anyhow!("{es:?}"))?;
    Ok(json!({
        "graph": bundle, "input": {"name": id}, "repo": repo.display().to_string(),
        "git_ref": "HEAD", "agent": {"backend": "scripted", "script": {}}, "run_id": id,
    }))
}

/// The value of the metric line that starts with `series` (0 when there is none).
async fn metric(stack: &Stack, series: &str) -> anyhow::Result<f64> {
    let text = stack.get_text("/metrics").await?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0))
}

fn job_folders(work_dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(work_dir.join("jobs"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// A worker killed (SIGKILL) at `point` on a two-step run, then started again with the same
/// id: the run succeeds, each step's result is applied once, nothing of the killed execution
/// is left on the host.
async fn worker_killed_at(point: &str) -> anyhow::Result<()> {
    let faults = Faults::new()?;
    let fault_dir = faults.dir();
    let mut stack = Stack::start_config(StackConfig {
        tag: "wkill",
        workers: 1,
        concurrency: 1,
        worker_env: &[
            ("FLEET_FAULT_PAUSE", point),
            ("FLEET_FAULT_DIR", &fault_dir),
        ],
        ..StackConfig::default()
    })
    .await?;
    let worker = stack.worker_ids()[0].clone();
    let run = submit(&stack, TWO_STEPS, "two")?;
    faults.reached(point, Duration::from_secs(60)).await?;
    stack.kill_worker(&worker)?;
    stack.worker_env.clear();
    stack.start_worker(&worker)?;

    let status = stack.wait_run(&run, Duration::from_secs(120)).await?;
    assert_eq!(status["status"], "succeeded", "killed at {point}: {status}");
    assert_eq!(
        applied_nodes(&stack, &run).await?,
        vec!["first", "second"],
        "killed at {point}: each job's result applied exactly once"
    );
    assert_eq!(status["visits"]["first"], 1, "{status}");
    assert_eq!(status["visits"]["second"], 1, "{status}");
    // The restarted worker reaped what the killed one left.
    let label = format!("fleet.worker={worker}");
    let work_dir = stack.dir.path().join(format!("work-{worker}"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = containers(&label);
        let folders = job_folders(&work_dir);
        if left.is_empty() && folders.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "killed at {point}: left behind containers {left:?}, job folders {folders:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_before_its_container_starts_loses_nothing() -> anyhow::Result<()> {
    worker_killed_at("worker.before_container").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_run_loses_nothing_and_leaves_nothing() -> anyhow::Result<()> {
    worker_killed_at("worker.mid_run").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_after_storing_its_result_but_before_the_ack_is_applied_once(
) -> anyhow::Result<()> {
    worker_killed_at("worker.after_store").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_after_the_ack_loses_nothing() -> anyhow::Result<()> {
    worker_killed_at("worker.after_ack").await
}

/// A stack on a Redis of its own, with the coordinator armed to stop at `point` (if any).
async fn stack_on_private_redis(
    redis: &PrivateRedis,
    faults: &Faults,
    point: Option<&str>,
) -> anyhow::Result<Stack> {
    let url = redis.url();
    let fault_dir = faults.dir();
    let armed = [
        ("FLEET_FAULT_PAUSE", point.unwrap_or_default()),
        ("FLEET_FAULT_DIR", fault_dir.as_str()),
    ];
    Stack::start_config(StackConfig {
        tag: "rlost",
        workers: 2,
        concurrency: 2,
        common_env: &[("FLEET_REDIS", &url)],
        coordinator_env: if point.is_some() { &armed } else { &[] },
        ..StackConfig::default()
    })
    .await
}

fn succeeded_with_every_node_once(status: &Value, nodes: &[&str]) {
    assert_eq!(status["status"], "succeeded", "{status}");
    for n in nodes {
        assert_eq!(status["visits"][n], 1, "{n} ran one visit: {status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lost_between_a_commit_and_its_mirror_write_the_run_still_succeeds(
) -> anyhow::Result<()> {
    let mut redis = PrivateRedis::start()?;
    let faults = Faults::new()?;
    let stack = stack_on_private_redis(&redis, &faults, Some("coordinator.after_commit")).await?;
    let run = submit(&stack, TWO_STEPS, "mirror")?;
    // The first commit after the run's creation (a start notice or a result) stops there.
    faults
        .reached("coordinator.after_commit", Duration::from_secs(60))
        .await?;
    redis.lose_everything().await?;
    assert_eq!(redis.key_count().await?, 0);
    faults.resume("coordinator.after_commit")?;

    let status = stack.wait_run(&run, Duration::from_secs(120)).await?;
    succeeded_with_every_node_once(&status, &["first", "second"]);
    let metrics = stack.get_text("/metrics").await?;
    assert!(metrics.contains("fleet_runs_restored_total 1"), "{metrics}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lost_with_jobs_in_the_outbox_and_the_relay_dead_the_run_still_succeeds(
) -> anyhow::Result<()> {
    let mut redis = PrivateRedis::start()?;
    let faults = Faults::new()?;
    let mut stack =
        stack_on_private_redis(&redis, &faults, Some("coordinator.after_claim")).await?;
    let run = submit(&stack, TWO_STEPS, "outbox")?;
    // The first job is claimed from the outbox, not yet published; the coordinator dies and
    // Redis loses the claimed list with everything else: only the mirror knows of the job.
    faults
        .reached("coordinator.after_claim", Duration::from_secs(60))
        .await?;
    stack.kill_coordinator()?;
    redis.lose_everything().await?;
    stack.coordinator_env.clear();
    stack.restart_coordinator().await?;

    let status = stack.wait_run(&run, Duration::from_secs(120)).await?;
    succeeded_with_every_node_once(&status, &["first", "second"]);
    // Restored from the mirror: by the startup sweep, or (when a read of the run came first)
    // on that read; either way the new coordinator says so.
    let log = std::fs::read_to_string(stack.log_dir.join("coordinator-2.log"))?;
    assert!(
        log.contains("restored runs the run store had lost")
            || log.contains("the run store had lost this run; restored it from object storage"),
        "{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lost_with_a_join_half_full_the_join_fires_once() -> anyhow::Result<()> {
    let mut redis = PrivateRedis::start()?;
    let faults = Faults::new()?;
    let stack = stack_on_private_redis(&redis, &faults, None).await?;
    let run = submit(&stack, FORK, "fork")?;
    // Wait on the run's state until one branch arrived at the join and the other is running.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = stack.get(&format!("/v1/runs/{run}")).await?;
        let arrived = st["joins"]["both"]["arrived"]
            .as_array()
            .map(|a| a.len())
            .unwrap_or(0);
        if arrived == 1 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the join never got half full: {st}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The mirror holds the arrival only in its deltas (the snapshot is the run's first
    // state): the restore must replay them, or `fast` would run twice.
    let mirror = s3_blobs(&stack.ns);
    let snapshot: Value = mirror.get_json(&format!("runs/{run}/state.json")).await?;
    assert!(
        snapshot["joins"]["both"]["arrived"]
            .as_array()
            .is_none_or(|a| a.is_empty()),
        "the snapshot is not rewritten per commit: {snapshot}"
    );
    let deltas = mirror.list(&format!("runs/{run}/deltas/")).await?;
    assert!(!deltas.is_empty(), "each commit wrote a delta");
    redis.lose_everything().await?;

    let status = stack.wait_run(&run, Duration::from_secs(120)).await?;
    succeeded_with_every_node_once(&status, &["split", "fast", "slow", "both"]);
    assert_eq!(status["joins"]["both"]["fired"], 1, "{status}");
    // What finished before the loss was replayed from the deltas, not issued again.
    for done in ["split", "fast"] {
        let attempts: Vec<&Value> = (status["jobs"].as_array().into_iter().flatten())
            .filter(|j| j["node"] == done)
            .map(|j| &j["attempt"])
            .collect();
        assert_eq!(
            attempts,
            [&json!(1)],
            "{done} ran once, before the loss: {status}"
        );
    }
    // The final snapshot (and the removal of the deltas) follows the commit the run is seen
    // to end by.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = mirror.list(&format!("runs/{run}/deltas/")).await?;
        if left.is_empty() {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "a finished run's deltas are removed: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_killed_between_claim_and_confirm_and_restarted_with_its_id_loses_nothing(
) -> anyhow::Result<()> {
    let faults = Faults::new()?;
    let fault_dir = faults.dir();
    let id = format!("coord-{}", std::process::id());
    let mut stack = Stack::start_config(StackConfig {
        tag: "cclaim",
        workers: 1,
        concurrency: 2,
        coordinator_env: &[
            ("FLEET_COORDINATOR_ID", &id),
            ("FLEET_FAULT_PAUSE", "coordinator.after_claim"),
            ("FLEET_FAULT_DIR", &fault_dir),
        ],
        ..StackConfig::default()
    })
    .await?;
    let run = submit(&stack, TWO_STEPS, "claim")?;
    faults
        .reached("coordinator.after_claim", Duration::from_secs(60))
        .await?;
    stack.kill_coordinator()?;
    // Same configuration, same id, no fault: it takes back its own in-flight list at start
    // (its lease key may still be alive, which hides the list from everybody else).
    stack.coordinator_env = vec![("FLEET_COORDINATOR_ID".into(), id.clone())];
    stack.restart_coordinator().await?;

    let status = stack.wait_run(&run, Duration::from_secs(60)).await?;
    succeeded_with_every_node_once(&status, &["first", "second"]);
    assert_eq!(
        applied_nodes(&stack, &run).await?,
        vec!["first", "second"],
        "duplicates dropped"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_runs_leave_redis_after_their_retention_and_read_back_from_the_mirror(
) -> anyhow::Result<()> {
    let stack = Stack::start_config(StackConfig {
        tag: "retain",
        workers: 1,
        coordinator_env: &[("FLEET_RUN_RETENTION_SECONDS", "2")],
        ..StackConfig::default()
    })
    .await?;
    let run = submit(&stack, TWO_STEPS, "retained")?;
    let status = stack.wait_run(&run, Duration::from_secs(60)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    // Its commits were mirrored as deltas after its first snapshot; once it ended, the final
    // snapshot holds them and they are removed.
    let deltas_written = r#"fleet_mirror_writes_total{kind="delta"}"#;
    assert!(metric(&stack, deltas_written).await? >= 1.0);
    let mirror = s3_blobs(&stack.ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !mirror
        .list(&format!("runs/{run}/deltas/"))
        .await?
        .is_empty()
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the finished run's deltas stayed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = redis::Client::open(fleet_tests::stack::REDIS_URL)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let key = format!("{}:run:{run}", stack.ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let exists: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut conn)
            .await?;
        if !exists {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the finished run stayed in redis"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Read again, it comes back from object storage, finished as it was.
    let again = stack.get(&format!("/v1/runs/{run}")).await?;
    assert_eq!(again["status"], "succeeded", "{again}");

    // A run submitted under a chosen id and pruned the same way: submitted again, it is the
    // same run, read back from the mirror, not a second one started under its id.
    let repo = make_calc_repo(stack.dir.path())?;
    let body = run_body(TWO_STEPS, &repo, "kept-1")?;
    let (code, answer) = stack.post_answer("/v1/runs", &body).await?;
    assert_eq!(code, 201, "{answer}");
    let status = stack.wait_run("kept-1", Duration::from_secs(60)).await?;
    succeeded_with_every_node_once(&status, &["first", "second"]);
    let key = format!("{}:run:kept-1", stack.ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    while redis::cmd("EXISTS")
        .arg(&key)
        .query_async::<bool>(&mut conn)
        .await?
    {
        anyhow::ensure!(Instant::now() < deadline, "kept-1 stayed in redis");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, answer) = stack.post_answer("/v1/runs", &body).await?;
    assert_eq!((code, &answer["created"]), (200, &json!(false)), "{answer}");
    let status = stack.get("/v1/runs/kept-1").await?;
    succeeded_with_every_node_once(&status, &["first", "second"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_submitted_again_after_redis_went_back_to_an_older_copy_is_the_same_run(
) -> anyhow::Result<()> {
    let mut redis = PrivateRedis::start()?;
    let faults = Faults::new()?;
    let stack = stack_on_private_redis(&redis, &faults, None).await?;
    let reconciled = r#"fleet_store_reconciles_total{outcome="marked"}"#;
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&stack, reconciled).await? < 1.0 {
        anyhow::ensure!(Instant::now() < deadline, "the store was never reconciled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let older = redis.copy_data()?;

    // On a reconciled store a new id is known to be free without asking object storage.
    let repo = make_calc_repo(stack.dir.path())?;
    let body = run_body(TWO_STEPS, &repo, "rolled-1")?;
    let (code, answer) = stack.post_answer("/v1/runs", &body).await?;
    assert_eq!(code, 201, "{answer}");
    let store_answered = r#"fleet_mirror_lookups_total{answer="store"}"#;
    let asked = r#"fleet_mirror_lookups_total{answer="missing"}"#;
    assert_eq!(metric(&stack, store_answered).await?, 1.0);
    assert_eq!(metric(&stack, asked).await?, 0.0);
    let status = stack.wait_run("rolled-1", Duration::from_secs(60)).await?;
    succeeded_with_every_node_once(&status, &["first", "second"]);

    // Redis goes back to the copy taken before the run existed: the same epoch, the same
    // reconciled mark, no run. The same submission must find the run in the mirror.
    redis.restart_from(&older).await?;
    let (code, answer) = stack.post_answer("/v1/runs", &body).await?;
    assert_eq!((code, &answer["created"]), (200, &json!(false)), "{answer}");
    let status = stack.get("/v1/runs/rolled-1").await?;
    succeeded_with_every_node_once(&status, &["first", "second"]);
    assert_eq!(
        metric(&stack, r#"fleet_mirror_lookups_total{answer="found"}"#).await?,
        1.0
    );
    Ok(())
}

/// A new run's job goes out before the creation's mirror writes; if its result came back and
/// were committed and mirrored meanwhile, the creation's older snapshot would land over the
/// final one, and a restore would run the finished run again. The creation stops before its
/// writes; the test lets it go once the run finished in Redis (it cannot while the creation
/// holds the run; reads of it wait meanwhile) or after a bound, and the mirror must end with
/// the finished state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_back_before_its_runs_first_mirror_write_is_mirrored_after_it(
) -> anyhow::Result<()> {
    let faults = Faults::new()?;
    let fault_dir = faults.dir();
    let point = "coordinator.before_first_mirror";
    let stack = Stack::start_config(StackConfig {
        tag: "firstmirror",
        workers: 1,
        coordinator_env: &[
            ("FLEET_FAULT_PAUSE", point),
            ("FLEET_FAULT_DIR", fault_dir.as_str()),
        ],
        ..StackConfig::default()
    })
    .await?;
    let repo = make_calc_repo(stack.dir.path())?;
    // One command job (the per-job benchmark's graph).
    let graph = std::fs::read_to_string(workspace_root().join("graphs/bench/noop-command.yaml"))?;
    let body = run_body(&graph, &repo, "early-1")?;
    let url = format!("{}/v1/runs", stack.server);
    let posted = tokio::spawn(async move {
        let r = reqwest::Client::new().post(url).json(&body).send().await?;
        anyhow::Ok(r.status().as_u16())
    });
    faults.reached(point, Duration::from_secs(60)).await?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        // A read of the run waits while the creation holds it: bounded, it tells nothing.
        let read = stack.get_answer("/v1/runs/early-1");
        if let Ok(answer) = tokio::time::timeout(Duration::from_secs(1), read).await {
            if answer?.1["status"] == "succeeded" {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    faults.resume(point)?;
    assert_eq!(posted.await??, 201);
    let status = stack.wait_run("early-1", Duration::from_secs(60)).await?;
    succeeded_with_every_node_once(&status, &["noop"]);

    let mirror = s3_blobs(&stack.ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mirrored: Value = mirror.get_json("runs/early-1/state.json").await?;
        if mirrored["status"] == "succeeded" {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the mirror kept an older state of the finished run: {}",
            mirrored["status"]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
