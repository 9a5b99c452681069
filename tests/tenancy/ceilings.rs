//! Items 10 and 2 (outside the gateway): the operator's ceilings. The operator sets ceilings
//! per team and for every other team (`FLEET_TEAM_CEILINGS`); a new team starts at them, and
//! its admin can lower its limits but never raise one above them (nor lift one by leaving it
//! out). Here: a team's runs under way and dollars per day, and the models it may call.

use super::kit::call;
use fleet_tests::stack::{token_of, Stack, StackConfig};
use fleet_tests::submit::git_repo;
use serde_json::{json, Value};

const GRAPH: &str = "name: ceil\nstart: work\nnodes:\n  work:\n    kind: command\n    \
    commands: [\"true\"]\n    image: fleet-agent-py:1\n    worktree: {from: base, mode: ro}\n    \
    routes: [{to: done}]\n  done: {kind: exit, status: work.ok}\n";

const CEILINGS: &str = r#"{"*": {"concurrent_runs": 2, "daily_usd": 5, "models": ["gpt-4o-mini"],
    "schedules": 1, "batch_weight": 2},
    "team-big": {"concurrent_runs": 3, "daily_usd": 50}}"#;

/// `POST /v1/runs` of the one-command graph on `repo`, its input `n`, its agent `agent`.
async fn submit(
    stack: &Stack,
    token: &str,
    repo: &str,
    n: u32,
    agent: Value,
) -> anyhow::Result<(u16, Value)> {
    let bundle = shared::graph::load_bundle("graph.yaml", GRAPH, |_| Err("no files".into()))
        .map_err(|es| anyhow::anyhow!("{es:?}"))?;
    let body = json!({
        "graph": bundle, "input": {"n": n}, "repo": repo, "git_ref": "HEAD", "agent": agent,
    });
    call(stack, token, "/v1/runs", Some(&body)).await
}

fn scripted() -> Value {
    json!({"backend": "scripted", "script": {}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_admin_cannot_raise_the_operators_ceilings() -> anyhow::Result<()> {
    let srv = tempfile::tempdir()?;
    let root = srv.path().canonicalize()?;
    let repo = git_repo(&root, "repo", &[("a.txt", "a\n")])?;
    let repo = repo.display().to_string();
    let roots = root.display().to_string();
    // No workers: runs stay under way.
    let stack = Stack::start_config(StackConfig {
        tag: "tenceil",
        workers: 0,
        coordinator_env: &[
            ("FLEET_OPEN_API", "0"),
            ("FLEET_REPO_ROOTS", &roots),
            ("FLEET_TEAM_CEILINGS", CEILINGS),
        ],
        ..StackConfig::default()
    })
    .await?;
    let admin = token_of(&stack.cli(&["token", "bootstrap", "--team", "team-a"])?)?;
    let member = token_of(&stack.cli_env(
        &["token", "create", "--role", "member"],
        &[("FLEET_TOKEN", admin.as_str())],
    )?)?;

    // A new team starts at the ceilings.
    let (code, view) = call(&stack, &admin, "/v1/team", None).await?;
    assert_eq!(code, 200, "{view}");
    assert_eq!(view["limits"]["concurrent_runs"], 2, "{view}");
    assert_eq!(view["limits"]["daily_usd"], 5.0, "{view}");

    // Its admin raises them: refused, named, nothing changed.
    for raise in [
        json!({"concurrent_runs": 1000, "daily_usd": 1}),
        json!({"daily_usd": 1e9}),
        json!({"models": ["gpt-4o-mini", "o3"]}),
        json!({"schedules": 100, "batch_weight": 1000}),
    ] {
        let (code, said) = call(&stack, &admin, "/v1/team/limits", Some(&raise)).await?;
        assert_eq!(
            code, 403,
            "a team admin raised the operator's ceiling: {raise} → {said}"
        );
        assert!(
            said["error"]
                .as_str()
                .unwrap_or_default()
                .contains("ceiling"),
            "{said}"
        );
    }
    // Leaving a limit out lifts nothing; lowering one is the admin's to do.
    let (code, said) = call(
        &stack,
        &admin,
        "/v1/team/limits",
        Some(&json!({"daily_usd": 1})),
    )
    .await?;
    assert_eq!(code, 200, "{said}");
    let (_, view) = call(&stack, &admin, "/v1/team", None).await?;
    assert_eq!(view["limits"]["daily_usd"], 1.0, "{view}");
    assert_eq!(view["limits"]["concurrent_runs"], 2, "{view}");

    // The ceiling holds for the team's members: a third run under way is refused.
    for n in 0..2 {
        let (code, said) = submit(&stack, &member, &repo, n, scripted()).await?;
        assert_eq!(code, 201, "{said}");
    }
    let (code, said) = submit(&stack, &member, &repo, 2, scripted()).await?;
    assert_eq!(code, 429, "a third run past the ceiling of 2: {said}");

    // A model outside the team's allow-list is refused at submission.
    // (`o3` has a price: the refusal is the allow-list's, not the price table's.)
    let llm = json!({"backend": "openai", "model": "o3"});
    let (code, said) = submit(&stack, &member, &repo, 3, llm).await?;
    assert_eq!(
        code, 400,
        "a model outside the allow-list was accepted: {said}"
    );
    let why = said["error"].as_str().unwrap_or_default();
    assert!(why.contains("`o3`") && why.contains("allow"), "{said}");

    // One team cannot fill the fleet's schedules, nor weigh its batches above the ceiling.
    let item = json!({"id": "one", "repo": repo, "input": {"n": 9}});
    let data = stack.dir.path().join("data.jsonl");
    std::fs::write(&data, format!("{item}\n"))?;
    let data = data.display().to_string();
    let graph = stack.dir.path().join("graph.yaml");
    std::fs::write(&graph, GRAPH)?;
    let graph = graph.display().to_string();
    let as_member = [("FLEET_TOKEN", member.as_str())];
    let schedule = |name: &str| {
        stack.cli_env(
            &[
                "schedule",
                "add",
                name,
                "--cron",
                "0 2 * * *",
                "--dataset",
                &data,
                "--graph",
                &graph,
            ],
            &as_member,
        )
    };
    let first = schedule("first")?;
    assert_eq!(first.code, 0, "{}", first.stderr);
    let second = schedule("second")?;
    assert_ne!(second.code, 0, "a second schedule past the ceiling of 1");
    assert!(second.stderr.contains("(schedules)"), "{}", second.stderr);
    let heavy = stack.cli_env(
        &["batch", "submit", &data, "--graph", &graph, "--weight", "5"],
        &as_member,
    )?;
    assert_ne!(heavy.code, 0, "a batch of weight 5 past the ceiling of 2");
    assert!(heavy.stderr.contains("batch_weight"), "{}", heavy.stderr);

    // A team with its own ceiling starts at it.
    let big = token_of(&stack.cli(&["token", "bootstrap", "--team", "team-big"])?)?;
    let (_, view) = call(&stack, &big, "/v1/team", None).await?;
    assert_eq!(view["limits"]["concurrent_runs"], 3, "{view}");
    assert_eq!(view["limits"]["daily_usd"], 50.0, "{view}");
    Ok(())
}
