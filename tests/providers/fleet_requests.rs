//! The fleet's own requests obey every rule the strict fake enforces: the bodies the agent
//! loop's wire formats build (`worker::agent::{Anthropic, OpenAi}`), with every built-in tool
//! and the `submit` tool carrying each agent schema of the repository's graphs, through a
//! conversation that uses each message shape the loop writes (tool results, a text answer
//! pushed back, the nudge, a continued session), are all answered 200.

use super::refusals::{post, CLAUDE, GPT};
use fleet_tests::fake_llm::{FakeLlm, ScriptedReply};
use fleet_tests::stack::workspace_root;
use serde_json::{json, Value};
use shared::graph::Tool;
use shared::messages::LlmConfig;
use worker::agent::{Anthropic, ChatApi, OpenAi, ToolOutput, ToolResult};
use worker::tools::{definition, ToolDef};

/// Every agent node's output schema of the five graphs, by `graph/node`.
fn repository_schemas() -> anyhow::Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    for g in [
        "factory",
        "hybrid-tdd",
        "v3-tree",
        "types-first",
        "hardened-coder",
    ] {
        let dir = workspace_root().join("graphs").join(g);
        let yaml = std::fs::read_to_string(dir.join("graph.yaml"))?;
        let bundle = shared::graph::load_bundle(g, &yaml, |rel| {
            std::fs::read_to_string(dir.join(rel)).map_err(|e| e.to_string())
        })
        .map_err(|e| anyhow::anyhow!("{g}: {e:?}"))?;
        for (id, node) in &bundle.graph.nodes {
            if let Some(agent) = node.agent() {
                let text = bundle.file(&agent.output_schema).unwrap_or("null");
                out.push((format!("{g}/{id}"), serde_json::from_str(text)?));
            }
        }
    }
    anyhow::ensure!(out.len() >= 10, "only {} agent schemas found", out.len());
    Ok(out)
}

fn tools(schema: &Value) -> Vec<ToolDef> {
    let mut tools: Vec<ToolDef> = [
        Tool::ReadFile,
        Tool::ListDir,
        Tool::WriteFile,
        Tool::EditFile,
        Tool::RunCommand,
        Tool::Browser,
    ]
    .into_iter()
    .map(definition)
    .collect();
    tools.push(ToolDef {
        name: "submit",
        description: "Submit your final answer.",
        schema: schema.clone(),
    });
    tools
}

fn cfg(model: &str) -> LlmConfig {
    // The defaults a submission gets (`max_tokens` 4096, temperature 0).
    serde_json::from_value(json!({ "model": model })).expect("an llm config")
}

/// One conversation of the loop's shapes over `api`, each request answered 200.
async fn converse<A: ChatApi>(
    api: &A,
    anthropic: bool,
    model: &str,
    schema: &Value,
    what: &str,
) -> anyhow::Result<()> {
    let fake = FakeLlm::start(vec![
        ScriptedReply::tool_use("read_file", json!({"path": "a.py"})),
        ScriptedReply::text("I am done."),
        ScriptedReply::tool_use("submit", json!({})),
        ScriptedReply::text("{}"),
    ])
    .await?;
    let cfg = cfg(model);
    let tools = tools(schema);
    let mut messages = api.start(None, "Do the task.");
    let send = |messages: Vec<Value>| {
        let body = api.request(&cfg, &tools, &messages);
        let fake = &fake;
        async move {
            let (status, resp) = post(fake, anthropic, &body).await?;
            anyhow::ensure!(status == 200, "{what} ({model}): {status} {resp}");
            anyhow::Ok(resp)
        }
    };
    let resp = send(messages.clone()).await?;
    let reply = api.parse(&resp)?;
    let id = reply.calls[0].id.clone();
    messages.push(reply.turn);
    messages.extend(api.tool_results(vec![ToolResult {
        id,
        output: ToolOutput::Done("x = 1".into()),
    }]));
    let resp = send(messages.clone()).await?;
    messages.push(api.parse(&resp)?.turn);
    messages.push(api.user_text("Call the `submit` tool with your final answer.".into()));
    api.nudge(&mut messages, worker::agent::NUDGE);
    let resp = send(messages.clone()).await?;
    messages.push(api.parse(&resp)?.turn);
    // A later session continues this transcript, its trailing `submit` answered first.
    let transcript = api.transcript(model, messages);
    let continued = api.start(Some(&transcript), "Go on.");
    send(continued).await?;
    Ok(())
}

#[tokio::test]
async fn the_fleets_anthropic_requests_obey_the_strict_fake() -> anyhow::Result<()> {
    for (what, schema) in repository_schemas()? {
        converse(&Anthropic, true, CLAUDE, &schema, &what).await?;
    }
    Ok(())
}

#[tokio::test]
async fn the_fleets_openai_requests_obey_the_strict_fake() -> anyhow::Result<()> {
    for (what, schema) in repository_schemas()? {
        for model in [GPT, "gpt-5-mini"] {
            converse(&OpenAi, false, model, &schema, &what).await?;
        }
    }
    Ok(())
}
