//! Seed 003's types-first graph (`graphs/types-first`) on the real stack with its scripted
//! Python example (`examples/types-first`): the harness renders the skeletons from the types
//! (they build, and every test fails with its specification); the test and impl sessions run in
//! parallel, in increments; the test session's commits reach the impl session as messages while
//! it runs (in its transcript); the impl checkpoint's build failure is fed into its next
//! invocation; the merged code's failing test goes back to the impl session, continued; a
//! session that does not move is stuck; tests that pass on the skeleton are refused; a worker
//! killed mid-loop is resumed from the checkpoint, not from scratch. Seed 003's own example, the
//! Haskell `Data.Stack` with QuickCheck properties, runs the same story in `fleet-agent-hs:1`.

use fleet_tests::stack::{workspace_root, Stack, StackConfig};
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

async fn submit(stack: &Stack, script: &str) -> anyhow::Result<String> {
    submit_with(stack, script, "input.json").await
}

async fn submit_with(stack: &Stack, script: &str, input: &str) -> anyhow::Result<String> {
    let root = workspace_root();
    let repo = stack.dir.path().join(format!("repo-{script}"));
    let made = Command::new(root.join("examples/types-first/make-repo.sh"))
        .arg(&repo)
        .output()?;
    anyhow::ensure!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let example = |f: &str| {
        root.join("examples/types-first")
            .join(f)
            .display()
            .to_string()
    };
    let out = stack.cli(&[
        "submit",
        "--graph",
        &root
            .join("graphs/types-first/graph.yaml")
            .display()
            .to_string(),
        "--repo",
        &repo.display().to_string(),
        "--input",
        &example(input),
        "--script",
        &example(&format!("script-{script}.json")),
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    Ok(out.stdout.trim().to_string())
}

async fn outputs(stack: &Stack, run: &str) -> anyhow::Result<Value> {
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?;
    Ok(result["result"].clone())
}

/// The user turns of a scripted session's transcript, in order.
fn user_turns(transcript: &Value) -> Vec<String> {
    transcript
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["role"] == "user")
        .filter_map(|t| t["content"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_types_first_story_runs_with_crosstalk_checkpoints_and_a_continued_session(
) -> anyhow::Result<()> {
    let stack = Stack::start("typesfirst", 2, &[]).await?;
    let run = submit(&stack, "happy").await?;
    let status = stack.wait_run(&run, Duration::from_secs(300)).await?;
    let result = outputs(&stack, &run).await?;
    assert_eq!(status["status"], "succeeded", "{result}");
    assert_eq!(result["exit"], "done", "{result}");

    // The skeletons came from the templates: the impl's stubs and the tests' specifications.
    let red = stack
        .node_artifact_json(&run, "skeleton_red", 1, "test_report.json")
        .await?;
    assert!(red.to_string().contains("SPEC[push]"), "{red}");
    // One job per session; the impl session's was published at the fork, before the tests
    // said anything, so the message came into it while it ran.
    assert_eq!(status["visits"]["impl_loop"], 1, "{status}");
    let transcript = stack
        .node_artifact_json(&run, "impl_loop", 1, "transcript.json")
        .await?;
    let turns = user_turns(&transcript);
    let heard = turns
        .iter()
        .position(|t| {
            t.contains(
                "[message from `tests_loop`] FYI: the test agent just added test_push, test_pop",
            )
        })
        .unwrap_or_else(|| panic!("no crosstalk in {turns:#?}"));
    let second = turns
        .iter()
        .position(|t| t.contains("Invocation 2."))
        .unwrap_or_else(|| panic!("no second invocation in {turns:#?}"));
    assert!(heard <= second, "{turns:#?}");
    assert_eq!(
        turns.iter().filter(|t| t.contains("invocation 1)")).count(),
        1,
        "each message once: {turns:#?}"
    );
    // The checkpoint's build failure went into the second invocation.
    let prompt = stack
        .node_artifact_text(&run, "impl_loop", 1, "prompts/2.md")
        .await?;
    assert!(prompt.contains("Checkpoint `build` failed"), "{prompt}");
    assert!(prompt.contains("SyntaxError"), "{prompt}");
    let imp = &result["outputs"]["impl_loop"]["output"];
    assert_eq!(imp["status"], "done", "{imp}");
    assert_eq!(imp["invocations"], 2, "{imp}");
    let tests = &result["outputs"]["tests_loop"]["output"];
    assert_eq!(tests["invocations"], 2, "{tests}");
    // The merged code failed test_peek; the impl session itself, continued, mended it.
    assert_eq!(status["visits"]["validate"], 2, "{status}");
    let fix = stack
        .node_artifact_json(&run, "fix", 1, "transcript.json")
        .await?;
    let continued = fix[0]["continued_from"].to_string();
    assert!(continued.contains("Invocation 2."), "{fix}");
    let fix_prompt = stack
        .node_artifact_text(&run, "fix", 1, "prompt.md")
        .await?;
    assert!(fix_prompt.contains("test_peek"), "{fix_prompt}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_does_not_move_is_stuck_and_green_tests_on_the_skeleton_are_refused(
) -> anyhow::Result<()> {
    let stack = Stack::start("typesfirst-bad", 2, &[]).await?;
    let stuck = submit(&stack, "stuck").await?;
    let cheat = submit(&stack, "green-tests").await?;

    let status = stack.wait_run(&stuck, Duration::from_secs(300)).await?;
    let result = outputs(&stack, &stuck).await?;
    assert_eq!(status["status"], "failed", "{result}");
    assert_eq!(result["exit"], "impl_stuck", "{result}");
    let imp = &result["outputs"]["impl_loop"]["output"];
    assert_eq!(imp["status"], "stuck", "{imp}");
    assert_eq!(imp["invocations"], 3, "{imp}");

    let status = stack.wait_run(&cheat, Duration::from_secs(300)).await?;
    let result = outputs(&stack, &cheat).await?;
    assert_eq!(status["status"], "failed", "{result}");
    assert_eq!(result["exit"], "tests_pass_on_skeleton", "{result}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_loop_resumes_the_session_from_its_checkpoint() -> anyhow::Result<()> {
    let faults = tempfile::tempdir()?;
    let fault_dir = faults.path().display().to_string();
    let point = "worker.after_checkpoint";
    let mut stack = Stack::start_config(StackConfig {
        tag: "typesfirst-kill",
        workers: 1,
        concurrency: 2,
        worker_env: &[
            ("FLEET_FAULT_PAUSE", point),
            ("FLEET_FAULT_DIR", &fault_dir),
        ],
        ..StackConfig::default()
    })
    .await?;
    let worker = stack.worker_ids()[0].clone();
    let run = submit(&stack, "happy").await?;
    let reached = faults.path().join(format!("{point}.reached"));
    let deadline = Instant::now() + Duration::from_secs(240);
    while !reached.exists() {
        anyhow::ensure!(Instant::now() < deadline, "{point} not reached");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The test session's first invocation is checkpointed (the impl session's first one is
    // still thinking): the worker dies before it announces anything.
    stack.kill_worker(&worker)?;
    stack.worker_env.clear();
    stack.start_worker(&worker)?;

    let status = stack.wait_run(&run, Duration::from_secs(300)).await?;
    let result = outputs(&stack, &run).await?;
    assert_eq!(status["status"], "succeeded", "{result}");
    let tests = &result["outputs"]["tests_loop"]["output"];
    assert_eq!(tests["resumed_after"], 1, "{tests}");
    assert_eq!(tests["invocations"], 2, "{tests}");
    // Invocation 1 ran once: its prompt is in the resumed session once, and the second
    // invocation continued it.
    let transcript = stack
        .node_artifact_json(&run, "tests_loop", 1, "transcript.json")
        .await?;
    let turns = user_turns(&transcript);
    assert_eq!(
        turns
            .iter()
            .filter(|t| t.contains("You write the tests of"))
            .count(),
        1,
        "{turns:#?}"
    );
    assert!(
        turns.iter().any(|t| t.contains("Invocation 2.")),
        "{turns:#?}"
    );
    // Its crosstalk, announced again by the resumed execution, reached the impl session once.
    let imp = stack
        .node_artifact_json(&run, "impl_loop", 1, "transcript.json")
        .await?;
    let heard: Vec<String> = user_turns(&imp)
        .into_iter()
        .filter(|t| t.contains("(invocation 1)"))
        .collect();
    assert_eq!(heard.len(), 1, "{imp}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_haskell_example_runs_types_first_end_to_end() -> anyhow::Result<()> {
    let stack = Stack::start("typesfirst-hs", 2, &[]).await?;
    let run = submit_with(&stack, "haskell", "input-haskell.json").await?;
    let status = stack.wait_run(&run, Duration::from_secs(600)).await?;
    let result = outputs(&stack, &run).await?;
    assert_eq!(status["status"], "succeeded", "{result}");
    assert_eq!(result["exit"], "done", "{result}");

    // The harness wrote the data declaration from the constructors and a stub per function;
    // every property of the test skeleton failed on it with its specification.
    let red = stack
        .node_artifact_json(&run, "skeleton_red", 1, "test_report.json")
        .await?;
    let text = red.to_string();
    for spec in ["SPEC[push]: puts a value on top", "SPEC[lifo_order]"] {
        assert!(text.contains(spec), "{spec} missing: {red}");
    }
    // The test session's properties reached the impl session while it ran.
    let transcript = stack
        .node_artifact_json(&run, "impl_loop", 1, "transcript.json")
        .await?;
    let turns = user_turns(&transcript);
    assert!(
        turns.iter().any(|t| t.contains(
            "FYI: the test agent just added prop_empty, prop_push, prop_pop (invocation 1)"
        )),
        "{turns:#?}"
    );
    // ghc's type error at the impl checkpoint went into the second invocation.
    let prompt = stack
        .node_artifact_text(&run, "impl_loop", 1, "prompts/2.md")
        .await?;
    assert!(prompt.contains("Checkpoint `build` failed"), "{prompt}");
    assert!(prompt.contains("src/Data/Stack.hs"), "{prompt}");
    // The written properties all failed on the skeleton; on the merged code prop_peek failed,
    // and the continued impl session mended it; the frozen properties then all passed.
    let frozen = &result["outputs"]["tests_red"]["output"]["executed"];
    let props = frozen
        .as_array()
        .into_iter()
        .flatten()
        .filter(|id| id.as_str().is_some_and(|id| id.starts_with("Spec::prop_")))
        .count();
    assert_eq!(props, 8, "{frozen}");
    assert_eq!(status["visits"]["validate"], 2, "{status}");
    let fix_prompt = stack
        .node_artifact_text(&run, "fix", 1, "prompt.md")
        .await?;
    assert!(fix_prompt.contains("`prop_peek`"), "{fix_prompt}");
    assert!(fix_prompt.contains("Falsified"), "{fix_prompt}");
    let green = &result["outputs"]["validate"]["output"];
    assert_eq!(green["passed"], true, "{green}");
    assert_eq!(green["failures"], serde_json::json!([]), "{green}");
    Ok(())
}
