//! Seed 004's hardened coder (`graphs/hardened-coder`) on the real stack with its scripted
//! example (`examples/hardened-coder`): the review shows the list's statistics and warnings and
//! coding waits for a person; claims are read from feature_list.json on disk, and a coder that
//! rewrites a feature's steps or deletes a feature is refused and reverted; every claim goes to
//! a verifier in its own container on a clean checkout, with the app the harness started and
//! the browser only; a verifier's pass stands only on the feature's steps, one to one, each
//! with a screenshot it took (one that passes a 4-step feature with an invented step is void);
//! a refuted claim is set back on disk with the reason in the next session's prompt, then fixed
//! and verified; a claim whose verifications disagree goes to quarantine, with its evidence and
//! the claiming session, where a person approves it through `fleet quarantine`.

#[path = "hardened/budget.rs"]
mod budget;
#[path = "hardened/evidence.rs"]
mod evidence;
#[path = "hardened/review_edits.rs"]
mod review_edits;

use fleet_tests::stack::{workspace_root, Stack};
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};

fn example(f: &str) -> String {
    workspace_root()
        .join("examples/hardened-coder")
        .join(f)
        .display()
        .to_string()
}

async fn submit(stack: &Stack) -> anyhow::Result<String> {
    let repo = stack.dir.path().join("todo-repo");
    let made = Command::new(example("make-repo.sh")).arg(&repo).output()?;
    anyhow::ensure!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let graph = workspace_root().join("graphs/hardened-coder/graph.yaml");
    let out = stack.cli(&[
        "submit",
        "--graph",
        &graph.display().to_string(),
        "--repo",
        &repo.display().to_string(),
        "--input",
        &example("input.json"),
        "--script",
        &example("script-story.json"),
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    Ok(out.stdout.trim().to_string())
}

/// Waits until the run waits for a person at `node`.
async fn awaiting(stack: &Stack, run: &str, node: &str) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = stack.get(&format!("/v1/runs/{run}")).await?;
        if s["awaiting_approval"] == json!([node]) {
            return Ok(s);
        }
        anyhow::ensure!(Instant::now() < deadline, "never waited at {node}: {s}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_come_from_disk_and_stand_only_when_an_independent_verifier_confirms_them(
) -> anyhow::Result<()> {
    let stack = Stack::start("hardened", 2, &[]).await?;
    let run = submit(&stack).await?;

    // The review: the seed's statistics and warnings; nothing is coded before a person says so.
    let status = awaiting(&stack, &run, "approve_features").await?;
    assert!(
        !status["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|j| j["node"] == "coder"),
        "{status}"
    );
    let review = stack
        .node_artifact_json(&run, "review", 1, "review_features.json")
        .await?;
    let stats = &review["stats"];
    // The person deciding sees them in the run's status (`fleet status`, the API).
    assert_eq!(
        &status["approvals"]["approve_features"]["shown"], stats,
        "{status}"
    );
    assert_eq!(stats["total"], 4, "{stats}");
    assert_eq!(stats["already_passing"], json!([4]), "{stats}");
    let warnings = stats["warnings"].to_string();
    assert!(
        warnings.contains("below the minimum feature count (40): 4"),
        "{warnings}"
    );
    assert!(
        stats["feature_warnings"].to_string().contains("too vague"),
        "{stats}"
    );
    // The initializer's claim of feature 4 is set back before anyone codes.
    assert!(review["features"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|f| f["passes"] == false));
    let approve = stack.cli(&["approve", &run, "approve_features", "--by", "ana"])?;
    assert_eq!(approve.code, 0, "{}", approve.stderr);

    // Nothing is left but features 1 and 4, whose verifications disagreed: they wait for a
    // person, each with the screenshots that back it and the session that claimed it.
    awaiting(&stack, &run, "quarantine_review").await?;
    let listed = stack.cli(&["quarantine", "list", &run])?;
    assert_eq!(listed.code, 0, "{}", listed.stdout);
    let lines: Vec<&str> = listed.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", listed.stdout);
    assert!(lines[0].starts_with("1  "), "{}", listed.stdout);
    assert!(lines[1].starts_with("4  "), "{}", listed.stdout);
    for line in &lines {
        assert!(line.contains("\"status\":\"quarantined\""), "{line}");
    }
    assert!(
        lines[1].contains("the count reads 2 items"),
        "{line}",
        line = lines[1]
    );
    let details: Value = serde_json::from_str(lines[0].trim_start_matches("1  ").trim())?;
    assert_eq!(details["claimed_session"], 1, "{details}");
    let shots: Vec<&str> = details["evidence"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|p| {
            p.contains("/verify_again_") && p.contains("/screenshots/") && p.ends_with(".png")
        })
        .collect();
    assert_eq!(shots.len(), 4, "one screenshot per step: {details}");
    let four: Value = serde_json::from_str(lines[1].trim_start_matches("4  ").trim())?;
    assert_eq!(four["claimed_session"], 2, "{four}");
    let wrong = stack.cli(&["quarantine", "approve", &run, "2"])?;
    assert_ne!(wrong.code, 0, "feature 2 is not in quarantine");
    assert!(
        wrong.stderr.contains("the item is not in quarantine"),
        "{}",
        wrong.stderr
    );
    let approve = stack.cli(&[
        "quarantine",
        "approve",
        &run,
        "4",
        "--by",
        "ana",
        "--comment",
        "counted by hand",
    ])?;
    assert_eq!(approve.code, 0, "{}", approve.stderr);
    assert_eq!(approve.stdout.trim(), "4: approved");
    // Settled at once; 1 still waits.
    let deadline = Instant::now() + Duration::from_secs(120);
    while stack.get(&format!("/v1/runs/{run}")).await?["visits"]["settle"] != 3 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the decision on 4 was never settled"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    awaiting(&stack, &run, "quarantine_review").await?;
    let approve = stack.cli(&[
        "quarantine",
        "approve",
        &run,
        "1",
        "--by",
        "ana",
        "--comment",
        "the second verifier's screenshots show it",
    ])?;
    assert_eq!(approve.code, 0, "{}", approve.stderr);

    let status = stack.wait_run(&run, Duration::from_secs(300)).await?;
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?["result"].clone();
    let outputs = &result["outputs"];

    // Session 1's claims were read from disk: 1 and 2 (it said 1 to 4); its rewrite of
    // feature 3's steps and its deletion of feature 4 were refused.
    let first = stack
        .node_artifact_json(&run, "claims", 1, "extract_claims.json")
        .await?;
    assert_eq!(ids(&first["claims"]), [1, 2], "{first}");
    let refused = first["refused"].to_string();
    assert!(refused.contains("steps rewritten"), "{refused}");
    assert!(refused.contains("deleted"), "{refused}");
    // The first verifier of feature 1 passed the 4-step feature on one invented step and no
    // screenshot: the harness voided its answer, so it never counted as a pass.
    let lie = status["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|j| j["node"] == "verify" && j["status"] == "output_invalid")
        .cloned()
        .unwrap_or_default();
    let error = lie["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("step 1: `step 1` is not the feature's step `Step 1: Navigate to http://127.0.0.1:8765/`"),
        "{status}"
    );
    let round1 = stack
        .node_artifact_json(&run, "settle", 1, "settle_claims.json")
        .await?;
    assert_eq!(round1["verdicts"]["1"], "quarantined", "{round1}");
    assert_eq!(round1["verdicts"]["2"], "refuted", "{round1}");
    // Every verifier had the browser only, on the app the harness started in its container.
    for node in ["verify", "verify_again"] {
        let n = status["visits"][node].as_u64().unwrap_or_default() as u32;
        assert!(n >= 1, "{status}");
        for visit in 1..=n {
            let started = stack
                .node_artifact_text(&run, node, visit, "logs/setup.stdout")
                .await?;
            assert!(started.contains("http://127.0.0.1:8765/"), "{started}");
            let t = stack
                .node_artifact_json(&run, node, visit, "transcript.json")
                .await?
                .to_string();
            for tool in ["run_command", "read_file", "list_dir"] {
                assert!(!t.contains(&format!("\"tool\":\"{tool}\"")), "{t}");
            }
        }
    }

    // Session 2 was told why 2 is open again and what was refused, and found the list on disk
    // as the harness left it: 1 passing, 2 set back, 3's steps and 4 restored.
    let prompt = stack
        .node_artifact_text(&run, "coder", 2, "prompt.md")
        .await?;
    assert!(
        prompt.contains(
            "feature 2: refuted by the verifier: again: 'milk' went into the error paragraph"
        ),
        "{prompt}"
    );
    assert!(prompt.contains("feature 3: steps rewritten"), "{prompt}");
    assert!(prompt.contains("feature 4: deleted"), "{prompt}");
    let coder2 = stack
        .node_artifact_json(&run, "coder", 2, "transcript.json")
        .await?;
    let seen = coder2.to_string();
    assert!(
        seen.contains("Step 3: Verify the element with id 'error' shows 'Item is empty'"),
        "{seen}"
    );
    assert!(seen.contains("The list shows its count"), "{seen}");

    // Feature 2's second claim was checked in a browser: typed, clicked, read the list, and
    // kept a screenshot after each of its five steps.
    let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
    let mut browsed = None;
    for visit in 3..=5 {
        let t = stack
            .node_artifact_json(&run, "verify", visit, "transcript.json")
            .await?
            .to_string();
        if t.contains("f2_step5") {
            browsed = Some((visit, t));
        }
    }
    let (visit, browser) = browsed.expect("a verifier checked feature 2 in the browser");
    assert!(browser.contains("milk"), "{browser}");
    let shots = logs
        .as_array()
        .into_iter()
        .flatten()
        .find(|j| j["node"] == "verify" && j["visit"] == visit)
        .and_then(|j| j["artifacts"].as_object())
        .map(|a| a.keys().filter(|k| k.contains("-f2_step")).count());
    assert_eq!(shots, Some(5), "{logs}");

    // Round 2: 2 and 3 verified; 4's verifications disagreed: quarantined, passes: false.
    let round2 = stack
        .node_artifact_json(&run, "settle", 2, "settle_claims.json")
        .await?;
    assert_eq!(round2["verdicts"]["2"], "verified", "{round2}");
    assert_eq!(round2["verdicts"]["3"], "verified", "{round2}");
    assert_eq!(round2["verdicts"]["4"], "quarantined", "{round2}");
    assert_eq!(ids(&round2["pending"]), [1, 4], "{round2}");
    let four = round2["features"]
        .as_array()
        .and_then(|l| l.iter().find(|f| f["id"] == 4));
    assert_eq!(four.map(|f| f["passes"].clone()), Some(json!(false)));
    // Each approval released the hold: settled at once, and the run is done.
    let settle = &outputs["settle"]["output"];
    assert_eq!(status["visits"]["settle"], 4, "{status}");
    assert_eq!(settle["states"]["4"]["status"], "approved", "{settle}");
    assert_eq!(settle["states"]["1"]["status"], "approved", "{settle}");
    assert_eq!(settle["states"]["2"]["reverts"], 1, "{settle}");
    assert_eq!(settle["states"]["2"]["attempts"], 2, "{settle}");
    assert!(settle["features"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|f| f["passes"] == true));
    let metrics = &settle["metrics"];
    assert_eq!(metrics["claims"], 5, "{metrics}");
    assert_eq!(metrics["verified"], 2, "{metrics}");
    assert_eq!(metrics["reverts"], 1, "{metrics}");
    assert_eq!(metrics["quarantined"], 2, "{metrics}");
    assert_eq!(metrics["human_decisions"], 2, "{metrics}");
    assert_eq!(result["exit"], "done", "{result}");
    assert_eq!(status["status"], "succeeded", "{status}");
    assert_eq!(status["quarantine"]["4"][0]["by"], "ana", "{status}");

    // The event log says the same, from the harness's own steps: five claims, the two
    // refused edits, the revert and the quarantine, a verification per settled claim.
    let log = stack.get_text(&format!("/v1/runs/{run}/events")).await?;
    let count = |kind: &str| {
        log.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event_type"] == kind)
            .count()
    };
    assert_eq!(count("claim"), 5, "{log}");
    assert_eq!(count("edit_refused"), 2, "{log}");
    assert_eq!(count("revert"), 1, "{log}");
    assert_eq!(count("quarantine"), 2, "{log}");
    assert!(count("verification") >= 4, "{log}");
    assert!(count("gate_pass") >= 1, "{log}");
    assert!(
        count("decision") >= 3,
        "the approval and the quarantine's two: {log}"
    );
    assert!(log.contains(r#""item":"4""#), "{log}");
    // Every tool call of the sessions went through the resilient executor: the initializer's
    // and coders' writes, the verifiers' commands and the browser check, each a `tool_use`;
    // the profile (`python_app`, detected from the spec) found its tools in both images but
    // pytest in the verifier's (optional: a warning, nothing failed).
    assert!(count("tool_use") >= 10, "{log}");
    let preflight: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event_type"] == "tool_error" && e["data"]["preflight"] == true)
        .collect();
    assert!(!preflight.is_empty(), "{log}");
    assert!(
        preflight
            .iter()
            .all(|e| e["data"]["tool"] == "pytest" && e["data"]["profile"] == "python_app"),
        "{preflight:?}"
    );
    // `fleet status` draws the seed's dashboard for this run.
    let out = stack.cli(&["status", &run])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    for want in [
        "PROGRESS",
        "4/4 (100%)",
        "✓ syntax   ✗ changelog",
        "Per verified test: $0.0000",
        "revert rate 20%",
    ] {
        assert!(
            out.stdout.contains(want),
            "{want:?} missing:\n{}",
            out.stdout
        );
    }
    Ok(())
}
