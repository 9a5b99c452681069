//! The four other graphs (hybrid-tdd, v3-tree, types-first, hardened-coder) end to end through
//! the built-in agent loop against the strict fake, on each provider: every agent node is
//! answered by the fake in the provider's wire format (its example script's steps as one turn
//! of parallel tool calls, `submit` last; `fake_llm::script_responder`), and the run reaches
//! the end its scripted example reaches.

use super::refusals::{CLAUDE, GPT};
use fleet_tests::fake_llm::{script_nodes, script_responder, FakeLlm, Picker, Played};
use fleet_tests::stack::{workspace_root, Stack};
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};

const RUN_TIMEOUT: Duration = Duration::from_secs(400);

/// One graph's example: its folder under `graphs/` and `examples/`, and the script it plays.
struct Case {
    graph: &'static str,
    example: &'static str,
    script: &'static str,
    /// The agent nodes its run reaches, each answered by the fake.
    nodes: &'static [&'static str],
    /// How a prompt picks its step where the script's `when` is not in the prompt.
    picker: Option<fn(&Value) -> Picker>,
}

/// A run of a case on `api` against the strict fake.
struct Running {
    stack: Stack,
    llm: FakeLlm,
    played: Played,
    script: Value,
    nodes: &'static [&'static str],
    run: String,
}

async fn start(case: &Case, api: &str) -> anyhow::Result<Running> {
    let root = workspace_root();
    let example = root.join("examples").join(case.example);
    let script: Value = serde_json::from_str(&std::fs::read_to_string(example.join(case.script))?)?;
    let (responder, played) = script_responder(
        &root.join("graphs").join(case.graph),
        &script,
        case.picker.map(|p| p(&script)),
    )?;
    let llm = FakeLlm::start_responder(responder).await?;
    let url = llm.base_url.clone();
    let tag = format!("pg{}{api}", &case.graph[..2]);
    let stack = Stack::start(
        &tag,
        2,
        &[
            ("FLEET_ANTHROPIC_BASE_URL", url.as_str()),
            ("ANTHROPIC_API_KEY", "k"),
            ("FLEET_OPENAI_BASE_URL", url.as_str()),
            ("OPENAI_API_KEY", "k"),
        ],
    )
    .await?;
    let repo = stack.dir.path().join("repo");
    let made = Command::new(example.join("make-repo.sh"))
        .arg(&repo)
        .output()?;
    anyhow::ensure!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let model = if api == "anthropic" { CLAUDE } else { GPT };
    let graph = root.join("graphs").join(case.graph).join("graph.yaml");
    let out = stack.cli(&[
        "submit",
        "--graph",
        &graph.display().to_string(),
        "--repo",
        &repo.display().to_string(),
        "--input",
        &example.join("input.json").display().to_string(),
        "--llm-api",
        api,
        "--llm-model",
        model,
    ])?;
    anyhow::ensure!(out.code == 0, "{api}: submit failed: {}", out.stderr);
    let run = out.stdout.trim().to_string();
    Ok(Running {
        stack,
        llm,
        played,
        script,
        nodes: case.nodes,
        run,
    })
}

impl Running {
    /// The run's end: its status, after checking that the fake accepted every request and
    /// that every node of the script was answered by it.
    async fn end(&self, api: &str) -> anyhow::Result<Value> {
        let status = self.stack.wait_run(&self.run, RUN_TIMEOUT).await?;
        let reqs = self.llm.requests();
        let refused: Vec<(u16, Value)> = reqs
            .iter()
            .filter(|r| r.status != 200)
            .map(|r| (r.status, r.body.clone()))
            .collect();
        assert!(
            refused.is_empty(),
            "{api}: the strict fake refused: {refused:?}"
        );
        let played = self.played.lock().map(|p| p.clone()).unwrap_or_default();
        assert_eq!(reqs.len(), played.len(), "{api}: one request per session");
        let reached: std::collections::BTreeSet<&str> =
            played.iter().map(|(n, _)| n.as_str()).collect();
        let expected: std::collections::BTreeSet<&str> = self.nodes.iter().copied().collect();
        assert_eq!(reached, expected, "{api}: agent nodes answered: {played:?}");
        let scripted = script_nodes(&self.script);
        assert!(reached.iter().all(|n| scripted.contains_key(*n)), "{api}");
        let path = if api == "anthropic" {
            "/v1/messages"
        } else {
            "/v1/chat/completions"
        };
        assert!(reqs.iter().all(|r| r.path == path), "{api}");
        eprintln!("{api}: {} calls: {played:?}", reqs.len());
        Ok(status)
    }

    /// Waits until the run waits for a person at `node`.
    async fn awaiting(&self, node: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let s = self.stack.get(&format!("/v1/runs/{}", self.run)).await?;
            if s["awaiting_approval"] == json!([node]) {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "never waited at {node}: {s}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

const HYBRID: Case = Case {
    graph: "hybrid-tdd",
    example: "hybrid-stack",
    script: "script-happy.json",
    nodes: &[
        "types",
        "type_adversary",
        "tests",
        "impl",
        "witness",
        "mutation",
    ],
    picker: None,
};

async fn hybrid(api: &str) -> anyhow::Result<()> {
    let r = start(&HYBRID, api).await?;
    let status = r.end(api).await?;
    assert_eq!(status["status"], "succeeded", "{api}: {status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_tdd_on_anthropic() -> anyhow::Result<()> {
    hybrid("anthropic").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_tdd_on_openai() -> anyhow::Result<()> {
    hybrid("openai").await
}

const TYPES_FIRST: Case = Case {
    graph: "types-first",
    example: "types-first",
    script: "script-happy.json",
    nodes: &["types", "tests_loop", "impl_loop", "fix"],
    picker: None,
};

async fn types_first(api: &str) -> anyhow::Result<()> {
    let r = start(&TYPES_FIRST, api).await?;
    let status = r.end(api).await?;
    assert_eq!(status["status"], "succeeded", "{api}: {status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn types_first_on_anthropic() -> anyhow::Result<()> {
    types_first("anthropic").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn types_first_on_openai() -> anyhow::Result<()> {
    types_first("openai").await
}

const V3_TREE: Case = Case {
    graph: "v3-tree",
    example: "v3-tree",
    script: "script-happy.json",
    nodes: &["scaffold", "tests", "impl", "review", "judge"],
    picker: Some(modules),
};

/// A v3-tree prompt names its module (and a judge's, its child) in its first lines, but also
/// names other modules (its children, its parent): the step whose `when` names the module
/// the template puts in its place.
fn modules(script: &Value) -> Picker {
    let script = script.clone();
    Box::new(move |prompt, nodes| {
        let node = *nodes.first()?;
        let ticked = |after: &str| -> Option<String> {
            let rest = prompt.split(after).nth(1)?;
            Some(rest.split('`').next()?.to_string())
        };
        let (module, child) = match node {
            "scaffold" => (ticked("** of module `")?, None),
            "judge" => (ticked("` of `")?, Some(ticked("Parent-as-judge: child `")?)),
            _ => {
                let line = prompt.lines().find(|l| l.starts_with("# "))?;
                let rest = line.split(": ").nth(1)?;
                (rest.split_whitespace().next()?.to_string(), None)
            }
        };
        let steps = script[node].as_array()?;
        let j = steps.iter().position(|s| {
            s["when"]["module"] == module.as_str()
                && child.as_deref().is_none_or(|c| s["when"]["child"] == c)
        })?;
        Some((node.to_string(), j))
    })
}

async fn v3_tree(api: &str) -> anyhow::Result<()> {
    let r = start(&V3_TREE, api).await?;
    let status = r.end(api).await?;
    assert_eq!(status["status"], "succeeded", "{api}: {status}");
    // Each of the four modules' scaffold, tests and impl was answered once.
    let played = r.played.lock().map(|p| p.clone()).unwrap_or_default();
    for node in ["scaffold", "tests", "impl", "review"] {
        let n = played.iter().filter(|(p, _)| p == node).count();
        assert_eq!(n, 4, "{api}: {node}: {played:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v3_tree_on_anthropic() -> anyhow::Result<()> {
    v3_tree("anthropic").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v3_tree_on_openai() -> anyhow::Result<()> {
    v3_tree("openai").await
}

const HARDENED: Case = Case {
    graph: "hardened-coder",
    example: "hardened-coder",
    script: "script-story.json",
    nodes: &["initializer", "coder", "verify", "verify_again"],
    picker: Some(verifications),
};

/// `verify` and `verify_again` share a template and their prompt names the feature but not
/// the round: each feature's verifications in the order the story plays them (its script's
/// `when`), the feature read from the test case the prompt carries.
fn verifications(_script: &Value) -> Picker {
    let order: [(u64, &[(&str, usize)]); 4] = [
        (1, &[("verify", 0), ("verify_again", 0)]),
        (2, &[("verify", 1), ("verify_again", 1), ("verify", 2)]),
        (3, &[("verify", 3)]),
        (4, &[("verify", 4), ("verify_again", 2)]),
    ];
    let queues: std::collections::BTreeMap<u64, std::collections::VecDeque<(String, usize)>> =
        order
            .iter()
            .map(|(f, q)| (*f, q.iter().map(|(n, j)| (n.to_string(), *j)).collect()))
            .collect();
    let queues = std::sync::Mutex::new(queues);
    Box::new(move |prompt, nodes| {
        if !nodes.contains(&"verify") {
            // The other nodes have no `when`: their steps in order.
            return None;
        }
        let case = prompt.split("```json").nth(1)?.split("```").next()?;
        let feature: Value = serde_json::from_str(case.trim()).ok()?;
        let id = feature["id"].as_u64()?;
        let mut queues = queues.lock().ok()?;
        queues.get_mut(&id)?.pop_front()
    })
}

/// The story of `tests/hardened.rs`: the feature list approved, features 1 (its first
/// verifier's invented step voided) and 4 (disagreeing verifications) settled by a person, the
/// run succeeds.
async fn hardened(api: &str) -> anyhow::Result<()> {
    let r = start(&HARDENED, api).await?;
    r.awaiting("approve_features").await?;
    let out = r
        .stack
        .cli(&["approve", &r.run, "approve_features", "--by", "ana"])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    // 4 first, settled at once (the third settle), then 1, as `tests/hardened.rs` does.
    for (feature, settled) in [("4", 3), ("1", 4)] {
        r.awaiting("quarantine_review").await?;
        let out = r
            .stack
            .cli(&["quarantine", "approve", &r.run, feature, "--by", "ana"])?;
        assert_eq!(out.code, 0, "{feature}: {}", out.stderr);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let s = r.stack.get(&format!("/v1/runs/{}", r.run)).await?;
            if s["visits"]["settle"].as_u64() >= Some(settled) || s["finished_at"].is_string() {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "{feature} never settled: {s}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let status = r.end(api).await?;
    assert_eq!(status["status"], "succeeded", "{api}: {status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hardened_coder_on_anthropic() -> anyhow::Result<()> {
    hardened("anthropic").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hardened_coder_on_openai() -> anyhow::Result<()> {
    hardened("openai").await
}
