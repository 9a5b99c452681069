//! Flaky tests on the real stack: a batch of three hybrid-TDD runs (the stack example) whose
//! validation has a test that passes every other run, a stable failure, and nothing wrong.
//!
//! The flip is real: the test keeps a counter in the container's `/tmp`, which the harness's
//! reruns share (they run in the job's one container; the frozen tests are laid down again in
//! the worktree before each), and fails when the counter is even. Nothing in the harness
//! simulates it. The flaky run is detected, listed in the step's output and artifacts and in
//! the batch's reports, and ends at `flaky_tests`: not a pass, not an ordinary failure. The
//! stable failure is still a plain failure after its reruns; the stable pass costs none.

use fleet_tests::stack::{example, workspace_root, Stack};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The test that passes every other run (its id as pytest reports it).
const FLIP_ID: &str = "tests.test_stack::test_is_empty_passes_every_other_run";
const FLIP_TEST: &str = r#"

def test_is_empty_passes_every_other_run():
    # A counter in /tmp: every run of this container sees the last one's.
    import os

    path = "/tmp/fleet-flaky-counter"
    n = int(open(path).read()) if os.path.exists(path) else 0
    with open(path, "w") as f:
        f.write(str(n + 1))
    assert Stack().is_empty()
    assert n % 2 == 1, f"run {n + 1} of this container: this test passes every other run"
"#;

fn read_example(name: &str) -> anyhow::Result<Value> {
    Ok(serde_json::from_str(&std::fs::read_to_string(example(
        &format!("hybrid-stack/{name}"),
    ))?)?)
}

fn make_repo(stack: &Stack) -> anyhow::Result<String> {
    let dest = stack.dir.path().join("stack-repo");
    let out =
        std::process::Command::new(workspace_root().join("examples/hybrid-stack/make-repo.sh"))
            .arg(&dest)
            .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(dest.display().to_string())
}

/// The happy script with the flipping test added to the tests agent's file.
fn flaky_script() -> anyhow::Result<Value> {
    let mut script = read_example("script-happy.json")?;
    let file = &mut script["tests"][0]["files"]["tests/test_stack.py"];
    let text = file.as_str().unwrap_or_default().to_string();
    anyhow::ensure!(text.contains("def test_"), "the happy tests: {text}");
    *file = json!(text + FLIP_TEST);
    Ok(script)
}

fn item<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["items"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["item_id"] == id))
        .unwrap_or(&Value::Null)
}

/// Every visit of `node` in the run, in order.
async fn visits(stack: &Stack, run: &str, node: &str) -> anyhow::Result<Vec<u32>> {
    let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
    let mut v: Vec<u32> = logs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["node"] == node)
        .filter_map(|e| e["visit"].as_u64().map(|x| x as u32))
        .collect();
    v.sort_unstable();
    Ok(v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_that_passes_every_other_run_is_reported_flaky_and_decides_no_verdict(
) -> anyhow::Result<()> {
    let stack = Stack::start("flaky", 2, &[]).await?;
    let repo = make_repo(&stack)?;
    let input = read_example("input.json")?;
    let items = [
        json!({"id": "flaky", "repo": repo, "input": input, "script": flaky_script()?}),
        json!({"id": "stable-fail", "repo": repo, "input": input,
               "script": read_example("script-stuck.json")?}),
        json!({"id": "stable-pass", "repo": repo, "input": input,
               "script": read_example("script-happy.json")?}),
    ];
    let lines: Vec<String> = items.iter().map(Value::to_string).collect();
    let data = stack.dir.path().join("flaky.jsonl");
    std::fs::write(&data, lines.join("\n") + "\n")?;
    let graph = workspace_root().join("graphs/hybrid-tdd/graph.yaml");
    let out = stack.cli(&[
        "batch",
        "submit",
        &data.display().to_string(),
        "--graph",
        &graph.display().to_string(),
        "--max-running",
        "3",
        "--max-infra-retries",
        "0",
    ])?;
    anyhow::ensure!(out.code == 0, "batch submit failed: {}", out.stderr);
    let id = out.stdout.trim().to_string();
    let started = Instant::now();
    let v = stack.wait_batch(&id, Duration::from_secs(600)).await?;
    eprintln!("batch {id} took {:?}", started.elapsed());
    let c = &v["counts"];
    assert_eq!(
        (
            c["passed"].as_u64(),
            c["failed"].as_u64(),
            c["flaky"].as_u64()
        ),
        (Some(1), Some(1), Some(1)),
        "{v}"
    );
    assert_eq!(c["errored"], 0, "{v}");

    let report = stack.get(&format!("/v1/batches/{id}/report")).await?;
    let run_of = |name: &str| {
        item(&report, name)["run_id"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };

    // The flaky item: no verdict, its flaky test listed and counted.
    let f = item(&report, "flaky");
    assert_eq!(f["state"], "flaky", "{f}");
    assert_eq!(f["verdict"], "FLAKY", "{f}");
    assert_eq!(f["flaky_tests"], json!([FLIP_ID]), "{f}");
    assert_eq!(report["flaky"], json!({"items": 1, "tests": 1}), "{report}");
    assert_eq!(
        report["pass_rate"]["judged"], 2,
        "flaky is no verdict: {report}"
    );
    // Its run ended at flaky_tests, and its result carries the test.
    let run = run_of("flaky");
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?["result"].clone();
    assert_eq!(result["success"], false, "{result}");
    assert_eq!(result["exit"], "FlakyTests", "{result}");
    assert_eq!(result["flaky_tests"], json!([FLIP_ID]), "{result}");
    // The validation step: three real runs (fail, pass, fail), listed in its output and in
    // its artifacts.
    let t = stack
        .node_artifact_json(&run, "validate", 1, "test_report.json")
        .await?;
    assert_eq!(t["runs"], 3, "{t}");
    assert_eq!(t["run_verdicts"], json!([false, true, false]), "{t}");
    assert_eq!(t["flaky"], true, "{t}");
    assert_eq!(t["verdict"], "flaky", "{t}");
    assert_eq!(t["flaky_tests"], json!([FLIP_ID]), "{t}");
    assert_eq!(t["stability"]["stable_fail"], 0, "{t}");
    assert_eq!(t["stability"]["stable_pass"], 7, "{t}");
    let flaky = stack
        .node_artifact_json(&run, "validate", 1, "flaky.json")
        .await?;
    assert_eq!(flaky["decision"], "flaky", "{flaky}");
    assert_eq!(
        flaky["combined"]["flaky"],
        json!([{"id": FLIP_ID, "seen": ["failed", "passed", "failed"]}]),
        "{flaky}"
    );
    let failed_per_run: Vec<Value> = flaky["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| r["counts"]["failed"].clone())
        .collect();
    assert_eq!(failed_per_run, [json!(1), json!(0), json!(1)], "{flaky}");
    let second = stack
        .node_artifact_text(&run, "validate", 1, "logs/tests_run2.stdout")
        .await?;
    // The flip passed in the second run (the harness's planted tests, twins and the types
    // step's checks, run beside it and are not counted here).
    assert!(
        second.contains("PASSED tests/test_stack.py::test_is_empty_passes_every_other_run"),
        "the second run passed: {second}"
    );
    assert!(
        t["failures"]
            .to_string()
            .contains("run 1 of this container"),
        "the first run's failure is the flip's: {t}"
    );
    // At verify-TDD the tests all failed on the stubs, as expected and as the agent claimed:
    // no rerun.
    let tdd = stack
        .node_artifact_json(&run, "verify_tdd", 1, "test_report.json")
        .await?;
    assert_eq!(
        (tdd["runs"].as_u64(), tdd["flaky"].as_bool()),
        (Some(1), Some(false)),
        "{tdd}"
    );

    // The stable failure: every validation rerun, every one a plain failure; the run ends as
    // before (stuck on the same failing test).
    let f = item(&report, "stable-fail");
    assert_eq!(
        (f["state"].as_str(), f["verdict"].as_str()),
        (Some("failed"), Some("FAIL")),
        "{f}"
    );
    let run = run_of("stable-fail");
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?["result"].clone();
    assert_eq!(result["exit"], "StuckOnPattern", "{result}");
    assert_eq!(result["flaky_tests"], json!([]), "{result}");
    let validated = visits(&stack, &run, "validate").await?;
    assert!(!validated.is_empty(), "{validated:?}");
    for visit in validated {
        let t = stack
            .node_artifact_json(&run, "validate", visit, "test_report.json")
            .await?;
        assert_eq!(t["runs"], 3, "visit {visit}: {t}");
        assert_eq!(
            t["run_verdicts"],
            json!([false, false, false]),
            "visit {visit}: {t}"
        );
        assert_eq!(t["verdict"], "fail", "visit {visit}: {t}");
        assert_eq!(t["flaky"], false, "visit {visit}: {t}");
        assert_eq!(t["flaky_tests"], json!([]), "visit {visit}: {t}");
        assert!(
            t["stability"]["stable_fail"].as_u64() >= Some(1),
            "visit {visit}: {t}"
        );
    }

    // The stable pass: a plain pass, and not one rerun.
    let p = item(&report, "stable-pass");
    assert_eq!(
        (p["state"].as_str(), p["verdict"].as_str()),
        (Some("passed"), Some("PASS")),
        "{p}"
    );
    let run = run_of("stable-pass");
    for node in ["verify_tdd", "validate"] {
        let t = stack
            .node_artifact_json(&run, node, 1, "test_report.json")
            .await?;
        assert_eq!(t["runs"], 1, "{node}: {t}");
        assert!(t["rerun_because"].is_null(), "{node}: {t}");
        assert!(
            stack
                .node_artifact_json(&run, node, 1, "flaky.json")
                .await
                .is_err(),
            "{node} ran once: no flaky.json"
        );
    }

    // JUnit and HTML list it too.
    let junit = stack.get_text(&format!("/v1/batches/{id}/junit")).await?;
    assert!(junit.contains("<skipped type=\"flaky\""), "{junit}");
    assert!(junit.contains(FLIP_ID), "{junit}");
    assert_eq!(junit.matches("<failure").count(), 1, "{junit}");
    let html = stack.get_text(&format!("/v1/batches/{id}/html")).await?;
    assert!(
        html.contains("1 flaky items (no verdict), 1 flaky tests listed"),
        "{html}"
    );
    assert!(html.contains(FLIP_ID), "{html}");
    assert!(html.contains("pass rate 50.0% (1 / 2 judged)"), "{html}");
    Ok(())
}
