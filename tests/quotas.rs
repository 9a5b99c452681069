//! A team's quotas over the whole fleet, on the real stack (Redis counters shared by every
//! worker and coordinator, the fake LLM server speaking the Anthropic wire format):
//!
//! - a team past 80% of its daily dollars gets the `budget_warning` notice and a signed webhook;
//!   at 100% its running agent is stopped at its next LLM call (`budget_exhausted`, the call
//!   never reaches the provider), while another team's run goes on;
//! - a team at its limit of runs under way gets 429 until one ends;
//! - two workers under one fleet-wide provider limit of N calls per window never exceed it
//!   together, measured on the fake LLM server's own log;
//! - the Redis ledger's rules one by one: budgets, windows, a 429's back-off and halved rate
//!   growing back, runs under way, notices handed to one coordinator and taken over after one
//!   died.

use fleet_tests::fake_llm::{Conversation, FakeLlm, ScriptedReply};
use fleet_tests::stack::{unique_namespace, Stack, StackConfig, REDIS_URL};
use fleet_tests::webhook::{fake_webhook, header, Received};
use serde_json::{json, Value};
use shared::quota::{QuotaScope, Rate, Spent, TeamLimits};
use std::time::{Duration, SystemTime};
use worker::quota::redis_ledger::RedisLedger;
use worker::quota::{Admission, Call, Ledger, Rates};

const SECRET: &str = "quota-test-secret";

fn graph(prompt_key: &str) -> String {
    format!(
        r#"
name: spend-{prompt_key}
start: work
nodes:
  work:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    image: fleet-agent-py:1
    routes: [{{to: done}}]
  done: {{kind: exit, status: work.ok}}
"#
    )
}

/// A graph folder whose agent's prompt names `key` (the fake LLM's conversation).
fn graph_dir(stack: &Stack, key: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = stack.dir.path().join(key);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("graph.yaml"), graph(key))?;
    std::fs::write(
        dir.join("prompt.md"),
        format!("{key}: look around, then submit\n"),
    )?;
    std::fs::write(dir.join("schema.json"), r#"{"type": "object"}"#)?;
    std::fs::write(dir.join("input.json"), "{}")?;
    Ok(dir)
}

fn submit_llm(stack: &Stack, dir: &std::path::Path, token: &str) -> anyhow::Result<String> {
    let repo = fleet_tests::submit::git_repo(dir, "repo", &[("a.txt", "a\n")])?;
    let p = |f: &str| dir.join(f).display().to_string();
    let out = stack.cli_env(
        &[
            "submit",
            "--graph",
            &p("graph.yaml"),
            "--repo",
            &repo.display().to_string(),
            "--input",
            &p("input.json"),
            "--llm-api",
            "anthropic",
            "--llm-model",
            "claude-haiku-4-5",
        ],
        &[("FLEET_TOKEN", token)],
    )?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    Ok(out.stdout.trim().to_string())
}

/// Submits `n` runs of the agent graph `key` (open API) and waits for each to succeed; both
/// workers of the stack must have run some of their jobs.
async fn runs_on_both_workers(stack: &Stack, key: &str, n: usize) -> anyhow::Result<()> {
    let dir = graph_dir(stack, key)?;
    let repo = fleet_tests::submit::git_repo(&dir, "repo", &[("a.txt", "a\n")])?;
    let mut runs = Vec::new();
    for n in 0..n {
        std::fs::write(
            dir.join(format!("in-{n}.json")),
            json!({"n": n}).to_string(),
        )?;
        let out = stack.cli(&[
            "submit",
            "--graph",
            &dir.join("graph.yaml").display().to_string(),
            "--repo",
            &repo.display().to_string(),
            "--input",
            &dir.join(format!("in-{n}.json")).display().to_string(),
            "--llm-api",
            "anthropic",
            "--llm-model",
            "claude-haiku-4-5",
        ])?;
        anyhow::ensure!(out.code == 0, "{}", out.stderr);
        runs.push(out.stdout.trim().to_string());
    }
    let mut workers = std::collections::BTreeSet::new();
    for run in &runs {
        let v = stack.wait_run(run, Duration::from_secs(120)).await?;
        assert_eq!(v["status"], "succeeded", "{v}");
        for j in v["jobs"].as_array().into_iter().flatten() {
            workers.insert(j["worker"].as_str().unwrap_or_default().to_string());
        }
    }
    assert_eq!(workers.len(), 2, "both workers ran agents: {workers:?}");
    Ok(())
}

async fn get(stack: &Stack, token: &str, path: &str) -> anyhow::Result<Value> {
    Ok(reqwest::Client::new()
        .get(format!("{}{path}", stack.server))
        .bearer_auth(token)
        .send()
        .await?
        .json()
        .await?)
}

async fn wait_ended(stack: &Stack, token: &str, run: &str) -> anyhow::Result<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let v = get(stack, token, &format!("/v1/runs/{run}")).await?;
        if !matches!(v["status"].as_str(), Some("running") | Some("pending")) {
            return Ok(v);
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "still running: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_is_warned_at_80_percent_and_stopped_at_100_at_its_next_llm_call(
) -> anyhow::Result<()> {
    let mut a_replies: Vec<ScriptedReply> = (0..10)
        .map(|_| ScriptedReply::tool_use("list_dir", json!({"path": "."})).with_usage(100, 0))
        .collect();
    a_replies.push(ScriptedReply::tool_use("submit", json!({"done": true})));
    let b_replies = vec![
        ScriptedReply::tool_use("list_dir", json!({"path": "."})).with_usage(100, 0),
        ScriptedReply::tool_use("list_dir", json!({"path": "."})).with_usage(100, 0),
        ScriptedReply::tool_use("submit", json!({"done": true})).with_usage(100, 0),
    ];
    let llm = FakeLlm::start_conversations(
        vec![
            Conversation::new("team-a-work", a_replies),
            Conversation::new("team-b-work", b_replies),
        ],
        Duration::ZERO,
    )
    .await?;
    let received: Received = Default::default();
    let hook = fake_webhook(received.clone(), "/team-a").await?;
    let stack = Stack::start_config(StackConfig {
        tag: "quota",
        workers: 1,
        coordinator_env: &[("FLEET_OPEN_API", "0")],
        common_env: &[("FLEET_WEBHOOK_SECRET", SECRET)],
        worker_env: &[
            ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
            ("ANTHROPIC_API_KEY", "test-key"),
            // 100 input tokens cost one dollar.
            ("FLEET_PRICES", r#"{"claude-haiku-4-5": [10000.0, 0.0]}"#),
        ],
        ..StackConfig::default()
    })
    .await?;
    let admin_a =
        fleet_tests::stack::token_of(&stack.cli(&["token", "bootstrap", "--team", "team-a"])?)?;
    let admin_b =
        fleet_tests::stack::token_of(&stack.cli(&["token", "bootstrap", "--team", "team-b"])?)?;
    let as_a = [("FLEET_TOKEN", admin_a.as_str())];
    let out = stack.cli_env(&["team", "limits", "--daily-usd", "5"], &as_a)?;
    anyhow::ensure!(out.code == 0, "limits: {}", out.stderr);
    let out = stack.cli_env(&["team", "webhook", &hook], &as_a)?;
    anyhow::ensure!(out.code == 0, "webhook: {}", out.stderr);

    let run_a = submit_llm(&stack, &graph_dir(&stack, "team-a-work")?, &admin_a)?;
    let run_b = submit_llm(&stack, &graph_dir(&stack, "team-b-work")?, &admin_b)?;
    let done_a = wait_ended(&stack, &admin_a, &run_a).await?;
    let done_b = wait_ended(&stack, &admin_b, &run_b).await?;

    // Team A: five calls of a dollar made, the sixth refused before it was sent.
    assert_eq!(done_a["status"], "failed", "{done_a}");
    let errors: Vec<&str> = done_a["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|j| j["error"].as_str())
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("budget_exhausted") && e.contains("daily_usd")),
        "{errors:?}"
    );
    assert_eq!(
        llm.remaining_in("team-a-work"),
        Some(6),
        "exactly five calls reached the provider"
    );
    // Team B is not held by team A's spend.
    assert_eq!(done_b["status"], "succeeded", "{done_b}");
    assert_eq!(llm.remaining_in("team-b-work"), Some(0));

    // The notices: 80% then 100%, once each, on team A only.
    let events = get(&stack, &admin_a, "/v1/team/events").await?;
    let marks: Vec<(String, u64)> = events
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["event"].as_str().unwrap_or_default().to_string(),
                e["percent"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        marks,
        vec![
            ("budget_exhausted".to_string(), 100),
            ("budget_warning".to_string(), 80)
        ]
    );
    assert_eq!(get(&stack, &admin_b, "/v1/team/events").await?, json!([]));
    let shown = stack.cli_env(&["team", "show"], &as_a)?;
    assert!(
        shown.stdout.contains("$5.0000 of $5.00 (100%)"),
        "{}",
        shown.stdout
    );

    // The warning reached the team's webhook, signed; its first attempt got a 500 and was
    // retried, every attempt in the team's delivery log.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let warning = loop {
        let found = received
            .lock()
            .unwrap()
            .iter()
            .find(|(h, _, status)| {
                header(h, "x-fleet-event") == "team.budget_warning" && *status == 200
            })
            .cloned();
        if let Some(f) = found {
            break f;
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "no warning delivered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (headers, body, _) = warning;
    let signature = header(&headers, "x-fleet-signature").to_string();
    // Signed with team a's own key (issue 42: one team's key verifies no other's).
    let key = shared::schedule::webhook::team_secret(SECRET, "team-a");
    assert!(shared::schedule::webhook::verify(
        key.as_bytes(),
        &body,
        &signature
    ));
    let body: Value = serde_json::from_slice(&body)?;
    assert_eq!(body["notice"]["scope"], "daily_usd");
    assert_eq!(body["notice"]["run"], run_a.as_str());
    let log = get(&stack, &admin_a, "/v1/team/deliveries").await?;
    assert!(
        log.as_array()
            .into_iter()
            .flatten()
            .any(|d| d["event"] == "team.budget_warning" && d["state"] == "delivered"),
        "{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_at_its_limit_of_runs_under_way_waits_for_one_to_end() -> anyhow::Result<()> {
    let stack = Stack::start_config(StackConfig {
        tag: "quota-runs",
        workers: 1,
        coordinator_env: &[("FLEET_OPEN_API", "0")],
        ..StackConfig::default()
    })
    .await?;
    let admin =
        fleet_tests::stack::token_of(&stack.cli(&["token", "bootstrap", "--team", "team-c"])?)?;
    let as_c = [("FLEET_TOKEN", admin.as_str())];
    let out = stack.cli_env(&["team", "limits", "--concurrent-runs", "1"], &as_c)?;
    anyhow::ensure!(out.code == 0, "limits: {}", out.stderr);
    let dir = stack.dir.path().join("gated");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("graph.yaml"),
        "name: gated\nstart: gate\nnodes:\n  gate: {kind: approval, routes: [{to: done}]}\n  done: {kind: exit, status: gate.ok}\n",
    )?;
    let repo = fleet_tests::submit::git_repo(&dir, "repo", &[("a.txt", "a\n")])?;
    let submit = |n: u32| -> anyhow::Result<fleet_tests::stack::CliOutput> {
        let input = dir.join(format!("input-{n}.json"));
        std::fs::write(&input, json!({"n": n}).to_string())?;
        fleet_tests::submit::submit_as(&stack, &dir.join("graph.yaml"), &repo, &input, &admin)
    };
    let first = submit(1)?;
    anyhow::ensure!(first.code == 0, "{}", first.stderr);
    let first = first.stdout.trim().to_string();
    let refused = submit(2)?;
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("429") && refused.stderr.contains("concurrent_runs"),
        "{}",
        refused.stderr
    );
    // The same submission again is the same run, not a second one.
    let again = submit(1)?;
    assert_eq!(again.stdout.trim(), first, "{}", again.stderr);
    let out = stack.cli_env(&["cancel", &first], &as_c)?;
    anyhow::ensure!(out.code == 0, "cancel: {}", out.stderr);
    wait_ended(&stack, &admin, &first).await?;
    let second = submit(2)?;
    assert_eq!(second.code, 0, "{}", second.stderr);
    let view = get(&stack, &admin, "/v1/team").await?;
    assert_eq!(view["runs_under_way"], 1, "{view}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_under_one_provider_limit_never_exceed_it_together() -> anyhow::Result<()> {
    const RUNS: usize = 4;
    const CALLS: u32 = 3;
    const WINDOW: Duration = Duration::from_secs(4);
    // Each run: list, list, submit; the lists first, so every run ends on one submit.
    let mut replies: Vec<ScriptedReply> = (0..RUNS * 2)
        .map(|_| ScriptedReply::tool_use("list_dir", json!({"path": "."})))
        .collect();
    replies.extend((0..RUNS).map(|_| ScriptedReply::tool_use("submit", json!({"done": true}))));
    let llm = FakeLlm::start(replies).await?;
    let stack = Stack::start_config(StackConfig {
        tag: "quota-rate",
        workers: 2,
        concurrency: 2,
        worker_env: &[
            ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
            ("ANTHROPIC_API_KEY", "test-key"),
            ("FLEET_LLM_RATE", "3/4"),
        ],
        ..StackConfig::default()
    })
    .await?;
    runs_on_both_workers(&stack, "shared-work", RUNS).await?;
    let mut at: Vec<SystemTime> = llm.requests().iter().map(|r| r.received_at).collect();
    at.sort();
    assert_eq!(at.len(), RUNS * 3);
    // No window holds more than CALLS requests (less 100 ms: a request reaches the fake a
    // little after the ledger admitted it, on Redis's clock).
    let window = WINDOW - Duration::from_millis(100);
    for (i, start) in at.iter().enumerate() {
        let inside = at[i..]
            .iter()
            .take_while(|t| t.duration_since(*start).unwrap_or_default() < window)
            .count();
        assert!(
            inside <= CALLS as usize,
            "{inside} calls within {window:?} from call {i}: {at:?}"
        );
    }
    // And the limit was what held them: 12 calls at 3 per 4 s span at least 12 s.
    let span = at[at.len() - 1].duration_since(at[0])?;
    assert!(span >= Duration::from_secs(11), "{span:?}");
    Ok(())
}

/// The Redis ledger's rules, one by one, on the real server.
#[tokio::test]
async fn the_redis_ledger_keeps_budgets_windows_back_offs_runs_and_notices() -> anyhow::Result<()> {
    let ns = unique_namespace("ledger");
    let ledger = RedisLedger::connect(REDIS_URL, &ns).await?;
    let limits = TeamLimits {
        daily_tokens: Some(1000),
        ..TeamLimits::default()
    };
    ledger.set_limits("t", &limits).await?;
    assert_eq!(ledger.limits("t").await?, limits);
    let bounds = limits.bounds();
    let call = Call {
        team: Some("t"),
        run: "r1",
        provider: "openai",
        day: "2026-11-23",
    };
    let none = Rates::default();
    assert_eq!(ledger.admit(&call, &bounds, &none).await?, Admission::Go);
    let spend = |tokens| Spent {
        usd_micros: 0,
        tokens,
    };
    assert!(ledger
        .record(&call, spend(700), &bounds, None, "t0")
        .await?
        .is_empty());
    let warned = ledger
        .record(&call, spend(100), &bounds, None, "t1")
        .await?;
    assert_eq!(warned.len(), 1);
    assert_eq!(
        (warned[0].percent, warned[0].scope),
        (80, QuotaScope::DailyTokens)
    );
    let stopped = ledger
        .record(&call, spend(500), &bounds, None, "t2")
        .await?;
    assert_eq!(stopped[0].event, "budget_exhausted");
    assert_eq!(
        ledger.admit(&call, &bounds, &none).await?,
        Admission::Exhausted(QuotaScope::DailyTokens)
    );
    assert_eq!(ledger.used("t", "2026-11-23").await?, (spend(1300), 3));
    // The open API's runs are under no team's budget.
    let open = Call {
        team: None,
        ..call.clone()
    };
    assert_eq!(ledger.admit(&open, &bounds, &none).await?, Admission::Go);

    // The fleet's window, a 429's back-off for everyone, the rate halved and grown back.
    let fleet = Rate {
        calls: 4,
        per_seconds: 1,
    };
    let rates = Rates {
        team: None,
        fleet: Some(fleet),
    };
    let other = Call {
        team: Some("u"),
        run: "r2",
        ..call.clone()
    };
    let free = TeamLimits::default().bounds();
    for _ in 0..4 {
        assert_eq!(ledger.admit(&other, &free, &rates).await?, Admission::Go);
    }
    assert!(
        matches!(ledger.admit(&other, &free, &rates).await?, Admission::Wait(w) if w <= Duration::from_secs(1))
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    ledger
        .throttled("openai", Duration::from_millis(600), Some(fleet))
        .await?;
    assert!(
        matches!(ledger.admit(&other, &free, &rates).await?, Admission::Wait(w) if w <= Duration::from_millis(600))
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(ledger.admit(&other, &free, &rates).await?, Admission::Go);
    assert_eq!(ledger.admit(&other, &free, &rates).await?, Admission::Go);
    assert!(
        matches!(
            ledger.admit(&other, &free, &rates).await?,
            Admission::Wait(_)
        ),
        "halved to 2"
    );
    for _ in 0..2 {
        ledger
            .record(&other, spend(1), &free, Some(fleet), "t")
            .await?;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for _ in 0..4 {
        assert_eq!(
            ledger.admit(&other, &free, &rates).await?,
            Admission::Go,
            "back to 4"
        );
    }

    // Runs under way.
    assert!(ledger.admit_run("t", "a", Some(1)).await?);
    assert!(!ledger.admit_run("t", "b", Some(1)).await?);
    ledger.run_ended("t", "a").await?;
    assert!(ledger.admit_run("t", "b", Some(1)).await?);
    assert_eq!(ledger.runs_under_way("t").await?, vec!["b".to_string()]);

    // Notices: each handed to one consumer, done once delivered.
    let first = ledger.take_notices("c1").await?;
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(ledger.take_notices("c2").await?.is_empty(), "taken by c1");
    ledger.notice_done(&first[0].0).await?;
    assert_eq!(ledger.events("t", 10).await?.len(), 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_429_holds_every_workers_calls_then_they_go_on() -> anyhow::Result<()> {
    const RUNS: usize = 4;
    let mut replies = vec![ScriptedReply::throttled(3)];
    replies
        .extend((0..RUNS * 2).map(|_| ScriptedReply::tool_use("list_dir", json!({"path": "."}))));
    replies.extend((0..RUNS).map(|_| ScriptedReply::tool_use("submit", json!({"done": true}))));
    let llm = FakeLlm::start(replies).await?;
    let stack = Stack::start_config(StackConfig {
        tag: "quota-429",
        workers: 2,
        concurrency: 2,
        worker_env: &[
            ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
            ("ANTHROPIC_API_KEY", "test-key"),
        ],
        ..StackConfig::default()
    })
    .await?;
    runs_on_both_workers(&stack, "throttled-work", RUNS).await?;
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1 + RUNS * 3);
    let throttled_at = reqs[0].received_at;
    assert_eq!(reqs[0].status, 429);
    // While the provider asked for 3 s, no worker called it (a call already admitted may land
    // just after the 429: 300 ms of grace); then the calls went on.
    let after = |r: &fleet_tests::fake_llm::RecordedRequest| {
        r.received_at
            .duration_since(throttled_at)
            .unwrap_or_default()
    };
    let held: Vec<Duration> = reqs[1..]
        .iter()
        .map(after)
        .filter(|d| *d > Duration::from_millis(300) && *d < Duration::from_millis(2900))
        .collect();
    assert!(held.is_empty(), "calls made during the back-off: {held:?}");
    let resumed = reqs[1..]
        .iter()
        .filter(|r| after(r) >= Duration::from_millis(2900))
        .count();
    assert!(resumed >= RUNS, "{resumed} calls after the back-off");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teams_webhook_hears_of_its_runs_approvals_and_batches() -> anyhow::Result<()> {
    let received: Received = Default::default();
    let hook = fake_webhook(received.clone(), "/team-d").await?;
    let root = std::env::temp_dir().canonicalize()?.display().to_string();
    let stack = Stack::start_config(StackConfig {
        tag: "team-hooks",
        workers: 1,
        coordinator_env: &[("FLEET_OPEN_API", "0"), ("FLEET_REPO_ROOTS", &root)],
        common_env: &[("FLEET_WEBHOOK_SECRET", SECRET)],
        ..StackConfig::default()
    })
    .await?;
    let admin =
        fleet_tests::stack::token_of(&stack.cli(&["token", "bootstrap", "--team", "team-d"])?)?;
    let as_d = [("FLEET_TOKEN", admin.as_str())];
    let out = stack.cli_env(&["team", "webhook", &hook], &as_d)?;
    anyhow::ensure!(out.code == 0, "webhook: {}", out.stderr);
    // A run that names no webhook of its own: its approval and its end go to the team's.
    let dir = stack.dir.path().join("gated");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("graph.yaml"),
        "name: gated\nstart: gate\nnodes:\n  gate: {kind: approval, routes: [{to: done}]}\n  done: {kind: exit, status: gate.ok}\n",
    )?;
    std::fs::write(dir.join("input.json"), "{}")?;
    std::fs::write(dir.join("script.json"), "{}")?;
    let repo = fleet_tests::stack::make_calc_repo(stack.dir.path())?;
    let p = |f: &str| dir.join(f).display().to_string();
    let out = stack.cli_env(
        &[
            "submit",
            "--graph",
            &p("graph.yaml"),
            "--repo",
            &repo.display().to_string(),
            "--input",
            &p("input.json"),
            "--script",
            &p("script.json"),
        ],
        &as_d,
    )?;
    anyhow::ensure!(out.code == 0, "submit: {}", out.stderr);
    let run = out.stdout.trim().to_string();
    let out = stack.cli_env(&["approve", &run, "gate"], &as_d)?;
    anyhow::ensure!(out.code == 0, "approve: {}", out.stderr);
    // A batch of one item: its end goes to the team's webhook too.
    let item = json!({"id": "gold", "repo": repo,
        "work_order": serde_json::from_str::<Value>(&std::fs::read_to_string(fleet_tests::stack::example("factory-calc/work_order.json"))?)?,
        "script": serde_json::from_str::<Value>(&std::fs::read_to_string(fleet_tests::stack::example("factory-calc/script-pass.json"))?)?});
    std::fs::write(dir.join("data.jsonl"), format!("{item}\n"))?;
    let out = stack.cli_env(&["batch", "submit", &p("data.jsonl")], &as_d)?;
    anyhow::ensure!(out.code == 0, "batch: {}", out.stderr);
    let batch = out.stdout.trim().to_string();

    let wanted = [
        "run.approval_requested",
        "run.run_finished",
        "team.batch_finished",
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let seen: Vec<(String, Vec<u8>, u16)> = received
            .lock()
            .unwrap()
            .iter()
            .map(|(h, b, s)| (header(h, "x-fleet-event").to_string(), b.clone(), *s))
            .collect();
        let delivered = |event: &str| seen.iter().any(|(e, _, s)| e == event && *s == 200);
        if wanted.iter().all(|e| delivered(e)) {
            let (_, body, _) = seen
                .iter()
                .find(|(e, _, s)| e == "team.batch_finished" && *s == 200)
                .expect("delivered");
            let h = received
                .lock()
                .unwrap()
                .iter()
                .find(|(h, _, s)| header(h, "x-fleet-event") == "team.batch_finished" && *s == 200)
                .map(|(h, _, _)| header(h, "x-fleet-signature").to_string())
                .unwrap_or_default();
            let key = shared::schedule::webhook::team_secret(SECRET, "team-d");
            assert!(shared::schedule::webhook::verify(key.as_bytes(), body, &h));
            let body: Value = serde_json::from_slice(body)?;
            assert_eq!(body["batch_id"], batch.as_str());
            assert_eq!(body["counts"]["passed"], 1, "{body}");
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "not every notice delivered: {:?}",
            seen.iter()
                .map(|(e, _, s)| (e.clone(), *s))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let log = get(&stack, &admin, "/v1/team/deliveries").await?;
    assert!(
        log.as_array()
            .into_iter()
            .flatten()
            .any(|d| d["event"] == "team.batch_finished"),
        "{log}"
    );
    Ok(())
}

const WIDE: &str = r#"
name: wide
start: spread
nodes:
  spread: {kind: fanout, over: input.items, body: work, join: gather}
  work:
    kind: command
    commands: ["sleep 3", "echo {{ item }}"]
    image: fleet-agent-py:1
    worktree: {from: base, mode: ro}
    routes: [{to: gather}]
  gather: {kind: join, routes: [{to: done}]}
  done: {kind: exit, status: gather.output.count == (input.items | length)}
"#;

/// The most of `spans` (start, end) that overlap at any instant.
fn most_at_once(spans: &[(String, String)]) -> usize {
    let mut edges: Vec<(chrono::DateTime<chrono::Utc>, i32)> = Vec::new();
    for (start, end) in spans {
        edges.push((start.parse().expect("a start time"), 1));
        edges.push((end.parse().expect("an end time"), -1));
    }
    // An end and a start at the same instant do not overlap.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

/// Each job's (started_at, ended_at) of a finished run's view.
fn spans(view: &Value) -> Vec<(String, String)> {
    view["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|j| {
            Some((
                j["started_at"].as_str()?.to_string(),
                j["ended_at"].as_str()?.to_string(),
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_at_its_concurrent_jobs_runs_that_many_at_once_over_all_its_runs(
) -> anyhow::Result<()> {
    // Room for six jobs at once; team A may have two in flight, team B has no limit.
    let stack = Stack::start_config(StackConfig {
        tag: "quota-jobs",
        workers: 2,
        concurrency: 3,
        coordinator_env: &[("FLEET_OPEN_API", "0")],
        ..StackConfig::default()
    })
    .await?;
    let admin_a =
        fleet_tests::stack::token_of(&stack.cli(&["token", "bootstrap", "--team", "team-a"])?)?;
    let admin_b =
        fleet_tests::stack::token_of(&stack.cli(&["token", "bootstrap", "--team", "team-b"])?)?;
    let as_a = [("FLEET_TOKEN", admin_a.as_str())];
    let out = stack.cli_env(&["team", "limits", "--concurrent-jobs", "2"], &as_a)?;
    anyhow::ensure!(out.code == 0, "limits: {}", out.stderr);

    let dir = stack.dir.path().join("wide");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("graph.yaml"), WIDE)?;
    let repo = fleet_tests::submit::git_repo(&dir, "repo", &[("a.txt", "a\n")])?;
    let submit = |n: u32, token: &str| -> anyhow::Result<String> {
        let input = dir.join(format!("input-{n}.json"));
        // Items of their own per run: no step is a cache hit of another.
        let items: Vec<u32> = (1..=3).map(|i| n * 10 + i).collect();
        std::fs::write(&input, json!({ "items": items }).to_string())?;
        fleet_tests::submit::submit_run_as(&stack, &dir.join("graph.yaml"), &repo, &input, token)
    };
    // Two runs of team A (six jobs), a third cancelled while its jobs wait, then team B's.
    let a1 = submit(1, &admin_a)?;
    let a2 = submit(2, &admin_a)?;
    let a3 = submit(3, &admin_a)?;
    let b1 = submit(4, &admin_b)?;
    let mut most_waiting = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while most_waiting == 0 {
        let view = get(&stack, &admin_a, "/v1/team").await?;
        assert!(
            view["jobs_in_flight"].as_u64() <= Some(2),
            "team A holds at most two slots: {view}"
        );
        most_waiting = view["jobs_waiting"].as_u64().unwrap_or(0);
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "no job ever waited: {view}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = stack.cli_env(&["status", &a1], &as_a)?;
    assert!(
        status.stderr.contains("team team-a:") && status.stderr.contains("jobs in flight"),
        "fleet status shows the team's quotas: {}",
        status.stderr
    );
    let out = stack.cli_env(&["cancel", &a3], &as_a)?;
    anyhow::ensure!(out.code == 0, "cancel: {}", out.stderr);

    let done_b = wait_ended(&stack, &admin_b, &b1).await?;
    let done_a1 = wait_ended(&stack, &admin_a, &a1).await?;
    let done_a2 = wait_ended(&stack, &admin_a, &a2).await?;
    let done_a3 = wait_ended(&stack, &admin_a, &a3).await?;
    assert_eq!(done_a1["status"], "succeeded", "{done_a1}");
    assert_eq!(done_a2["status"], "succeeded", "{done_a2}");
    assert_eq!(done_b["status"], "succeeded", "{done_b}");
    assert_eq!(done_a3["status"], "cancelled", "{done_a3}");

    // Measured from the jobs' own start and end times: never more than two of team A's jobs
    // ran at once, over both of its runs; all six ran.
    let mut team_a = spans(&done_a1);
    team_a.extend(spans(&done_a2));
    assert_eq!(team_a.len(), 6, "{done_a1} {done_a2}");
    for view in [&done_a1, &done_a2, &done_b] {
        let ok = view["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|j| j["status"] == "ok");
        assert!(ok, "every job slept and succeeded: {view}");
    }
    assert!(
        most_at_once(&team_a) <= 2,
        "team A ran {} jobs at once: {team_a:?}",
        most_at_once(&team_a)
    );
    // The cancelled run's jobs waited in line and never ran.
    assert!(
        spans(&done_a3).is_empty(),
        "a job of the cancelled run ran: {done_a3}"
    );
    // Team B was not held behind team A: its run ended before team A's work did.
    let ended = |v: &Value| v["finished_at"].as_str().unwrap_or_default().to_string();
    assert!(
        ended(&done_b) < ended(&done_a1).max(ended(&done_a2)),
        "team B waited for team A: {} vs {} {}",
        ended(&done_b),
        ended(&done_a1),
        ended(&done_a2)
    );
    // Nothing is left holding a slot or waiting.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let view = get(&stack, &admin_a, "/v1/team").await?;
        if view["jobs_in_flight"] == 0 && view["jobs_waiting"] == 0 {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "slots left behind: {view}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let show = stack.cli_env(&["team", "show"], &as_a)?;
    assert!(
        show.stdout.contains("jobs in flight 0 of 2, 0 waiting"),
        "{}",
        show.stdout
    );
    Ok(())
}
