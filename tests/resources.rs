//! Resources and error classes of the worker on the real stack: a job folder's disk quota, the
//! job folders a killed worker leaves, a root sandbox user refused at start, and permanent
//! failures reported at once instead of requeued until the delivery limit.

use fleet_tests::stack::{
    base_env, containers, delete_queues, make_calc_repo, run_cli, unique_namespace,
    wait_for_container, Stack, AMQP_URL,
};
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const MIB: u64 = 1024 * 1024;

/// A one-node graph: `commands` in the agent image, on a writable worktree of the base.
fn command_graph(dir: &Path, name: &str, commands: &[&str]) -> anyhow::Result<String> {
    let d = dir.join(name);
    std::fs::create_dir_all(&d)?;
    let yaml = format!(
        r#"
name: {name}
start: work
nodes:
  work:
    kind: command
    image: fleet-agent-py:1
    timeout_seconds: 120
    worktree: {{from: base, mode: rw}}
    commands: {commands}
    routes: [{{to: done}}]
  done:
    kind: exit
    status: work.ok
"#,
        commands = serde_json::to_string(commands)?,
    );
    std::fs::write(d.join("graph.yaml"), yaml)?;
    Ok(d.join("graph.yaml").display().to_string())
}

/// Submits `graph` on a fresh calc repository; returns the run id.
fn submit(stack: &Stack, graph: &str, tag: &str) -> anyhow::Result<String> {
    let repo = make_calc_repo(&stack.dir.path().join(tag))?
        .display()
        .to_string();
    // Run ids are content addressed: the tag makes each submission a run of its own.
    let input = stack.dir.path().join(format!("{tag}-input.json"));
    std::fs::write(&input, serde_json::to_vec(&json!({ "case": tag }))?)?;
    let script = stack.dir.path().join(format!("{tag}-script.json"));
    std::fs::write(&script, b"{}")?;
    let out = stack.cli(&[
        "submit",
        "--graph",
        graph,
        "--repo",
        &repo,
        "--input",
        &input.display().to_string(),
        "--script",
        &script.display().to_string(),
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    Ok(out.stdout.trim().to_string())
}

fn jobs_dir(stack: &Stack, worker: &str) -> PathBuf {
    stack.dir.path().join(format!("work-{worker}")).join("jobs")
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until `dir` has no entries.
async fn wait_empty(dir: &Path, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let left = entries(dir);
        if left.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "left in {}: {left:?}",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_no_containers(label: &str, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while !containers(label).is_empty() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "containers with {label} are left"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn job_of<'a>(status: &'a Value, node: &str) -> &'a Value {
    status["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| j["node"] == node))
        .unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_writing_past_its_disk_quota_is_killed_and_fails_and_its_folder_goes(
) -> anyhow::Result<()> {
    let stack = Stack::start("quota", 1, &[("FLEET_JOB_DISK_MB", "50")]).await?;
    let worker = stack.worker_ids()[0].clone();
    // 1 GiB of zeros into the worktree: far past the 50 MiB quota.
    let g = command_graph(
        stack.dir.path(),
        "fill",
        &["dd if=/dev/zero of=big.bin bs=1M count=1024"],
    )?;
    let started = Instant::now();
    let run = submit(&stack, &g, "fill")?;
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    let took = started.elapsed();
    assert_eq!(status["status"], "failed", "{status}");
    let job = job_of(&status, "work");
    let error = job["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("disk_quota_exceeded: "), "{status}");
    assert!(
        error.contains("(52428800 bytes)"),
        "the limit is named: {error}"
    );

    let result = stack.get(&format!("/v1/runs/{run}/result")).await?;
    let quota = &result["result"]["outputs"]["work"]["output"]["disk_quota_exceeded"];
    let used = quota["used_bytes"].as_u64().expect("used_bytes");
    let after_kill = quota["after_kill_bytes"]
        .as_u64()
        .expect("after_kill_bytes");
    assert_eq!(quota["limit_bytes"], 50 * MIB, "{result}");
    assert!(used > 50 * MIB, "{result}");
    // The writer was stopped long before it wrote its gigabyte.
    assert!(after_kill < 1024 * MIB, "{result}");
    eprintln!(
        "disk quota 50 MiB, dd if=/dev/zero bs=1M count=1024: detected at {:.1} MiB, {:.1} MiB once killed ({:.1} MiB over); run took {:.1}s",
        used as f64 / MIB as f64,
        after_kill as f64 / MIB as f64,
        after_kill.saturating_sub(50 * MIB) as f64 / MIB as f64,
        took.as_secs_f64()
    );

    // The container was killed and removed, the job folder removed.
    wait_no_containers(&format!("fleet.worker={worker}"), Duration::from_secs(10)).await?;
    wait_empty(&jobs_dir(&stack, &worker), Duration::from_secs(10)).await?;
    stack
        .wait_for_metric(
            &worker,
            "fleet_worker_disk_quota_exceeded_total",
            &[],
            1.0,
            Duration::from_secs(5),
        )
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_job_and_restarted_leaves_no_job_folder_and_no_container(
) -> anyhow::Result<()> {
    let mut stack = Stack::start("leftover", 1, &[]).await?;
    let worker = stack.worker_ids()[0].clone();
    let g = command_graph(stack.dir.path(), "slow", &["sleep 6"])?;
    let run = submit(&stack, &g, "slow")?;
    let container = wait_for_container(&format!("fleet.job={run}.work.1")).await?;
    let jobs = jobs_dir(&stack, &worker);
    let before = entries(&jobs);
    assert_eq!(before.len(), 1, "the running job's folder: {before:?}");
    assert!(
        jobs.join(&before[0]).join("wt/calc.py").exists(),
        "a worktree was checked out there"
    );

    stack.kill_worker(&worker)?;
    // The kill left both behind.
    assert!(jobs.join(&before[0]).exists());
    assert!(containers(&format!("fleet.worker={worker}")).contains(&container));

    stack.start_worker(&worker)?;
    stack
        .wait_for_metric(
            &worker,
            "fleet_worker_job_dirs_removed_total",
            &[("why", "start")],
            1.0,
            Duration::from_secs(30),
        )
        .await?;
    assert!(
        !jobs.join(&before[0]).exists(),
        "the killed execution's folder was removed at start"
    );
    assert!(
        !containers(&format!("fleet.worker={worker}")).contains(&container),
        "the killed execution's container was reaped"
    );

    // The job, redelivered, runs again here; then nothing of either execution is left.
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    wait_empty(&jobs, Duration::from_secs(10)).await?;
    wait_no_containers(&format!("fleet.worker={worker}"), Duration::from_secs(10)).await?;
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            &format!("label=fleet.worker={worker}"),
            "--format",
            "{{.Names}}",
        ])
        .output()?;
    assert!(
        String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "docker ps -a: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_job_folders_are_removed_but_never_a_running_jobs() -> anyhow::Result<()> {
    let stack = Stack::start("stale", 1, &[("FLEET_JOB_DIR_MAX_AGE_SECONDS", "2")]).await?;
    let worker = stack.worker_ids()[0].clone();
    let g = command_graph(stack.dir.path(), "slow", &["sleep 7"])?;
    let run = submit(&stack, &g, "stale")?;
    wait_for_container(&format!("fleet.job={run}.work.1")).await?;
    let jobs = jobs_dir(&stack, &worker);
    let running = entries(&jobs);
    assert_eq!(running.len(), 1, "{running:?}");
    // A folder whose removal failed when its job ended, long ago.
    let stale = jobs.join(format!("{run}.old.1-a1-e9-abcdef"));
    std::fs::create_dir_all(stale.join("wt"))?;
    std::fs::write(stale.join("wt/file"), b"left")?;
    stack
        .wait_for_metric(
            &worker,
            "fleet_worker_job_dirs_removed_total",
            &[("why", "stale")],
            1.0,
            Duration::from_secs(10),
        )
        .await?;
    assert!(!stale.exists(), "the stale folder is gone");
    // The running job's folder is older than the maximum age by now, and stays.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        jobs.join(&running[0]).exists(),
        "a running job's folder was removed"
    );
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    wait_empty(&jobs, Duration::from_secs(10)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_sandbox_user_is_root_does_not_start() -> anyhow::Result<()> {
    let ns = unique_namespace("rootuser");
    let dir = tempfile::tempdir()?;
    let env = base_env(&ns);
    for user in ["0", "0:0", "root", "root:root", "10001:0", "10001"] {
        let work = dir.path().join("work").display().to_string();
        let out = run_cli(
            &[
                "worker",
                "--id",
                &format!("{ns}-w"),
                "--work-dir",
                &work,
                "--sandbox-user",
                user,
            ],
            &env,
        )?;
        assert_ne!(out.code, 0, "{user}: the worker started:\n{}", out.stderr);
        assert!(
            out.stderr.contains(&format!("the sandbox user `{user}`")),
            "{user}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains("root") || out.stderr.contains("group 0"),
            "{user}: {}",
            out.stderr
        );
        assert!(
            !out.stderr.contains("worker ready"),
            "{user}: {}",
            out.stderr
        );
    }
    // Through the environment as well.
    let mut env = env;
    env.push(("FLEET_SANDBOX_USER".into(), "0".into()));
    let work = dir.path().join("work").display().to_string();
    let out = run_cli(
        &["worker", "--id", &format!("{ns}-w"), "--work-dir", &work],
        &env,
    )?;
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("containers never run as root"),
        "{}",
        out.stderr
    );
    delete_queues(&ns);
    Ok(())
}

/// Takes the next job of the namespace off its queue (acked: it is the test's now).
async fn take_job(conn: &Connection, ns: &str) -> anyhow::Result<Value> {
    let ch = conn.create_channel().await?;
    let queue = format!("{ns}.jobs");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(msg) = ch.basic_get(&queue, BasicGetOptions::default()).await? {
            let body: Value = serde_json::from_slice(&msg.delivery.data)?;
            msg.delivery.acker.ack(BasicAckOptions::default()).await?;
            return Ok(body);
        }
        anyhow::ensure!(Instant::now() < deadline, "no job in {queue}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn put_job(conn: &Connection, ns: &str, envelope: &Value) -> anyhow::Result<()> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    ch.basic_publish(
        "",
        &format!("{ns}.jobs"),
        BasicPublishOptions::default(),
        &serde_json::to_vec(envelope)?,
        BasicProperties::default().with_delivery_mode(2),
    )
    .await?
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_cannot_run_fails_at_once_instead_of_being_requeued() -> anyhow::Result<()> {
    // No worker yet: the test takes each job off the queue, breaks it, and puts it back.
    let mut stack = Stack::start("permanent", 0, &[]).await?;
    let conn = Connection::connect(AMQP_URL, ConnectionProperties::default()).await?;
    let g = command_graph(stack.dir.path(), "plain", &["true"])?;

    // A node its graph does not have.
    let ghost = submit(&stack, &g, "ghost")?;
    let mut first = take_job(&conn, &stack.ns).await?;
    assert_eq!(first["job_id"], format!("{ghost}.work.1"), "{first}");
    // A commit that is in none of the job's packs.
    let bad_commit = submit(&stack, &g, "badcommit")?;
    assert_ne!(bad_commit, ghost);
    let mut second = take_job(&conn, &stack.ns).await?;
    assert_eq!(second["job_id"], format!("{bad_commit}.work.1"));
    first["spec"]["node"] = json!("ghost");
    assert!(second["spec"]["worktree"]["commit"].is_string(), "{second}");
    second["spec"]["worktree"]["commit"] = json!("00000000000000000000000000000000000000aa");
    put_job(&conn, &stack.ns, &first).await?;
    put_job(&conn, &stack.ns, &second).await?;

    let id = format!("{}-w1", stack.ns);
    let started = Instant::now();
    stack.start_worker(&id)?;
    for (run, why) in [
        (&ghost, "node `ghost` is not in the job's graph"),
        (&bad_commit, "00000000000000000000000000000000000000aa"),
    ] {
        let status = stack.wait_run(run, Duration::from_secs(60)).await?;
        assert_eq!(status["status"], "failed", "{status}");
        let job = job_of(&status, "work");
        assert_eq!(job["status"], "error", "{status}");
        assert_eq!(job["attempt"], 1, "{status}");
        let error = job["error"].as_str().unwrap_or_default();
        assert!(error.contains("permanent failure, not retried"), "{error}");
        assert!(error.contains(why), "{error}");
    }
    // Both ended on their first delivery: one start each, none requeued or dead-lettered.
    let took = started.elapsed();
    let log = stack.log(&id);
    for run in [&ghost, &bad_commit] {
        let starts: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("job started") && l.contains(&format!("{run}.work.1")))
            .collect();
        assert_eq!(starts.len(), 1, "one delivery of {run}:\n{log}");
        assert!(starts[0].contains("delivery=0"), "{}", starts[0]);
    }
    assert!(!log.contains("; requeueing"), "{log}");
    assert_eq!(
        log.matches("job hit a permanent failure").count(),
        2,
        "{log}"
    );
    assert!(
        took < Duration::from_secs(30),
        "permanent failures took {took:?}"
    );
    eprintln!("two permanent failures reported {took:?} after the worker started");
    let dead = conn.create_channel().await?;
    let q = dead
        .queue_declare(
            &format!("{}.jobs.dead", stack.ns),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            Default::default(),
        )
        .await?;
    assert_eq!(q.message_count(), 0, "nothing was dead-lettered");
    wait_empty(&jobs_dir(&stack, &id), Duration::from_secs(10)).await?;
    let _ = conn.close(200, "done").await;
    Ok(())
}

#[test]
fn disk_usage_counts_lengths_and_blocks_never_through_links() -> anyhow::Result<()> {
    use worker::sandbox::disk::usage;
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join("job");
    std::fs::create_dir_all(root.join("wt/deep/er"))?;
    let empty = usage(&root).bytes;

    // 8 MiB written: counted.
    std::fs::write(root.join("wt/deep/er/data"), vec![1u8; 8 << 20])?;
    let written = usage(&root).bytes - empty;
    assert!(
        (8 << 20..(8 << 20) + (1 << 20)).contains(&written),
        "{written}"
    );

    // A sparse file of 10 GiB holding nothing costs its length: whatever reads the worktree
    // after the job (its commit, its tree hash) would read 10 GiB.
    let sparse = std::fs::File::create(root.join("wt/sparse"))?;
    sparse.set_len(10 << 30)?;
    let with_sparse = usage(&root).bytes;
    assert!(
        (10u64 << 30..(10u64 << 30) + (1 << 20)).contains(&(with_sparse - empty - written)),
        "{with_sparse}"
    );

    // A link to a big file outside the folder, and to the folder's own parent: not followed.
    let outside = tmp.path().join("outside");
    std::fs::write(&outside, vec![2u8; 4 << 20])?;
    std::os::unix::fs::symlink(&outside, root.join("wt/link"))?;
    std::os::unix::fs::symlink(tmp.path(), root.join("wt/up"))?;
    // A second name of the data file: counted once.
    std::fs::hard_link(root.join("wt/deep/er/data"), root.join("wt/again"))?;
    let with_links = usage(&root).bytes;
    assert!(
        with_links - with_sparse < 64 << 10,
        "{with_links} vs {with_sparse}"
    );
    assert!(usage(&root).entries >= 9);
    assert_eq!(usage(&tmp.path().join("missing")).bytes, 0);
    Ok(())
}

/// Runs `script` with `sh -c` in the session; (exit code, stdout).
async fn sh(session: &dyn worker::sandbox::Session, script: &str) -> anyhow::Result<(i64, String)> {
    let argv = ["sh", "-c", script].map(String::from);
    let out = session.exec(&argv, None, Duration::from_secs(30)).await?;
    Ok((
        out.exit_code,
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_run_docker_init_which_reaps_zombies_and_survives_the_job_killing_strays(
) -> anyhow::Result<()> {
    use worker::sandbox::docker::{DockerSandbox, WORKER_LABEL};
    use worker::sandbox::{Limits, Sandbox, SandboxError, SandboxSpec};
    let id = unique_namespace("init");
    let dir = tempfile::tempdir()?;
    let spec = SandboxSpec {
        name: format!("fleet-{id}"),
        image: "fleet-agent-py:1".into(),
        worktree: dir.path().to_path_buf(),
        writable: false,
        shared_worktree: false,
        layered_worktree: false,
        harness_dir: None,
        network: false,
        gateway_dir: None,
        lifetime: Duration::from_secs(120),
        labels: vec![(WORKER_LABEL.into(), id.clone())],
    };
    let docker = DockerSandbox::connect(Limits::default(), "10001:10001".into()).await?;
    let session = docker.start(&spec).await?;
    let checks = async {
        // PID 1 is docker-init, run (with the `sleep` under it) by the keeper, not the job's user.
        let (_, init) = sh(session.as_ref(), "tr '\\0' ' ' < /proc/1/cmdline").await?;
        assert!(init.starts_with("/sbin/docker-init -- sleep"), "{init}");
        let (_, uids) = sh(session.as_ref(), "grep ^Uid: /proc/1/status; id -u; id -g").await?;
        assert_eq!(
            uids.split_whitespace().collect::<Vec<_>>(),
            ["Uid:", "65534", "65534", "65534", "65534", "10001", "10001"],
            "{uids}"
        );
        // A daemon left behind, and an orphan that ends at once.
        let (_, daemon) = sh(
            session.as_ref(),
            "sleep 1000 >/dev/null 2>&1 & echo $!; (sleep 0.1 &) ; sleep 0.5",
        )
        .await?;
        let daemon: u32 = daemon.parse()?;
        let (_, zombies) = sh(
            session.as_ref(),
            "sleep 0.5; grep -l '^State:.*Z' /proc/[0-9]*/status || true",
        )
        .await?;
        assert_eq!(zombies, "", "the init reaps orphans that ended");
        // The harness kills the strays: the daemon goes, the container stays up.
        session.kill_strays().await?;
        let (code, _) = sh(session.as_ref(), &format!("test -e /proc/{daemon}")).await?;
        assert_ne!(code, 0, "the daemon survived kill_strays");
        let (code, out) = sh(session.as_ref(), "echo alive").await?;
        assert_eq!((code, out.as_str()), (0, "alive"), "the container survived");
        // The job's own `kill -9 -1` cannot end its container either.
        let (_, _) = sh(
            session.as_ref(),
            "kill -9 -1 2>/dev/null; kill -9 1 2>/dev/null; true",
        )
        .await?;
        let (code, out) = sh(session.as_ref(), "echo still").await?;
        assert_eq!((code, out.as_str()), (0, "still"));
        anyhow::Ok(())
    }
    .await;
    session.remove().await?;
    checks?;
    assert!(containers(&format!("{WORKER_LABEL}={id}")).is_empty());

    // A sandbox whose user is root refuses to start a container, whoever calls it.
    let root = DockerSandbox::connect(Limits::default(), "0:0".into()).await?;
    match root.start(&spec).await {
        Err(SandboxError::Refused(why)) => assert!(why.contains("root"), "{why}"),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(s) => {
            let _ = s.remove().await;
            panic!("a container was started as root");
        }
    }
    assert!(containers(&format!("{WORKER_LABEL}={id}")).is_empty());
    Ok(())
}
