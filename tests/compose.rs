//! The production compose file run for real: the images of `docker-compose.yml` built without a
//! registry by `scripts/build-deploy-images.sh`, `docker-compose up` under a project of its own,
//! the API closed to callers without a token, the first admin token made in the coordinator's
//! container, and the factory example submitted twice from the host with the host's `fleet`
//! through the published port: its repository uploaded, and by path on the coordinator's disk
//! (`tests/compose/override.yml` mounts the test's repositories there). Both runs must succeed:
//! their PO step runs pytest in a job container of `fleet-agent-py:1` that a worker's container
//! starts through the host's Docker socket, on a worktree beneath the work root mounted at the
//! same path. `docker-compose down -v` always; its logs when the test fails.

use fleet_tests::stack::{example, fleet_bin, make_calc_repo, workspace_root};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const RUN_TIMEOUT_SECONDS: u64 = 300;

/// One compose project: every `docker-compose` command of the test names it, its files and its
/// environment. Dropping it takes the project down with its volumes, and removes any job
/// container its workers left.
struct Project {
    name: String,
    env: Vec<(String, String)>,
}

impl Project {
    fn command(&self, args: &[&str]) -> Command {
        let root = workspace_root();
        let mut cmd = Command::new("docker-compose");
        cmd.arg("-p")
            .arg(&self.name)
            .arg("-f")
            .arg(root.join("docker-compose.yml"))
            .arg("-f")
            .arg(root.join("tests/compose/override.yml"))
            .args(args)
            .envs(self.env.iter().cloned())
            .current_dir(&root);
        cmd
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        let out = self.command(args).output()?;
        anyhow::ensure!(
            out.status.success(),
            "docker-compose {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(out)
    }

    fn print_logs(&self) {
        if let Ok(out) = self
            .command(&["logs", "--no-color", "--tail", "50"])
            .output()
        {
            eprintln!(
                "docker-compose logs --tail 50:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }

    /// The worker ids: each worker's container's host name (its short id).
    fn worker_ids(&self) -> Vec<String> {
        let out = self.command(&["ps", "-q", "worker"]).output();
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.len() >= 12)
                .map(|l| l[..12].to_string())
                .collect()
        })
        .unwrap_or_default()
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let workers = self.worker_ids();
        let _ = self
            .command(&["down", "-v", "--remove-orphans", "-t", "5"])
            .output();
        for id in workers {
            let out = Command::new("docker")
                .args(["ps", "-aq", "--filter", &format!("label=fleet.worker={id}")])
                .output();
            if let Ok(o) = out {
                let ids: Vec<String> = String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .map(str::to_string)
                    .collect();
                if !ids.is_empty() {
                    let _ = Command::new("docker")
                        .arg("rm")
                        .arg("-f")
                        .args(&ids)
                        .output();
                }
            }
        }
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The host's `fleet` against the published API, with `token` as FLEET_TOKEN; fails unless it
/// exits 0. Its standard output.
fn fleet(server: &str, token: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(fleet_bin())
        .args(args)
        .env("FLEET_SERVER", server)
        .env("FLEET_TOKEN", token)
        .current_dir(workspace_root())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "fleet {args:?} exited {:?}:\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn wait_healthy(server: &str, timeout: Duration) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(r) = http.get(format!("{server}/healthz")).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{server}/healthz not up after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Everything after `up`: the runs, from the host, through the published port.
async fn submit_and_check(project: &Project, server: &str, repos: &Path) -> anyhow::Result<()> {
    wait_healthy(server, Duration::from_secs(120)).await?;

    // The coordinator serves tokens only: a caller without one is refused.
    let status = reqwest::get(format!("{server}/v1/runs")).await?.status();
    anyhow::ensure!(
        status.as_u16() == 401,
        "the API answers without a token: {status}"
    );

    let out = project.run(&[
        "exec",
        "-T",
        "coordinator",
        "fleet",
        "token",
        "bootstrap",
        "--team",
        "ops",
    ])?;
    let token = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    anyhow::ensure!(token.starts_with("fleet_"), "not a token: {token:?}");

    // Two runs side by side: one whose repository the client uploads (how a client anywhere
    // submits), one naming its repository by path on the coordinator's disk (the override's
    // mount beneath FLEET_REPO_ROOTS).
    let mut runs = Vec::new();
    for (name, extra) in [("uploaded", None), ("on-server", Some("--repo-on-server"))] {
        let dir = repos.join(name);
        std::fs::create_dir_all(&dir)?;
        let repo = make_calc_repo(&dir)?.display().to_string();
        let graph = workspace_root().join("graphs/factory/graph.yaml");
        let mut args = vec![
            "submit".to_string(),
            "--graph".into(),
            graph.display().to_string(),
            "--repo".into(),
            repo,
            "--work-order".into(),
            example("factory-calc/work_order.json"),
            "--script".into(),
            example("factory-calc/script-pass.json"),
        ];
        args.extend(extra.map(str::to_string));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = fleet(server, &token, &args)?.trim().to_string();
        anyhow::ensure!(!run.is_empty(), "submit ({name}) printed no run id");
        runs.push(run);
    }
    let workers = project.worker_ids();
    anyhow::ensure!(workers.len() == 2, "two workers: {workers:?}");
    for run in &runs {
        check_run(server, &token, run, &workers)?;
    }
    Ok(())
}

/// The run succeeded with the factory's PASS, its acceptance tests passed in a job container,
/// and every job of it ran on one of `workers`.
fn check_run(server: &str, token: &str, run: &str, workers: &[String]) -> anyhow::Result<()> {
    let waited = fleet(
        server,
        token,
        &["wait", run, "--timeout", &RUN_TIMEOUT_SECONDS.to_string()],
    )?;
    let status: Value = serde_json::from_str(&fleet(server, token, &["status", run, "--json"])?)?;
    anyhow::ensure!(status["status"] == "succeeded", "{status}\n{waited}");

    let summary: Value = serde_json::from_str(&fleet(
        server,
        token,
        &[
            "artifacts",
            run,
            "--get",
            &format!("runs/{run}/run_summary.json"),
        ],
    )?)?;
    anyhow::ensure!(summary["verdict"] == "PASS", "{summary}");
    let acceptance = &summary["attempts"][0]["acceptance"][0];
    anyhow::ensure!(acceptance["exit_code"] == 0, "{acceptance}");
    anyhow::ensure!(
        acceptance["stdout_trunc"]
            .as_str()
            .unwrap_or_default()
            .contains("2 passed"),
        "pytest did not pass in the job container: {acceptance}"
    );

    // The jobs (TR, SE, PO) ran on the project's workers, whose ids are their containers' host
    // names.
    let logs = fleet(server, token, &["logs", run])?;
    let jobs: Vec<&str> = logs.lines().filter(|l| l.contains(" visit ")).collect();
    anyhow::ensure!(
        jobs.len() >= 3,
        "fewer jobs than the factory's three:\n{logs}"
    );
    anyhow::ensure!(
        jobs.iter()
            .all(|l| workers.iter().any(|w| l.contains(&format!(" on {w}")))),
        "a job ran elsewhere than on {workers:?}:\n{logs}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_deployment_runs_a_submitted_run_to_success() -> anyhow::Result<()> {
    let root = workspace_root();
    let started = Instant::now();
    let build = Command::new(root.join("scripts/build-deploy-images.sh"))
        .env("FLEET_BIN", fleet_bin())
        .current_dir(&root)
        .output()?;
    anyhow::ensure!(
        build.status.success(),
        "scripts/build-deploy-images.sh failed:\n{}{}",
        String::from_utf8_lossy(&build.stdout),
        String::from_utf8_lossy(&build.stderr)
    );
    eprintln!("deploy images ready in {:?}", started.elapsed());

    // Host paths the containers see at the same path: the workers' work root (job worktrees
    // are bind-mounted from it) and the coordinator's repositories.
    let work_root = tempfile::tempdir()?;
    let repos = tempfile::tempdir()?;
    let canonical = |p: &Path| -> anyhow::Result<PathBuf> { Ok(p.canonicalize()?) };
    let (work_root_path, repos_path) = (canonical(work_root.path())?, canonical(repos.path())?);
    let port = free_port()?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let project = Project {
        name: format!("fleetcompose{}x{}", std::process::id(), nanos % 100_000),
        env: vec![
            ("FLEET_API_PORT".into(), port.to_string()),
            (
                "FLEET_WORK_ROOT".into(),
                work_root_path.display().to_string(),
            ),
            ("FLEET_TEST_REPOS".into(), repos_path.display().to_string()),
        ],
    };
    let server = format!("http://127.0.0.1:{port}");
    let result = match project.run(&["up", "-d"]) {
        Ok(_) => submit_and_check(&project, &server, &repos_path).await,
        Err(e) => Err(e),
    };
    if result.is_err() {
        project.print_logs();
    }
    eprintln!("compose test done in {:?}", started.elapsed());
    result
}
