//! The built-in agent loop against the fake LLM server, a worker killed mid-job, and the
//! embedded mode giving the same verdict as the fleet.

use fleet_tests::fake_llm::{FakeLlm, ScriptedReply};
use fleet_tests::stack::{
    base_env, container_label, containers, example, make_calc_repo, run_cli, wait_for_container,
    Stack,
};
use serde_json::{json, Value};
use shared::factory::RunSummary;
use std::time::{Duration, Instant};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);

fn good_diff() -> String {
    let script: Value = serde_json::from_str(
        &std::fs::read_to_string(example("factory-calc/script-pass.json")).unwrap(),
    )
    .unwrap();
    script["se"][0]["output"]["unified_diff"]
        .as_str()
        .unwrap()
        .to_string()
}

fn tool_results(body: &Value) -> Vec<Value> {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_array())
        .map(|c| {
            c.iter()
                .filter(|b| b["type"] == "tool_result")
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_built_in_agent_reads_in_the_container_and_submits_a_diff() -> anyhow::Result<()> {
    let llm = FakeLlm::start(vec![
        ScriptedReply::error(429),
        ScriptedReply::tool_use("list_dir", json!({"path": "."})).with_usage(1000, 100),
        ScriptedReply::tool_use("read_file", json!({"path": "calc.py"})).with_usage(1200, 80),
        ScriptedReply::tool_use("read_file", json!({"path": "../../etc/passwd"}))
            .with_usage(1300, 50),
        ScriptedReply::tool_use(
            "submit",
            json!({"unified_diff": good_diff(), "summary": "multiply"}),
        )
        .with_usage(1400, 200),
    ])
    .await?;
    let stack = Stack::start(
        "llm",
        2,
        &[
            ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
            ("ANTHROPIC_API_KEY", "test-key"),
            ("FLEET_PRICES", r#"{"claude-haiku-4-5": [3.0, 15.0]}"#),
        ],
    )
    .await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let out = stack.cli(&[
        "submit",
        "--repo",
        &repo,
        "--work-order",
        &example("factory-calc/work_order.json"),
        "--llm-api",
        "anthropic",
        "--llm-model",
        "claude-haiku-4-5",
    ])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let run = out.stdout.trim().to_string();
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "succeeded", "{status}");

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 5, "one 429, then four turns");
    assert_eq!(reqs[0].status, 429);
    assert!(reqs[1..].iter().all(|r| r.status == 200));
    assert_eq!(
        reqs[1].body, reqs[0].body,
        "the 429 was retried with the same request"
    );
    assert_eq!(reqs[1].header("x-api-key"), Some("test-key"));

    // The tool calls ran in the job's container, on the baseline worktree.
    let listing = tool_results(&reqs[2].body);
    let listing = listing[0]["content"].as_str().unwrap_or_default();
    assert!(
        listing.contains("calc.py") && listing.contains("tests"),
        "{listing}"
    );
    assert!(
        !listing.contains(".git"),
        "no git directory is reachable from the container: {listing}"
    );
    let read = tool_results(&reqs[3].body);
    assert!(read[0]["content"]
        .as_str()
        .unwrap_or_default()
        .contains("raise NotImplementedError"));
    let refused = tool_results(&reqs[4].body);
    assert_eq!(refused[0]["is_error"], true);
    assert!(refused[0]["content"]
        .as_str()
        .unwrap_or_default()
        .contains("escapes the worktree"));
    // The prompt carried the context file; the submit tool carried the output schema.
    let prompt = reqs[1].body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(prompt.contains("### calc.py") && prompt.contains("def multiply"));
    let tools: Vec<&str> = reqs[1].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        tools,
        vec!["read_file", "list_dir", "submit"],
        "the SE may read, never run or write"
    );

    // Tokens and cost are recorded.
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?;
    let usage = &result["usage"];
    assert_eq!(usage["llm_calls"], 4);
    assert_eq!(usage["input_tokens"], 1000 + 1200 + 1300 + 1400);
    assert_eq!(usage["output_tokens"], 100 + 80 + 50 + 200);
    let expected = (4900.0 * 3.0 + 430.0 * 15.0) / 1e6;
    assert!(
        (usage["cost_usd"].as_f64().unwrap() - expected).abs() < 1e-9,
        "{usage}"
    );
    assert_eq!(result["result"]["verdict"], "PASS");
    let transcript = stack
        .node_artifact_json(&run, "se", 1, "transcript.json")
        .await?;
    assert_eq!(transcript["api"], "anthropic");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_wire_format_works_too_and_retries_server_errors() -> anyhow::Result<()> {
    let llm = FakeLlm::start(vec![
        ScriptedReply::error(500),
        ScriptedReply::tool_use("read_file", json!({"path": "calc.py"})),
        ScriptedReply::tool_use(
            "submit",
            json!({"unified_diff": good_diff(), "summary": "multiply"}),
        ),
    ])
    .await?;
    let stack = Stack::start(
        "oai",
        1,
        &[
            ("FLEET_OPENAI_BASE_URL", llm.base_url.as_str()),
            ("OPENAI_API_KEY", "sk-test"),
        ],
    )
    .await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let out = stack.cli(&[
        "submit",
        "--repo",
        &repo,
        "--work-order",
        &example("factory-calc/work_order.json"),
        "--llm-api",
        "openai",
        "--llm-model",
        "gpt-4o-mini",
    ])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let run = out.stdout.trim().to_string();
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let reqs = llm.requests();
    assert_eq!(
        reqs.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![500, 200, 200]
    );
    let tool_msg = reqs[2].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(tool_msg["role"], "tool");
    assert!(tool_msg["content"]
        .as_str()
        .unwrap()
        .contains("raise NotImplementedError"));
    let usage = stack.get(&format!("/v1/runs/{run}/result")).await?["usage"].clone();
    assert_eq!(usage["input_tokens"], 200);
    assert!(
        usage["cost_usd"].as_f64().unwrap() > 0.0,
        "gpt-4o-mini is in the default price table"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_job_loses_nothing_and_its_container_is_reaped() -> anyhow::Result<()> {
    let mut stack = Stack::start("kill", 2, &[]).await?;
    let run = stack.submit_slow_factory(4.0)?;

    // Find the worker whose container runs the se job, and kill it.
    let job = format!("{run}.se.1");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (container, victim) = loop {
        if let Some(c) = containers(&format!("fleet.job={job}")).first() {
            if let Some(w) = container_label(c, "fleet.worker") {
                break (c.clone(), w);
            }
        }
        assert!(Instant::now() < deadline, "the se job never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stack.kill_worker(&victim)?;

    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
    let se: Vec<&Value> = logs
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["node"] == "se")
        .collect();
    assert_eq!(se.len(), 1, "exactly one result for the node: {logs}");
    assert_ne!(
        se[0]["worker"].as_str(),
        Some(victim.as_str()),
        "the other worker finished it"
    );
    let jobs: Vec<&Value> = status["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["node"] == "se")
        .collect();
    assert_eq!(jobs.len(), 1);

    // The dead worker's container outlived it; the restarted worker reaps it.
    assert!(containers(&format!("fleet.worker={victim}")).contains(&container));
    stack.start_worker(&victim)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !containers(&format!("fleet.worker={victim}")).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the restarted worker never reaped its orphan"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_mode_gives_the_same_verdict_and_summary_as_the_fleet() -> anyhow::Result<()> {
    let stack = Stack::start("embed", 2, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let wo = example("factory-calc/work_order.json");
    let script = example("factory-calc/script-scope-then-pass.json");
    let out = stack.cli(&[
        "submit",
        "--repo",
        &repo,
        "--work-order",
        &wo,
        "--script",
        &script,
    ])?;
    let run = out.stdout.trim().to_string();
    stack.wait_run(&run, RUN_TIMEOUT).await?;
    let fleet: RunSummary = serde_json::from_value(
        stack
            .artifact_json(&format!("runs/{run}/run_summary.json"))
            .await?,
    )?;

    let out_dir = stack.dir.path().join("embedded-out");
    let out_arg = out_dir.display().to_string();
    let embedded = run_cli(
        &[
            "run",
            "--repo",
            &repo,
            "--work-order",
            &wo,
            "--script",
            &script,
            "--out",
            &out_arg,
        ],
        &base_env("unused"),
    )?;
    assert_eq!(embedded.code, 0, "{}", embedded.stderr);
    assert!(
        embedded.stdout.contains(&format!("run {run}: PASS")),
        "{}",
        embedded.stdout
    );
    let local: RunSummary = serde_json::from_slice(&std::fs::read(
        out_dir.join("runs").join(&run).join("run_summary.json"),
    )?)?;

    assert_eq!(local.run_id, fleet.run_id);
    assert_eq!(local.verdict, fleet.verdict);
    assert_eq!(local.ended_stage, fleet.ended_stage);
    assert_eq!(local.work_order_hash, fleet.work_order_hash);
    assert_eq!(local.repo_baseline_commit, fleet.repo_baseline_commit);
    assert_eq!(local.repo_tree_hash_before, fleet.repo_tree_hash_before);
    assert_eq!(local.repo_tree_hash_after, fleet.repo_tree_hash_after);
    assert_eq!(local.attempts.len(), fleet.attempts.len());
    for (a, b) in local.attempts.iter().zip(&fleet.attempts) {
        assert_eq!(a.touched_files, b.touched_files);
        assert_eq!(a.apply_ok, b.apply_ok);
        // The same key but for the execution's folder (each execution names its own).
        assert_eq!(
            without_execution(&a.patch_path),
            without_execution(&b.patch_path)
        );
        assert!(a.patch_path.contains("/exec-"), "{}", a.patch_path);
        assert_eq!(
            a.failure_brief.as_ref().map(|f| f.stage),
            b.failure_brief.as_ref().map(|f| f.stage)
        );
        let codes = |x: &RunSummary, i: usize| {
            x.attempts[i]
                .acceptance
                .iter()
                .map(|c| c.exit_code)
                .collect::<Vec<_>>()
        };
        let i = (a.attempt_index - 1) as usize;
        assert_eq!(codes(&local, i), codes(&fleet, i));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_run_stops_its_running_container() -> anyhow::Result<()> {
    let stack = Stack::start("cancel", 1, &[]).await?;
    let run = stack.submit_slow_factory(30.0)?;
    let label = format!("fleet.job={run}.se.1");
    wait_for_container(&label).await?;
    let cancelled = stack.cli(&["cancel", &run])?;
    assert_eq!(cancelled.stdout.trim(), "cancelled", "{}", cancelled.stderr);
    // The worker stops the job and removes its container long before the agent's 30 s.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !containers(&label).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the container outlived the cancel"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = stack.get(&format!("/v1/runs/{run}")).await?;
    assert_eq!(status["status"], "cancelled");
    assert_eq!(status["jobs"][0]["state"], "cancelled");
    // The worker ended the job as stopped (an error result nobody waits for any more).
    stack
        .wait_for_metric(
            &stack.worker_ids()[0],
            "fleet_worker_jobs_total",
            &[("status", "error")],
            1.0,
            Duration::from_secs(5),
        )
        .await?;
    Ok(())
}

/// An artifact key without its execution's folder (`.../exec-<tag>/name` → `.../name`).
fn without_execution(key: &str) -> String {
    key.split('/')
        .filter(|seg| !seg.starts_with("exec-"))
        .collect::<Vec<_>>()
        .join("/")
}
