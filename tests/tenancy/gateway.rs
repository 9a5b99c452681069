//! Item 3 (and item 2's gateway part): a tenant's command agent against the worker's LLM
//! gateway. The agent is `attack_agent.py`, committed into the job's repository and run from
//! the read-only worktree (`/work`) in the job's container.

use fleet_tests::fake_llm::{FakeLlm, ScriptedReply};
use fleet_tests::stack::Stack;
use fleet_tests::submit::git_repo;
use serde_json::Value;
use std::time::Duration;

const KEY: &str = "sk-fleet-tenancy-5e1d";
const AGENT: &str = include_str!("attack_agent.py");

/// A graph of one command-agent node; its output is whatever the program printed.
const GRAPH: &str = "name: attack\nstart: ask\nnodes:\n  ask:\n    kind: agent\n    \
    template: prompt.md\n    output_schema: schema.json\n    image: fleet-agent-py:1\n    \
    worktree: {from: base, mode: ro}\n    routes: [{to: done}]\n  done: {kind: exit, status: ask.ok}\n";

async fn stack(llm: &FakeLlm, tag: &str) -> anyhow::Result<Stack> {
    let env = [
        ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
        ("ANTHROPIC_API_KEY", KEY),
    ];
    Stack::start(tag, 1, &env).await
}

/// Runs the attack agent with `args`; the run's status, its node's output and transcript.
async fn attack(stack: &Stack, args: &str) -> anyhow::Result<(Value, Value, Value)> {
    let dir = stack.dir.path();
    let repo = git_repo(dir, "attacker", &[("attack.py", AGENT), ("README", "x\n")])?;
    let g = dir.join("attack");
    std::fs::create_dir_all(&g)?;
    std::fs::write(g.join("graph.yaml"), GRAPH)?;
    std::fs::write(g.join("prompt.md"), "attack\n")?;
    std::fs::write(g.join("schema.json"), r#"{"type": "object"}"#)?;
    std::fs::write(dir.join("input.json"), "{}")?;
    let command = format!("python3 /work/attack.py {args}");
    let (graph, repo, input) = (
        g.join("graph.yaml").display().to_string(),
        repo.display().to_string(),
        dir.join("input.json").display().to_string(),
    );
    let out = stack.cli(&[
        "submit",
        "--graph",
        &graph,
        "--repo",
        &repo,
        "--input",
        &input,
        "--llm-api",
        "anthropic",
        "--llm-model",
        "claude-haiku-4-5",
        "--agent-command",
        &command,
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let id = out.stdout.trim().to_string();
    let status = stack.wait_run(&id, Duration::from_secs(300)).await?;
    let output = stack
        .node_artifact_json(&id, "ask", 1, "output.json")
        .await?;
    let transcript = stack
        .node_artifact_json(&id, "ask", 1, "transcript.json")
        .await?;
    Ok((status, output, transcript))
}

/// The worker process's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmHWM in /proc/{pid}/status"))?;
    Ok(kb * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_connections_of_32_mib_bodies_do_not_grow_the_worker() -> anyhow::Result<()> {
    let llm = FakeLlm::start(vec![ScriptedReply::text("DONE").with_usage(1, 1)]).await?;
    let stack = stack(&llm, "tenbig").await?;
    let pid = stack.worker_pids()[0];
    let before = peak_rss(pid)?;
    // 16 connections at once (the gateway's cap), each a 32 MiB body (just under the old cap).
    let (status, output, _) = attack(&stack, &format!("bigbodies 16 {}", (32 << 20) - 64)).await?;
    let grown = peak_rss(pid)?.saturating_sub(before);
    eprintln!("worker peak RSS grew by {} MiB", grown >> 20);
    // At cb4f93f every body was read and parsed at once: the worker grew by 478 MiB.
    assert!(
        grown < 64 << 20,
        "the worker's peak memory grew by {} MiB",
        grown >> 20
    );
    assert_eq!(status["status"], "succeeded", "{status}");
    let results = output["results"].as_array().cloned().unwrap_or_default();
    assert_eq!(results.len(), 16, "{output}");
    for r in &results {
        assert_eq!(r["status"], 413, "an oversized body is refused: {r}");
    }
    assert!(llm.requests().is_empty(), "nothing reached the provider");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_under_the_cap_are_read_a_few_at_a_time() -> anyhow::Result<()> {
    let llm = FakeLlm::start(vec![ScriptedReply::text("DONE").with_usage(1, 1)]).await?;
    let stack = stack(&llm, "teninflight").await?;
    // 16 bodies of 3 MiB (under the 4 MiB cap) at once: each is read, then refused (a
    // stream), but never more than the job's bytes in flight (8 MiB) are held together.
    let (status, output, transcript) = attack(&stack, &format!("bigbodies 16 {}", 3 << 20)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let results = output["results"].as_array().cloned().unwrap_or_default();
    assert_eq!(results.len(), 16, "{output}");
    for r in &results {
        assert_eq!(r["status"], 400, "read, then refused as a stream: {r}");
    }
    let peak = transcript["peak_body_bytes"].as_u64().unwrap_or(u64::MAX);
    eprintln!("the gateway held at most {peak} request bytes at once");
    assert!(
        (3 << 20..=8 << 20).contains(&peak),
        "the gateway held {peak} request bytes at once"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_program_sends_cannot_raise_what_a_call_costs() -> anyhow::Result<()> {
    let llm = FakeLlm::start(vec![
        ScriptedReply::text("one").with_usage(1, 1),
        ScriptedReply::text("never sent").with_usage(1, 1),
    ])
    .await?;
    let stack = stack(&llm, "tenspend").await?;
    let (status, output, _) = attack(&stack, "spend").await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    assert_eq!(output["pricey"]["status"], 200, "{output}");
    // The provider saw the configured model, a clamped output, one choice, no tier.
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1, "only the plain call left the worker");
    let sent = &reqs[0].body;
    assert_eq!(sent["model"], "claude-haiku-4-5");
    let asked = sent["max_tokens"].as_u64().unwrap_or(u64::MAX);
    assert!(asked <= 16_384, "max_tokens {asked} reached the provider");
    assert_eq!(sent["n"], 1, "{sent}");
    assert!(sent.get("service_tier").is_none(), "{sent}");
    // Provider-side tools and connectors are refused with a reason, never forwarded.
    for (call, says) in [("server_tool", "web_search"), ("mcp", "mcp_servers")] {
        let r = &output[call];
        assert_eq!(r["status"], 400, "{r}");
        let message = r["body"]["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{message}");
    }
    Ok(())
}
