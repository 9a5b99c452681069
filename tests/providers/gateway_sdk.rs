//! Command agents through the LLM gateway against the strict fake: a program written on the
//! providers' official Python SDKs (`anthropic`, `openai` from PyPI, unmodified; the image
//! `fleet-agent-sdk:1` of scripts/build-sdk-image.sh, `images/sdk-agents/fleet-sdk-agent`),
//! pointed at the gateway's unix socket through the SDK's own HTTP client. The gateway pins
//! the model, clamps `max_tokens` (the operator's cap, the run's dollars left), counts cache
//! tokens at their prices, and refuses before it leaves the worker a request the provider
//! would refuse (a top-level `oneOf`) or one it cannot serve (a stream), with a clear error
//! the SDK shows the program.

use super::refusals::{CLAUDE, GPT};
use fleet_tests::fake_llm::{FakeLlm, ScriptedReply};
use fleet_tests::stack::{make_calc_repo, workspace_root, Stack};
use serde_json::{json, Value};
use std::time::Duration;

const IMAGE: &str = "fleet-agent-sdk:1";

/// Builds the SDK image if it is missing (needs PyPI the first time).
fn sdk_image() -> anyhow::Result<()> {
    let out = std::process::Command::new(workspace_root().join("scripts/build-sdk-image.sh"))
        .arg(IMAGE)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "scripts/build-sdk-image.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Submits a one-node graph whose command agent is the SDK agent, with `prompt`; the run's
/// status and the node's output.
async fn run(
    stack: &Stack,
    api: &str,
    prompt: &str,
    extra: &[&str],
) -> anyhow::Result<(Value, Value)> {
    let dir = stack.dir.path().join(format!("g-{}", prompt.len()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("graph.yaml"),
        format!(
            "name: sdk-agent\nstart: ask\nnodes:\n  ask:\n    kind: agent\n    template: prompt.md\n    \
             output_schema: schema.json\n    image: {IMAGE}\n    routes: [{{to: done}}]\n  \
             done: {{kind: exit, status: ask.ok}}\n"
        ),
    )?;
    std::fs::write(dir.join("prompt.md"), prompt)?;
    std::fs::write(
        dir.join("schema.json"),
        r#"{"type": "object", "required": ["submitted"]}"#,
    )?;
    std::fs::write(dir.join("input.json"), "{}")?;
    let repo = make_calc_repo(&dir)?.display().to_string();
    let (graph, input) = (
        dir.join("graph.yaml").display().to_string(),
        dir.join("input.json").display().to_string(),
    );
    let model = if api == "anthropic" { CLAUDE } else { GPT };
    let mut args = vec![
        "submit",
        "--graph",
        &graph,
        "--repo",
        &repo,
        "--input",
        &input,
        "--llm-api",
        api,
        "--llm-model",
        model,
        "--agent-command",
        "fleet-sdk-agent",
    ];
    args.extend_from_slice(extra);
    let out = stack.cli(&args)?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let id = out.stdout.trim().to_string();
    let status = stack.wait_run(&id, Duration::from_secs(120)).await?;
    let result = stack.get(&format!("/v1/runs/{id}/result")).await?;
    let output = result["result"]["outputs"]["ask"]["output"].clone();
    Ok((status, output))
}

async fn stack_for(tag: &str, llm: &FakeLlm) -> anyhow::Result<Stack> {
    let url = llm.base_url.as_str();
    Stack::start(
        tag,
        1,
        &[
            ("FLEET_ANTHROPIC_BASE_URL", url),
            ("ANTHROPIC_API_KEY", "k"),
            ("FLEET_OPENAI_BASE_URL", url),
            ("OPENAI_API_KEY", "k"),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_reach_the_strict_fake_through_the_gateway() -> anyhow::Result<()> {
    sdk_image()?;
    for (api, model) in [("anthropic", CLAUDE), ("openai", GPT)] {
        // A tool call the program answers "no such tool", then its answer; the first reply
        // reports prompt-cache writes and reads (Anthropic's usage fields).
        let llm = FakeLlm::start(vec![
            ScriptedReply::tool_use("read_file", json!({"path": "calc.py"}))
                .with_usage(1000, 50)
                .with_cache(2000, 4000),
            ScriptedReply::tool_use("submit", json!({"submitted": "42"})).with_usage(1200, 60),
        ])
        .await?;
        let stack = stack_for(&format!("sdk{api}"), &llm).await?;
        let (status, output) = run(&stack, api, "Answer 42.", &[]).await?;
        assert_eq!(status["status"], "succeeded", "{api}: {status} {output}");
        assert_eq!(output["submitted"]["submitted"], "42", "{api}: {output}");
        let sdk = output["sdk"].as_str().unwrap_or_default();
        assert!(sdk.starts_with(api), "{api}: {output}");
        let reqs = llm.requests();
        assert_eq!(reqs.len(), 2, "{api}: {reqs:?}");
        for r in &reqs {
            assert_eq!(r.status, 200, "{api}: the strict fake refused: {}", r.body);
            // The model is the run's, whatever the program asked for; its 100000 output
            // tokens are clamped to the gateway's cap (16384 by default).
            assert_eq!(r.body["model"], model, "{api}");
            assert_eq!(r.body["max_tokens"], 16_384, "{api}: {}", r.body);
        }
        // The program's second request carries its tool result in the provider's shape.
        let second = reqs[1].body["messages"].to_string();
        assert!(second.contains("no such tool"), "{api}: {second}");
        if api == "anthropic" {
            // Haiku 4.5 at $1 / $5 a million: 2200 input, 110 output, 2000 cache writes at
            // 1.25 x input, 4000 cache reads at 0.1 x input.
            let want = (2200.0 + 110.0 * 5.0 + 2000.0 * 1.25 + 4000.0 * 0.1) / 1e6;
            let cost = status["usage"]["cost_usd"].as_f64().unwrap_or_default();
            eprintln!("anthropic via the gateway: ${cost} (want ${want})");
            assert!((cost - want).abs() < 1e-9, "{cost} != {want}: {status}");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_refuses_what_the_provider_would_and_clamps_to_the_runs_dollars(
) -> anyhow::Result<()> {
    sdk_image()?;
    let llm = FakeLlm::start(vec![ScriptedReply::tool_use(
        "submit",
        json!({"submitted": "ok"}),
    )
    .with_usage(100, 10)])
    .await?;
    let stack = stack_for("sdkrefuse", &llm).await?;
    // A top-level oneOf: Anthropic refuses the whole request; the gateway refuses it first.
    let (_, output) = run(&stack, "anthropic", "ONEOF answer.", &[]).await?;
    let message = output["message"].as_str().unwrap_or_default();
    assert_eq!(output["error"], "BadRequestError", "{output}");
    assert!(
        message.contains("tool `submit`")
            && message.contains("input_schema does not support oneOf, allOf, or anyOf"),
        "{output}"
    );
    // A stream: not served, said so.
    let (_, output) = run(&stack, "anthropic", "STREAM answer.", &[]).await?;
    assert!(
        output["message"]
            .as_str()
            .unwrap_or_default()
            .contains("streaming is not served through the gateway"),
        "{output}"
    );
    assert!(llm.requests().is_empty(), "{:?}", llm.requests());
    // $0.01 of Haiku 4.5 output ($5 a million) is 2000 tokens, less the call's input.
    let (status, output) =
        run(&stack, "anthropic", "Answer ok.", &["--budget-usd", "0.01"]).await?;
    assert_eq!(status["status"], "succeeded", "{status} {output}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let max = reqs[0].body["max_tokens"].as_u64().unwrap_or_default();
    eprintln!("max_tokens under a $0.01 budget: {max}");
    assert!(
        (1000..2000).contains(&max),
        "not clamped to the run's dollars: {max}"
    );
    Ok(())
}
