//! Item 11: the open API (`--open-api`, local use: no tokens) driven by a web page its
//! developer opens. The page can send a cross-site "simple" request (a `text/plain` body, no
//! preflight), or reach the API under a name of its own that resolves to 127.0.0.1 (DNS
//! rebinding). Each is refused; the CLI's own requests still pass; and the open API will not
//! listen beyond loopback unless told to.

use fleet_tests::stack::{base_env, fleet_bin, unique_namespace, workspace_root, Stack};
use fleet_tests::submit::git_repo;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const GRAPH: &str = "name: page\nstart: work\nnodes:\n  work:\n    kind: command\n    \
    commands: [\"cat secret.txt\"]\n    image: fleet-agent-py:1\n    \
    worktree: {from: base, mode: ro}\n    routes: [{to: done}]\n  done: {kind: exit, status: work.ok}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_page_cannot_drive_the_open_api() -> anyhow::Result<()> {
    let stack = Stack::start("tenopen", 0, &[]).await?;
    let repo = git_repo(
        stack.dir.path(),
        "developer",
        &[("secret.txt", "the developer's\n")],
    )?;
    let bundle = shared::graph::load_bundle("graph.yaml", GRAPH, |p| Err(p.to_string()))
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let submission = |n: u32| json!({"graph": bundle, "input": {"n": n}, "repo": repo});
    let http = reqwest::Client::new();
    let runs = format!("{}/v1/runs", stack.server);
    let host = stack.server.trim_start_matches("http://").to_string();
    let send = |req: reqwest::RequestBuilder| async move {
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        anyhow::Ok((status, body))
    };

    // A cross-site form post: JSON in a `text/plain` body.
    let plain = http
        .post(&runs)
        .header("content-type", "text/plain")
        .header("origin", "https://evil.example")
        .body(submission(1).to_string());
    let (status, body) = send(plain).await?;
    assert_eq!(status, 403, "a page's text/plain submission: {body}");
    let plain = http
        .post(&runs)
        .header("content-type", "text/plain;charset=UTF-8")
        .body(submission(2).to_string());
    let (status, body) = send(plain).await?;
    assert_eq!(status, 415, "a text/plain submission: {body}");
    // JSON from another origin, or another site by the browser's own word.
    let foreign = http
        .post(&runs)
        .header("origin", "https://evil.example")
        .json(&submission(3));
    let (status, body) = send(foreign).await?;
    assert_eq!(status, 403, "{body}");
    let fetched = http
        .post(&runs)
        .header("sec-fetch-site", "cross-site")
        .json(&submission(4));
    let (status, body) = send(fetched).await?;
    assert_eq!(status, 403, "{body}");
    // A name of the page's own that resolves to 127.0.0.1 (DNS rebinding): reads refused too.
    let port = host.rsplit(':').next().unwrap_or_default();
    let rebound = http
        .get(&runs)
        .header("host", format!("rebind.evil.example:{port}"));
    let (status, body) = send(rebound).await?;
    assert_eq!(status, 403, "{body}");
    let pack = http
        .post(format!(
            "{}/v1/uploads?commit={}",
            stack.server,
            "a".repeat(40)
        ))
        .header("content-type", "text/plain")
        .body("PACK");
    let (status, body) = send(pack).await?;
    assert_eq!(status, 415, "{body}");
    let (_, listed) = send(http.get(&runs)).await?;
    assert_eq!(
        listed.as_array().map(Vec::len),
        Some(0),
        "no run was made: {listed}"
    );

    // The CLI's way, and the dashboard's (its own origin), still pass.
    let (status, body) = send(http.post(&runs).json(&submission(5))).await?;
    assert_eq!(status, 201, "{body}");
    let own = http
        .post(&runs)
        .header("origin", stack.server.as_str())
        .json(&submission(6));
    let (status, body) = send(own).await?;
    assert_eq!(status, 201, "{body}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_api_listens_on_loopback_only_unless_told() -> anyhow::Result<()> {
    let ns = unique_namespace("tenbind");
    let mut env = base_env(&ns);
    env.push(("FLEET_OPEN_API".into(), "1".into()));
    let mut child = std::process::Command::new(fleet_bin())
        .args(["coordinator", "--listen", "0.0.0.0:0"])
        .envs(env)
        .current_dir(workspace_root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let status = status.ok_or_else(|| anyhow::anyhow!("the open API served on 0.0.0.0"))?;
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut err)?;
    }
    assert!(!status.success());
    assert!(err.contains("loopback"), "{err}");
    Ok(())
}
