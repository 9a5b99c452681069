//! Item 1: another team's repository on the coordinator's disk. The operator keeps every
//! team's repositories beneath one folder (today's only way: `FLEET_REPO_ROOTS` for the whole
//! fleet) and gives each team its own roots (`FLEET_TEAM_REPO_ROOTS`). Team A's member names
//! team B's repository with `--repo-on-server`, directly, through a `.git` that is a symbolic
//! link, and through an `objects/` that is one; each is refused, and B's own run passes.

use fleet_tests::stack::{token_of, Stack, StackConfig};
use fleet_tests::submit::git_repo;
use std::path::Path;
use std::time::Duration;

const GRAPH: &str = "name: reader\nstart: read\nnodes:\n  read:\n    kind: command\n    \
    commands: [\"cat secret.txt\"]\n    image: fleet-agent-py:1\n    \
    worktree: {from: base, mode: ro}\n    routes: [{to: done}]\n  done: {kind: exit, status: read.ok}\n";

const SECRET: &str = "team-b's source: the victim's own secret\n";

/// `fleet submit --repo-on-server` of the reader graph on `repo` as the holder of `token`.
fn submit(stack: &Stack, dir: &Path, repo: &Path, token: &str) -> anyhow::Result<(i32, String)> {
    let g = dir.join("reader");
    std::fs::create_dir_all(&g)?;
    std::fs::write(g.join("graph.yaml"), GRAPH)?;
    std::fs::write(g.join("input.json"), "{}")?;
    std::fs::write(g.join("script.json"), "{}")?;
    let path = |p: &Path| p.display().to_string();
    let out = stack.cli_env(
        &[
            "submit",
            "--graph",
            &path(&g.join("graph.yaml")),
            "--repo",
            &path(repo),
            "--repo-on-server",
            "--input",
            &path(&g.join("input.json")),
            "--script",
            &path(&g.join("script.json")),
        ],
        &[("FLEET_TOKEN", token)],
    )?;
    let said = if out.code == 0 {
        out.stdout
    } else {
        out.stderr
    };
    Ok((out.code, said.trim().to_string()))
}

/// A member token of a new team.
fn member_of(stack: &Stack, team: &str) -> anyhow::Result<String> {
    let admin = token_of(&stack.cli(&["token", "bootstrap", "--team", team])?)?;
    token_of(&stack.cli_env(
        &["token", "create", "--role", "member"],
        &[("FLEET_TOKEN", admin.as_str())],
    )?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_cannot_open_another_teams_repository_on_the_server() -> anyhow::Result<()> {
    let srv = tempfile::tempdir()?;
    let srv_path = srv.path().canonicalize()?;
    let (a_root, b_root) = (srv_path.join("team-a"), srv_path.join("team-b"));
    std::fs::create_dir_all(&a_root)?;
    std::fs::create_dir_all(&b_root)?;
    let victim = git_repo(&b_root, "secret-repo", &[("secret.txt", SECRET)])?;
    let all = srv_path.display().to_string();
    let teams = format!("team-a={};team-b={}", a_root.display(), b_root.display());
    let stack = Stack::start_config(StackConfig {
        tag: "tenrepo",
        workers: 1,
        coordinator_env: &[
            ("FLEET_OPEN_API", "0"),
            ("FLEET_REPO_ROOTS", &all),
            ("FLEET_TEAM_REPO_ROOTS", &teams),
        ],
        ..StackConfig::default()
    })
    .await?;
    let (member_a, member_b) = (member_of(&stack, "team-a")?, member_of(&stack, "team-b")?);
    let dir = stack.dir.path();

    // A names B's repository directly.
    let (code, said) = submit(&stack, dir, &victim, &member_a)?;
    assert_ne!(code, 0, "team a opened team b's repository: run {said}");
    assert!(said.contains("not beneath a root"), "{said}");

    // A's own folder holds a repository whose `.git` is a link to B's.
    let linked = a_root.join("linked");
    std::fs::create_dir_all(&linked)?;
    std::fs::write(linked.join("secret.txt"), SECRET)?;
    std::os::unix::fs::symlink(victim.join(".git"), linked.join(".git"))?;
    let (code, said) = submit(&stack, dir, &linked, &member_a)?;
    assert_ne!(code, 0, "a `.git` link was followed: run {said}");
    assert!(said.contains("symbolic link"), "{said}");

    // A copy of B's repository in A's folder whose objects are B's, through a link.
    let borrowed = a_root.join("borrowed");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&victim)
        .arg(&borrowed)
        .status()?;
    anyhow::ensure!(status.success(), "cp -a failed");
    std::fs::remove_dir_all(borrowed.join(".git/objects"))?;
    std::os::unix::fs::symlink(victim.join(".git/objects"), borrowed.join(".git/objects"))?;
    let (code, said) = submit(&stack, dir, &borrowed, &member_a)?;
    assert_ne!(code, 0, "an `objects/` link was followed: run {said}");
    assert!(said.contains("symbolic link"), "{said}");

    // B's own run on its own repository passes, and reads what it should.
    let (code, run) = submit(&stack, dir, &victim, &member_b)?;
    assert_eq!(code, 0, "team b cannot open its own repository: {run}");
    let status = stack_status(&stack, &run, &member_b).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    Ok(())
}

/// The run's status as the holder of `token` sees it, once it ended.
async fn stack_status(stack: &Stack, run: &str, token: &str) -> anyhow::Result<serde_json::Value> {
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let status: serde_json::Value = http
            .get(format!("{}/v1/runs/{run}", stack.server))
            .header("Authorization", format!("Bearer {token}"))
            .send()
            .await?
            .json()
            .await?;
        let s = status["status"].as_str().unwrap_or_default();
        let ended = matches!(s, "succeeded" | "failed" | "cancelled");
        if ended || std::time::Instant::now() > deadline {
            return Ok(status);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
