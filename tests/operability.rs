//! Operator surprises, one test each, on the real services: a dependency that is not there
//! (RabbitMQ, Redis, the bucket) ends the process within the startup wait with an error naming
//! it and its address (never its credentials); logs in a file carry no colour codes; JSON logs
//! parse; `fleet wait | head -1` ends without a panic; cancelling a finished run says so; a
//! graph with an unknown field is refused naming the field; a client waiting on a fan-out does
//! not make the coordinator read the whole run back from the store at each commit, nor do
//! status reads of a finished run.

use fleet_tests::stack::{
    base_env, example, fleet_bin, make_calc_repo, sum_samples, unique_namespace, workspace_root,
    Stack,
};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

struct Ended {
    code: Option<i32>,
    took: Duration,
    stdout: String,
    stderr: String,
}

/// Runs `fleet args` with the stack's base environment plus `env`, stdout and stderr going to
/// files (as under a service manager); kills it after `limit`.
fn run_to_files(args: &[&str], env: &[(&str, &str)], dir: &Path, limit: Duration) -> Ended {
    let ns = unique_namespace("op");
    let mut all = base_env(&ns);
    all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let out_path = dir.join(format!("{ns}.stdout"));
    let err_path = dir.join(format!("{ns}.stderr"));
    let started = Instant::now();
    let mut child = Command::new(fleet_bin())
        .args(args)
        .envs(all)
        .current_dir(workspace_root())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("fleet starts (build it first)");
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code();
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // A process that got as far as RabbitMQ declared the namespace's queues.
    fleet_tests::stack::delete_queues(&ns);
    Ended {
        code,
        took: started.elapsed(),
        stdout: std::fs::read_to_string(out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(err_path).unwrap_or_default(),
    }
}

/// The process ended on its own, non-zero, within the wait (2 s) and some slack; its stderr
/// names `what` and `url`, shows progress lines, and no secret.
fn assert_named_failure(e: &Ended, what: &str, url: &str) {
    let log = &e.stderr;
    assert!(e.code.is_some(), "still running after {:?}:\n{log}", e.took);
    assert_ne!(e.code, Some(0), "{log}");
    assert!(
        e.took < Duration::from_secs(15),
        "took {:?}:\n{log}",
        e.took
    );
    let needle = format!("cannot reach {what} at {url}");
    assert!(log.contains(&needle), "`{needle}` not in:\n{log}");
    assert!(
        log.contains(&format!("waiting for {what} at {url} (attempt 1)")),
        "no progress line in:\n{log}"
    );
    assert!(!log.contains("sekrit"), "a credential leaked:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn a_coordinator_without_rabbitmq_exits_naming_it_and_its_url() {
    let dir = tempfile::tempdir().unwrap();
    let port = closed_port();
    let amqp = format!("amqp://fleet:sekrit@127.0.0.1:{port}/%2f");
    let e = run_to_files(
        &["coordinator", "--listen", "127.0.0.1:0"],
        &[("FLEET_AMQP", &amqp), ("FLEET_STARTUP_WAIT_SECONDS", "2")],
        dir.path(),
        Duration::from_secs(30),
    );
    assert_named_failure(&e, "RabbitMQ", &format!("amqp://127.0.0.1:{port}/%2f"));
    assert!(!e.stdout.contains("listening on"), "{}", e.stdout);
}

#[test]
fn a_coordinator_without_redis_exits_naming_it_and_its_url() {
    let dir = tempfile::tempdir().unwrap();
    let port = closed_port();
    let redis = format!("redis://:sekrit@127.0.0.1:{port}");
    let e = run_to_files(
        &["coordinator", "--listen", "127.0.0.1:0"],
        &[("FLEET_REDIS", &redis), ("FLEET_STARTUP_WAIT_SECONDS", "2")],
        dir.path(),
        Duration::from_secs(30),
    );
    assert_named_failure(&e, "Redis", &format!("redis://127.0.0.1:{port}"));
}

#[test]
fn a_worker_given_a_missing_bucket_exits_naming_it_instead_of_consuming() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let e = run_to_files(
        &[
            "worker",
            "--id",
            "op-w",
            "--work-dir",
            &work.display().to_string(),
        ],
        &[
            ("FLEET_STORE", "s3://no-such-bucket-xyz"),
            ("FLEET_STARTUP_WAIT_SECONDS", "2"),
        ],
        dir.path(),
        Duration::from_secs(30),
    );
    let log = &e.stderr;
    assert!(e.code.is_some(), "still running:\n{log}");
    assert_ne!(e.code, Some(0), "{log}");
    assert!(
        e.took < Duration::from_secs(15),
        "took {:?}:\n{log}",
        e.took
    );
    assert!(
        log.contains("cannot use bucket `no-such-bucket-xyz` at s3://no-such-bucket-xyz"),
        "{log}"
    );
    assert!(log.contains("does not exist"), "{log}");
    assert!(!log.contains("consuming"), "it consumed the queue:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_written_to_a_file_carry_no_colour_codes() -> anyhow::Result<()> {
    // The stack's processes log to files (stdout and stderr redirected).
    let stack = Stack::start("opansi", 1, &[]).await?;
    let run = stack.submit_slow_factory(0.0)?;
    stack.wait_run(&run, Duration::from_secs(120)).await?;
    for id in ["coordinator".to_string(), stack.worker_ids()[0].clone()] {
        let log = stack.log(&id);
        assert!(log.contains(" INFO "), "{id} logged nothing:\n{log}");
        assert!(
            !log.contains("\x1b["),
            "colour codes in the log of {id}:\n{log}"
        );
    }
    // And a failing startup's file.
    let dir = tempfile::tempdir()?;
    let e = run_to_files(
        &["coordinator", "--listen", "127.0.0.1:0"],
        &[
            (
                "FLEET_REDIS",
                &format!("redis://127.0.0.1:{}", closed_port()),
            ),
            ("FLEET_STARTUP_WAIT_SECONDS", "1"),
        ],
        dir.path(),
        Duration::from_secs(30),
    );
    assert!(e.stderr.contains("waiting for Redis"), "{}", e.stderr);
    assert!(!e.stderr.contains("\x1b["), "{}", e.stderr);
    Ok(())
}

fn assert_json_lines(stderr: &str) -> Vec<Value> {
    let lines: Vec<Value> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not json ({e}): {l}")))
        .collect();
    assert!(!lines.is_empty(), "no log lines");
    for l in &lines {
        assert!(l["level"].is_string(), "{l}");
        assert!(l["fields"]["message"].is_string(), "{l}");
    }
    lines
}

#[test]
fn log_json_gives_lines_that_parse_as_json() {
    let dir = tempfile::tempdir().unwrap();
    // A coordinator that comes up: every stderr line is JSON, the ready line among them.
    let ns = unique_namespace("opjson");
    let err_path = dir.path().join("coordinator.stderr");
    let mut child = Command::new(fleet_bin())
        .args(["--log-json", "coordinator", "--listen", "127.0.0.1:0"])
        .envs(base_env(&ns))
        .current_dir(workspace_root())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("fleet starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&err_path)
        .unwrap_or_default()
        .contains("coordinator ready")
    {
        assert!(
            Instant::now() < deadline,
            "{}",
            std::fs::read_to_string(&err_path).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    fleet_tests::stack::delete_queues(&ns);
    let lines = assert_json_lines(&std::fs::read_to_string(&err_path).unwrap());
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "coordinator ready"),
        "{lines:?}"
    );

    // FLEET_LOG_FORMAT=json, and a fatal error: still one JSON object per line.
    let e = run_to_files(
        &["coordinator", "--listen", "127.0.0.1:0"],
        &[
            ("FLEET_LOG_FORMAT", "json"),
            (
                "FLEET_REDIS",
                &format!("redis://127.0.0.1:{}", closed_port()),
            ),
            ("FLEET_STARTUP_WAIT_SECONDS", "1"),
        ],
        dir.path(),
        Duration::from_secs(30),
    );
    assert_ne!(e.code, Some(0));
    let lines = assert_json_lines(&e.stderr);
    let last = lines.last().unwrap();
    assert_eq!(last["level"], "ERROR", "{last}");
    assert!(
        last["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot reach Redis"),
        "{last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_wait_into_a_closed_pipe_ends_with_the_runs_code_and_no_panic() -> anyhow::Result<()>
{
    let stack = Stack::start("oppipe", 1, &[]).await?;
    let run = stack.submit_slow_factory(2.0)?;
    let mut child = Command::new(fleet_bin())
        .args(["wait", &run])
        .env("FLEET_SERVER", &stack.server)
        .current_dir(workspace_root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // `| head -1`: read one line, then close the read end.
    let stdout = child.stdout.take().expect("piped stdout");
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first)?;
    assert!(
        first.starts_with(&format!("run {run}: ")),
        "a progress line, not {first:?}"
    );
    let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(101), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "the run's own code: {stderr}");

    // Without a closed pipe: one line per change, then the verdict.
    let again = stack.cli(&["wait", &run])?;
    assert_eq!(again.code, 0, "{}", again.stderr);
    let lines: Vec<&str> = again.stdout.lines().collect();
    assert!(
        lines[0].starts_with(&format!("run {run}: succeeded (jobs done")),
        "{lines:?}"
    );
    assert!(
        lines.contains(&format!("run {run}: PASS").as_str()),
        "{lines:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_finished_run_says_so_and_fails() -> anyhow::Result<()> {
    let stack = Stack::start("opcancel", 1, &[]).await?;
    let run = stack.submit_slow_factory(0.0)?;
    let done = stack.wait_run(&run, Duration::from_secs(120)).await?;
    assert_eq!(done["status"], "succeeded");
    let out = stack.cli(&["cancel", &run])?;
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "run {run} already finished: succeeded; nothing to cancel"
        )),
        "{}",
        out.stderr
    );
    assert!(!out.stdout.contains("succeeded"), "{}", out.stdout);
    let after = stack.get(&format!("/v1/runs/{run}")).await?;
    assert_eq!(after["status"], "succeeded", "the run is unchanged");
    // An unknown run is an error too.
    let missing = stack.cli(&["cancel", "no-such-run"])?;
    assert_ne!(missing.code, 0);
    assert!(missing.stderr.contains("not found"), "{}", missing.stderr);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_waiting_for_a_result_is_answered_when_the_run_finishes() -> anyhow::Result<()> {
    let stack = Stack::start("opwait", 1, &[]).await?;
    // The SE agent answers after 4 s: the run cannot have finished yet.
    let run = stack.submit_slow_factory(4.0)?;
    let result = format!("/v1/runs/{run}/result");
    let (code, body) = stack.get_answer(&result).await?;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["error"], "run is running", "{body}");
    // A short wait that ends first says the same.
    let (code, body) = stack
        .get_answer(&format!("{result}?wait_seconds=0.5"))
        .await?;
    assert_eq!(code, 409, "{body}");
    // Bad waits are refused with a reason, and change nothing.
    for bad in ["61", "-1", "soon"] {
        let (code, body) = stack
            .get_answer(&format!("{result}?wait_seconds={bad}"))
            .await?;
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap_or("")
                .contains("wait_seconds"),
            "{bad}: {body}"
        );
    }
    // A long wait is answered with the outcome once the run ends, not at its bound.
    let (code, body) = stack
        .get_answer(&format!("{result}?wait_seconds=60"))
        .await?;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    assert_eq!(body["result"]["verdict"], "PASS", "{body}");
    let summary = stack.get(&format!("/v1/runs/{run}/summary")).await?;
    assert_eq!(summary["status"], "succeeded", "{summary}");
    // A waiter for a run that does not exist is told so at once.
    let (code, body) = stack
        .get_answer("/v1/runs/no-such-run/result?wait_seconds=5")
        .await?;
    assert_eq!(code, 404, "{body}");
    Ok(())
}

/// A client waiting on a run's result is told at every commit and looks at the run each time.
/// While a commit has the run's state out, that look used to read the whole run back from
/// Redis, at every commit of a big fan-out (0.9 ms of coordinator CPU per job at 30,000
/// branches: BENCHMARKS.md §16). Now it waits for the commit in flight. The run is read from
/// the store only at its first commit, at the waiter's first look (before any commit) and at
/// its look once the run ended and was let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_a_fan_out_never_makes_the_coordinator_reload_the_run() -> anyhow::Result<()> {
    // One worker running one job at a time: results come one by one, each commit right after
    // the one before (many commits, back to back, whatever the machine's speed).
    let stack = Stack::start_with("opwaitfan", 1, 1, &[]).await?;
    let metric = |text: &str, name: &str, labels: &[(&str, &str)]| sum_samples(text, name, labels);
    let before = stack.get_text("/metrics").await?;
    let run = submit_fanout(&stack, 400)?;
    stack.wait_run_told(&run, Duration::from_secs(300)).await?;
    let after = stack.get_text("/metrics").await?;
    let st = stack.get(&format!("/v1/runs/{run}")).await?;
    assert_eq!(st["status"], "succeeded", "{st}");
    assert_eq!(st["joins"]["gather"]["fired"], 1, "{st}");
    let commits = metric(
        &after,
        "fleet_commit_phase_seconds_count",
        &[("phase", "load")],
    ) - metric(
        &before,
        "fleet_commit_phase_seconds_count",
        &[("phase", "load")],
    );
    let loads = metric(&after, "fleet_run_store_loads_total", &[])
        - metric(&before, "fleet_run_store_loads_total", &[]);
    assert!(
        commits >= 10.0,
        "a fan-out of 400 takes many commits for the waiter to look at: {commits}"
    );
    assert!(
        loads <= 3.0,
        "the run was read from the store {loads} times over {commits} commits"
    );
    Ok(())
}

/// Status reads of a finished run are served from the state the coordinator holds: the one
/// that finished it keeps it (it used to let it go, and each read loaded the whole run back
/// from Redis: 443 ms a read at 30,000 branches, BENCHMARKS.md §16), and one that starts
/// afterwards holds it from its first read on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reads_of_a_finished_run_read_it_from_the_store_at_most_once() -> anyhow::Result<()>
{
    let mut stack = Stack::start_with("opheld", 1, 8, &[]).await?;
    let run = submit_fanout(&stack, 40)?;
    stack.wait_run_told(&run, Duration::from_secs(120)).await?;
    let views = [
        format!("/v1/runs/{run}"),
        format!("/v1/runs/{run}/summary"),
        format!("/v1/runs/{run}/result"),
        format!("/v1/runs/{run}?node=noop"),
    ];
    let mut seen = Vec::new();
    for round in ["finisher", "restarted"] {
        let loads = || async {
            let text = stack.get_text("/metrics").await?;
            anyhow::Ok(sum_samples(&text, "fleet_run_store_loads_total", &[]))
        };
        let before = loads().await?;
        for _ in 0..5 {
            for view in &views {
                let v = stack.get(view).await?;
                assert_eq!(v["status"], "succeeded", "{round} {view}: {v}");
            }
        }
        let full = stack.get(&views[0]).await?;
        let noops = (full["jobs"].as_array().into_iter().flatten())
            .filter(|j| j["node"] == "noop")
            .count();
        assert_eq!(noops, 40, "{full}");
        let loads = loads().await? - before;
        let most = if round == "finisher" { 0.0 } else { 1.0 };
        assert!(
            loads <= most,
            "{round}: the finished run was read from the store {loads} times in 21 reads"
        );
        seen.push(full);
        if round == "finisher" {
            stack.restart_coordinator().await?;
        }
    }
    assert_eq!(
        seen[0], seen[1],
        "the same run before and after the restart"
    );
    Ok(())
}

/// A look at one node of a run (`GET /v1/runs/{id}?node=...`, what the dashboard asks when a
/// node is clicked) renders that node's jobs only, with the same run around them.
#[tokio::test]
async fn a_status_read_of_one_node_has_that_nodes_jobs_only() -> anyhow::Result<()> {
    let stack = Stack::start_with("opnode", 1, 8, &[]).await?;
    let run = submit_fanout(&stack, 30)?;
    stack.wait_run_told(&run, Duration::from_secs(120)).await?;
    let all = stack.get(&format!("/v1/runs/{run}")).await?;
    let noop = stack.get(&format!("/v1/runs/{run}?node=noop")).await?;
    let nothing = stack
        .get(&format!("/v1/runs/{run}?node=no-such-node"))
        .await?;
    let jobs = |v: &serde_json::Value| v["jobs"].as_array().cloned().unwrap_or_default();
    let of = |v: &serde_json::Value, node: &str| {
        jobs(v).into_iter().filter(|j| j["node"] == node).count()
    };
    assert_eq!(of(&all, "noop"), 30, "{all}");
    assert_eq!(jobs(&noop).len(), 30, "only the node's jobs: {noop}");
    assert_eq!(of(&noop, "noop"), 30, "{noop}");
    assert!(jobs(&nothing).is_empty(), "{nothing}");
    for view in [&noop, &nothing] {
        assert_eq!(view["status"], all["status"]);
        assert_eq!(view["visits"], all["visits"]);
        assert_eq!(view["joins"], all["joins"]);
    }
    Ok(())
}

/// Submits `graphs/bench/fanout.yaml` over `branches` items (no-op harness jobs into one join).
fn submit_fanout(stack: &Stack, branches: usize) -> anyhow::Result<String> {
    let repo = make_calc_repo(stack.dir.path())?;
    let graph = workspace_root().join("graphs/bench/fanout.yaml");
    let script = stack.dir.path().join("script.json");
    std::fs::write(&script, "{}")?;
    let input = stack.dir.path().join("input.json");
    let items: Vec<usize> = (0..branches).collect();
    std::fs::write(
        &input,
        serde_json::to_vec(&serde_json::json!({"items": items}))?,
    )?;
    fleet_tests::submit::submit_with_script(stack, &graph, &repo, &input, &script)
}

/// Every graph file of the repository (not templates or schemas).
fn repository_graphs() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![workspace_root().join("graphs")];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let p = entry.path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if p.is_dir() && name != "templates" && name != "schemas" {
                dirs.push(p);
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_with_an_unknown_field_is_refused_naming_the_field() -> anyhow::Result<()> {
    let graphs = repository_graphs();
    assert!(graphs.len() >= 5, "{graphs:?}");
    let stack = Stack::start("opgraph", 0, &[]).await?;
    for g in &graphs {
        let out = stack.cli(&["graph", "check", &g.display().to_string()])?;
        assert_eq!(out.code, 0, "{}: {}", g.display(), out.stderr);
    }

    // A copy of the review graph with a misspelt field, in a node and in a write scope.
    let dir = tempfile::tempdir()?;
    let yaml = std::fs::read_to_string(workspace_root().join("graphs/review/graph.yaml"))?;
    let cases = [
        (
            yaml.replace("    kind: command\n", "    kind: command\n    retries: 3\n"),
            "retries",
        ),
        (
            yaml.replace(
                "    worktree: { from: base, mode: ro }\n",
                "    worktree: { from: base, mode: rw, commit: true }\n    \
                 writes: { paths: [\"'*.py'\"], symlink: true }\n",
            ),
            "symlink",
        ),
    ];
    for (i, (text, field)) in cases.iter().enumerate() {
        assert_ne!(text, &yaml, "the case changed nothing");
        let path = dir.path().join(format!("g{i}.yaml"));
        std::fs::write(&path, text)?;
        let out = stack.cli(&["graph", "check", &path.display().to_string()])?;
        assert_ne!(out.code, 0, "{}", out.stdout);
        assert!(
            out.stderr.contains(&format!("unknown field `{field}`")),
            "{}",
            out.stderr
        );
        // `fleet submit` checks the same way before anything is sent.
        let repo = make_calc_repo(&dir.path().join(format!("r{i}")))?;
        let input = dir.path().join("input.json");
        std::fs::write(&input, "{}")?;
        let out = stack.cli(&[
            "submit",
            "--graph",
            &path.display().to_string(),
            "--repo",
            &repo.display().to_string(),
            "--input",
            &input.display().to_string(),
            "--script",
            &example("factory-calc/script-pass.json"),
        ])?;
        assert_ne!(out.code, 0, "{}", out.stdout);
        assert!(
            out.stderr.contains(&format!("unknown field `{field}`")),
            "{}",
            out.stderr
        );
    }

    // The API refuses a bundle with an unknown field, from a client that skipped the check.
    let repo = make_calc_repo(&dir.path().join("api"))?;
    let graph: Value = serde_yaml::from_str(&yaml)?;
    let body = serde_json::json!({
        "graph": {"source": "review.yaml", "graph": graph, "files": {}, "signed_by": "me"},
        "input": {}, "repo": repo.display().to_string(),
        "agent": {"backend": "scripted", "script": {}},
    });
    let r = reqwest::Client::new()
        .post(format!("{}/v1/runs", stack.server))
        .json(&body)
        .send()
        .await?;
    let (status, text) = (r.status(), r.text().await?);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("unknown field `signed_by`"), "{text}");
    assert_eq!(stack.get("/v1/runs").await?, serde_json::json!([]));
    Ok(())
}
