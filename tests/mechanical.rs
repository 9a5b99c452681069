//! Seed 001's Rebaser restriction on the real stack: `check_mechanical` judges an adaptation by
//! the edits the sibling's change made, on the diffs git computes from commits the worker
//! materialized. The honest adaptation repeats the sibling's rename; every cheat an adapter
//! that wants the green light might try instead is refused, naming the edit.

use fleet_tests::stack::{make_calc_repo, workspace_root, Stack};
use serde_json::{json, Value};
use std::time::Duration;

async fn adapt(stack: &Stack, tag: &str, edit: &str) -> anyhow::Result<(Value, Value)> {
    let graph = workspace_root().join("examples/child-runs/mechanical.yaml");
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let input = stack.dir.path().join(format!("{tag}.json"));
    std::fs::write(&input, serde_json::to_vec(&json!({ "edit": edit }))?)?;
    let none = workspace_root().join("examples/child-runs/no-agents.json");
    let out = stack.cli(&[
        "submit",
        "--graph",
        &graph.display().to_string(),
        "--repo",
        &repo,
        "--input",
        &input.display().to_string(),
        "--script",
        &none.display().to_string(),
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let run = out.stdout.trim().to_string();
    let status = stack.wait_run(&run, Duration::from_secs(120)).await?;
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?;
    Ok((status, result["result"]["outputs"]["check"].clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_siblings_own_edits_pass_as_a_mechanical_adaptation() -> anyhow::Result<()> {
    let stack = Stack::start("mechanical", 2, &[]).await?;
    let (status, check) = adapt(&stack, "honest", ".replace('foo', 'bar')").await?;
    assert_eq!(status["status"], "succeeded", "{check}");
    assert_eq!(check["output"]["mechanical"], true, "{check}");
    assert_eq!(check["output"]["violations"], json!([]));

    for (tag, edit, made_up) in [
        (
            "assert",
            ".replace('foo', 'bar').replace('assert bar(2) == 2', 'pass')",
            json!(["pass"]),
        ),
        (
            "logic",
            ".replace('foo', 'bar').replace('bar(1)', 'bar(1) + 1')",
            json!(["+", "1"]),
        ),
        (
            "extra",
            ".replace('foo', 'bar') + 'import os'",
            json!(["import", "os"]),
        ),
    ] {
        let (status, check) = adapt(&stack, tag, edit).await?;
        assert_eq!(status["status"], "failed", "{tag}: {check}");
        assert_eq!(check["output"]["mechanical"], false, "{tag}: {check}");
        let violations = check["output"]["violations"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            violations
                .iter()
                .any(|v| v["edit"]["added"] == made_up && v["file"] == "use.py"),
            "{tag}: {check}"
        );
    }
    Ok(())
}
