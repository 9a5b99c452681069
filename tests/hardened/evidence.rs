//! A verifier that invents its evidence, on the real stack: a scripted verifier in
//! `fleet-agent-web:1` takes one real screenshot in headless Chromium and cites it (its answer
//! stands), then one that also cites a screenshot it never took (its answer is invalid: the
//! node's `evidence:` check against the screenshots the job kept, so the pass never counts).

use fleet_tests::stack::Stack;
use fleet_tests::submit::git_repo;
use serde_json::{json, Value};
use std::time::Duration;

const GRAPH: &str = r#"
name: evidence
start: verify
nodes:
  verify:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    tools: [run_command, browser]
    image: fleet-agent-web:1
    worktree: {from: base, mode: ro}
    evidence: "output.shots"
    routes: [{to: done}]
  done: {kind: exit, status: verify.ok}
"#;

fn script(cited: &[&str]) -> Value {
    json!({"verify": [{
        "commands": ["nohup python3 -m http.server 8331 --bind 127.0.0.1 >/tmp/http.log 2>&1 & \
            for i in $(seq 50); do python3 -c 'import urllib.request; \
            urllib.request.urlopen(\"http://127.0.0.1:8331/\")' 2>/dev/null && exit 0; \
            sleep 0.1; done; exit 1"],
        "tool_calls": [{"name": "browser", "input": {
            "url": "http://127.0.0.1:8331/index.html",
            "actions": [{"screenshot": "home"}]}}],
        "output": {"verdict": "pass", "shots": cited}
    }]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verifier_cannot_cite_a_screenshot_it_did_not_take() -> anyhow::Result<()> {
    let stack = Stack::start("evidence", 1, &[]).await?;
    let repo = git_repo(
        stack.dir.path(),
        "page",
        &[(
            "index.html",
            "<!doctype html><title>t</title><h1>To-do</h1>\n",
        )],
    )?;
    let dir = stack.dir.path().join("evidence");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("graph.yaml"), GRAPH)?;
    std::fs::write(dir.join("prompt.md"), "Check the page.\n")?;
    std::fs::write(dir.join("schema.json"), r#"{"type": "object"}"#)?;
    std::fs::write(dir.join("input.json"), "{}")?;
    let path = |f: &str| dir.join(f).display().to_string();
    let mut runs = Vec::new();
    for (name, cited) in [
        ("honest", vec!["home"]),
        ("forged", vec!["home", "step_2.png"]),
    ] {
        std::fs::write(dir.join(format!("{name}.json")), script(&cited).to_string())?;
        let out = stack.cli(&[
            "submit",
            "--graph",
            &path("graph.yaml"),
            "--repo",
            &repo.display().to_string(),
            "--input",
            &path("input.json"),
            "--script",
            &path(&format!("{name}.json")),
        ])?;
        anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
        runs.push(out.stdout.trim().to_string());
    }
    let honest = stack.wait_run(&runs[0], Duration::from_secs(180)).await?;
    assert_eq!(honest["status"], "succeeded", "{honest}");
    let forged = stack.wait_run(&runs[1], Duration::from_secs(180)).await?;
    assert_eq!(forged["status"], "failed", "{forged}");
    let job = &forged["jobs"][0];
    assert_eq!(job["status"], "output_invalid", "{job}");
    let error = job["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("cites screenshot `step_2.png` that this job did not take")
            && error.contains("screenshots/1-home.png"),
        "{error}"
    );
    Ok(())
}
