//! Batches on the real stack: a dataset of factory items (a gold patch, a wrong one, one out of
//! scope, one whose repository does not exist) gives the expected verdict for each item, the
//! infrastructure error is never a verdict, the JSON and JUnit reports say so, and the batch
//! goes on, every item exactly once, when its coordinator and a worker are killed; the HTML report opened in
//! headless Chromium; a small batch submitted after a big one gets its fair share at once; a
//! batch of the most items allowed (100,000) runs, cancels and reads back whole.

use fleet_tests::browser;
use fleet_tests::stack::{example, make_calc_repo, Stack};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

fn read_json(path: &str) -> anyhow::Result<Value> {
    Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
}

/// The dataset: one line per item, scripts inline.
fn dataset(dir: &Path, repo: &str) -> anyhow::Result<std::path::PathBuf> {
    let order = read_json(&example("factory-calc/work_order.json"))?;
    let script = |name: &str| read_json(&example(&format!("factory-calc/{name}")));
    let items = [
        json!({"id": "gold", "repo": repo, "work_order": order, "script": script("script-pass.json")?}),
        json!({"id": "wrong", "repo": repo, "work_order": order,
               "script": script("script-acceptance-fail.json")?}),
        json!({"id": "scope", "repo": repo, "work_order": order,
               "script": script("script-scope-then-pass.json")?}),
        json!({"id": "norepo", "repo": "/nonexistent/repo", "work_order": order,
               "script": script("script-pass.json")?}),
    ];
    let text: Vec<String> = items.iter().map(|i| i.to_string()).collect();
    let path = dir.join("dataset.jsonl");
    std::fs::write(&path, text.join("\n") + "\n")?;
    Ok(path)
}

fn item<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["items"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["item_id"] == id))
        .unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_gives_each_item_its_verdict_and_reports_it() -> anyhow::Result<()> {
    let mut stack = Stack::start("batch", 2, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let data = dataset(stack.dir.path(), &repo)?;
    let submit = |stack: &Stack| {
        stack.cli(&[
            "batch",
            "submit",
            &data.display().to_string(),
            "--max-attempts",
            "1",
            "--max-running",
            "2",
            "--max-infra-retries",
            "1",
            "--label",
            "suite=calc",
        ])
    };
    let out = submit(&stack)?;
    anyhow::ensure!(out.code == 0, "batch submit failed: {}", out.stderr);
    let id = out.stdout.trim().to_string();
    // The same batch again is the same batch.
    let again = submit(&stack)?;
    assert_eq!(again.stdout.trim(), id, "{}", again.stderr);

    // The coordinator dies while the batch runs; another takes over and finishes it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = stack.get(&format!("/v1/batches/{id}")).await?;
        if v["counts"]["running"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "nothing started: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stack.restart_coordinator().await?;
    // And a worker dies too: its jobs go back to the queue and the other worker takes them.
    let victim = stack.worker_ids()[0].clone();
    stack.kill_worker(&victim)?;

    let v = stack.wait_batch(&id, Duration::from_secs(300)).await?;
    let c = &v["counts"];
    assert_eq!(
        (
            c["total"].as_u64(),
            c["passed"].as_u64(),
            c["failed"].as_u64(),
            c["errored"].as_u64()
        ),
        (Some(4), Some(1), Some(2), Some(1)),
        "{v}"
    );
    assert_eq!(v["batch"]["spec"]["labels"]["suite"], "calc");
    // The summary is the view without its items, for polling.
    let summary = stack.get(&format!("/v1/batches/{id}/summary")).await?;
    assert_eq!(summary["counts"], v["counts"], "{summary}");
    assert_eq!(summary["progress"]["done"], 4, "{summary}");
    assert_eq!(summary["batch"]["items"], json!([]), "{summary}");
    // Every item exactly once: one settled run each, distinct (the missing repository never
    // became a run), and only the missing repository took a second attempt.
    let items = v["batch"]["items"].as_array().cloned().unwrap_or_default();
    let runs: std::collections::BTreeSet<&str> =
        items.iter().filter_map(|i| i["run_id"].as_str()).collect();
    assert_eq!(runs.len(), 3, "{v}");
    for i in &items {
        let expected = if i["item_id"] == "norepo" { 2 } else { 1 };
        assert_eq!(i["attempt"], expected, "{i}");
    }

    // The reports, through the CLI.
    let out_dir = stack.dir.path().join("report");
    let rep = stack.cli(&[
        "batch",
        "report",
        &id,
        "--out",
        &out_dir.display().to_string(),
    ])?;
    assert_eq!(rep.code, 0, "{}", rep.stderr);
    let report: Value = serde_json::from_slice(&std::fs::read(out_dir.join("report.json"))?)?;
    assert_eq!(item(&report, "gold")["verdict"], "PASS", "{report}");
    assert_eq!(item(&report, "wrong")["verdict"], "FAIL");
    assert_eq!(item(&report, "wrong")["ended_stage"], "acceptance_failed");
    assert_eq!(item(&report, "scope")["verdict"], "FAIL");
    assert_eq!(
        item(&report, "scope")["ended_stage"],
        "patch_scope_violation"
    );
    // The missing repository is an error of the item, retried once, never a verdict.
    let norepo = item(&report, "norepo");
    assert_eq!(norepo["state"], "errored", "{norepo}");
    assert!(norepo["verdict"].is_null(), "{norepo}");
    assert_eq!(norepo["attempt"], 2, "{norepo}");
    assert_eq!(norepo["infra_errors"].as_array().map(Vec::len), Some(1));
    // Each run the batch made is a real run of the fleet, with the verdict the report gives.
    for name in ["gold", "wrong", "scope"] {
        let run = item(&report, name)["run_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let result = stack.get(&format!("/v1/runs/{run}/result")).await?;
        assert_eq!(
            result["result"]["verdict"],
            item(&report, name)["verdict"],
            "{name}"
        );
    }

    let junit = std::fs::read_to_string(out_dir.join("junit.xml"))?;
    assert_eq!(junit.matches("<testcase").count(), 4, "{junit}");
    assert_eq!(junit.matches("<failure").count(), 2, "{junit}");
    assert_eq!(junit.matches("<error").count(), 1, "{junit}");

    let html = std::fs::read_to_string(out_dir.join("report.html"))?;
    for text in ["gold", "wrong", "scope", "norepo", "PASS", "FAIL"] {
        assert!(html.contains(text), "{text} missing: {html}");
    }
    assert!(html.contains("pass rate 33.3% (1 / 3 judged)"), "{html}");
    assert_eq!(html.matches("<svg").count(), 2, "{html}");
    assert!(!html.contains("https://"), "{html}");
    // The page in a real browser: its script sorts the table by the linked column (item,
    // descending), and the summary shows the pass rate; a screenshot is kept.
    let url = browser::file_url(&out_dir.join("report.html"), "#sort=-item")?;
    let dom = browser::dom(&url)?;
    assert!(dom.contains("pass rate 33.3% (1 / 3 judged)"), "{dom}");
    let order: Vec<usize> = ["wrong", "scope", "norepo", "gold"]
        .iter()
        .map(|id| {
            dom.find(&format!("<tr class=\"item\"><td data-v=\"{id}\">"))
                .unwrap_or(usize::MAX)
        })
        .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]) && order[3] != usize::MAX,
        "rows not sorted by item, descending: {order:?}"
    );
    assert!(dom.contains("aria-sort=\"descending\""), "{dom}");
    browser::screenshot(&url, "batch-report", 1400)?;

    // Listed, and `wait` on a finished batch with an errored item exits 1.
    let list = stack.cli(&["batch", "list"])?;
    assert!(list.stdout.contains(&id), "{}", list.stdout);
    let wait = stack.cli(&["batch", "wait", &id])?;
    assert_eq!(wait.code, 1, "{}", wait.stdout);
    assert!(
        wait.stdout
            .contains("passed 1, failed 2, flaky 0, errored 1"),
        "{}",
        wait.stdout
    );

    // The errored item again, as a batch of its own (its repository is still missing).
    let rerun = stack.cli(&["batch", "rerun", &id, "--errored"])?;
    assert_eq!(rerun.code, 0, "{}", rerun.stderr);
    let rerun_id = rerun.stdout.trim().to_string();
    assert_ne!(rerun_id, id);
    let v2 = stack
        .wait_batch(&rerun_id, Duration::from_secs(120))
        .await?;
    assert_eq!(v2["counts"]["total"], 1, "{v2}");
    assert_eq!(v2["counts"]["errored"], 1, "{v2}");
    assert_eq!(v2["batch"]["items"][0]["item_id"], "norepo");
    assert_eq!(v2["batch"]["spec"]["labels"]["rerun_of"], id.as_str());
    let nothing = stack.cli(&["batch", "rerun", &rerun_id, "--failed"])?;
    assert_ne!(nothing.code, 0);
    assert!(
        nothing.stderr.contains("no item to rerun"),
        "{}",
        nothing.stderr
    );
    // Side by side: the three judged items only in the first, the errored one not comparable.
    let cmp = stack.cli(&["batch", "compare", &id, &rerun_id])?;
    assert_eq!(cmp.code, 0, "{}", cmp.stderr);
    let cmp: Value = serde_json::from_str(&cmp.stdout)?;
    assert_eq!(
        cmp["only_before"],
        json!(["gold", "scope", "wrong"]),
        "{cmp}"
    );
    assert_eq!(cmp["not_comparable"], json!(["norepo"]), "{cmp}");
    assert_eq!(cmp["improved"], json!([]));
    assert_eq!(cmp["regressed"], json!([]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_dataset_is_refused_naming_its_line_and_nothing_runs() -> anyhow::Result<()> {
    let stack = Stack::start("batchbad", 0, &[]).await?;
    let path = stack.dir.path().join("bad.jsonl");
    std::fs::write(
        &path,
        "{\"id\": \"a\", \"repo\": \"/r\"}\n{\"id\": \"a\", \"repo\": \"/r\"}\n",
    )?;
    let out = stack.cli(&["batch", "submit", &path.display().to_string()])?;
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("line 2"), "{}", out.stderr);
    let list = stack.get("/v1/batches").await?;
    assert_eq!(list, json!([]), "nothing was created");
    Ok(())
}

/// A dataset of `n` gold items named `<prefix><i>`.
fn gold_dataset(dir: &Path, repo: &str, prefix: &str, n: usize) -> anyhow::Result<String> {
    let order = read_json(&example("factory-calc/work_order.json"))?;
    let script = read_json(&example("factory-calc/script-pass.json"))?;
    let lines: Vec<String> = (0..n)
        .map(|i| {
            json!({"id": format!("{prefix}{i}"), "repo": repo, "work_order": order, "script": script})
                .to_string()
        })
        .collect();
    let path = dir.join(format!("{prefix}.jsonl"));
    std::fs::write(&path, lines.join("\n") + "\n")?;
    Ok(path.display().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_batch_submitted_after_a_big_one_gets_its_fair_share_at_once() -> anyhow::Result<()>
{
    // Two batch slots for the whole fleet; the big batch alone would take both (and, without
    // sharing, all twelve of its runs at once: the small batch's jobs would queue behind them).
    let stack = Stack::start_config(fleet_tests::stack::StackConfig {
        tag: "batchfair",
        workers: 1,
        coordinator_env: &[("FLEET_BATCH_SLOTS", "2")],
        ..Default::default()
    })
    .await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let big = gold_dataset(stack.dir.path(), &repo, "big", 12)?;
    let small = gold_dataset(stack.dir.path(), &repo, "small", 2)?;
    let submit = |path: &str| -> anyhow::Result<String> {
        let out = stack.cli(&["batch", "submit", path, "--max-running", "12"])?;
        anyhow::ensure!(out.code == 0, "batch submit failed: {}", out.stderr);
        Ok(out.stdout.trim().to_string())
    };
    let big_id = submit(&big)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = stack.get(&format!("/v1/batches/{big_id}")).await?;
        if v["counts"]["running"].as_u64() == Some(2) {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the big batch never started: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let small_id = submit(&small)?;

    // Until the small batch ends: never more than the two slots under way over both batches.
    let deadline = Instant::now() + Duration::from_secs(240);
    let (big_left, most_running) = {
        let mut most = 0;
        loop {
            let s = stack.get(&format!("/v1/batches/{small_id}")).await?;
            let b = stack.get(&format!("/v1/batches/{big_id}")).await?;
            let running = s["counts"]["running"].as_u64().unwrap_or(0)
                + b["counts"]["running"].as_u64().unwrap_or(0);
            most = most.max(running);
            if s["batch"]["finished_at"].is_string() {
                let left = b["counts"]["queued"].as_u64().unwrap_or(0)
                    + b["counts"]["running"].as_u64().unwrap_or(0);
                break (left, most);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the small batch never ended: {s}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert!(
        most_running <= 2,
        "{most_running} runs under way over 2 slots"
    );
    // The small batch had one slot from the start: it ended while most of the big one waited.
    assert!(
        big_left >= 6,
        "the small batch ended only when the big one had {big_left} of 12 items left"
    );
    let s = stack.wait_batch(&small_id, Duration::from_secs(10)).await?;
    assert_eq!(s["counts"]["passed"], 2, "{s}");
    assert_eq!(s["progress"]["pass_rate"], 1.0, "{s}");
    let b = stack.wait_batch(&big_id, Duration::from_secs(300)).await?;
    assert_eq!(b["counts"]["passed"], 12, "{b}");
    assert!(b["progress"]["eta_seconds"].is_null(), "{b}");
    // The big batch's weight makes no difference to the verdicts, only to its share.
    assert_eq!(b["batch"]["spec"]["weight"], 1, "{b}");
    Ok(())
}

/// The most items a batch may have: submitted once (again: the same batch), run a few items
/// while the rest wait, cancelled (the queued items cancelled a chunk at a time), every item
/// read back in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_the_most_items_allowed_runs_cancels_and_reads_back_whole() -> anyhow::Result<()>
{
    let n = shared::batch::MAX_BATCH_ITEMS;
    assert_eq!(n, 100_000);
    let stack = Stack::start("batchmax", 1, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let lines: Vec<String> = (0..n)
        .map(|i| json!({"id": format!("i{i}"), "repo": repo, "input": {"items": [i]}}).to_string())
        .collect();
    let path = stack.dir.path().join("max.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n")?;
    let graph = fleet_tests::stack::workspace_root()
        .join("graphs/bench/fanout.yaml")
        .display()
        .to_string();
    let args = [
        "batch",
        "submit",
        &path.display().to_string(),
        "--graph",
        &graph,
        "--max-running",
        "4",
    ];
    let out = stack.cli(&args)?;
    anyhow::ensure!(out.code == 0, "batch submit failed: {}", out.stderr);
    let id = out.stdout.trim().to_string();
    let again = stack.cli(&args)?;
    assert_eq!(again.stdout.trim(), id, "the same batch: {}", again.stderr);

    // Items run while 99,990-odd wait; the summary reads the header alone.
    let deadline = Instant::now() + Duration::from_secs(120);
    let summary = loop {
        let s = stack.get(&format!("/v1/batches/{id}/summary")).await?;
        if s["counts"]["passed"].as_u64().unwrap_or(0) >= 10 {
            break s;
        }
        anyhow::ensure!(Instant::now() < deadline, "items never passed: {s}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(summary["counts"]["total"], n, "{summary}");
    assert!(
        summary["counts"]["running"].as_u64() <= Some(4),
        "{summary}"
    );
    assert_eq!(summary["batch"]["items"], json!([]));

    let out = stack.cli(&["batch", "cancel", &id])?;
    anyhow::ensure!(out.code == 0, "batch cancel failed: {}", out.stderr);
    let deadline = Instant::now() + Duration::from_secs(120);
    let summary = loop {
        let s = stack.get(&format!("/v1/batches/{id}/summary")).await?;
        if s["batch"]["finished_at"].is_string() {
            break s;
        }
        anyhow::ensure!(Instant::now() < deadline, "the cancel never drained: {s}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let c = &summary["counts"];
    let count = |k: &str| c[k].as_u64().unwrap_or(0) as usize;
    assert_eq!((count("queued"), count("running")), (0, 0), "{summary}");
    assert_eq!(count("passed") + count("cancelled"), n, "{summary}");
    assert!(count("cancelled") >= n - 100, "{summary}");

    // The whole batch, read back: every item once, in order, agreeing with the books.
    let whole = stack.get(&format!("/v1/batches/{id}")).await?;
    let items = whole["batch"]["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(items.len(), n);
    for (i, item) in items.iter().enumerate() {
        assert_eq!(item["item_id"], format!("i{i}"));
    }
    let passed = items.iter().filter(|i| i["state"] == "passed").count();
    assert_eq!(passed, count("passed"));
    assert!(items
        .iter()
        .filter(|i| i["state"] == "passed")
        .all(|i| i["run_id"].is_string() && i["verdict"] == "PASS"));
    assert_eq!(whole["counts"], summary["counts"]);
    Ok(())
}
