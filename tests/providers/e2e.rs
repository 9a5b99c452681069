//! The factory graph through the built-in agent loop against the strict fake, for each
//! provider, to its expected end; an unpriced model refused at submission; a run's budget
//! clamping `max_tokens` on the real stack.

use super::refusals::{CLAUDE, GPT};
use fleet_tests::fake_llm::{FakeLlm, ScriptedReply};
use fleet_tests::stack::{example, make_calc_repo, Stack};
use serde_json::{json, Value};
use std::time::Duration;

const RUN_TIMEOUT: Duration = Duration::from_secs(180);

fn good_diff() -> anyhow::Result<String> {
    let script: Value = serde_json::from_str(&std::fs::read_to_string(example(
        "factory-calc/script-pass.json",
    ))?)?;
    Ok(script["se"][0]["output"]["unified_diff"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// The SE reads `calc.py`, then submits the passing diff.
fn se_replies() -> anyhow::Result<Vec<ScriptedReply>> {
    Ok(vec![
        ScriptedReply::tool_use("read_file", json!({"path": "calc.py"})).with_usage(1000, 50),
        ScriptedReply::tool_use(
            "submit",
            json!({"unified_diff": good_diff()?, "summary": "multiply"}),
        )
        .with_usage(1200, 150),
    ])
}

/// Starts a stack whose workers call `llm` for `api`, submits the calc work order with the
/// built-in loop on `model`, and returns the CLI's output code, stdout and stderr.
async fn submit_factory(
    stack: &Stack,
    api: &str,
    model: &str,
    extra: &[&str],
) -> anyhow::Result<fleet_tests::stack::CliOutput> {
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let wo = example("factory-calc/work_order.json");
    let mut args = vec![
        "submit",
        "--repo",
        &repo,
        "--work-order",
        &wo,
        "--llm-api",
        api,
        "--llm-model",
        model,
    ];
    args.extend_from_slice(extra);
    stack.cli(&args)
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
async fn the_factory_graph_passes_through_the_built_in_loop_on_both_providers() -> anyhow::Result<()>
{
    for (api, model) in [("anthropic", CLAUDE), ("openai", GPT)] {
        let llm = FakeLlm::start(se_replies()?).await?;
        let stack = stack_for(&format!("prov{api}"), &llm).await?;
        let out = submit_factory(&stack, api, model, &[]).await?;
        assert_eq!(out.code, 0, "{api}: {}", out.stderr);
        let run = out.stdout.trim().to_string();
        let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
        assert_eq!(status["status"], "succeeded", "{api}: {status}");
        let reqs = llm.requests();
        assert_eq!(reqs.len(), 2, "{api}: two turns");
        assert!(
            reqs.iter().all(|r| r.status == 200),
            "{api}: the strict fake refused the fleet: {:?}",
            reqs.iter()
                .map(|r| (r.status, r.body.clone()))
                .collect::<Vec<_>>()
        );
        assert_eq!(llm.remaining(), 0, "{api}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpriced_model_is_refused_and_a_budget_clamps_max_tokens() -> anyhow::Result<()> {
    let llm = FakeLlm::start(vec![
        ScriptedReply::tool_use("read_file", json!({"path": "calc.py"})).with_usage(0, 3000),
        ScriptedReply::tool_use("read_file", json!({"path": "calc.py"})).with_usage(0, 100),
    ])
    .await?;
    let stack = stack_for("provmoney", &llm).await?;
    // A model the price table does not know: refused before anything is stored or called.
    let out = submit_factory(&stack, "anthropic", "claude-haiku-4-5-preview", &[]).await?;
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(out.stderr.contains("no price for model"), "{}", out.stderr);
    assert!(llm.requests().is_empty());
    // $0.02 of Haiku 4.5 ($5 a million output tokens): 4000 output tokens, less the input.
    let out = submit_factory(&stack, "anthropic", CLAUDE, &["--budget-usd", "0.02"]).await?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let run = out.stdout.trim().to_string();
    let _ = stack.wait_run(&run, RUN_TIMEOUT).await;
    let reqs = llm.requests();
    anyhow::ensure!(reqs.len() >= 2, "{reqs:?}");
    let max: Vec<u64> = reqs
        .iter()
        .map(|r| r.body["max_tokens"].as_u64().unwrap_or_default())
        .collect();
    eprintln!("max_tokens of each call: {max:?}");
    // The first call may ask for up to 4000 less its input; after 3000 output tokens ($0.015)
    // the second asks for at most the 1000 left, less its input.
    assert!(max[0] <= 4000 && max[0] > 1000, "{max:?}");
    assert!(max[1] < 1000, "the second call was not clamped: {max:?}");
    Ok(())
}
