//! The step cache on the real stack: a batch rerun with nothing changed reuses every harness
//! step's kept result (the agent steps run again: graphs cache them only on request), gives the
//! same verdicts, and points only at artifacts in its own runs' folders; a cache whose entries
//! were tampered with is never believed: every step runs again and the verdicts hold. A Docker
//! failure at each point of a step (container gone before its start, before an exec, during one)
//! is never kept: the next run with the same inputs is not served it.

use fleet_tests::stack::{example, make_calc_repo, s3_blobs, Stack};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

fn read_json(path: &str) -> anyhow::Result<Value> {
    Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
}

fn dataset(dir: &Path, repo: &str) -> anyhow::Result<String> {
    let order = read_json(&example("factory-calc/work_order.json"))?;
    let pass = read_json(&example("factory-calc/script-pass.json"))?;
    let fail = read_json(&example("factory-calc/script-acceptance-fail.json"))?;
    let items = [
        json!({"id": "gold1", "repo": repo, "work_order": order, "script": pass}),
        json!({"id": "gold2", "repo": repo, "work_order": order, "script": pass}),
        json!({"id": "wrong", "repo": repo, "work_order": order, "script": fail}),
    ];
    let text: Vec<String> = items.iter().map(|i| i.to_string()).collect();
    let path = dir.join("dataset.jsonl");
    std::fs::write(&path, text.join("\n") + "\n")?;
    Ok(path.display().to_string())
}

/// Item id → (verdict, run id).
fn verdicts(batch: &Value) -> BTreeMap<String, (String, String)> {
    batch["batch"]["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            (
                i["item_id"].as_str().unwrap_or_default().to_string(),
                (
                    i["verdict"].as_str().unwrap_or_default().to_string(),
                    i["run_id"].as_str().unwrap_or_default().to_string(),
                ),
            )
        })
        .collect()
}

/// The run's outcomes: (node, where its result came from, if reused).
async fn outcomes(stack: &Stack, run: &str) -> anyhow::Result<Vec<(String, Value)>> {
    let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
    Ok(logs
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            (
                o["node"].as_str().unwrap_or_default().to_string(),
                o["cached_from"].clone(),
            )
        })
        .collect())
}

async fn rerun_all(stack: &Stack, id: &str) -> anyhow::Result<(String, Value, f64)> {
    let started = Instant::now();
    let out = stack.cli(&["batch", "rerun", id, "--all"])?;
    anyhow::ensure!(out.code == 0, "rerun failed: {}", out.stderr);
    let rerun = out.stdout.trim().to_string();
    let v = stack.wait_batch(&rerun, Duration::from_secs(300)).await?;
    Ok((rerun, v, started.elapsed().as_secs_f64()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_rerun_reuses_every_harness_step_and_a_tampered_cache_is_never_believed(
) -> anyhow::Result<()> {
    let stack = Stack::start("stepcache", 1, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let data = dataset(stack.dir.path(), &repo)?;
    let started = Instant::now();
    let out = stack.cli(&["batch", "submit", &data, "--max-attempts", "1"])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let first_id = out.stdout.trim().to_string();
    let first = stack
        .wait_batch(&first_id, Duration::from_secs(300))
        .await?;
    let first_wall = started.elapsed().as_secs_f64();
    let first_verdicts = verdicts(&first);
    assert_eq!(first_verdicts["gold1"].0, "PASS", "{first}");
    assert_eq!(first_verdicts["wrong"].0, "FAIL", "{first}");
    // Within the first batch, the two gold items are the same step twice: the second may
    // reuse the first's harness steps, never an agent step, and never across different inputs
    // (the wrong item's patch differs, so its steps ran).
    for (item, (_, run)) in &first_verdicts {
        for (node, from) in outcomes(&stack, run).await? {
            if !from.is_null() {
                assert!(
                    item.starts_with("gold") && node != "se",
                    "{item} {node}: {from}"
                );
                assert!(
                    from["run_id"] == first_verdicts["gold1"].1
                        || from["run_id"] == first_verdicts["gold2"].1,
                    "{from}"
                );
            }
        }
    }
    let worker = stack.worker_ids()[0].clone();
    let hits_before = stack
        .worker_metric(
            &worker,
            "fleet_worker_step_cache_total",
            &[("result", "hit")],
        )
        .await?;

    // Nothing changed: every harness step (tr, po) is a hit from a first-batch run of the same
    // inputs; the scripted agent (se) runs again.
    let (second_id, second, second_wall) = rerun_all(&stack, &first_id).await?;
    let second_verdicts = verdicts(&second);
    let mut hits = 0;
    for (item, (verdict, run)) in &second_verdicts {
        assert_eq!(verdict, &first_verdicts[item].0, "{item}: {second}");
        for (node, from) in outcomes(&stack, run).await? {
            match node.as_str() {
                "tr" | "po" => {
                    let same_inputs: Vec<&String> = first_verdicts
                        .iter()
                        .filter(|(i, _)| {
                            *i == item || (i.starts_with("gold") && item.starts_with("gold"))
                        })
                        .map(|(_, (_, r))| r)
                        .collect();
                    assert!(
                        same_inputs.iter().any(|r| from["run_id"] == r.as_str()),
                        "{item} {node}: reused from {from}, not a run of the same inputs"
                    );
                    hits += 1;
                }
                _ => assert!(
                    from.is_null(),
                    "{item}: agent step {node} was reused: {from}"
                ),
            }
        }
    }
    assert_eq!(hits, 6, "tr and po of three items");
    // The batch's report says so, item by item and in all.
    let report = stack
        .get(&format!("/v1/batches/{second_id}/report"))
        .await?;
    assert_eq!(
        report["step_cache"],
        json!({"steps": 9, "hits": 6}),
        "{report}"
    );
    for item in report["items"].as_array().into_iter().flatten() {
        assert_eq!(item["cache_hits"], 2, "{item}");
    }
    // A reused step's artifacts were copied into this run's own execution folder
    // (`artifact_key` checks the folder), with the same content.
    let run2 = &second_verdicts["gold1"].1;
    let a2 = stack
        .node_artifact_json(run2, "po", 1, "acceptance_result.json")
        .await?;
    let (_, from) = outcomes(&stack, run2)
        .await?
        .into_iter()
        .find(|(node, _)| node == "po")
        .expect("po ran");
    let source = from["run_id"].as_str().unwrap_or_default().to_string();
    let a1 = stack
        .node_artifact_json(&source, "po", 1, "acceptance_result.json")
        .await?;
    assert_eq!(a1, a2);
    assert!(stack
        .artifact_key(run2, "po", 1, "acceptance_result.json")
        .await?
        .starts_with(&format!("runs/{run2}/")));
    let hit_metric = stack
        .worker_metric(
            &worker,
            "fleet_worker_step_cache_total",
            &[("result", "hit")],
        )
        .await?;
    assert_eq!(hit_metric - hits_before, 6.0);
    eprintln!(
        "wall time: first run {first_wall:.1} s, unchanged rerun {second_wall:.1} s \
         ({second_id}: 6 of 6 harness steps reused)"
    );

    // Every kept entry is tampered with: garbage, or a well-formed entry for another key.
    let blobs = s3_blobs(&stack.ns);
    let keys = blobs.list("cache/steps/").await?;
    assert!(keys.len() >= 4, "entries kept: {keys:?}");
    for (i, key) in keys.iter().enumerate() {
        if i % 2 == 0 {
            blobs.put(key, b"{not json".to_vec()).await?;
        } else {
            let mut entry: Value = blobs.get_json(key).await?;
            entry["key"] = json!("0".repeat(64));
            entry["status"] = json!("ok");
            blobs.put_json(key, &entry).await?;
        }
    }
    // Every step runs again (a step the batch itself just kept may be reused by its twin item:
    // those entries are new and honest), and the verdicts hold.
    let (_, third, _) = rerun_all(&stack, &second_id).await?;
    let third_verdicts = verdicts(&third);
    let third_runs: Vec<&String> = third_verdicts.values().map(|(_, r)| r).collect();
    for (item, (verdict, run)) in &third_verdicts {
        assert_eq!(verdict, &first_verdicts[item].0, "{item}: {third}");
        for (node, from) in outcomes(&stack, run).await? {
            assert!(
                from.is_null() || third_runs.iter().any(|r| from["run_id"] == r.as_str()),
                "{item}: {node} believed a tampered entry: {from}"
            );
        }
    }
    Ok(())
}

/// One command step the cache may keep (a read-only worktree, a container).
const ONE_COMMAND: &str = r#"
name: one-command
start: first
defaults: {image: "fleet-agent-py:1", timeout_seconds: 60}
nodes:
  first:
    kind: command
    commands: ["sleep 1"]
    worktree: {from: base, mode: ro}
    routes: [{to: done}]
  done: {kind: exit, status: first.ok}
"#;

fn submit_one_command(stack: &Stack, repo: &Path, name: &str) -> anyhow::Result<String> {
    let dir = stack.dir.path().join(name);
    std::fs::create_dir_all(&dir)?;
    let graph = dir.join("graph.yaml");
    std::fs::write(&graph, ONE_COMMAND)?;
    let input = dir.join("input.json");
    std::fs::write(&input, serde_json::to_vec(&json!({"name": name}))?)?;
    let script = dir.join("script.json");
    std::fs::write(&script, "{}")?;
    fleet_tests::submit::submit_with_script(stack, &graph, repo, &input, &script)
}

/// Waits until the worker passed the fault point `point` (`worker::faults`).
async fn reached(dir: &Path, point: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.join(format!("{point}.reached")).exists() {
        anyhow::ensure!(Instant::now() < deadline, "{point} not reached");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Docker fails the step at `point` (its container removed from under it there, as a daemon
/// restart or an OOM kill of the container would); the step cache must never keep what came of
/// it: the run retries the step on a new container and succeeds, and a second run with the same
/// inputs succeeds (a kept failure would be served to it).
async fn a_docker_failure_is_never_kept(point: &str) -> anyhow::Result<()> {
    let faults = tempfile::tempdir()?;
    let dir = faults.path().display().to_string();
    let env = [
        ("FLEET_FAULT_PAUSE", point),
        ("FLEET_FAULT_DIR", dir.as_str()),
    ];
    let stack = Stack::start("dockerfail", 1, &env).await?;
    let repo = make_calc_repo(stack.dir.path())?;
    let first = submit_one_command(&stack, &repo, "broken")?;
    reached(faults.path(), point).await?;
    let label = format!("label=fleet.job={first}.first.1");
    let listed = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter", &label])
        .output()?;
    let ids: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    anyhow::ensure!(!ids.is_empty(), "no container of {first} at {point}");
    let removed = std::process::Command::new("docker")
        .args(["rm", "-f"])
        .args(&ids)
        .output()?;
    anyhow::ensure!(removed.status.success(), "docker rm -f: {removed:?}");
    std::fs::write(faults.path().join(format!("{point}.resume")), b"")?;
    let broken = stack.wait_run(&first, Duration::from_secs(120)).await?;

    let second = submit_one_command(&stack, &repo, "clean")?;
    let clean = stack.wait_run(&second, Duration::from_secs(120)).await?;
    let reused = outcomes(&stack, &second).await?;
    assert_eq!(
        clean["status"], "succeeded",
        "{point}: the second run got {clean}; its outcomes {reused:?}"
    );
    assert_eq!(
        broken["status"], "succeeded",
        "{point}: an infrastructure failure is retried, not a verdict: {broken}"
    );
    // What the second run was served, if anything, is the retry's result (execution 2 on), never
    // the first execution's, which Docker broke.
    for (node, from) in &reused {
        let execution = from["execution"].as_str().unwrap_or_default();
        assert!(
            !execution.starts_with("e1-"),
            "{point}: {node} was served the broken execution's result: {from}"
        );
    }
    println!("{point}: the second run's outcomes {reused:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_gone_before_its_start_is_never_kept() -> anyhow::Result<()> {
    a_docker_failure_is_never_kept("docker.after_create").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_gone_before_an_exec_is_never_kept() -> anyhow::Result<()> {
    a_docker_failure_is_never_kept("docker.before_exec").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_gone_during_an_exec_is_never_kept() -> anyhow::Result<()> {
    a_docker_failure_is_never_kept("docker.in_exec").await
}
