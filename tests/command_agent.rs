//! Command agents on the real stack: a program installed in the agent image
//! (`images/agents/fleet-echo-agent`) runs in the job's container with no network and reaches
//! the fake LLM server only through the worker's gateway on a unix socket. The gateway adds the
//! key (which never enters the container: the agent reports every variable and file it can
//! see), makes every call with the configured model, counts the usage itself, and refuses
//! calls past what is left of the run's budget.

use fleet_tests::fake_llm::{FakeLlm, ScriptedReply};
use fleet_tests::stack::{make_calc_repo, Stack};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

const KEY: &str = "sk-fleet-secret-7f3a9c";

/// A graph of command-agent nodes run one after the other (each reads the worktree), ending
/// with the last one's status.
fn graph_yaml(nodes: &[&str]) -> String {
    let mut yaml = format!("name: command-agent\nstart: {}\nnodes:\n", nodes[0]);
    for (i, node) in nodes.iter().enumerate() {
        let next = nodes.get(i + 1).copied().unwrap_or("done");
        yaml.push_str(&format!(
            "  {node}:\n    kind: agent\n    template: prompt.md\n    output_schema: schema.json\n    \
             image: fleet-agent-py:1\n    worktree: {{from: base, mode: ro}}\n    routes: [{{to: {next}}}]\n"
        ));
    }
    let last = nodes[nodes.len() - 1];
    yaml.push_str(&format!("  done: {{kind: exit, status: {last}.ok}}\n"));
    yaml
}

const SCHEMA: &str = r#"{
  "type": "object",
  "required": ["replies", "refused", "session_id", "evidence"],
  "properties": {"replies": {"type": "array", "items": {"type": "string"}}}
}"#;

fn graph(dir: &Path, yaml: &str, prompt: &str) -> anyhow::Result<String> {
    let d = dir.join("command-agent");
    std::fs::create_dir_all(&d)?;
    std::fs::write(d.join("graph.yaml"), yaml)?;
    std::fs::write(d.join("prompt.md"), prompt)?;
    std::fs::write(d.join("schema.json"), SCHEMA)?;
    Ok(d.join("graph.yaml").display().to_string())
}

/// Runs the graph with the echo agent; the run's id and status.
async fn run(stack: &Stack, yaml: &str, extra: &[&str]) -> anyhow::Result<(String, Value)> {
    run_with_prompt(stack, yaml, "Say DONE when you are done.", extra).await
}

async fn run_with_prompt(
    stack: &Stack,
    yaml: &str,
    prompt: &str,
    extra: &[&str],
) -> anyhow::Result<(String, Value)> {
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let g = graph(stack.dir.path(), yaml, prompt)?;
    let input = stack.dir.path().join("input.json");
    std::fs::write(&input, "{}")?;
    let input = input.display().to_string();
    let mut args = vec![
        "submit",
        "--graph",
        &g,
        "--repo",
        &repo,
        "--input",
        &input,
        "--llm-api",
        "anthropic",
        "--llm-model",
        "claude-haiku-4-5",
        "--agent-command",
        "fleet-echo-agent",
    ];
    args.extend_from_slice(extra);
    let out = stack.cli(&args)?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let id = out.stdout.trim().to_string();
    let status = stack.wait_run(&id, Duration::from_secs(120)).await?;
    Ok((id, status))
}

async fn stack(llm: &FakeLlm, tag: &str) -> anyhow::Result<Stack> {
    stack_with(llm, tag, &[]).await
}

async fn stack_with(llm: &FakeLlm, tag: &str, extra: &[(&str, &str)]) -> anyhow::Result<Stack> {
    let mut env = vec![
        ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
        ("ANTHROPIC_API_KEY", KEY),
        ("FLEET_PRICES", r#"{"claude-haiku-4-5": [3.0, 15.0]}"#),
    ];
    env.extend_from_slice(extra);
    Stack::start(tag, 1, &env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_agent_reaches_the_model_through_the_gateway_and_never_sees_the_key(
) -> anyhow::Result<()> {
    let llm = FakeLlm::start(vec![
        ScriptedReply::text("thinking").with_usage(100, 10),
        ScriptedReply::text("still thinking").with_usage(200, 20),
        ScriptedReply::text("DONE").with_usage(300, 30),
    ])
    .await?;
    let stack = stack(&llm, "cmdagent").await?;
    // A long node name makes a long job folder: the socket's path must still fit (107 bytes).
    let node = "ask_with_a_name_long_enough_to_push_the_job_folder_past_a_socket_path";
    let (id, status) = run(&stack, &graph_yaml(&[node]), &[]).await?;
    let output = stack
        .node_artifact_json(&id, node, 1, "output.json")
        .await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    assert_eq!(
        output["replies"],
        json!(["thinking", "still thinking", "DONE"])
    );
    assert!(output["refused"].is_null(), "{}", output["refused"]);
    assert!(output["session_id"]
        .as_str()
        .is_some_and(|s| s.ends_with(&format!(".{node}"))));

    // The fake server saw the worker's key and the configured model, never the agent's.
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_eq!(r.header("x-api-key"), Some(KEY));
        assert_eq!(r.body["model"], "claude-haiku-4-5");
    }
    // Nothing the agent could see holds the key: its environment, /proc, the gateway's
    // folder, the worktree, /tmp and /run. It did see the gateway's socket, and nothing else
    // of the worker's.
    let evidence = output["evidence"].to_string();
    assert!(!evidence.contains(KEY), "the key reached the container");
    assert!(!evidence.contains("ANTHROPIC_API_KEY"), "{evidence}");
    let env = &output["evidence"]["env"];
    assert_eq!(env["FLEET_LLM_SOCKET"], "/run/fleet-llm/llm.sock");
    let files: Vec<&String> = output["evidence"]["files"]
        .as_object()
        .map(|o| o.keys().collect())
        .unwrap_or_default();
    assert!(
        files
            .iter()
            .any(|f| f.as_str() == "/run/fleet-llm/llm.sock"),
        "{files:?}"
    );
    assert!(files.iter().any(|f| f.ends_with("calc.py")), "{files:?}");

    // The usage is the gateway's count, priced by the worker.
    let usage = &status["usage"];
    assert_eq!(usage["llm_calls"], 3, "{status}");
    assert_eq!(usage["input_tokens"], 600);
    assert_eq!(usage["output_tokens"], 60);
    let cost = usage["cost_usd"].as_f64().unwrap_or_default();
    assert!(
        (cost - (600.0 * 3.0 + 60.0 * 15.0) / 1e6).abs() < 1e-9,
        "{cost}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_stops_a_command_agent_at_the_runs_budget() -> anyhow::Result<()> {
    // Three calls for the whole run: two by the first node, one by the second, whose next
    // call the gateway refuses.
    let llm = FakeLlm::start(vec![
        ScriptedReply::text("first").with_usage(10, 1),
        ScriptedReply::text("DONE").with_usage(10, 1),
        ScriptedReply::text("more").with_usage(10, 1),
        ScriptedReply::text("never sent").with_usage(10, 1),
    ])
    .await?;
    let stack = stack(&llm, "cmdbudget").await?;
    let (id, status) = run(
        &stack,
        &graph_yaml(&["ask", "again"]),
        &["--agent-max-calls", "3"],
    )
    .await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let first = stack
        .node_artifact_json(&id, "ask", 1, "output.json")
        .await?;
    assert_eq!(first["replies"], json!(["first", "DONE"]));
    assert!(first["refused"].is_null());
    let second = stack
        .node_artifact_json(&id, "again", 1, "output.json")
        .await?;
    assert_eq!(second["replies"], json!(["more"]));
    assert_eq!(second["refused"]["status"], 429, "{second}");
    assert_eq!(
        second["refused"]["body"]["error"]["type"],
        "budget_exhausted"
    );
    assert!(second["refused"]["body"]["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("1 of 1 calls")));
    assert_eq!(
        llm.requests().len(),
        3,
        "the fourth call never left the worker"
    );
    assert_eq!(llm.remaining(), 1);
    assert_eq!(status["usage"]["llm_calls"], 3, "{status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_rate_limit_holds_back_a_command_agents_calls() -> anyhow::Result<()> {
    // Two calls per second to the provider: the third call waits for the first to leave the
    // window, so it cannot be answered before a second has passed since the gateway started
    // (a lower bound: the limit cannot make calls faster).
    let llm = FakeLlm::start(vec![
        ScriptedReply::text("one"),
        ScriptedReply::text("two"),
        ScriptedReply::text("three"),
        ScriptedReply::text("DONE"),
    ])
    .await?;
    let stack = stack_with(&llm, "cmdrate", &[("FLEET_LLM_RATE", "2/1")]).await?;
    let (id, status) = run(&stack, &graph_yaml(&["ask"]), &[]).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let transcript = stack
        .node_artifact_json(&id, "ask", 1, "transcript.json")
        .await?;
    let at: Vec<u64> = transcript["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["at_ms"].as_u64())
        .collect();
    assert_eq!(at.len(), 4, "{transcript}");
    assert!(at[2] >= 1000, "the third call was answered {} ms in", at[2]);
    assert_eq!(llm.requests().len(), 4);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_floods_the_gateway_with_connections_is_held_to_its_cap(
) -> anyhow::Result<()> {
    let llm = FakeLlm::start(vec![ScriptedReply::text("DONE")]).await?;
    let stack = stack(&llm, "cmdflood").await?;
    let prompt = "FLOOD the gateway, then say DONE.";
    let (id, status) = run_with_prompt(&stack, &graph_yaml(&["ask"]), prompt, &[]).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let output = stack
        .node_artifact_json(&id, "ask", 1, "output.json")
        .await?;
    // Its 64 connections went through (the extra ones wait in the socket's backlog)...
    assert_eq!(output["flooded"], 64, "{}", output["flooded"]);
    assert_eq!(output["replies"], json!(["DONE"]));
    // ...but the gateway never served more than its cap at once, and then served the call.
    let transcript = stack
        .node_artifact_json(&id, "ask", 1, "transcript.json")
        .await?;
    let peak = transcript["peak_connections"].as_u64().unwrap_or(u64::MAX);
    assert!(
        (1..=16).contains(&peak),
        "the gateway served {peak} connections at once"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_agent_in_a_warm_container_reaches_the_gateway_moved_into_it(
) -> anyhow::Result<()> {
    // The warm container mounts a folder of the pool's; the job's gateway folder, with the
    // socket the worker listens on, is moved into it when the container is handed out.
    let llm = FakeLlm::start(vec![
        ScriptedReply::text("DONE").with_usage(10, 1),
        ScriptedReply::text("warm DONE").with_usage(10, 1),
    ])
    .await?;
    let stack = stack_with(&llm, "cmdwarm", &[("FLEET_WARM_CONTAINERS", "1")]).await?;
    let worker = stack.worker_ids()[0].clone();
    let yaml = graph_yaml(&["ask"]);
    let (_, first) = run_with_prompt(&stack, &yaml, "First. Say DONE.", &[]).await?;
    assert_eq!(first["status"], "succeeded", "{first}");
    let gauge = "fleet_worker_warm_containers";
    stack
        .wait_for_metric(&worker, gauge, &[], 1.0, Duration::from_secs(30))
        .await?;
    let (id, second) = run_with_prompt(&stack, &yaml, "Second. Say DONE.", &[]).await?;
    assert_eq!(second["status"], "succeeded", "{second}");
    let total = "fleet_worker_containers_total";
    let warm = stack
        .worker_metric(&worker, total, &[("start", "warm")])
        .await?;
    assert_eq!(warm, 1.0, "the second job was handed a warm container");
    let output = stack
        .node_artifact_json(&id, "ask", 1, "output.json")
        .await?;
    assert_eq!(output["replies"], json!(["warm DONE"]));
    assert!(!output["evidence"].to_string().contains(KEY));
    assert_eq!(
        output["evidence"]["env"]["FLEET_LLM_SOCKET"],
        "/run/fleet-llm/llm.sock"
    );
    assert_eq!(llm.requests().len(), 2);
    Ok(())
}
