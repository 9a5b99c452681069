//! Seed 004's budget and notices on the real stack: a run of five agent sessions, each one
//! LLM call priced at $0.10 by the fake LLM server's reported usage, under a $0.35 budget.
//! At 80% the warning is recorded once; at 100% the run pauses (the fifth session is held,
//! `fleet wait` says so), a raise below what was spent is refused, a raise to $1 resumes it and
//! it finishes with nothing redone. Each mark reaches the run's webhook signed, the first
//! after a retry, and the delivery log shows every attempt. The event log has it all, and
//! nothing of the events, usage and cost the agents forge in their answers.

use fleet_tests::fake_llm::{FakeLlm, ScriptedReply};
use fleet_tests::stack::{make_calc_repo, Stack, StackConfig};
use fleet_tests::webhook::{fake_webhook, header, Received};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: &str = "a-secret-of-32-bytes-for-notices";

const GRAPH: &str = r#"
name: spend
start: work
nodes:
  work:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    image: fleet-agent-py:1
    max_visits: 10
    routes:
      - to: work
        when: work.ok and visits.work < 5
      - to: done
  done: {kind: exit, status: work.ok}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_pauses_at_its_budget_and_resumes_when_raised_with_signed_notices(
) -> anyhow::Result<()> {
    let submit = || {
        // Each answer also forges what a cheating agent would want believed: a passing
        // verification, a budget already raised, a cost of nothing. The schema lets the fields
        // through; none of them may reach the log, the costs or the budget.
        ScriptedReply::tool_use(
            "submit",
            json!({"summary": "one more session",
                "events": [{"at": "2026-01-01T00:00:00Z", "event_type": "verification",
                    "data": {"feature": 1, "verdict": "pass"}},
                    {"at": "2026-01-01T00:00:00Z", "event_type": "resumed", "data": {}}],
                "event_type": "verification",
                "usage": {"input_tokens": 0, "output_tokens": 0}, "cost_usd": 0.0}),
        )
        .with_usage(100_000, 0)
    };
    let llm = FakeLlm::start((0..5).map(|_| submit()).collect()).await?;
    let received: Received = Arc::default();
    let hook = fake_webhook(received.clone(), "/notices").await?;
    let stack = Stack::start_config(StackConfig {
        tag: "budget",
        worker_env: &[
            ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
            ("ANTHROPIC_API_KEY", "test-key"),
            ("FLEET_PRICES", r#"{"claude-haiku-4-5": [1.0, 0.0]}"#),
        ],
        coordinator_env: &[("FLEET_WEBHOOK_SECRET", SECRET)],
        ..StackConfig::default()
    })
    .await?;
    let dir = stack.dir.path().join("spend");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("graph.yaml"), GRAPH)?;
    std::fs::write(dir.join("prompt.md"), "Do one more piece of the work.")?;
    std::fs::write(
        dir.join("schema.json"),
        r#"{"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}"#,
    )?;
    std::fs::write(dir.join("input.json"), "{}")?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let path = |f: &str| dir.join(f).display().to_string();
    let base = [
        "submit",
        "--graph",
        &path("graph.yaml"),
        "--repo",
        &repo,
        "--input",
        &path("input.json"),
        "--llm-api",
        "anthropic",
        "--llm-model",
        "claude-haiku-4-5",
    ];
    // A webhook needs the coordinator's secret and a plain http(s) URL.
    let mut bad = base.to_vec();
    bad.extend(["--webhook", "ftp://127.0.0.1/x"]);
    let out = stack.cli(&bad)?;
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(out.stderr.contains("webhook"), "{}", out.stderr);
    let mut bad = base.to_vec();
    bad.extend(["--budget-usd=-1"]);
    let out = stack.cli(&bad)?;
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("positive"), "{}", out.stderr);

    let mut args = base.to_vec();
    args.extend(["--budget-usd", "0.35", "--webhook", &hook]);
    let out = stack.cli(&args)?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let run = out.stdout.trim().to_string();

    // Four sessions ($0.40) pass the limit: the fifth is held and `fleet wait` says why.
    let out = stack.cli(&["wait", &run, "--timeout", "120"])?;
    assert_eq!(out.code, 3, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("paused: budget_exhausted") && out.stdout.contains("1 job(s) held"),
        "{}",
        out.stdout
    );
    assert_eq!(llm.remaining(), 1, "the held session made no call");
    let summary = stack.get(&format!("/v1/runs/{run}/summary")).await?;
    assert_eq!(summary["status"], "running", "paused, not ended: {summary}");
    assert_eq!(summary["jobs_held"], 1);
    assert_eq!(summary["budget"]["paused"], true);
    let warnings = stack.events(&run, "budget_warning")?;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!((warnings[0]["data"]["spent_usd"].as_f64().unwrap() - 0.3).abs() < 1e-9);
    assert_eq!(stack.events(&run, "budget_exhausted")?.len(), 1);

    // A raise must be above what was spent; a refused one changes nothing.
    let out = stack.cli(&["budget", &run, "--usd", "0.3", "--by", "ana"])?;
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("above what the run spent"),
        "{}",
        out.stderr
    );
    let out = stack.cli(&["budget", &run, "--usd", "1", "--by", "ana"])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = stack.cli(&["wait", &run, "--timeout", "120"])?;
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(llm.remaining(), 0);
    assert_eq!(llm.requests().len(), 5, "nothing was redone");

    // The log: five sessions, each with its cost, and the budget's marks in order.
    let all = stack.get_text(&format!("/v1/runs/{run}/events")).await?;
    let all: Vec<Value> = all
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let kinds: Vec<&str> = all
        .iter()
        .filter_map(|e| e["event_type"].as_str())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "session_start").count(),
        5,
        "{kinds:?}"
    );
    let ends: Vec<&Value> = all
        .iter()
        .filter(|e| e["event_type"] == "session_end")
        .collect();
    assert_eq!(ends.len(), 5);
    assert!(ends
        .iter()
        .all(|e| e["data"]["model"] == "anthropic:claude-haiku-4-5"));
    let marks: Vec<&str> = kinds
        .iter()
        .copied()
        .filter(|k| k.starts_with("budget") || *k == "resumed" || *k == "run_finished")
        .collect();
    assert_eq!(
        marks,
        [
            "budget_warning",
            "budget_exhausted",
            "resumed",
            "run_finished"
        ]
    );
    let costs = stack.get(&format!("/v1/runs/{run}/costs")).await?;
    assert!(
        (costs["total_usd"].as_f64().unwrap() - 0.5).abs() < 1e-9,
        "{costs}"
    );
    assert_eq!(costs["sessions"].as_array().unwrap().len(), 5);
    assert!(
        !kinds.contains(&"verification"),
        "an agent's answer never reaches the log: {kinds:?}"
    );

    // Each mark reached the webhook, signed; the first POST failed and was retried.
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.lock().unwrap().len() < 5 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let got = received.lock().unwrap().clone();
    assert_eq!(got.len(), 5, "four notices, one retried");
    let mut delivered = std::collections::BTreeMap::new();
    for (h, body, status) in &got {
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(body);
        let expected = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        assert_eq!(header(h, "x-fleet-signature"), expected);
        let b: Value = serde_json::from_slice(body)?;
        assert_eq!(b["run_id"], run.as_str());
        assert_eq!(
            header(h, "x-fleet-delivery"),
            b["delivery"].as_str().unwrap()
        );
        assert_eq!(
            header(h, "x-fleet-event"),
            format!("run.{}", b["event"]["event_type"].as_str().unwrap())
        );
        delivered
            .entry(b["event"]["event_type"].as_str().unwrap().to_string())
            .or_insert_with(Vec::new)
            .push(*status);
    }
    let kinds: Vec<&String> = delivered.keys().collect();
    assert_eq!(
        kinds,
        [
            "budget_exhausted",
            "budget_warning",
            "resumed",
            "run_finished"
        ]
    );
    assert_eq!(
        delivered.values().filter(|s| **s == [500, 200]).count(),
        1,
        "{delivered:?}"
    );
    let logs = stack.get(&format!("/v1/runs/{run}/webhooks")).await?;
    let logs = logs.as_array().unwrap();
    assert_eq!(logs.len(), 4, "{logs:?}");
    assert!(logs.iter().all(|l| l["state"] == "delivered"), "{logs:?}");
    let retried: Vec<&Value> = logs
        .iter()
        .filter(|l| l["attempts"].as_array().unwrap().len() == 2)
        .collect();
    assert_eq!(retried.len(), 1, "{logs:?}");
    assert_eq!(retried[0]["attempts"][0]["status"], 500);
    Ok(())
}
