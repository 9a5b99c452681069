//! Graph-language features on the real stack: git steps with structured conflicts, a dynamic
//! fan-out with a worktree per branch, continued agent sessions and nudges before the timeout.

use fleet_tests::fake_llm::{Conversation, FakeLlm, ScriptedReply};
use fleet_tests::stack::{make_calc_repo, Stack};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

const SCHEMA: &str = r#"{"type": "object", "required": ["summary"], "properties": {"summary": {"type": "string"}, "items": {"type": "array"}}}"#;

/// Writes a graph with a prompt template and an output schema beside it.
fn graph(dir: &Path, name: &str, yaml: &str) -> anyhow::Result<String> {
    let d = dir.join(name);
    std::fs::create_dir_all(&d)?;
    std::fs::write(d.join("graph.yaml"), yaml)?;
    std::fs::write(
        d.join("prompt.md"),
        "Node {{ params.name }}: do the work. {{ params.extra }}",
    )?;
    std::fs::write(d.join("schema.json"), SCHEMA)?;
    Ok(d.join("graph.yaml").display().to_string())
}

async fn run(
    stack: &Stack,
    graph: &str,
    input: Value,
    agent: &[&str],
) -> anyhow::Result<(String, Value)> {
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let input_path = stack
        .dir
        .path()
        .join(format!("input-{}.json", rand_suffix()));
    std::fs::write(&input_path, serde_json::to_vec(&input)?)?;
    let input_arg = input_path.display().to_string();
    let mut args = vec![
        "submit", "--graph", graph, "--repo", &repo, "--input", &input_arg,
    ];
    args.extend_from_slice(agent);
    let out = stack.cli(&args)?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let id = out.stdout.trim().to_string();
    let status = stack.wait_run(&id, Duration::from_secs(120)).await?;
    Ok((id, status))
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

const CONFLICT: &str = r#"
name: conflict
start: split
nodes:
  split:
    kind: harness
    op: noop
    routes: [{to: [left, right]}]
  left:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    tools: [write_file]
    image: fleet-agent-py:1
    worktree: {from: base, mode: rw, commit: true}
    writes: ["'calc.py'", "'left.txt'"]
    with: {name: "'left'"}
    routes: [{to: both}]
  right:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    tools: [write_file]
    image: fleet-agent-py:1
    worktree: {from: base, mode: rw, commit: true}
    writes: ["'calc.py'", "'right.txt'"]
    with: {name: "'right'"}
    routes: [{to: both}]
  both:
    kind: join
    wait_for: [left, right]
    routes: [{to: pick}]
  pick:
    kind: git
    op: cherry_pick
    worktree: {from: base, mode: rw, commit: true}
    with: {commits: "[left.commit, right.commit]"}
    routes:
      - to: merged
        when: pick.ok
      - to: conflicted
  merged: {kind: exit, status: "true"}
  conflicted: {kind: exit, status: "false"}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cherry_pick_conflict_is_structured_output_and_a_clean_one_merges() -> anyhow::Result<()>
{
    let stack = Stack::start("gitops", 2, &[]).await?;
    let g = graph(stack.dir.path(), "conflict", CONFLICT)?;
    let step =
        |file: &str, text: &str| json!([{"files": {file: text}, "output": {"summary": "edit"}}]);
    // Both branches rewrite calc.py: the second pick conflicts.
    let script = json!({"left": step("calc.py", "def add(a, b):\n    return b + a\n"),
                        "right": step("calc.py", "def add(a, b):\n    return a.__add__(b)\n")});
    let sp = stack.dir.path().join("conflict.json");
    std::fs::write(&sp, serde_json::to_vec(&script)?)?;
    let (id, status) = run(
        &stack,
        &g,
        json!({}),
        &["--script", &sp.display().to_string()],
    )
    .await?;
    assert_eq!(status["status"], "failed");
    let result = stack.get(&format!("/v1/runs/{id}/result")).await?;
    let pick = &result["result"]["outputs"]["pick"]["output"];
    assert_eq!(
        pick["conflicts"][0]["paths"],
        json!(["calc.py"]),
        "{result}"
    );
    assert_eq!(
        pick["applied"].as_array().unwrap().len(),
        1,
        "the first pick applied"
    );
    assert_eq!(result["result"]["exit"], "conflicted");

    // Different files: both picks apply and the result is one commit after the other.
    let script = json!({"left": step("left.txt", "L\n"), "right": step("right.txt", "R\n")});
    let sp = stack.dir.path().join("clean.json");
    std::fs::write(&sp, serde_json::to_vec(&script)?)?;
    let (id, status) = run(
        &stack,
        &g,
        json!({"round": 2}),
        &["--script", &sp.display().to_string()],
    )
    .await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let result = stack.get(&format!("/v1/runs/{id}/result")).await?;
    assert_eq!(
        result["result"]["outputs"]["pick"]["output"]["applied"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    Ok(())
}

const FANOUT: &str = r#"
name: spread
start: plan
nodes:
  plan:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    image: fleet-agent-py:1
    with: {name: "'plan'"}
    routes: [{to: each}]
  each:
    kind: fanout
    over: plan.output.items
    body: work
    join: gather
  work:
    kind: command
    image: fleet-agent-py:1
    worktree: {from: base, mode: rw, commit: true}
    writes: ["'out-*.txt'"]
    commands: ["python -c \"open('out-{{ item }}.txt', 'w').write('{{ item }}')\""]
    routes: [{to: check}]
  check:
    kind: command
    image: fleet-agent-py:1
    worktree: {from: work, mode: ro}
    commands: ["python -c \"import os, sys; sys.exit(0 if os.listdir('.') .count('out-{{ item }}.txt') == 1 and len([f for f in os.listdir('.') if f.startswith('out-')]) == 1 else 1)\""]
    routes: [{to: gather}]
  gather:
    kind: join
    routes: [{to: done}]
  done:
    kind: exit
    status: gather.ok and gather.output.count == (plan.output.items | length)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_over_an_output_list_runs_a_chain_per_branch_in_its_own_worktree(
) -> anyhow::Result<()> {
    let stack = Stack::start("fanout", 2, &[]).await?;
    let g = graph(stack.dir.path(), "spread", FANOUT)?;
    let script = json!({"plan": [{"output": {"summary": "three", "items": ["a", "b", "c"]}}]});
    let sp = stack.dir.path().join("plan.json");
    std::fs::write(&sp, serde_json::to_vec(&script)?)?;
    let (_, status) = run(
        &stack,
        &g,
        json!({}),
        &["--script", &sp.display().to_string()],
    )
    .await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    assert_eq!(status["branches"], 3);
    assert_eq!(status["visits"]["work"], 3);
    assert_eq!(
        status["visits"]["check"], 3,
        "each branch's check saw only its own file"
    );
    assert_eq!(status["joins"]["gather"]["fired"], 1);
    assert_eq!(status["joins"]["gather"]["expected"], 3);
    Ok(())
}

const SESSION: &str = r#"
name: session
start: first
nodes:
  first:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    tools: [list_dir]
    image: fleet-agent-py:1
    worktree: {from: base, mode: ro}
    nudge_after_seconds: 1
    with: {name: "'first'", extra: "'FIRST-PROMPT'"}
    routes: [{to: second}]
  second:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    image: fleet-agent-py:1
    continues: first
    with: {name: "'second'", extra: "'the harness adds: please also summarise ' ~ first.output.summary"}
    routes: [{to: done}]
  done: {kind: exit, status: second.ok}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_continues_across_nodes_and_a_slow_agent_is_nudged() -> anyhow::Result<()> {
    let llm = FakeLlm::start_conversations(
        vec![Conversation::new(
            "FIRST-PROMPT",
            vec![
                ScriptedReply::tool_use("list_dir", json!({"path": "."})),
                ScriptedReply::tool_use("submit", json!({"summary": "looked around"})),
                ScriptedReply::tool_use("submit", json!({"summary": "summarised"})),
            ],
        )],
        Duration::from_millis(1200),
    )
    .await?;
    let stack = Stack::start(
        "session",
        1,
        &[
            ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
            ("ANTHROPIC_API_KEY", "k"),
        ],
    )
    .await?;
    let g = graph(stack.dir.path(), "session", SESSION)?;
    let (_, status) = run(
        &stack,
        &g,
        json!({}),
        &["--llm-api", "anthropic", "--llm-model", "claude-haiku-4-5"],
    )
    .await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    // After 1.2 s (past the 1 s nudge) the second call of `first` carries the nudge.
    let second_turn = reqs[1].body["messages"].to_string();
    assert!(second_turn.contains("Time is nearly up"), "{second_turn}");
    // `second` continues `first`'s conversation: the earlier turns, the submit answered, then
    // the harness's new message.
    let msgs = reqs[2].body["messages"].as_array().unwrap();
    assert!(msgs.len() >= 5, "{msgs:?}");
    assert!(msgs[0]["content"]
        .as_str()
        .unwrap_or("")
        .contains("FIRST-PROMPT"));
    let last = msgs.last().unwrap();
    assert_eq!(
        last["content"][0]["type"], "tool_result",
        "the earlier submit is answered first"
    );
    assert!(last["content"][1]["text"]
        .as_str()
        .unwrap()
        .contains("please also summarise looked around"));
    Ok(())
}

const WIDE: &str = r#"
name: wide
start: spread
nodes:
  spread:
    kind: fanout
    over: input.items
    body: noop
    join: gather
  noop:
    kind: harness
    op: noop
    routes: [{to: gather}]
  gather:
    kind: join
    routes: [{to: done}]
  done:
    kind: exit
    status: gather.output.count == (input.items | length)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_coordinators_fire_a_wide_join_exactly_once() -> anyhow::Result<()> {
    let mut stack = Stack::start_with("race", 2, 8, &[]).await?;
    stack.start_extra_coordinator()?;
    stack.start_extra_coordinator()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let g = graph(stack.dir.path(), "wide", WIDE)?;
    let items: Vec<u32> = (0..300).collect();
    let (_, status) = run(
        &stack,
        &g,
        json!({"items": items}),
        &["--script", &{
            let p = stack.dir.path().join("empty.json");
            std::fs::write(&p, "{}")?;
            p.display().to_string()
        }],
    )
    .await?;
    assert_eq!(status["status"], "succeeded", "{}", status["status"]);
    assert_eq!(status["joins"]["gather"]["fired"], 1);
    assert_eq!(status["visits"]["gather"], 1);
    assert_eq!(status["visits"]["noop"], 300);
    let done = status["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["state"] == "done")
        .count();
    assert_eq!(done, 300, "every branch's result applied exactly once");
    Ok(())
}

const SLOW: &str = r#"
name: slow
start: work
nodes:
  work:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    image: fleet-agent-py:1
    timeout_seconds: 4
    with: {name: "'work'"}
    routes: [{to: done}]
  done: {kind: exit, status: work.ok}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_worker_is_superseded_and_its_late_result_is_rejected() -> anyhow::Result<()> {
    // One job per worker: the hung worker cannot swallow the re-issued attempt. (A process that
    // hangs completely also stops its heartbeats; the broker then requeues what it held.)
    let stack = Stack::start_with("hung", 2, 1, &[]).await?;
    let g = graph(stack.dir.path(), "slow", SLOW)?;
    let script = json!({"work": [{"output": {"summary": "done"}, "delay_seconds": 3.0}]});
    let sp = stack.dir.path().join("slow.json");
    std::fs::write(&sp, serde_json::to_vec(&script)?)?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let input = stack.dir.path().join("in.json");
    std::fs::write(&input, "{}")?;
    let out = stack.cli(&[
        "submit",
        "--graph",
        &g,
        "--repo",
        &repo,
        "--input",
        &input.display().to_string(),
        "--script",
        &sp.display().to_string(),
    ])?;
    anyhow::ensure!(out.code == 0, "{}", out.stderr);
    let run = out.stdout.trim().to_string();

    // The worker that took the job hangs (SIGSTOP): no result, no ack, connection still open.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let victim = loop {
        let found = fleet_tests::stack::containers(&format!("fleet.job={run}.work.1"));
        if let Some(w) = found
            .first()
            .and_then(|c| fleet_tests::stack::container_label(c, "fleet.worker"))
        {
            break w;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the job never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stack.pause_worker(&victim)?;

    // Its deadline (start + 4 s timeout + 2 s grace) passes: attempt 2 runs on the other worker.
    let status = stack.wait_run(&run, Duration::from_secs(60)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let job = &status["jobs"][0];
    assert_eq!(job["attempt"], 2);
    assert_ne!(job["worker"].as_str(), Some(victim.as_str()));

    // The hung worker wakes up and reports attempt 1: fenced off as stale.
    stack.resume_worker(&victim)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = stack.get_text("/metrics").await?;
        let stale = metrics
            .lines()
            .any(|l| l.starts_with("fleet_events_total{applied=\"stale\"}") && !l.ends_with(" 0"));
        if stale {
            assert!(metrics.contains("fleet_jobs_reissued_total 1"), "{metrics}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the late result never came: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
    assert_eq!(
        logs.as_array().unwrap().len(),
        1,
        "one result for the job: {logs}"
    );
    Ok(())
}
