//! A team's daily dollars clamp each call's `max_tokens` like the run's budget does: a call
//! asks for no more output than the team has left, so a budget that runs out mid-call is
//! clamped, not overshot (the fake reports no more output than `max_tokens` allowed, as the
//! providers do).

use super::refusals::CLAUDE;
use fleet_tests::fake_llm::{FakeLlm, ScriptedReply};
use fleet_tests::stack::{token_of, Stack, StackConfig};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const GRAPH: &str = r#"
name: team-spend
start: work
nodes:
  work:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    image: fleet-agent-py:1
    routes: [{to: done}]
  done: {kind: exit, status: work.ok}
"#;

async fn get(stack: &Stack, token: &str, path: &str) -> anyhow::Result<Value> {
    Ok(reqwest::Client::new()
        .get(format!("{}{path}", stack.server))
        .bearer_auth(token)
        .send()
        .await?
        .json()
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_budget_that_runs_out_mid_call_is_clamped_not_overshot() -> anyhow::Result<()> {
    // Each turn would write 1500 tokens: $1.50 at $1 a thousand output tokens.
    let mut replies: Vec<ScriptedReply> = (0..4)
        .map(|_| ScriptedReply::tool_use("list_dir", json!({"path": "."})).with_usage(0, 1500))
        .collect();
    replies.push(ScriptedReply::tool_use("submit", json!({"done": true})));
    let llm = FakeLlm::start(replies).await?;
    let stack = Stack::start_config(StackConfig {
        tag: "provteam",
        workers: 1,
        coordinator_env: &[("FLEET_OPEN_API", "0")],
        worker_env: &[
            ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
            ("ANTHROPIC_API_KEY", "k"),
            ("FLEET_PRICES", r#"{"claude-haiku-4-5": [0.0, 1000.0]}"#),
        ],
        ..StackConfig::default()
    })
    .await?;
    let admin = token_of(&stack.cli(&["token", "bootstrap", "--team", "team-t"])?)?;
    let as_t = [("FLEET_TOKEN", admin.as_str())];
    let out = stack.cli_env(&["team", "limits", "--daily-usd", "2"], &as_t)?;
    anyhow::ensure!(out.code == 0, "limits: {}", out.stderr);

    let dir = stack.dir.path().join("g");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("graph.yaml"), GRAPH)?;
    std::fs::write(dir.join("prompt.md"), "look around, then submit\n")?;
    std::fs::write(dir.join("schema.json"), r#"{"type": "object"}"#)?;
    std::fs::write(dir.join("input.json"), "{}")?;
    let repo = fleet_tests::submit::git_repo(&dir, "repo", &[("a.txt", "a\n")])?;
    let p = |f: &str| dir.join(f).display().to_string();
    let out = stack.cli_env(
        &[
            "submit",
            "--graph",
            &p("graph.yaml"),
            "--repo",
            &repo.display().to_string(),
            "--input",
            &p("input.json"),
            "--llm-api",
            "anthropic",
            "--llm-model",
            CLAUDE,
        ],
        &as_t,
    )?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let run = out.stdout.trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    let done = loop {
        let v = get(&stack, &admin, &format!("/v1/runs/{run}")).await?;
        if !matches!(v["status"].as_str(), Some("running" | "pending")) {
            break v;
        }
        anyhow::ensure!(Instant::now() < deadline, "still running: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let max: Vec<u64> = llm
        .requests()
        .iter()
        .map(|r| r.body["max_tokens"].as_u64().unwrap_or_default())
        .collect();
    let team = get(&stack, &admin, "/v1/team").await?;
    let used = team["used_today"]["usd_micros"]
        .as_u64()
        .unwrap_or(u64::MAX);
    eprintln!("max_tokens of each call: {max:?}; team spent {used} micro-dollars");
    // $2 are 2000 output tokens: the first call asks for at most that, the second for the
    // 500 left after its 1500, and nothing more is sent once the team has nothing left.
    assert_eq!(max, vec![2000, 500], "{done}");
    assert!(used <= 2_000_000, "the team's budget was overshot: {used}");
    assert_eq!(done["status"], "failed", "{done}");
    assert!(done.to_string().contains("budget_exhausted"), "{done}");
    Ok(())
}
