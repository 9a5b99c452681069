//! The factory loop (seed 002) on the real stack: coordinator and two workers as processes,
//! RabbitMQ, Redis, S3 (moto) and Docker.

use fleet_tests::stack::{example, make_calc_repo, Stack};
use serde_json::Value;
use shared::factory::RunSummary;
use std::time::Duration;

const RUN_TIMEOUT: Duration = Duration::from_secs(120);

fn submit_args<'a>(repo: &'a str, wo: &'a str, script: &'a str) -> Vec<&'a str> {
    vec![
        "submit",
        "--repo",
        repo,
        "--work-order",
        wo,
        "--script",
        script,
    ]
}

async fn submit(stack: &Stack, script: &str) -> anyhow::Result<(String, String)> {
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let wo = example("factory-calc/work_order.json");
    let script = example(&format!("factory-calc/{script}"));
    let out = stack.cli(&submit_args(&repo, &wo, &script))?;
    assert_eq!(out.code, 0, "submit failed: {}", out.stderr);
    Ok((out.stdout.trim().to_string(), repo))
}

async fn summary(stack: &Stack, run: &str) -> anyhow::Result<(Value, RunSummary)> {
    let raw = stack
        .artifact_json(&format!("runs/{run}/run_summary.json"))
        .await?;
    let typed: RunSummary = serde_json::from_value(raw.clone())?;
    Ok((raw, typed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correct_patch_passes_with_a_complete_summary_and_artifacts() -> anyhow::Result<()> {
    let stack = Stack::start("pass", 2, &[]).await?;
    let (run, repo) = submit(&stack, "script-pass.json").await?;
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "succeeded", "{status}");

    let (raw, s) = summary(&stack, &run).await?;
    for field in [
        "run_id",
        "repo_path",
        "work_order_path",
        "work_order_hash",
        "repo_baseline_commit",
        "repo_tree_hash_before",
        "repo_tree_hash_after",
        "max_attempts",
        "attempts",
        "verdict",
        "ended_stage",
        "started_utc",
        "ended_utc",
    ] {
        assert!(raw.get(field).is_some(), "run_summary.json lacks {field}");
    }
    assert_eq!(s.run_id, run);
    assert_eq!(s.verdict, "PASS");
    assert_eq!(s.ended_stage, "success");
    assert_eq!(s.repo_path, repo);
    assert_eq!(s.max_attempts, 2);
    assert_eq!(s.attempts.len(), 1);
    assert_ne!(
        s.repo_tree_hash_before, s.repo_tree_hash_after,
        "the patch changed the tree"
    );
    let a = &s.attempts[0];
    assert!(a.apply_ok);
    assert_eq!(a.touched_files, vec!["calc.py"]);
    assert_eq!(a.baseline_commit, s.repo_baseline_commit);
    assert_eq!(a.verify[0].command, vec!["bash", "scripts/verify.sh"]);
    assert_eq!(a.verify[0].exit_code, 0);
    assert_eq!(a.acceptance.len(), 2);
    assert!(
        a.acceptance[0].stdout_trunc.contains("2 passed"),
        "{:?}",
        a.acceptance[0]
    );
    assert!(a.failure_brief.is_none());

    // Artifacts at their documented keys, full logs included.
    let keys: Vec<String> =
        serde_json::from_value(stack.get(&format!("/v1/runs/{run}/artifacts")).await?)?;
    for k in [
        "attempt_1/proposed_patch.diff",
        "attempt_1/apply_result.json",
        "attempt_1/verify_result.json",
        "attempt_1/acceptance_result.json",
        "attempt_1/logs/verify_0.stdout",
        "attempt_1/logs/acceptance_0.stdout",
        "attempt_1/se/prompt.md",
        "run_summary.json",
        "result.json",
        "state.json",
    ] {
        let key = format!("runs/{run}/{k}");
        assert!(keys.contains(&key), "missing artifact {key}; have {keys:?}");
    }
    let patch = stack
        .get_text(&format!("/v1/artifacts/{}", a.patch_path))
        .await?;
    assert!(patch.contains("+    return a * b"));
    let log = stack
        .get_text(&format!("/v1/artifacts/{}", a.acceptance[0].stdout_path))
        .await?;
    assert!(log.contains("2 passed"));

    // The tr job committed on one worker; po read that commit from object storage.
    let jobs = status["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 3);

    // Same inputs, same run id: the submission is idempotent.
    let again = stack.cli(&submit_args(
        &repo,
        &example("factory-calc/work_order.json"),
        &example("factory-calc/script-pass.json"),
    ))?;
    assert_eq!(again.stdout.trim(), run);
    assert!(again.stderr.contains("same inputs"), "{}", again.stderr);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_violation_feeds_its_brief_into_the_next_attempt() -> anyhow::Result<()> {
    let stack = Stack::start("scope", 2, &[]).await?;
    let (run, _) = submit(&stack, "script-scope-then-pass.json").await?;
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let (_, s) = summary(&stack, &run).await?;
    assert_eq!(s.verdict, "PASS");
    assert_eq!(s.attempts.len(), 2);
    let first = s.attempts[0]
        .failure_brief
        .as_ref()
        .expect("attempt 1 failed");
    assert_eq!(serde_json::to_value(first.stage)?, "patch_scope_violation");
    assert!(first.primary_error_excerpt.contains("tests/test_calc.py"));
    assert_eq!(
        s.attempts[0].touched_files,
        vec!["calc.py", "tests/test_calc.py"]
    );
    assert!(!s.attempts[0].apply_ok);
    assert!(s.attempts[1].failure_brief.is_none());

    let prompt2 = stack
        .get_text(&format!("/v1/artifacts/runs/{run}/attempt_2/se/prompt.md"))
        .await?;
    assert!(
        prompt2.contains("stage: patch_scope_violation"),
        "{prompt2}"
    );
    assert!(prompt2.contains("outside allowed_files: tests/test_calc.py"));
    let prompt1 = stack
        .get_text(&format!("/v1/artifacts/runs/{run}/attempt_1/se/prompt.md"))
        .await?;
    assert!(!prompt1.contains("previous attempt failed"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_patch_on_every_attempt_fails_after_max_attempts() -> anyhow::Result<()> {
    let stack = Stack::start("fail", 2, &[]).await?;
    let (run, _) = submit(&stack, "script-always-fail.json").await?;
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "failed", "{status}");
    let (_, s) = summary(&stack, &run).await?;
    assert_eq!(s.verdict, "FAIL");
    assert_eq!(s.ended_stage, "verify_failed");
    assert_eq!(s.attempts.len(), 2);
    for a in &s.attempts {
        let b = a.failure_brief.as_ref().expect("each attempt failed");
        assert_eq!(b.command.as_deref(), Some("bash scripts/verify.sh"));
        assert_eq!(b.exit_code, Some(1));
        assert!(
            b.primary_error_excerpt.contains("assert"),
            "{}",
            b.primary_error_excerpt
        );
        assert!(b.primary_error_excerpt.len() <= 2000);
        assert!(
            a.acceptance.is_empty(),
            "acceptance does not run after a failed verify"
        );
    }
    assert_eq!(
        s.repo_tree_hash_after, s.repo_tree_hash_before,
        "failed attempts leave the baseline"
    );
    let visits = &status["visits"];
    assert_eq!(visits["se"], 2);
    assert_eq!(visits["po"], 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_work_orders_and_graphs_are_refused_and_nothing_is_enqueued() -> anyhow::Result<()>
{
    let stack = Stack::start("invalid", 1, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let script = example("factory-calc/script-pass.json");

    let mut wo: Value = serde_json::from_str(&std::fs::read_to_string(example(
        "factory-calc/work_order.json",
    ))?)?;
    wo["allowed_files"] = serde_json::json!(["../outside.py"]);
    let bad_wo = stack.dir.path().join("bad_wo.json");
    std::fs::write(&bad_wo, serde_json::to_vec(&wo)?)?;
    let out = stack.cli(&submit_args(&repo, &bad_wo.display().to_string(), &script))?;
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("allowed_files[0]") && out.stderr.contains("escapes"),
        "{}",
        out.stderr
    );

    let mut wo2: Value = serde_json::from_str(&std::fs::read_to_string(example(
        "factory-calc/work_order.json",
    ))?)?;
    wo2["acceptance_commands"] = serde_json::json!([]);
    std::fs::write(&bad_wo, serde_json::to_vec(&wo2)?)?;
    let out = stack.cli(&submit_args(&repo, &bad_wo.display().to_string(), &script))?;
    assert!(
        out.stderr.contains("acceptance_commands") && out.stderr.contains("must not be empty"),
        "{}",
        out.stderr
    );

    // A graph with a route to a node that does not exist.
    let graph_dir = stack.dir.path().join("badgraph");
    std::fs::create_dir_all(&graph_dir)?;
    std::fs::write(
        graph_dir.join("graph.yaml"),
        "name: bad\nstart: a\nnodes:\n  a:\n    kind: command\n    commands: ['true']\n    routes:\n      - to: nowhere\n  done:\n    kind: exit\n    status: a.ok\n",
    )?;
    std::fs::write(graph_dir.join("input.json"), "{}")?;
    let graph = graph_dir.join("graph.yaml").display().to_string();
    let input = graph_dir.join("input.json").display().to_string();
    let out = stack.cli(&[
        "submit", "--graph", &graph, "--repo", &repo, "--input", &input, "--script", &script,
    ])?;
    assert_ne!(out.code, 0);
    assert!(
        out.stderr
            .contains("node `a`: field `routes`: route to unknown node `nowhere`"),
        "{}",
        out.stderr
    );

    // The server refuses a bad graph even from a client that skipped the local check.
    let bundle = serde_json::json!({
        "source": "raw.yaml",
        "graph": {"name": "raw", "start": "missing", "nodes": {"done": {"kind": "exit", "status": "true"}}},
        "files": {}
    });
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/runs", stack.server))
        .json(&serde_json::json!({"graph": bundle, "input": {}, "repo": repo}))
        .send()
        .await?;
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await?;
    assert!(
        body["details"][0]
            .as_str()
            .unwrap_or("")
            .contains("field `start`: unknown node `missing`"),
        "{body}"
    );

    // A dirty product repo fails the clean-tree preflight.
    std::fs::write(format!("{repo}/stray.txt"), "x")?;
    let out = stack.cli(&submit_args(
        &repo,
        &example("factory-calc/work_order.json"),
        &script,
    ))?;
    assert!(
        out.stderr.contains("preflight") && out.stderr.contains("not clean"),
        "{}",
        out.stderr
    );

    // Nothing was created or published.
    assert_eq!(stack.get("/v1/runs").await?, serde_json::json!([]));
    let metrics = stack.get_text("/metrics").await?;
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("fleet_jobs_published_total") && !l.ends_with(" 0")),
        "{metrics}"
    );
    let client = redis::Client::open(fleet_tests::stack::REDIS_URL)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:*", stack.ns))
        .query_async(&mut conn)
        .await?;
    assert!(
        keys.iter()
            .all(|k| !k.contains(":run:") && !k.ends_with(":outbox")),
        "{keys:?}"
    );
    Ok(())
}
