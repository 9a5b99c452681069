//! The factory loop (seed 002) on the real stack: coordinator and two workers as processes,
//! RabbitMQ, Redis, S3 (moto) and Docker.

use fleet_tests::stack::{example, make_calc_repo, run_cli, Stack};
use serde_json::{json, Value};
use shared::factory::{FailureBrief, RunSummary, CONSTRAINTS_REMINDER, EXCERPT_CHARS};
use std::path::Path;
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
    submit_script(stack, &example(&format!("factory-calc/{script}"))).await
}

/// Submits the calc example with the scripted agent in the file `script`.
async fn submit_script(stack: &Stack, script: &str) -> anyhow::Result<(String, String)> {
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let wo = example("factory-calc/work_order.json");
    let out = stack.cli(&submit_args(&repo, &wo, script))?;
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

    // Artifacts at their documented keys, full logs included: the run's files at the run's
    // folder, each job's in its accepted execution's folder beneath the attempt's.
    let listing = stack.get(&format!("/v1/runs/{run}/artifacts")).await?;
    let keys: Vec<String> = serde_json::from_value(listing["keys"].clone())?;
    for k in ["run_summary.json", "result.json", "state.json"] {
        let key = format!("runs/{run}/{k}");
        assert!(keys.contains(&key), "missing artifact {key}; have {keys:?}");
    }
    for (node, name) in [
        ("tr", "proposed_patch.diff"),
        ("tr", "apply_result.json"),
        ("po", "verify_result.json"),
        ("po", "acceptance_result.json"),
        ("po", "logs/verify_0.stdout"),
        ("po", "logs/acceptance_0.stdout"),
        ("se", "prompt.md"),
    ] {
        let key = stack.artifact_key(&run, node, 1, name).await?;
        let folder = if node == "se" {
            "attempt_1/se"
        } else {
            "attempt_1"
        };
        assert!(
            key.starts_with(&format!("runs/{run}/{folder}/exec-")) && key.ends_with(name),
            "{node}'s {name} at {key}"
        );
        assert!(keys.contains(&key), "missing artifact {key}; have {keys:?}");
    }
    assert_eq!(
        listing["superseded"],
        serde_json::json!([]),
        "one execution per job"
    );
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

    let prompt2 = stack.node_artifact_text(&run, "se", 2, "prompt.md").await?;
    assert!(
        prompt2.contains("stage: patch_scope_violation"),
        "{prompt2}"
    );
    assert!(
        prompt2.contains("`tests/test_calc.py` (outside the write scope)"),
        "{prompt2}"
    );
    let prompt1 = stack.node_artifact_text(&run, "se", 1, "prompt.md").await?;
    assert!(!prompt1.contains("previous attempt failed"));
    Ok(())
}

/// A patch that reaches an attribute by a name computed at run time (`operator.attrgetter`,
/// the route of a runner-tampering patch) is refused by the policy after it applies, naming
/// file, line, rule and name; the brief goes back to the SE, whose honest second patch passes.
/// The first patch's branch on the tests' input is reported as a suspected special case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_beyond_the_policy_is_refused_with_its_line_and_the_next_attempt_passes(
) -> anyhow::Result<()> {
    let stack = Stack::start("policy", 2, &[]).await?;
    let (run, _) = submit(&stack, "script-policy-then-pass.json").await?;
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let (_, s) = summary(&stack, &run).await?;
    assert_eq!((s.verdict.as_str(), s.attempts.len()), ("PASS", 2));
    let first = s.attempts[0]
        .failure_brief
        .as_ref()
        .expect("attempt 1 failed");
    assert_eq!(serde_json::to_value(first.stage)?, "policy_refused");
    assert!(
        first
            .primary_error_excerpt
            .contains("calc.py:12: name_not_allowed `operator.attrgetter`"),
        "{}",
        first.primary_error_excerpt
    );
    assert_bounded(first);
    let tr1 = stack
        .node_artifact_json(&run, "tr", 1, "apply_result.json")
        .await?;
    assert_eq!(
        tr1["policy_refused"],
        json!([{"path": "calc.py", "name": "operator.attrgetter",
                "rule": "name_not_allowed", "line": 12}]),
        "{tr1}"
    );
    let signals: Vec<(u64, &str, &str)> = tr1["suspected_special_case"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| {
            (
                x["line"].as_u64().unwrap_or(0),
                x["literal"].as_str().unwrap_or(""),
                x["why"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        signals,
        vec![
            (9, "3", "branch"),
            (9, "4", "branch"),
            (10, "12", "return_after_branch")
        ],
        "{tr1}"
    );
    let tr2 = stack
        .node_artifact_json(&run, "tr", 2, "apply_result.json")
        .await?;
    assert_eq!(tr2["suspected_special_case"], json!([]), "{tr2}");
    assert!(tr2["policy_refused"].is_null(), "{tr2}");
    let prompt2 = prompt(&stack, &run, 2).await?;
    assert!(
        prompt2.contains("stage: policy_refused") && prompt2.contains("operator.attrgetter"),
        "{prompt2}"
    );
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

/// The brief every failed attempt records is the harness's bounded one, with the reminder.
fn assert_bounded(b: &FailureBrief) {
    assert!(
        b.primary_error_excerpt.chars().count() <= EXCERPT_CHARS,
        "{} chars",
        b.primary_error_excerpt.chars().count()
    );
    assert!(b.primary_error_excerpt.lines().count() <= 40);
    assert_eq!(b.constraints_reminder, CONSTRAINTS_REMINDER);
}

/// The failure brief as the harness step of `node` (`tr` or `po`) wrote it in attempt `n`.
async fn brief_artifact(
    stack: &Stack,
    run: &str,
    node: &str,
    n: u32,
) -> anyhow::Result<FailureBrief> {
    let raw = stack
        .node_artifact_json(run, node, n, "failure_brief.json")
        .await?;
    Ok(serde_json::from_value(raw)?)
}

async fn prompt(stack: &Stack, run: &str, n: u32) -> anyhow::Result<String> {
    stack.node_artifact_text(run, "se", n, "prompt.md").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_se_output_that_breaks_the_schema_ends_in_llm_output_invalid_with_a_bounded_brief(
) -> anyhow::Result<()> {
    let stack = Stack::start("invalidse", 2, &[]).await?;
    // No diff headers in 300 KB of text: the schema's pattern refuses it, and the schema error
    // quotes the whole value.
    let junk: String = (0..10_000)
        .map(|i| format!("line {i}: this is not a diff\n"))
        .collect();
    let script = json!({"se": [{"output": {"unified_diff": junk, "summary": "no diff"}}]});
    let path = stack.dir.path().join("script-invalid.json");
    std::fs::write(&path, serde_json::to_vec(&script)?)?;
    let (run, _) = submit_script(&stack, &path.display().to_string()).await?;
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "failed", "{status}");
    assert_eq!(status["visits"]["se"], 2);
    assert!(
        status["visits"].get("tr").is_none(),
        "an invalid output never reaches TR: {status}"
    );
    let error = status["jobs"][0]["error"].as_str().unwrap_or_default();
    assert!(
        error.len() > 100_000,
        "the raw error is large: {}",
        error.len()
    );

    let (raw, s) = summary(&stack, &run).await?;
    assert_eq!(s.verdict, "FAIL");
    assert_eq!(s.ended_stage, "llm_output_invalid");
    assert_eq!(raw["ended_stage"], "llm_output_invalid");
    assert_eq!(s.attempts.len(), 2);
    assert_eq!(s.repo_tree_hash_after, s.repo_tree_hash_before);
    for a in &s.attempts {
        let b = a.failure_brief.as_ref().expect("each attempt failed");
        assert_eq!(serde_json::to_value(b.stage)?, "llm_output_invalid");
        assert_eq!((b.command.as_deref(), b.exit_code), (None, None));
        assert_bounded(b);
        assert!(b.primary_error_excerpt.contains("does not match"), "{b:?}");
        assert!(!a.apply_ok);
        assert!(a.touched_files.is_empty() && a.verify.is_empty() && a.acceptance.is_empty());
    }

    // The second attempt's prompt carries the same bounded brief, reminder included, and not
    // the 300 KB of the first answer.
    let p1 = prompt(&stack, &run, 1).await?;
    let p2 = prompt(&stack, &run, 2).await?;
    let end_of_p2 = shared::text::tail(&p2, 40, 4000);
    assert!(p2.contains("stage: llm_output_invalid"), "{end_of_p2}");
    assert!(p2.contains(CONSTRAINTS_REMINDER), "{end_of_p2}");
    let brief = s.attempts[0].failure_brief.as_ref().unwrap();
    assert!(p2.contains(&brief.primary_error_excerpt), "{end_of_p2}");
    assert!(
        p2.len() <= p1.len() + EXCERPT_CHARS + CONSTRAINTS_REMINDER.len() + 300,
        "prompt 2 has {} bytes, prompt 1 {}",
        p2.len(),
        p1.len()
    );
    assert!(!p1.contains("previous attempt failed"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diff_whose_context_does_not_match_ends_in_patch_apply_failed() -> anyhow::Result<()> {
    let stack = Stack::start("applyfail", 2, &[]).await?;
    let (run, _) = submit(&stack, "script-apply-fail.json").await?;
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "failed", "{status}");
    assert_eq!(status["visits"]["tr"], 2);
    assert!(
        status["visits"].get("po").is_none(),
        "nothing to verify: {status}"
    );

    let (_, s) = summary(&stack, &run).await?;
    assert_eq!(s.verdict, "FAIL");
    assert_eq!(s.ended_stage, "patch_apply_failed");
    assert_eq!(s.attempts.len(), 2);
    assert_eq!(s.repo_tree_hash_after, s.repo_tree_hash_before);
    for (i, a) in s.attempts.iter().enumerate() {
        let n = i as u32 + 1;
        // In scope, so the harness tried to apply it; git refused.
        assert_eq!(a.touched_files, vec!["calc.py"]);
        assert!(!a.apply_ok);
        assert!(a.verify.is_empty() && a.acceptance.is_empty());
        assert_eq!(
            a.patch_path,
            stack
                .artifact_key(&run, "tr", n, "proposed_patch.diff")
                .await?
        );
        let b = a.failure_brief.as_ref().expect("each attempt failed");
        assert_eq!(serde_json::to_value(b.stage)?, "patch_apply_failed");
        assert_eq!(b.command.as_deref(), Some("git apply --whitespace=nowarn"));
        assert_eq!(b.exit_code, Some(1));
        assert!(!b.primary_error_excerpt.trim().is_empty());
        assert_bounded(b);
        assert_eq!(&brief_artifact(&stack, &run, "tr", n).await?, b);
        let apply = stack
            .node_artifact_json(&run, "tr", n, "apply_result.json")
            .await?;
        assert_eq!(apply["apply_ok"], false);
        assert_eq!(apply["touched_files"], json!(["calc.py"]));
        assert_eq!(apply["stderr_excerpt"], b.primary_error_excerpt.as_str());
    }

    let p2 = prompt(&stack, &run, 2).await?;
    assert!(p2.contains("stage: patch_apply_failed"), "{p2}");
    assert!(
        p2.contains("command: `git apply --whitespace=nowarn`"),
        "{p2}"
    );
    assert!(p2.contains(CONSTRAINTS_REMINDER), "{p2}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_that_passes_verification_but_not_acceptance_ends_in_acceptance_failed(
) -> anyhow::Result<()> {
    let stack = Stack::start("accfail", 2, &[]).await?;
    let (run, _) = submit(&stack, "script-acceptance-fail.json").await?;
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "failed", "{status}");
    assert_eq!(status["visits"]["po"], 2);

    let wo: Value = serde_json::from_str(&std::fs::read_to_string(example(
        "factory-calc/work_order.json",
    ))?)?;
    let negative = wo["acceptance_commands"][1].as_str().unwrap();

    let (_, s) = summary(&stack, &run).await?;
    assert_eq!(s.verdict, "FAIL");
    assert_eq!(s.ended_stage, "acceptance_failed");
    assert_eq!(s.attempts.len(), 2);
    assert_eq!(
        s.repo_tree_hash_after, s.repo_tree_hash_before,
        "failed attempts leave the baseline"
    );
    for (i, a) in s.attempts.iter().enumerate() {
        let n = i as u32 + 1;
        assert!(a.apply_ok);
        assert_eq!(a.touched_files, vec!["calc.py"]);
        assert_eq!(a.verify.len(), 1);
        assert_eq!(a.verify[0].command, vec!["bash", "scripts/verify.sh"]);
        assert_eq!(a.verify[0].exit_code, 0, "{:?}", a.verify[0]);
        // The first acceptance command passes, the second (negative numbers) fails.
        assert_eq!(a.acceptance.len(), 2);
        assert_eq!(a.acceptance[0].exit_code, 0, "{:?}", a.acceptance[0]);
        assert_eq!(a.acceptance[1].exit_code, 1, "{:?}", a.acceptance[1]);
        let b = a.failure_brief.as_ref().expect("each attempt failed");
        assert_eq!(serde_json::to_value(b.stage)?, "acceptance_failed");
        assert_eq!(b.command.as_deref(), Some(negative));
        assert_eq!(b.exit_code, Some(1));
        assert!(
            b.primary_error_excerpt
                .contains("AssertionError: negative numbers"),
            "{}",
            b.primary_error_excerpt
        );
        assert_bounded(b);
        assert_eq!(&brief_artifact(&stack, &run, "po", n).await?, b);
        let acceptance = stack
            .node_artifact_json(&run, "po", n, "acceptance_result.json")
            .await?;
        assert_eq!(acceptance[1]["exit_code"], 1);
        let log = stack
            .get_text(&format!("/v1/artifacts/{}", a.acceptance[1].stderr_path))
            .await?;
        assert!(log.contains("negative numbers"), "{log}");
    }

    let p2 = prompt(&stack, &run, 2).await?;
    assert!(p2.contains("stage: acceptance_failed"), "{p2}");
    assert!(p2.contains(&format!("command: `{negative}`")), "{p2}");
    assert!(p2.contains("exit code: 1"), "{p2}");
    assert!(p2.contains("negative numbers"), "{p2}");
    assert!(p2.contains(CONSTRAINTS_REMINDER), "{p2}");
    Ok(())
}

fn git_status(repo: &Path) -> anyhow::Result<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["status", "--porcelain", "--ignored"])
        .output()?;
    anyhow::ensure!(out.status.success(), "git status failed");
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn fleet_run_refuses_an_out_dir_inside_the_repository_even_through_a_symlink() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let repo = make_calc_repo(dir.path())?;
    let repo_real = repo.canonicalize()?.display().to_string();
    let run = |out: &Path| {
        run_cli(
            &[
                "run",
                "--repo",
                &repo.display().to_string(),
                "--work-order",
                &example("factory-calc/work_order.json"),
                "--script",
                &example("factory-calc/script-pass.json"),
                "--out",
                &out.display().to_string(),
            ],
            &[],
        )
    };

    // Directly inside, and inside by way of `..` through a directory that does not exist yet.
    for out in [
        repo.join("fleet-out"),
        dir.path().join("new/../calc-repo/out"),
    ] {
        let refused = run(&out)?;
        assert_eq!(refused.code, 2, "{out:?}: {}", refused.stderr);
        assert!(
            refused.stderr.contains("lies inside the repository")
                && refused.stderr.contains(&out.display().to_string())
                && refused.stderr.contains(&format!("`{repo_real}`")),
            "{}",
            refused.stderr
        );
    }

    // Through a symlink to the repository (and to one of its folders).
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&repo, &link)?;
    let sub_link = dir.path().join("tests-link");
    std::os::unix::fs::symlink(repo.join("tests"), &sub_link)?;
    for (out, resolved) in [
        (link.join("out"), format!("{repo_real}/out")),
        (link.clone(), repo_real.clone()),
        (sub_link.join("a/b"), format!("{repo_real}/tests/a/b")),
    ] {
        let refused = run(&out)?;
        assert_eq!(refused.code, 2, "{out:?}: {}", refused.stderr);
        assert!(
            refused.stderr.contains("lies inside the repository")
                && refused.stderr.contains(&out.display().to_string())
                && refused.stderr.contains(&format!("`{resolved}`"))
                && refused.stderr.contains(&format!("`{repo_real}`")),
            "{}",
            refused.stderr
        );
    }
    assert_eq!(
        git_status(&repo)?,
        "",
        "nothing was written into the repository"
    );
    assert!(!repo.join("fleet-out").exists() && !repo.join("out").exists());

    // A sibling whose name merely starts with the repository's is outside: the run goes ahead
    // and writes its summary there.
    let out = dir.path().join("calc-repo-out");
    let ok = run(&out)?;
    assert_eq!(ok.code, 0, "{}\n{}", ok.stdout, ok.stderr);
    assert!(ok.stdout.contains(": PASS"), "{}", ok.stdout);
    let summary_path = ok
        .stdout
        .lines()
        .find(|l| l.ends_with("run_summary.json"))
        .expect("the summary's path is printed");
    assert!(summary_path.starts_with(&out.canonicalize()?.display().to_string()));
    let s: RunSummary = serde_json::from_str(&std::fs::read_to_string(summary_path)?)?;
    assert_eq!(s.verdict, "PASS");
    assert_eq!(git_status(&repo)?, "");
    Ok(())
}

/// A repository that commits `ctx.md -> /proc/self/environ` (and `big.md -> /dev/zero`) and
/// lists them as context files: the harness refuses to read through a link, so no byte of the
/// worker's environment (its API key included) reaches the prompt, the transcript or the LLM,
/// and the run goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_file_that_links_to_the_workers_environment_is_refused() -> anyhow::Result<()> {
    const SECRET: &str = "sk-fleet-canary-3b1f9e";
    let stack = Stack::start("symenv", 1, &[("ANTHROPIC_API_KEY", SECRET)]).await?;
    let repo = make_calc_repo(stack.dir.path())?;
    std::os::unix::fs::symlink("/proc/self/environ", repo.join("ctx.md"))?;
    std::os::unix::fs::symlink("/dev/zero", repo.join("big.md"))?;
    for args in [
        vec!["add", "ctx.md", "big.md"],
        vec![
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "links",
        ],
    ] {
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(&args)
            .status()?
            .success();
        anyhow::ensure!(ok, "git {args:?}");
    }
    let mut wo: Value = serde_json::from_str(&std::fs::read_to_string(example(
        "factory-calc/work_order.json",
    ))?)?;
    wo["context_files"] = json!(["ctx.md", "big.md", "calc.py"]);
    let mut allowed = wo["allowed_files"].as_array().cloned().unwrap_or_default();
    allowed.extend([json!("ctx.md"), json!("big.md")]);
    wo["allowed_files"] = json!(allowed);
    let wo_path = stack.dir.path().join("wo-links.json");
    std::fs::write(&wo_path, serde_json::to_vec(&wo)?)?;
    let repo = repo.display().to_string();
    let out = stack.cli(&submit_args(
        &repo,
        &wo_path.display().to_string(),
        &example("factory-calc/script-pass.json"),
    ))?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let run = out.stdout.trim().to_string();
    let status = stack.wait_run(&run, Duration::from_secs(120)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let prompt = stack.node_artifact_text(&run, "se", 1, "prompt.md").await?;
    assert!(!prompt.contains(SECRET), "the secret reached the prompt");
    assert!(
        !prompt.contains("AWS_SECRET_ACCESS_KEY"),
        "the environment reached the prompt"
    );
    assert!(prompt.contains("`ctx.md` is a symlink"), "{prompt}");
    assert!(prompt.contains("`big.md` is a symlink"), "{prompt}");
    assert!(
        prompt.contains("def add"),
        "regular context files still arrive: {prompt}"
    );
    let transcript = stack
        .node_artifact_text(&run, "se", 1, "transcript.json")
        .await?;
    assert!(!transcript.contains(SECRET));
    Ok(())
}
