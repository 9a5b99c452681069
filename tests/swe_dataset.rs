//! SWE-bench-style datasets on the real stack. `scripts/build-swe-dataset.sh` builds a dataset
//! from toolz's published sdist (a git mirror, four injected bugs each as its own base commit,
//! gold patches, test patches, FAIL_TO_PASS and PASS_TO_PASS); a batch over it with scripted
//! agents — the gold patch, a wrong one, one out of scope, one that edits a file of the test
//! patch — gives every item its expected verdict and ended stage. A wrong patch fails exactly
//! the instance's FAIL_TO_PASS tests while every PASS_TO_PASS test passes, and the gold patch
//! passes them all, so the dataset's lists hold on the real package. Items whose mirror, base
//! commit or test patch is missing are errors of the item, never verdicts; a batch of
//! SWE-bench lines without a mirror directory, or with a malformed line, is refused.

use fleet_tests::stack::{workspace_root, Stack};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Builds the dataset into `out`; the sdist is cached under `target/` so reruns stay offline.
fn build_dataset(out: &Path) -> anyhow::Result<PathBuf> {
    let root = workspace_root();
    let cache = root.join("target/swe-cache");
    let started = Instant::now();
    let run = std::process::Command::new(root.join("scripts/build-swe-dataset.sh"))
        .arg(out)
        .arg("--cache")
        .arg(&cache)
        .output()?;
    anyhow::ensure!(
        run.status.success(),
        "build-swe-dataset.sh failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    eprintln!(
        "dataset built in {:.1}s: {}",
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&run.stdout).trim()
    );
    Ok(out.to_path_buf())
}

fn lines(path: &Path) -> anyhow::Result<Vec<Value>> {
    std::fs::read_to_string(path)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

fn write_lines(path: &Path, items: &[Value]) -> anyhow::Result<()> {
    let text: Vec<String> = items.iter().map(Value::to_string).collect();
    std::fs::write(path, text.join("\n") + "\n")?;
    Ok(())
}

/// The named tests of a run's PO, from its `tests_result.json`: node id → outcome.
async fn outcomes(stack: &Stack, run: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let judged = stack
        .node_artifact_json(run, "po", 1, "tests_result.json")
        .await?;
    Ok(serde_json::from_value(judged["outcomes"].clone())?)
}

fn strings(v: &Value) -> Vec<String> {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_the_real_package_dataset_gives_every_item_its_expected_verdict(
) -> anyhow::Result<()> {
    let stack = Stack::start("swe", 2, &[]).await?;
    let out = build_dataset(&stack.dir.path().join("swe"))?;
    let mirrors = out.join("mirrors").display().to_string();
    let expected: BTreeMap<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(out.join("expected.json"))?)?;
    let mut items = lines(&out.join("scripted.jsonl"))?;
    assert_eq!(items.len(), 16, "4 instances × 4 agents");

    // Three items that cannot become verdicts: their mirror, commit or test patch is missing.
    let gold = items
        .iter()
        .find(|i| i["instance_id"] == "pypi__toolz-1.gold")
        .cloned()
        .expect("the first instance's gold item");
    let mut no_mirror = gold.clone();
    no_mirror["instance_id"] = json!("pypi__toolz-1.nomirror");
    no_mirror["repo"] = json!("pypi/not-mirrored");
    let mut no_commit = gold.clone();
    no_commit["instance_id"] = json!("pypi__toolz-1.nocommit");
    no_commit["base_commit"] = json!("0".repeat(40));
    let mut bad_tests = gold.clone();
    bad_tests["instance_id"] = json!("pypi__toolz-1.badtestpatch");
    bad_tests["test_patch"] = json!(
        "diff --git a/toolz/tests/test_itertoolz.py b/toolz/tests/test_itertoolz.py\n\
         --- a/toolz/tests/test_itertoolz.py\n+++ b/toolz/tests/test_itertoolz.py\n\
         @@ -1,2 +1,3 @@\n not a line of this file\n nor this one\n+import pytest\n"
    );
    items.extend([no_mirror, no_commit, bad_tests]);
    let data = stack.dir.path().join("batch.jsonl");
    write_lines(&data, &items)?;
    let data_arg = data.display().to_string();

    // Without a mirror directory the batch is refused, naming what is missing.
    let refused = stack.cli(&["batch", "submit", &data_arg, "--max-attempts", "1"])?;
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("--mirror-dir"),
        "{}",
        refused.stderr
    );
    // A malformed SWE-bench line is refused naming its line and field.
    let mut broken = items[..2].to_vec();
    broken[1]["FAIL_TO_PASS"] = json!("[\"test_accumulate (tests.Case)\"]");
    let broken_path = stack.dir.path().join("broken.jsonl");
    write_lines(&broken_path, &broken)?;
    let refused = stack.cli(&[
        "batch",
        "submit",
        &broken_path.display().to_string(),
        "--mirror-dir",
        &mirrors,
    ])?;
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("line 2") && refused.stderr.contains("FAIL_TO_PASS[0]"),
        "{}",
        refused.stderr
    );
    assert_eq!(stack.get("/v1/batches").await?, json!([]), "nothing made");

    let started = Instant::now();
    let submitted = stack.cli(&[
        "batch",
        "submit",
        &data_arg,
        "--mirror-dir",
        &mirrors,
        "--max-attempts",
        "1",
        "--max-running",
        "4",
        "--max-infra-retries",
        "0",
    ])?;
    anyhow::ensure!(submitted.code == 0, "submit: {}", submitted.stderr);
    let id = submitted.stdout.trim().to_string();
    let v = stack.wait_batch(&id, Duration::from_secs(600)).await?;
    eprintln!(
        "batch of {} items finished in {:.1}s",
        items.len(),
        started.elapsed().as_secs_f64()
    );
    let c = &v["counts"];
    assert_eq!(
        (
            c["total"].as_u64(),
            c["passed"].as_u64(),
            c["failed"].as_u64(),
            c["errored"].as_u64()
        ),
        (Some(19), Some(4), Some(12), Some(3)),
        "{v}"
    );

    let report = stack.get(&format!("/v1/batches/{id}/report")).await?;
    let item = |id: &str| -> Value {
        report["items"]
            .as_array()
            .and_then(|a| a.iter().find(|i| i["item_id"] == id))
            .cloned()
            .unwrap_or(Value::Null)
    };
    for (name, want) in &expected {
        let got = item(name);
        assert_eq!(got["verdict"], want["verdict"], "{name}: {got}");
        assert_eq!(got["ended_stage"], want["ended_stage"], "{name}: {got}");
        let run = got["run_id"].as_str().unwrap_or_default().to_string();
        let (f2p, p2p) = (
            strings(&want["fail_to_pass"]),
            strings(&want["pass_to_pass"]),
        );
        if name.ends_with(".gold") {
            // Every named test ran and passed.
            let seen = outcomes(&stack, &run).await?;
            assert_eq!(seen.len(), f2p.len() + p2p.len(), "{name}: {seen:?}");
            assert!(seen.values().all(|o| o == "passed"), "{name}: {seen:?}");
            let summary = stack
                .artifact_json(&format!("runs/{run}/run_summary.json"))
                .await?;
            let command = &summary["attempts"][0]["acceptance"][0]["command"];
            assert!(command.to_string().contains("pytest"), "{name}: {summary}");
            // The agent is told the problem, never the hidden tests or their patch.
            let prompt = stack.node_artifact_text(&run, "se", 1, "prompt.md").await?;
            assert!(prompt.contains("## Acceptance (run by the harness after your patch)"));
            for t in f2p.iter().chain(&p2p) {
                let test_name = t.rsplit("::").next().unwrap_or_default();
                let test_name = test_name.split('[').next().unwrap_or_default();
                assert!(
                    !prompt.contains(test_name),
                    "{name}: {test_name} in {prompt}"
                );
            }
        } else if name.ends_with(".wrong") {
            // Exactly the FAIL_TO_PASS tests fail; every PASS_TO_PASS test passes.
            let seen = outcomes(&stack, &run).await?;
            for t in &f2p {
                assert_eq!(
                    seen.get(t).map(String::as_str),
                    Some("failed"),
                    "{name}: {t}"
                );
            }
            for t in &p2p {
                assert_eq!(
                    seen.get(t).map(String::as_str),
                    Some("passed"),
                    "{name}: {t}"
                );
            }
        } else if name.ends_with(".testfile") {
            // The agent's edit of a test-patch file is refused by the scope, naming the file.
            let brief = stack
                .node_artifact_json(&run, "tr", 1, "failure_brief.json")
                .await?;
            let test_file = f2p[0].split("::").next().unwrap_or_default();
            assert!(
                brief["primary_error_excerpt"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(test_file),
                "{name}: {brief}"
            );
        }
    }
    // The errors are the items', with their reason, never verdicts.
    for (name, why) in [
        ("pypi__toolz-1.nomirror", "no mirror of `pypi/not-mirrored`"),
        ("pypi__toolz-1.nocommit", "0000000000"),
        (
            "pypi__toolz-1.badtestpatch",
            "the test patch does not apply",
        ),
    ] {
        let got = item(name);
        assert_eq!(got["state"], "errored", "{name}: {got}");
        assert!(got["verdict"].is_null(), "{name}: {got}");
        let errors = got.to_string();
        assert!(errors.contains(why), "{name}: {got}");
    }
    // A rerun of the errored items keeps what they are: read from the same mirror directory.
    let rerun = stack.cli(&["batch", "rerun", &id, "--errored"])?;
    anyhow::ensure!(rerun.code == 0, "rerun: {}", rerun.stderr);
    let again = rerun.stdout.trim().to_string();
    let v = stack.wait_batch(&again, Duration::from_secs(300)).await?;
    assert_eq!(
        (
            v["counts"]["total"].as_u64(),
            v["counts"]["errored"].as_u64()
        ),
        (Some(3), Some(3)),
        "{v}"
    );
    let report = stack.get(&format!("/v1/batches/{again}/report")).await?;
    let nomirror = report["items"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["item_id"] == "pypi__toolz-1.nomirror"))
        .cloned()
        .unwrap_or(Value::Null);
    assert!(
        nomirror
            .to_string()
            .contains("no mirror of `pypi/not-mirrored`"),
        "{nomirror}"
    );
    Ok(())
}
