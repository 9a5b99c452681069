//! The web dashboard in a real browser (headless Chromium from Debian, driven over the DevTools
//! protocol by `images/agents/fleet-browser`, run on the host): a member signs in with a token,
//! finds the run in the list, opens it and watches its graph change without a reload (a node
//! running, then the approval waiting), approves from the page, sees the run succeed, opens a
//! node's files. Screenshots of each step are kept in `target/test-output/screenshots/`.

use fleet_tests::browser::output_dir;
use fleet_tests::stack::{Stack, StackConfig};
use serde_json::{json, Value};

const GRAPH: &str = r#"
name: watched
start: slow
nodes:
  slow:
    kind: command
    commands: ["sleep 6", "echo built > out.txt"]
    image: fleet-agent-py:1
    worktree: {from: base, mode: ro}
    routes: [{to: gate}]
  gate:
    kind: approval
    routes: [{to: done}]
  done: {kind: exit, status: slow.ok and gate.ok}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_watches_a_run_live_approves_it_from_the_page_and_sees_it_finish(
) -> anyhow::Result<()> {
    let stack = Stack::start_config(StackConfig {
        tag: "dashboard",
        workers: 1,
        coordinator_env: &[("FLEET_OPEN_API", "0")],
        ..StackConfig::default()
    })
    .await?;
    let admin =
        fleet_tests::stack::token_of(&stack.cli(&["token", "bootstrap", "--team", "web"])?)?;
    let member = fleet_tests::stack::token_of(&stack.cli_env(
        &["token", "create", "--role", "member", "--name", "browser"],
        &[("FLEET_TOKEN", admin.as_str())],
    )?)?;
    // The page itself is public and holds no data.
    let page = reqwest::get(format!("{}/ui", stack.server)).await?;
    assert_eq!(page.status().as_u16(), 200);
    let html = page.text().await?;
    assert!(html.contains("id=\"token\"") && !html.contains(&admin));

    let dir = stack.dir.path().join("watched");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("graph.yaml"), GRAPH)?;
    std::fs::write(dir.join("input.json"), "{}")?;
    let repo = fleet_tests::submit::git_repo(&dir, "repo", &[("a.txt", "a\n")])?;
    let run = fleet_tests::submit::submit_run_as(
        &stack,
        &dir.join("graph.yaml"),
        &repo,
        &dir.join("input.json"),
        &member,
    )?;

    let shots = tempfile::tempdir()?;
    let row = format!("tr[data-run=\"{run}\"]");
    let request = json!({
        "url": format!("{}/ui", stack.server),
        "timeout_seconds": 100,
        "screenshot_dir": shots.path(),
        "actions": [
            {"type": {"selector": "#token", "text": member}},
            {"click": "#login"},
            {"wait_for": row},
            {"screenshot": "dashboard-1-runs"},
            {"click": row},
            {"wait_for": "g[data-node=\"slow\"][data-state=\"running\"]"},
            {"screenshot": "dashboard-2-running"},
            {"wait_for": "g[data-node=\"gate\"][data-state=\"waiting\"]"},
            {"wait_for": "#approve-gate"},
            {"screenshot": "dashboard-3-waiting"},
            {"click": "#approve-gate"},
            {"wait_for": "[data-run-status=\"succeeded\"]"},
            {"wait_for": "g[data-node=\"gate\"][data-state=\"done\"]"},
            {"screenshot": "dashboard-4-succeeded"},
            {"click": "g[data-node=\"slow\"]"},
            // the node's jobs, read with `?node=slow`
            {"wait_for": "#node-detail tbody tr"},
            {"wait_for": "li[data-artifact]"},
            {"click": "li[data-artifact]"},
            {"screenshot": "dashboard-5-node"},
            {"text": "#loads"},
            {"text": "#run-live"}
        ]
    });
    let answer = tokio::task::spawn_blocking(move || fleet_tests::browser::fleet_browser(&request))
        .await??;
    // Screenshots kept whatever happened, for whoever looks into a failure.
    let kept = output_dir().join("screenshots");
    std::fs::create_dir_all(&kept)?;
    for entry in std::fs::read_dir(shots.path())? {
        let entry = entry?;
        std::fs::copy(entry.path(), kept.join(entry.file_name()))?;
    }
    assert_eq!(answer["ok"], true, "{answer:#}");
    let actions = answer["actions"].as_array().cloned().unwrap_or_default();
    let texts: Vec<&str> = actions
        .iter()
        .filter(|a| a["action"] == "text")
        .filter_map(|a| a["text"].as_str())
        .collect();
    // One page load from sign-in to the end: every change came over the live stream.
    assert_eq!(texts.first().map(|t| t.trim()), Some("1"), "{answer:#}");
    assert_eq!(texts.get(1).map(|t| t.trim()), Some("ended"), "{answer:#}");
    let shots_taken = actions
        .iter()
        .filter(|a| a["action"] == "screenshot")
        .count();
    assert_eq!(shots_taken, 5);
    for n in 1..=5 {
        let name = std::fs::read_dir(&kept)?
            .filter_map(Result::ok)
            .find(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("dashboard-{n}-"))
            })
            .ok_or_else(|| anyhow::anyhow!("screenshot {n} not kept"))?;
        let bytes = std::fs::read(name.path())?;
        assert!(
            bytes.starts_with(b"\x89PNG") && bytes.len() > 5_000,
            "screenshot {n}"
        );
    }

    // The page's approval is the run's, made with the member's token.
    let status: Value = reqwest::Client::new()
        .get(format!("{}/v1/runs/{run}", stack.server))
        .bearer_auth(&member)
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    // Recorded as the token's, with what the page said after it.
    let by = status["approvals"]["gate"]["decision"]["by"]
        .as_str()
        .unwrap_or_default();
    assert!(
        by.starts_with("token ") && by.ends_with(": dashboard"),
        "{status}"
    );
    assert_eq!(status["approvals"]["gate"]["decision"]["approved"], true);
    Ok(())
}
