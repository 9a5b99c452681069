//! Seed 001's V3 tree (`graphs/v3-tree`) on the real stack with its scripted example
//! (`examples/v3-tree`): a three-module spec whose Scaffold spawns two children, one of which
//! spawns its own; TDD's tests must fail on each skeleton and pass on each implementation (the
//! harness runs them); a sibling's MergeComplete starts a Rebaser in the sibling still
//! running; a child that asks for a retry five times is Stuck, and its parent's approval of it
//! does not take it (the harness decides); each Impl attempt is shown the last one's failing
//! tests, the review's critique and its last strategy; a child whose work passes its own
//! tests but misses its criteria is rejected by the parent;
//! siblings that collide fail their rebase and send the parent back to its Scaffold; a sibling
//! that renames an interface makes the other adapt, mechanically, after its rebase.

use fleet_tests::stack::{workspace_root, Stack};
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

/// Runs the example with `script`; the root's status and every run of its tree by module.
async fn run(stack: &Stack, script: &str) -> anyhow::Result<(Value, Vec<(String, Value)>)> {
    let root = workspace_root();
    let repo = stack.dir.path().join(format!("repo-{script}"));
    let made = Command::new(root.join("examples/v3-tree/make-repo.sh"))
        .arg(&repo)
        .output()?;
    anyhow::ensure!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let example = |f: &str| root.join("examples/v3-tree").join(f).display().to_string();
    let out = stack.cli(&[
        "submit",
        "--graph",
        &root.join("graphs/v3-tree/graph.yaml").display().to_string(),
        "--repo",
        &repo.display().to_string(),
        "--input",
        &example("input.json"),
        "--script",
        &example(&format!("script-{script}.json")),
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let id = out.stdout.trim().to_string();
    let status = stack.wait_run(&id, Duration::from_secs(400)).await?;
    // Every run of the tree, named by the module its parent's spawn gave it.
    let mut runs = Vec::new();
    let mut todo = vec![(id, "calc".to_string())];
    while let Some((run, module)) = todo.pop() {
        let mut st = stack.get(&format!("/v1/runs/{run}")).await?;
        let result = stack.get(&format!("/v1/runs/{run}/result")).await?;
        st["result"] = result["result"].clone();
        for c in st["result"]["outputs"]["children"]["output"]["children"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let (child, name) = (c["run_id"].as_str(), c["item"]["id"].as_str());
            if let (Some(child), Some(name)) = (child, name) {
                todo.push((child.to_string(), name.to_string()));
            }
        }
        // A re-planned spawn's earlier children are listed by the run, not its last outcome.
        for c in st["children"].as_array().into_iter().flatten() {
            let child = c["run_id"].as_str().unwrap_or_default();
            if !todo.iter().any(|(r, _)| r == child)
                && !runs
                    .iter()
                    .any(|(_, s): &(String, Value)| s["run_id"] == child)
            {
                todo.push((child.to_string(), String::from("earlier plan")));
            }
        }
        runs.push((module, st));
    }
    Ok((status, runs))
}

fn of<'a>(runs: &'a [(String, Value)], module: &str) -> Vec<&'a Value> {
    runs.iter()
        .filter(|(m, _)| m == module)
        .map(|(_, s)| s)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_modules_merge_up_the_tree_and_a_siblings_merge_rebases_the_other(
) -> anyhow::Result<()> {
    let stack = Stack::start("v3happy", 2, &[]).await?;
    let (status, runs) = run(&stack, "happy").await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let modules: Vec<&str> = runs.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(runs.len(), 4, "{modules:?}");
    for m in ["calc", "adder", "multiplier", "incr"] {
        let r = of(&runs, m);
        assert_eq!(r.len(), 1, "{m}: {modules:?}");
        assert_eq!(r[0]["status"], "succeeded", "{m}");
        // The harness ran the module's tests: red on the skeleton, green on the implementation.
        let out = &r[0]["result"]["outputs"];
        assert_eq!(
            out["tests_red"]["output"]["counts"]["failed"], 2,
            "{m}: {out}"
        );
        assert_eq!(out["verify"]["output"]["counts"]["passed"], 2, "{m}: {out}");
    }
    assert_eq!(of(&runs, "incr")[0]["tree"]["depth"], 2);
    // The root's contract suite ran every module's tests on its merge.
    let contract = &of(&runs, "calc")[0]["result"]["outputs"]["contract"]["output"];
    assert_eq!(contract["counts"]["passed"], 8, "{contract}");
    // `adder` waits for its own child, so `multiplier` merges first: its MergeComplete reached
    // `adder` while it ran, and `adder` rebased onto it.
    let rebased: u64 = ["adder", "multiplier"]
        .iter()
        .map(|m| of(&runs, m)[0]["visits"]["rebase"].as_u64().unwrap_or(0))
        .sum();
    assert!(rebased >= 1, "no sibling rebased");
    // Whether the other still imports: RebaseClean, no adaptation.
    for m in ["adder", "multiplier"] {
        assert_eq!(of(&runs, m)[0]["visits"].get("adapt"), None, "{m}");
    }

    // `multiplier` renames the interface its parent planned (`times` to `mul`); `adder`
    // imports `times` and is still running: its rebase is clean but it no longer imports, so
    // it adapts, and the harness finds the adaptation mechanical (RebaseAdapted).
    let (status, runs) = run(&stack, "adapted").await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let adder = of(&runs, "adder")[0];
    let outputs = &adder["result"]["outputs"];
    assert_eq!(outputs["rebase_build"]["ok"], false, "{outputs}");
    assert_eq!(
        outputs["mechanical"]["output"]["mechanical"], true,
        "{outputs}"
    );
    let allowed = outputs["mechanical"]["output"]["allowed"].to_string();
    assert!(
        allowed.contains("times") && allowed.contains("mul"),
        "{allowed}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_child_a_child_missing_its_criteria_and_colliding_siblings_are_judged_by_the_parent(
) -> anyhow::Result<()> {
    let stack = Stack::start("v3judge", 2, &[]).await?;

    // Five RequestRetry: the sixth entry is Stuck; the parent's judge approves the stuck child,
    // and the harness does not take it. Each retry's prompt names the strategy before it.
    let (status, runs) = run(&stack, "stuck").await?;
    assert_eq!(status["status"], "failed", "{status}");
    let mult = of(&runs, "multiplier")[0];
    assert_eq!(mult["visits"]["impl"], 5, "{mult}");
    assert_eq!(mult["result"]["exit"], "stuck", "{mult}");
    let calc = of(&runs, "calc")[0];
    assert_eq!(calc["result"]["exit"], "child_rejected", "{calc}");
    let child = mult["run_id"].as_str().unwrap_or_default();
    let fifth = stack
        .node_artifact_text(child, "impl", 5, "prompt.md")
        .await?;
    assert!(
        fifth.contains("The strategy your last retry named: attempt 4"),
        "{fifth}"
    );

    // The child's wrong implementation passes its own tests; the parent rejects it.
    let (status, runs) = run(&stack, "rejected").await?;
    assert_eq!(status["status"], "failed", "{status}");
    let mult = of(&runs, "multiplier")[0];
    assert_eq!(mult["status"], "succeeded", "{mult}");
    assert_eq!(of(&runs, "calc")[0]["result"]["exit"], "child_rejected");
    // Its first claim failed the harness's run: the next attempt was shown the failing tests;
    // the review sent the second back: the third was shown the critique.
    assert_eq!(mult["visits"]["impl"], 3, "{mult}");
    let child = mult["run_id"].as_str().unwrap_or_default();
    let second = stack
        .node_artifact_text(child, "impl", 2, "prompt.md")
        .await?;
    assert!(
        second.contains("these failed")
            && second.contains("test_mul")
            && second.contains("test_zero"),
        "{second}"
    );
    let third = stack
        .node_artifact_text(child, "impl", 3, "prompt.md")
        .await?;
    assert!(
        third.contains(
            "The review sent your last attempt back: mul special-cases a == 0: compute it"
        ),
        "{third}"
    );
    assert!(!third.contains("these failed"), "{third}");

    // Both children write `ops.py`: the one merging second conflicts on its rebase, the
    // parent re-plans once, and then escalates.
    let (status, runs) = run(&stack, "conflict").await?;
    assert_eq!(status["status"], "failed", "{status}");
    let calc = of(&runs, "calc")[0];
    assert_eq!(calc["result"]["exit"], "escalated", "{calc}");
    assert_eq!(calc["visits"]["scaffold"], 2, "{calc}");
    let conflicts = runs
        .iter()
        .filter(|(_, s)| s["result"]["exit"] == "rebase_conflict")
        .count();
    assert_eq!(conflicts, 2, "one per plan");
    Ok(())
}
