//! Seed 004's review with edits, on the real stack: while the feature list waits for approval,
//! a person approves it with an edited list; the review writes it to disk, checks it again and
//! asks again, and its statistics are the edited list's. Edits that do not fit the node's
//! schema are refused at once (the run still waits); a list that fits the schema but not the
//! harness's stricter rules (an id used twice) is refused by the review, which keeps the list
//! on disk (read back from the previous review's commit) and says why.

use super::{awaiting, submit};
use fleet_tests::stack::Stack;
use serde_json::{json, Value};

/// The example's four features as its initializer writes them, edited: feature 4 gets the
/// steps it lacked and a category of its own, feature 1 is marked passing (the review sets it
/// back).
fn edited() -> anyhow::Result<Value> {
    let story: Value = serde_json::from_str(&std::fs::read_to_string(super::example(
        "script-story.json",
    ))?)?;
    let text = story["initializer"][0]["files"]["feature_list.json"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("the story's initializer writes no feature list"))?;
    let mut list: Value = serde_json::from_str(text)?;
    anyhow::ensure!(list.as_array().map_or(0, Vec::len) == 4, "{list}");
    list[0]["passes"] = json!(true);
    list[3]["passes"] = json!(false);
    list[3]["category"] = json!("style-edited");
    list[3]["steps"] = json!([
        "Step 1: Navigate to http://127.0.0.1:8765/",
        "Step 2: Add 'milk' and 'eggs'",
        "Step 3: Verify the element with id 'count' shows '2 items'",
        "Step 4: Verify the list with id 'items' has two entries"
    ]);
    Ok(list)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_edits_the_list_while_reviewing_and_the_review_checks_it_again(
) -> anyhow::Result<()> {
    let stack = Stack::start("review-edits", 1, &[]).await?;
    let run = submit(&stack).await?;
    let first = awaiting(&stack, &run, "approve_features").await?;
    let shown = &first["approvals"]["approve_features"]["shown"];
    assert_eq!(shown["total"], 4, "{shown}");
    assert!(
        shown["feature_warnings"].to_string().contains("too vague"),
        "{shown}"
    );
    let dir = stack.dir.path();
    let write = |name: &str, v: &Value| -> anyhow::Result<String> {
        let p = dir.join(name);
        std::fs::write(&p, serde_json::to_string_pretty(v)?)?;
        Ok(p.display().to_string())
    };

    // Not a list: refused by the node's schema, nothing changes.
    let bad = write("bad.json", &json!({"features": []}))?;
    let out = stack.cli(&["approve", &run, "approve_features", "--edits", &bad])?;
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(out.stderr.contains("do not fit"), "{}", out.stderr);
    // Edits come with an approval only.
    let out = stack.cli(&[
        "approve",
        &run,
        "approve_features",
        "--reject",
        "--edits",
        &bad,
    ])?;
    assert_ne!(out.code, 0);
    // A misspelled field is refused, not ignored.
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/v1/runs/{run}/approvals/approve_features",
            stack.server
        ))
        .json(&json!({"approved": true, "edit": []}))
        .send()
        .await?;
    assert_eq!(resp.status(), 400);
    let still = awaiting(&stack, &run, "approve_features").await?;
    assert_eq!(still["visits"]["review"], 1, "{still}");

    // The edited list: written, reviewed again, asked again.
    let list = edited()?;
    let good = write("edited.json", &list)?;
    let out = stack.cli(&[
        "approve",
        &run,
        "approve_features",
        "--edits",
        &good,
        "--by",
        "ana",
    ])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let again = wait_visit(&stack, &run, 2).await?;
    let shown = &again["approvals"]["approve_features"]["shown"];
    assert!(
        !shown["feature_warnings"].to_string().contains("too vague"),
        "feature 4 has its steps now: {shown}"
    );
    assert_eq!(shown["already_passing"], json!([1]), "{shown}");
    assert_eq!(shown["avg_steps"], 4.25, "{shown}");

    // Ids used twice fit the schema but not the harness: refused by the review, which keeps
    // the edited list it wrote before (read from disk again) and says why.
    let mut twice = list.clone();
    twice[1]["id"] = json!(1);
    let dup = write("twice.json", &twice)?;
    let out = stack.cli(&["approve", &run, "approve_features", "--edits", &dup])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let third = wait_visit(&stack, &run, 3).await?;
    let shown = &third["approvals"]["approve_features"]["shown"];
    assert!(
        shown["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("the edited list was refused") && w.contains("twice")),
        "{shown}"
    );
    assert_eq!(
        shown["avg_steps"], 4.25,
        "the list on disk is the first edit: {shown}"
    );
    assert_eq!(
        shown["already_passing"],
        json!([]),
        "the review set feature 1 back on disk: {shown}"
    );
    let out = stack.cli(&["cancel", &run])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    Ok(())
}

/// Waits until the review's `visit`-th run asks for approval again.
async fn wait_visit(stack: &Stack, run: &str, visit: u64) -> anyhow::Result<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let s = awaiting(stack, run, "approve_features").await?;
        if s["visits"]["review"] == visit {
            return Ok(s);
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "no review {visit}: {s}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
