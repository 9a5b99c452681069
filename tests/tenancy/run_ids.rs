//! Item 6: run ids per team. Team A's member chooses run ids: the one team B will choose for
//! its nightly run, and the very id B's run was given back. Neither takes B's id nor tells A
//! whether it exists (the same answer whether it does or not); B's own submissions are made
//! and found under B's ids, and A never reads B's run.

use super::kit::call;
use fleet_tests::stack::{token_of, Stack, StackConfig};
use fleet_tests::submit::git_repo;
use serde_json::{json, Value};

const GRAPH: &str = "name: ids\nstart: work\nnodes:\n  work:\n    kind: command\n    \
    commands: [\"true\"]\n    image: fleet-agent-py:1\n    worktree: {from: base, mode: ro}\n    \
    routes: [{to: done}]\n  done: {kind: exit, status: work.ok}\n";

/// A member token of a new team.
fn member_of(stack: &Stack, team: &str) -> anyhow::Result<String> {
    let admin = token_of(&stack.cli(&["token", "bootstrap", "--team", team])?)?;
    token_of(&stack.cli_env(
        &["token", "create", "--role", "member"],
        &[("FLEET_TOKEN", admin.as_str())],
    )?)
}

/// `POST /v1/runs` of the one-command graph on `repo` under the chosen `run_id`, its input
/// `input` (so two teams' submissions differ in contents).
async fn submit(
    stack: &Stack,
    token: &str,
    repo: &str,
    run_id: &str,
    input: &str,
) -> anyhow::Result<(u16, Value)> {
    let bundle = shared::graph::load_bundle("graph.yaml", GRAPH, |_| Err("no files".into()))
        .map_err(|es| anyhow::anyhow!("{es:?}"))?;
    let body = json!({
        "graph": bundle, "input": {"who": input}, "repo": repo, "git_ref": "HEAD",
        "agent": {"backend": "scripted", "script": {}}, "run_id": run_id,
    });
    call(stack, token, "/v1/runs", Some(&body)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_cannot_take_or_probe_another_teams_run_ids() -> anyhow::Result<()> {
    let srv = tempfile::tempdir()?;
    let root = srv.path().canonicalize()?;
    let repo = git_repo(&root, "repo", &[("a.txt", "a\n")])?;
    let repo = repo.display().to_string();
    let roots = root.display().to_string();
    // No workers: these runs only need to exist.
    let stack = Stack::start_config(StackConfig {
        tag: "tenids",
        workers: 0,
        coordinator_env: &[("FLEET_OPEN_API", "0"), ("FLEET_REPO_ROOTS", &roots)],
        ..StackConfig::default()
    })
    .await?;
    let (a, b) = (member_of(&stack, "team-a")?, member_of(&stack, "team-b")?);

    // A takes the id B's nightly run will ask for, before B does.
    let (code, squat) = submit(&stack, &a, &repo, "nightly-1", "a").await?;
    assert_eq!(code, 201, "{squat}");
    let squat_id = squat["run_id"].as_str().unwrap_or_default().to_string();

    // B's run under that id is made, B's own.
    let (code, mine) = submit(&stack, &b, &repo, "nightly-1", "b").await?;
    assert_eq!(code, 201, "team a's squat blocked team b's run id: {mine}");
    let b_id = mine["run_id"].as_str().unwrap_or_default().to_string();
    assert_ne!(b_id, squat_id, "two teams share one run");
    let (code, run) = call(&stack, &b, &format!("/v1/runs/{b_id}"), None).await?;
    assert_eq!(code, 200, "{run}");
    assert_eq!(run["team"], "team-b", "{run}");

    // A probes with the id B was given, and with one nobody has: the same answer for both,
    // each a run of A's own; A never reads B's run.
    let (code_taken, taken) = submit(&stack, &a, &repo, &b_id, "a").await?;
    let (code_free, free) = submit(&stack, &a, &repo, "never-used-1", "a").await?;
    assert_eq!(
        (code_taken, code_free),
        (201, 201),
        "the answer tells team a which of team b's ids exist: {taken} / {free}"
    );
    assert_ne!(taken["run_id"], json!(b_id), "{taken}");
    let (code, seen) = call(&stack, &a, &format!("/v1/runs/{b_id}"), None).await?;
    assert_eq!(code, 404, "team a reads team b's run: {seen}");

    // The same submission by its own team again returns its run, by the id chosen or given.
    let (code, again) = submit(&stack, &b, &repo, "nightly-1", "b").await?;
    assert_eq!((code, &again["run_id"]), (200, &json!(b_id)), "{again}");
    let (code, again) = submit(&stack, &b, &repo, &b_id, "b").await?;
    assert_eq!((code, &again["run_id"]), (200, &json!(b_id)), "{again}");
    Ok(())
}
