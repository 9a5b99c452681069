//! Child runs on the real stack (RabbitMQ, Redis, S3, Docker): a spawn node starts real runs
//! of the same graph, each building on its parent's commit in its own containers; the parent
//! waits for them, squash-merges their work and checks every file of the tree is there; the
//! tree shows in `fleet status --tree` and `fleet graph show --run`; cancelling the root
//! cancels every run below it, down to the jobs in their containers; a tree outlives Redis
//! losing everything mid-way (every run restored from its mirror, each child asked for again).

use fleet_tests::private_redis::PrivateRedis;
use fleet_tests::stack::{make_calc_repo, Stack, StackConfig};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Each run writes `<name>.txt` (and sleeps `sleep` seconds first), starts a child per entry
/// of `plan.children` on top of that commit, squash-merges its own commit and its children's
/// heads onto its base, and checks the files `plan.expect` names are all in the merge.
const TREE: &str = include_str!("../examples/child-runs/tree.yaml");

fn write_graph(stack: &Stack) -> anyhow::Result<String> {
    let dir = stack.dir.path().join("tree");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("graph.yaml"), TREE)?;
    Ok(dir.join("graph.yaml").display().to_string())
}

fn submit(stack: &Stack, graph: &str, plan: Value) -> anyhow::Result<String> {
    let tag = plan["name"].as_str().unwrap_or("x").to_string();
    submit_input(stack, graph, json!({ "plan": plan }), &tag)
}

/// Submits `graph` with `input` (no agent node: an empty script); the run id.
fn submit_input(stack: &Stack, graph: &str, input: Value, tag: &str) -> anyhow::Result<String> {
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let path = stack.dir.path().join(format!("input-{tag}.json"));
    std::fs::write(&path, serde_json::to_vec(&input)?)?;
    let script = stack.dir.path().join("no-agents.json");
    std::fs::write(&script, "{}")?;
    let out = stack.cli(&[
        "submit",
        "--graph",
        graph,
        "--repo",
        &repo,
        "--input",
        &path.display().to_string(),
        "--script",
        &script.display().to_string(),
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    Ok(out.stdout.trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_of_child_runs_builds_on_its_parents_work_and_merges_back_up() -> anyhow::Result<()>
{
    let stack = Stack::start("tree", 2, &[]).await?;
    let graph = write_graph(&stack)?;
    // 1 + 2 + 1: `a` has a child of its own.
    let plan = json!({
        "name": "root",
        "expect": ["root.txt", "a.txt", "a1.txt", "b.txt", "calc.py"],
        "children": [
            {"name": "a", "expect": ["root.txt", "a.txt", "a1.txt"],
             "children": [{"name": "a1", "expect": ["root.txt", "a.txt", "a1.txt"]}]},
            {"name": "b", "expect": ["root.txt", "b.txt"]},
        ],
    });
    let root = submit(&stack, &graph, plan)?;
    let status = stack.wait_run(&root, Duration::from_secs(300)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let children = status["children"]
        .as_array()
        .expect("the root lists its children");
    assert_eq!(children.len(), 2, "{status}");
    assert!(
        children.iter().all(|c| c["status"] == "succeeded"),
        "{status}"
    );

    // Every child is a real run with its own id, linked to its parent and root.
    let a = children[0]["run_id"].as_str().unwrap().to_string();
    let a_status = stack.get(&format!("/v1/runs/{a}")).await?;
    assert_eq!(a_status["tree"]["parent"], root.as_str());
    assert_eq!(a_status["tree"]["depth"], 1);
    let a1 = a_status["children"][0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let a1_status = stack.get(&format!("/v1/runs/{a1}")).await?;
    assert_eq!(
        (
            a1_status["tree"]["root"].as_str(),
            a1_status["tree"]["depth"].as_u64()
        ),
        (Some(root.as_str()), Some(2))
    );
    assert_eq!(a1_status["status"], "succeeded");
    // Its jobs ran in their own containers: it has its own work, merge and check jobs.
    let jobs: Vec<&str> = a1_status["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|j| j["node"].as_str())
        .collect();
    assert_eq!(jobs, ["check", "merge", "work"], "{a1_status}");

    // The tree, from the CLI.
    let out = stack.cli(&["status", &root, "--tree"])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", out.stdout);
    assert!(
        lines[0].starts_with(&format!("{root}  succeeded")),
        "{}",
        out.stdout
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("    {a1}  succeeded  (from kids)"))),
        "{}",
        out.stdout
    );
    // And beside the spawn node in the live chart.
    let out = stack.cli(&["graph", "show", &graph, "--run", &root])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains(&format!("{a} succeeded")),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("kids -.->|child runs| kids__children"),
        "{}",
        out.stdout
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_root_cancels_every_run_below_it() -> anyhow::Result<()> {
    let stack = Stack::start("treecancel", 2, &[]).await?;
    let graph = write_graph(&stack)?;
    // The leaves sleep long; the middle run and the root wait for them.
    let plan = json!({
        "name": "root",
        "children": [
            {"name": "a", "children": [{"name": "a1", "sleep": 120}]},
            {"name": "b", "sleep": 120},
        ],
    });
    let root = submit(&stack, &graph, plan)?;
    // Wait until the grandchild runs its sleeping job.
    let deadline = Instant::now() + Duration::from_secs(120);
    let tree = loop {
        let tree = stack.get(&format!("/v1/runs/{root}/tree")).await?;
        if tree["tree"]["children"][0]["children"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
        {
            break tree;
        }
        anyhow::ensure!(Instant::now() < deadline, "the tree never grew: {tree}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let a1 = tree["tree"]["children"][0]["children"][0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let out = stack.cli(&["cancel", &root])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let started = Instant::now();
    let a1_status = stack.wait_run(&a1, Duration::from_secs(60)).await?;
    assert_eq!(a1_status["status"], "cancelled", "{a1_status}");
    let cascade = started.elapsed();
    let tree = stack.get(&format!("/v1/runs/{root}/tree")).await?;
    let mut statuses = Vec::new();
    collect(&tree["tree"], &mut statuses);
    assert_eq!(statuses.len(), 4, "{tree}");
    assert!(statuses.iter().all(|s| s == "cancelled"), "{tree}");
    // The grandchild's sleeping job was stopped, not left to run its two minutes.
    let work = a1_status["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["node"] == "work")
        .cloned()
        .unwrap_or_default();
    assert_eq!(work["state"], "cancelled", "{a1_status}");
    eprintln!("cascade to depth 2 took {cascade:?}");
    Ok(())
}

fn collect(tree: &Value, out: &mut Vec<String>) {
    out.push(tree["status"].as_str().unwrap_or_default().to_string());
    for c in tree["children"].as_array().into_iter().flatten() {
        collect(c, out);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_survives_redis_losing_everything_while_a_grandchild_runs() -> anyhow::Result<()> {
    let mut redis = PrivateRedis::start()?;
    let url = redis.url();
    let stack = Stack::start_config(StackConfig {
        tag: "treelost",
        workers: 2,
        concurrency: 2,
        common_env: &[("FLEET_REDIS", &url)],
        ..StackConfig::default()
    })
    .await?;
    let graph = write_graph(&stack)?;
    let plan = json!({
        "name": "root",
        "expect": ["root.txt", "a.txt", "a1.txt", "b.txt"],
        "children": [
            {"name": "a", "children": [{"name": "a1", "sleep": 4}]},
            {"name": "b"},
        ],
    });
    let root = submit(&stack, &graph, plan)?;
    // Wait until `b` has reported to the root and `a1` sleeps in its container.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let st = stack.get(&format!("/v1/runs/{root}")).await?;
        let b_done = st["children"][1]["status"] == "succeeded";
        let tree = stack.get(&format!("/v1/runs/{root}/tree")).await?;
        let a1_there = tree["tree"]["children"][0]["children"]
            .as_array()
            .is_some_and(|c| !c.is_empty());
        if b_done && a1_there {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the tree never got there: {st}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // (Not followed by a count of Redis's keys: the coordinators, busy with the tree, write
    // again at once; the restores counted below show what was lost.)
    redis.lose_everything().await?;

    let status = stack.wait_run(&root, Duration::from_secs(180)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    assert_eq!(
        status["visits"]["kids"], 1,
        "the root spawned once: {status}"
    );
    let tree = stack.get(&format!("/v1/runs/{root}/tree")).await?;
    let mut statuses = Vec::new();
    collect(&tree["tree"], &mut statuses);
    assert_eq!(statuses, ["succeeded"; 4], "{tree}");
    // The root, `a` and `a1` were under way: each came back from its mirror.
    let metrics = stack.get_text("/metrics").await?;
    let restored: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("fleet_runs_restored_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(restored >= 3.0, "{metrics}");
    Ok(())
}

/// Siblings that merge while the other still works: each child writes its file, waits
/// `input.sleep` seconds, then its `merge` checks the files `expect` names and broadcasts
/// `merged`; a sibling still running rebases its work onto the merged commit (git, conflicts
/// structured) and merges from there. A rebase that conflicts fails the child.
const SIBLINGS: &str = include_str!("../examples/child-runs/siblings.yaml");

async fn siblings_run(stack: &Stack, children: Value) -> anyhow::Result<(String, Value)> {
    let dir = stack.dir.path().join("siblings");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("graph.yaml"), SIBLINGS)?;
    let graph = dir.join("graph.yaml").display().to_string();
    let tag = format!("siblings-{}", children[0]["text"].as_str().unwrap_or("x"));
    let root = json!({"file": "root.txt", "text": "root", "children": children});
    let id = submit_input(stack, &graph, root, &tag)?;
    let status = stack.wait_run(&id, Duration::from_secs(180)).await?;
    Ok((id, status))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_siblings_merge_starts_a_rebase_in_the_sibling_still_running() -> anyhow::Result<()> {
    let stack = Stack::start("siblings", 2, &[]).await?;
    // `a` merges at once; `b` waits, hears of `a`'s merge, rebases onto it and then sees
    // `a.txt` in its own worktree.
    let (_, status) = siblings_run(
        &stack,
        json!([
            {"file": "a.txt", "text": "a", "expect": ["root.txt", "a.txt"]},
            {"file": "b.txt", "text": "b", "sleep": 15, "expect": ["root.txt", "a.txt", "b.txt"]},
        ]),
    )
    .await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let b = status["children"][1]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let b_status = stack.get(&format!("/v1/runs/{b}")).await?;
    assert_eq!(b_status["visits"]["rebase"], 1, "{b_status}");
    let a = status["children"][0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let a_status = stack.get(&format!("/v1/runs/{a}")).await?;
    assert_eq!(
        a_status["visits"].get("rebase"),
        None,
        "`a` ended before `b` merged: {a_status}"
    );

    // Both write the same file differently: `b`'s rebase conflicts and fails it.
    let (_, status) = siblings_run(
        &stack,
        json!([
            {"file": "shared.txt", "text": "one"},
            {"file": "shared.txt", "text": "two", "sleep": 15},
        ]),
    )
    .await?;
    assert_eq!(status["status"], "failed", "{status}");
    let b = status["children"][1]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let b_status = stack.get(&format!("/v1/runs/{b}")).await?;
    assert_eq!(b_status["status"], "failed", "{b_status}");
    assert_eq!(b_status["visits"]["rebase"], 1, "{b_status}");
    let result = stack.get(&format!("/v1/runs/{b}/result")).await?;
    let rebase = &result["result"]["outputs"]["rebase"];
    assert_eq!(
        rebase["ok"], false,
        "the rebase is what failed `b`: {result}"
    );
    assert!(
        rebase["output"].to_string().contains("shared.txt"),
        "{result}"
    );
    assert_eq!(status["children"][0]["status"], "succeeded", "{status}");
    Ok(())
}

/// A submission under a chosen run id (the API's `run_id`).
async fn post_as(stack: &Stack, run_id: &str, input: Value) -> anyhow::Result<Value> {
    let bundle = shared::graph::load_bundle("tree.yaml", TREE, |p| Err(format!("no file {p}")))
        .map_err(|es| anyhow::anyhow!("{es:?}"))?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let body = json!({
        "graph": bundle, "input": input, "repo": repo, "git_ref": "HEAD",
        "agent": {"backend": "scripted", "script": {}}, "run_id": run_id,
    });
    let r = reqwest::Client::new()
        .post(format!("{}/v1/runs", stack.server))
        .json(&body)
        .send()
        .await?;
    anyhow::ensure!(
        r.status().is_success(),
        "{}: {}",
        r.status(),
        r.text().await?
    );
    Ok(r.json().await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_run_id_another_submitter_took_fails_and_leaves_that_run_alone(
) -> anyhow::Result<()> {
    let stack = Stack::start("treeclaim", 2, &[]).await?;
    // Someone takes the id the parent's first child will have, with a run of their own.
    let decoy = json!({"plan": {"name": "decoy", "sleep": 8}});
    post_as(&stack, "victim-kids-1-0", decoy).await?;
    let plan = json!({"plan": {"name": "root", "children": [{"name": "a"}, {"name": "b"}]}});
    post_as(&stack, "victim", plan).await?;
    let status = stack.wait_run("victim", Duration::from_secs(120)).await?;
    assert_eq!(status["status"], "failed", "{status}");
    let result = stack.get("/v1/runs/victim/result").await?;
    let kids = &result["result"]["outputs"]["kids"]["output"];
    assert_eq!(
        kids["children"][0]["result"]["reason"], "child_run_id_taken",
        "{result}"
    );
    assert_eq!(kids["children"][1]["status"], "succeeded", "{result}");
    // The decoy was neither adopted nor cancelled: it runs to its own end.
    let decoy = stack
        .wait_run("victim-kids-1-0", Duration::from_secs(60))
        .await?;
    assert_eq!(decoy["status"], "succeeded", "{decoy}");
    assert_eq!(decoy.get("tree"), None, "{decoy}");
    Ok(())
}
