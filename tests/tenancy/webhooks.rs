//! Items 7 and 8: webhooks. A member names webhooks the coordinator POSTs to from inside the
//! fleet's network: loopback, private, link-local and metadata addresses are refused (the
//! operator allow-lists what its receivers need; here nothing), and the delivery log says only
//! coarse outcomes. Each team's notices are signed with its own key and say whose they are,
//! so team A cannot make the coordinator send team B's receiver a notice B's key verifies.

use super::kit::call;
use fleet_tests::stack::{token_of, Stack, StackConfig};
use fleet_tests::submit::git_repo;
use fleet_tests::webhook::{fake_webhook, header, Received};
use serde_json::{json, Value};
use std::time::Duration;

const SECRET: &str = "fleet-master-webhook-secret";

/// An admin and a member token of a new team.
fn tokens(stack: &Stack, team: &str) -> anyhow::Result<(String, String)> {
    let admin = token_of(&stack.cli(&["token", "bootstrap", "--team", team])?)?;
    let member = token_of(&stack.cli_env(
        &["token", "create", "--role", "member"],
        &[("FLEET_TOKEN", admin.as_str())],
    )?)?;
    Ok((admin, member))
}

/// `fleet submit` of a one-command graph as `token`, the run naming `webhook` (its input
/// names it too, so each webhook makes a run of its own); its id.
fn submit(stack: &Stack, token: &str, webhook: &str) -> anyhow::Result<(i32, String)> {
    let dir = stack.dir.path().join("hooked");
    std::fs::create_dir_all(&dir)?;
    let graph = "name: hooked\nstart: work\nnodes:\n  work:\n    kind: command\n    \
        commands: [\"true\"]\n    image: fleet-agent-py:1\n    worktree: {from: base, mode: ro}\n    \
        routes: [{to: done}]\n  done: {kind: exit, status: work.ok}\n";
    std::fs::write(dir.join("graph.yaml"), graph)?;
    std::fs::write(dir.join("input.json"), json!({"hook": webhook}).to_string())?;
    std::fs::write(dir.join("script.json"), "{}")?;
    let repo = match dir.join("repo").exists() {
        true => dir.join("repo"),
        false => git_repo(&dir, "repo", &[("a.txt", "a\n")])?,
    };
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
            "--script",
            &p("script.json"),
            "--webhook",
            webhook,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_aim_a_webhook_inside_the_fleets_network() -> anyhow::Result<()> {
    let received: Received = Default::default();
    let inside = fake_webhook(received.clone(), "/inside").await?;
    let stack = Stack::start_config(StackConfig {
        tag: "tenhookaddr",
        workers: 1,
        coordinator_env: &[("FLEET_OPEN_API", "0"), ("FLEET_WEBHOOK_ALLOW", "")],
        common_env: &[("FLEET_WEBHOOK_SECRET", SECRET)],
        ..StackConfig::default()
    })
    .await?;
    let (admin, member) = tokens(&stack, "team-a")?;
    let targets = [
        inside.clone(),
        "http://127.0.0.1:6379/".to_string(),
        "http://localhost:5672/".to_string(),
        "http://[::1]:9000/".to_string(),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://10.0.0.1/".to_string(),
        "http://0x7f000001:6379/".to_string(),
    ];
    for url in &targets {
        let (status, body) = call(
            &stack,
            &admin,
            "/v1/team/webhook",
            Some(&json!({"url": url})),
        )
        .await?;
        assert_eq!(status, 400, "the team's webhook took {url}: {body}");
        assert!(body.to_string().contains("address not allowed"), "{body}");
        let (code, said) = submit(&stack, &member, url)?;
        assert_ne!(code, 0, "a run's webhook took {url}: run {said}");
        assert!(said.contains("address not allowed"), "{said}");
    }
    assert!(
        received.lock().unwrap().is_empty(),
        "nothing was POSTed inside"
    );
    Ok(())
}

/// The run's delivery log once its end was delivered or given up.
async fn deliveries(stack: &Stack, token: &str, run: &str) -> anyhow::Result<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (_, log) = call(stack, token, &format!("/v1/runs/{run}/webhooks"), None).await?;
        let settled = log.as_array().is_some_and(|l| {
            l.iter()
                .any(|d| d["event"] == "run.run_finished" && d["state"] != "pending")
        });
        if settled || std::time::Instant::now() > deadline {
            return Ok(log);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teams_notices_are_signed_with_its_own_key_and_say_whose_they_are() -> anyhow::Result<()>
{
    let received: Received = Default::default();
    let b_hook = fake_webhook(received.clone(), "/team-b").await?;
    // A closed port on an allowed address: what the log says of it is coarse.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("http://{}/nobody", l.local_addr()?)
    };
    let stack = Stack::start_config(StackConfig {
        tag: "tenhookkey",
        workers: 1,
        coordinator_env: &[("FLEET_OPEN_API", "0")],
        common_env: &[("FLEET_WEBHOOK_SECRET", SECRET)],
        ..StackConfig::default()
    })
    .await?;
    let (_, member_a) = tokens(&stack, "team-a")?;
    let (admin_b, _) = tokens(&stack, "team-b")?;
    let (status, key_b) = call(&stack, &admin_b, "/v1/team/webhook/secret", None).await?;
    assert_eq!(status, 200, "{key_b}");
    let key_b = key_b["secret"].as_str().unwrap_or_default().to_string();
    assert!(!key_b.is_empty() && key_b != SECRET);

    // Team A's run names team B's receiver: the notice arrives, but B's key does not verify
    // it, and it says it is team A's.
    let (code, run) = submit(&stack, &member_a, &b_hook)?;
    anyhow::ensure!(code == 0, "submit: {run}");
    let log = deliveries(&stack, &member_a, &run).await?;
    let got: Vec<(String, Vec<u8>)> = received
        .lock()
        .unwrap()
        .iter()
        .map(|(h, b, _)| (header(h, "x-fleet-signature").to_string(), b.clone()))
        .collect();
    assert!(!got.is_empty(), "nothing delivered: {log}");
    for (signature, body) in &got {
        assert!(
            !shared::schedule::webhook::verify(key_b.as_bytes(), body, signature),
            "team b's key verifies team a's notice"
        );
        let body: Value = serde_json::from_slice(body)?;
        assert_eq!(body["team"], "team-a", "{body}");
    }

    // A's run at a closed port: the log says `could not connect`, not what the socket said.
    let (code, run) = submit(&stack, &member_a, &closed)?;
    anyhow::ensure!(code == 0, "submit: {run}");
    let log = deliveries(&stack, &member_a, &run).await?;
    let errors: Vec<String> = log
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|d| d["attempts"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a["error"].as_str().map(str::to_string))
        .collect();
    assert!(!errors.is_empty(), "{log}");
    for e in &errors {
        assert_eq!(e, "could not connect", "{log}");
    }
    Ok(())
}
