//! Retries as the providers ask, against the strict fake: its rate limit of N requests per
//! window (429 with `retry-after` and `x-should-retry: true`) under load from 4 workers × 8
//! agents at once, every run ending; `x-should-retry: false` ends a call at once, a 409 is
//! retried.

use super::refusals::CLAUDE;
use fleet_tests::fake_llm::{FakeLlm, ScriptedReply};
use fleet_tests::stack::Stack;
use serde_json::{json, Value};
use std::time::{Duration, Instant, SystemTime};

const GRAPH: &str = r#"
name: load
start: work
nodes:
  work:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    image: fleet-agent-py:1
    tools: []
    routes: [{to: done}]
  done: {kind: exit, status: work.ok}
"#;

/// Submits run `n` of the graph (its input names `n`: identical submissions are one run).
fn submit(stack: &Stack, n: usize) -> anyhow::Result<String> {
    let dir = stack.dir.path().join("g");
    if !dir.exists() {
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("graph.yaml"), GRAPH)?;
        std::fs::write(dir.join("prompt.md"), "submit at once\n")?;
        std::fs::write(dir.join("schema.json"), r#"{"type": "object"}"#)?;
        fleet_tests::submit::git_repo(&dir, "repo", &[("a.txt", "a\n")])?;
    }
    let input = dir.join(format!("input-{n}.json"));
    std::fs::write(&input, json!({ "n": n }).to_string())?;
    let p = |f: &str| dir.join(f).display().to_string();
    let out = stack.cli(&[
        "submit",
        "--graph",
        &p("graph.yaml"),
        "--repo",
        &p("repo"),
        "--input",
        &input.display().to_string(),
        "--llm-api",
        "anthropic",
        "--llm-model",
        CLAUDE,
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    Ok(out.stdout.trim().to_string())
}

async fn stack(
    tag: &str,
    llm: &FakeLlm,
    workers: usize,
    extra: &[(&str, &str)],
) -> anyhow::Result<Stack> {
    let mut env = vec![
        ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
        ("ANTHROPIC_API_KEY", "k"),
    ];
    env.extend_from_slice(extra);
    Stack::start(tag, workers, &env).await
}

/// The most requests the fake accepted (200) in any `per`, from its own log.
fn most_accepted_in(llm: &FakeLlm, per: Duration) -> usize {
    let times: Vec<SystemTime> = llm
        .requests()
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| r.received_at)
        .collect();
    times
        .iter()
        .map(|start| {
            times
                .iter()
                .filter(|t| t.duration_since(*start).is_ok_and(|d| d < per))
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_rate_limit_under_4_workers_x_8_agents_is_obeyed_and_every_run_ends(
) -> anyhow::Result<()> {
    const RUNS: usize = 32;
    const LIMIT: usize = 8;
    const PER: Duration = Duration::from_secs(4);
    let replies = (0..RUNS)
        .map(|_| ScriptedReply::tool_use("submit", json!({"done": true})))
        .collect();
    let llm = FakeLlm::start(replies).await?;
    llm.rate_limit(LIMIT, PER);
    // The fleet is not told the provider's limit: it learns it from the 429s.
    let stack = stack("provload", &llm, 4, &[("FLEET_CONCURRENCY", "8")]).await?;
    let started = Instant::now();
    let runs: Vec<String> = (0..RUNS)
        .map(|n| submit(&stack, n))
        .collect::<Result<_, _>>()?;
    let mut ended: Vec<Value> = Vec::new();
    for run in &runs {
        ended.push(stack.wait_run(run, Duration::from_secs(120)).await?);
    }
    let wall = started.elapsed();
    let reqs = llm.requests();
    let throttled = reqs.iter().filter(|r| r.status == 429).count();
    let accepted = reqs.iter().filter(|r| r.status == 200).count();
    let workers: std::collections::BTreeSet<String> = ended
        .iter()
        .flat_map(|s| s["jobs"].as_array().cloned().unwrap_or_default())
        .filter_map(|j| j["worker"].as_str().map(str::to_string))
        .collect();
    eprintln!(
        "{RUNS} runs on {} workers in {wall:?}: {accepted} calls accepted, {throttled} answered 429",
        workers.len()
    );
    for s in &ended {
        assert_eq!(s["status"], "succeeded", "{s}");
    }
    assert_eq!(accepted, RUNS);
    assert!(most_accepted_in(&llm, PER) <= LIMIT);
    assert!(
        throttled > 0,
        "the load never met the limit: the test shows nothing"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_should_retry_false_ends_a_call_and_a_409_is_retried() -> anyhow::Result<()> {
    let llm = FakeLlm::start(vec![
        ScriptedReply::error(529).should_retry(false),
        ScriptedReply::tool_use("submit", json!({"done": true})),
        ScriptedReply::error(409),
        ScriptedReply::tool_use("submit", json!({"done": true})),
    ])
    .await?;
    let stack = stack("provretry", &llm, 1, &[]).await?;
    let first = submit(&stack, 1)?;
    let status = stack.wait_run(&first, Duration::from_secs(60)).await?;
    assert_eq!(status["status"], "failed", "{status}");
    assert_eq!(
        llm.requests().len(),
        1,
        "a call the provider said not to retry was retried"
    );
    // The next run gets the first submit; the one after, a 409 (retried) then the other.
    for n in [2, 3] {
        let run = submit(&stack, n)?;
        let status = stack.wait_run(&run, Duration::from_secs(60)).await?;
        assert_eq!(status["status"], "succeeded", "{status}");
    }
    assert_eq!(llm.remaining(), 0);
    let statuses: Vec<u16> = llm.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![529, 200, 409, 200]);
    Ok(())
}
