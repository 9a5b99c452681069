//! A verifier that invents its evidence, on the real stack: a scripted verifier in
//! `fleet-agent-web:1` takes one real screenshot in headless Chromium and cites it (its answer
//! stands), then one that also cites a screenshot it never took (its answer is invalid: the
//! node's `evidence:` check against the screenshots the job kept, so the pass never counts).

use fleet_tests::fake_llm::{FakeLlm, ScriptedReply};
use fleet_tests::stack::{workspace_root, Stack};
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

/// Seed 004's independent verifier (`verifier:`) over the LLM wire format: the harness starts
/// the page, the verifier has the browser only and runs on its own model; an answer whose
/// steps are the feature's, each with a screenshot it took, stands; one that passes on an
/// invented step and no screenshot is void.
const VERIFIER_GRAPH: &str = r#"
name: verifier
start: verify
nodes:
  verify:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    tools: [browser]
    image: fleet-agent-web:1
    worktree: {from: base, mode: ro}
    verifier:
      setup: "nohup python3 -m http.server 8332 --bind 127.0.0.1 >/tmp/http.log 2>&1 & for i in $(seq 50); do python3 -c 'import urllib.request; urllib.request.urlopen(\"http://127.0.0.1:8332/\")' 2>/dev/null && echo up && exit 0; sleep 0.1; done; exit 1"
      steps: params.steps
      model: params.model
    with: {steps: input.steps, model: input.model}
    routes: [{to: done}]
  done: {kind: exit, status: verify.ok}
"#;

const STEPS: [&str; 2] = [
    "Step 1: Navigate to http://127.0.0.1:8332/",
    "Step 2: Verify the heading reads 'To-do'",
];

fn answer(steps: Value) -> Value {
    json!({"test_passes": true, "steps": steps, "overall_reasoning": "ok",
           "failure_reason": null})
}

fn step(n: usize, text: &str, shot: Option<&str>) -> Value {
    json!({"step_number": n, "step_text": text, "result": "pass", "screenshot": shot,
           "observation": "seen", "reasoning": "as written"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verifier_passes_only_on_the_features_steps_each_shown_on_its_own_model(
) -> anyhow::Result<()> {
    let llm = FakeLlm::start(vec![
        // Honest: both steps done in the browser, a screenshot after each.
        ScriptedReply::tool_use(
            "browser",
            json!({"url": "http://127.0.0.1:8332/", "actions": [
                {"screenshot": "step_1"}, {"text": "h1"}, {"screenshot": "step_2"}]}),
        ),
        ScriptedReply::tool_use(
            "submit",
            answer(json!([
                step(1, STEPS[0], Some("step_1")),
                step(2, STEPS[1], Some("step_2"))
            ])),
        ),
        // Lying: a pass on its word, one invented step, nothing shown.
        ScriptedReply::tool_use("submit", answer(json!([step(1, "it works", None)]))),
    ])
    .await?;
    let stack = Stack::start(
        "verifier",
        1,
        &[
            ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
            ("ANTHROPIC_API_KEY", "k"),
        ],
    )
    .await?;
    let repo = git_repo(
        stack.dir.path(),
        "page",
        &[(
            "index.html",
            "<!doctype html><title>t</title><h1>To-do</h1>\n",
        )],
    )?;
    let dir = stack.dir.path().join("verifier");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("graph.yaml"), VERIFIER_GRAPH)?;
    std::fs::write(dir.join("prompt.md"), "Verify {{ params.steps }}.\n")?;
    let schema = std::fs::read_to_string(
        workspace_root().join("graphs/hardened-coder/schemas/verification.json"),
    )?;
    std::fs::write(dir.join("schema.json"), schema)?;
    let path = |f: &str| dir.join(f).display().to_string();
    let (mut ends, mut runs) = (Vec::new(), Vec::new());
    for n in 0..2 {
        // Two submissions of their own (the same input would be the same run).
        let input = json!({"steps": STEPS, "model": "claude-haiku-4-5", "n": n});
        std::fs::write(dir.join("input.json"), input.to_string())?;
        let out = stack.cli(&[
            "submit",
            "--graph",
            &path("graph.yaml"),
            "--repo",
            &repo.display().to_string(),
            "--input",
            &path("input.json"),
            "--llm-api",
            "anthropic",
            "--llm-model",
            "claude-sonnet-4-5",
        ])?;
        anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
        let run = out.stdout.trim().to_string();
        ends.push(stack.wait_run(&run, Duration::from_secs(240)).await?);
        runs.push(run);
    }
    let (honest, lying) = (&ends[0], &ends[1]);
    assert_eq!(honest["status"], "succeeded", "{honest}");
    assert_eq!(lying["status"], "failed", "{lying}");
    let job = &lying["jobs"][0];
    assert_eq!(job["status"], "output_invalid", "{job}");
    let error = job["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(
            "step 1: `it works` is not the feature's step `Step 1: Navigate to http://127.0.0.1:8332/`"
        ),
        "{error}"
    );
    // Every call went out on the verifier's model, with the browser as its only tool.
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3, "{reqs:?}");
    for r in &reqs {
        assert_eq!(r.body["model"], "claude-haiku-4-5", "{}", r.body);
        let tools: Vec<&str> = r.body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert_eq!(tools, ["browser", "submit"], "{}", r.body);
    }
    // The harness started the page: its setup's output is the job's.
    let setup = stack
        .node_artifact_text(&runs[0], "verify", 1, "logs/setup.stdout")
        .await?;
    assert_eq!(setup.trim(), "up");
    Ok(())
}
