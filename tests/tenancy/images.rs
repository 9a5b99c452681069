//! Item 9: any image on the worker's Docker can be run. The operator allows team A the agent
//! image only, by its id (`FLEET_TEAM_IMAGES` on the workers); A's member names the fleet's
//! own Redis image in a command node. The job is refused naming the image, and A's run on
//! its allowed image passes.

use fleet_tests::stack::{token_of, Stack, StackConfig};
use fleet_tests::submit::git_repo;
use serde_json::{json, Value};
use std::time::Duration;

fn graph(image: &str) -> String {
    format!(
        "name: img\nstart: work\nnodes:\n  work:\n    kind: command\n    \
         commands: [\"true\"]\n    image: {image}\n    worktree: {{from: base, mode: ro}}\n    \
         routes: [{{to: done}}]\n  done: {{kind: exit, status: work.ok}}\n"
    )
}

fn image_id(image: &str) -> anyhow::Result<String> {
    let out = std::process::Command::new("docker")
        .args(["image", "inspect", image, "--format", "{{.Id}}"])
        .output()?;
    anyhow::ensure!(out.status.success(), "no image {image}");
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

async fn run_on(stack: &Stack, token: &str, repo: &str, image: &str) -> anyhow::Result<Value> {
    let bundle =
        shared::graph::load_bundle("graph.yaml", &graph(image), |_| Err("no files".into()))
            .map_err(|es| anyhow::anyhow!("{es:?}"))?;
    let body = json!({"graph": bundle, "input": {}, "repo": repo, "git_ref": "HEAD",
        "agent": {"backend": "scripted", "script": {}}});
    let http = reqwest::Client::new();
    let made: Value = http
        .post(format!("{}/v1/runs", stack.server))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await?
        .json()
        .await?;
    let run = made["run_id"].as_str().unwrap_or_default().to_string();
    anyhow::ensure!(!run.is_empty(), "not submitted: {made}");
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let status: Value = http
            .get(format!("{}/v1/runs/{run}", stack.server))
            .bearer_auth(token)
            .send()
            .await?
            .json()
            .await?;
        let s = status["status"].as_str().unwrap_or_default();
        if matches!(s, "succeeded" | "failed" | "cancelled") || std::time::Instant::now() > deadline
        {
            return Ok(status);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_runs_only_the_images_the_operator_allowed_it() -> anyhow::Result<()> {
    let allowed = image_id("fleet-agent-py:1")?;
    image_id("fleet-redis:local")?;
    let images = json!({"team-a": [allowed]}).to_string();
    let srv = tempfile::tempdir()?;
    let root = srv.path().canonicalize()?;
    let repo = git_repo(&root, "repo", &[("a.txt", "a\n")])?;
    let repo = repo.display().to_string();
    let roots = root.display().to_string();
    let stack = Stack::start_config(StackConfig {
        tag: "tenimg",
        workers: 1,
        coordinator_env: &[("FLEET_OPEN_API", "0"), ("FLEET_REPO_ROOTS", &roots)],
        worker_env: &[("FLEET_TEAM_IMAGES", &images)],
        ..StackConfig::default()
    })
    .await?;
    let admin = token_of(&stack.cli(&["token", "bootstrap", "--team", "team-a"])?)?;
    let member = token_of(&stack.cli_env(
        &["token", "create", "--role", "member"],
        &[("FLEET_TOKEN", admin.as_str())],
    )?)?;

    let status = run_on(&stack, &member, &repo, "fleet-redis:local").await?;
    assert_eq!(
        status["status"], "failed",
        "team a ran the fleet's own image: {status}"
    );
    let error = status["jobs"][0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("fleet-redis:local") && error.contains("not allowed"),
        "{status}"
    );

    let status = run_on(&stack, &member, &repo, "fleet-agent-py:1").await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    Ok(())
}
