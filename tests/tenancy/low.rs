//! The low items that are one-liners: an approver is who their token says, not who the
//! request says; a fleet worker never runs tenants' jobs as host processes.

use fleet_tests::stack::{base_env, fleet_bin, token_of, unique_namespace, Stack, StackConfig};
use fleet_tests::submit::git_repo;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const GATED: &str =
    "name: gated\nstart: gate\nnodes:\n  gate: {kind: approval, routes: [{to: done}]}\n  \
    done: {kind: exit, status: gate.ok}\n";

async fn post(
    stack: &Stack,
    token: &str,
    path: &str,
    body: &Value,
) -> anyhow::Result<(u16, Value)> {
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", stack.server))
        .bearer_auth(token)
        .json(body)
        .send()
        .await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_is_who_their_token_says() -> anyhow::Result<()> {
    let srv = tempfile::tempdir()?;
    let root = srv.path().canonicalize()?;
    let repo = git_repo(&root, "repo", &[("a.txt", "a\n")])?;
    let roots = root.display().to_string();
    let stack = Stack::start_config(StackConfig {
        tag: "tenby",
        workers: 0,
        coordinator_env: &[("FLEET_OPEN_API", "0"), ("FLEET_REPO_ROOTS", &roots)],
        ..StackConfig::default()
    })
    .await?;
    let admin = token_of(&stack.cli(&["token", "bootstrap", "--team", "team-a"])?)?;
    let member = token_of(&stack.cli_env(
        &["token", "create", "--role", "member", "--name", "mallory"],
        &[("FLEET_TOKEN", admin.as_str())],
    )?)?;
    let bundle = shared::graph::load_bundle("graph.yaml", GATED, |_| Err("no files".into()))
        .map_err(|es| anyhow::anyhow!("{es:?}"))?;
    let body = json!({"graph": bundle, "input": {}, "repo": repo, "git_ref": "HEAD",
        "agent": {"backend": "scripted", "script": {}}});
    let (code, made) = post(&stack, &member, "/v1/runs", &body).await?;
    assert_eq!(code, 201, "{made}");
    let run = made["run_id"].as_str().unwrap_or_default().to_string();

    // The member approves, saying the decision is the team lead's.
    let decision = json!({"approved": true, "by": "the-team-lead", "comment": "ok"});
    let (code, said) = post(
        &stack,
        &member,
        &format!("/v1/runs/{run}/approvals/gate"),
        &decision,
    )
    .await?;
    assert_eq!(code, 200, "{said}");
    let status = stack.wait_run(&run, Duration::from_secs(30)).await;
    let status = match status {
        Ok(s) => s,
        Err(_) => {
            let resp = reqwest::Client::new()
                .get(format!("{}/v1/runs/{run}", stack.server))
                .bearer_auth(&member)
                .send()
                .await?;
            resp.json().await?
        }
    };
    let by = status["approvals"]["gate"]["decision"]["by"]
        .as_str()
        .unwrap_or_default();
    assert!(
        by.starts_with("token "),
        "the decision is recorded as the request said, not as the token says: {by:?}"
    );
    Ok(())
}

#[test]
fn a_fleet_worker_refuses_to_run_jobs_as_host_processes() -> anyhow::Result<()> {
    let ns = unique_namespace("tenlocal");
    let mut child = std::process::Command::new(fleet_bin())
        .args(["worker", "--sandbox", "local-process"])
        .envs(base_env(&ns))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let Some(status) = status else {
        child.kill()?;
        child.wait()?;
        anyhow::bail!("a fleet worker started with `--sandbox local-process` and took jobs");
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("piped"), &mut err)?;
    assert!(!status.success(), "{err}");
    assert!(err.contains("local-process"), "{err}");
    Ok(())
}
