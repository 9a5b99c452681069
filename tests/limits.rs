//! Bounds on what a submission may ask for, on the real stack: a 20,000-node graph (under the
//! 2 MB body limit) is refused at once by the CLI's checker and by the API, a graph past a
//! budget likewise, and the coordinator keeps serving other runs meanwhile.

use fleet_tests::stack::{example, make_calc_repo, Stack};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A chain of `n` no-op nodes into an exit.
fn chain(n: usize) -> Value {
    let mut nodes = serde_json::Map::new();
    for i in 0..n {
        nodes.insert(
            format!("n{i}"),
            json!({"kind": "harness", "op": "noop", "routes": [{"to": format!("n{}", i + 1)}]}),
        );
    }
    nodes.insert(format!("n{n}"), json!({"kind": "exit", "status": "true"}));
    json!({"name": "big", "start": "n0", "nodes": nodes})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twenty_thousand_node_graph_is_refused_in_under_a_second_and_others_are_served(
) -> anyhow::Result<()> {
    let stack = Stack::start("limits", 1, &[]).await?;

    // The CLI's checker.
    let yaml = serde_yaml::to_string(&chain(20_000))?;
    let path = stack.dir.path().join("big.yaml");
    std::fs::write(&path, &yaml)?;
    let t = Instant::now();
    let out = stack.cli(&["graph", "check", &path.display().to_string()])?;
    let took = t.elapsed();
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("20001 nodes; at most 500"),
        "{}",
        out.stderr
    );
    assert!(took < Duration::from_secs(1), "the CLI took {took:?}");

    // The API, given the bundle directly (what a client that skips the CLI would send).
    let repo = make_calc_repo(stack.dir.path())?;
    let body = json!({
        "graph": {"source": "big.yaml", "graph": chain(20_000), "files": {}},
        "input": {},
        "repo": repo.display().to_string(),
        "git_ref": "HEAD",
        "agent": {"backend": "scripted", "script": {}},
    });
    let bytes = serde_json::to_vec(&body)?;
    assert!(bytes.len() < 2 * 1024 * 1024, "{} bytes", bytes.len());
    let http = reqwest::Client::new();
    let t = Instant::now();
    let r = http
        .post(format!("{}/v1/runs", stack.server))
        .header("content-type", "application/json")
        .body(bytes)
        .timeout(Duration::from_secs(30))
        .send()
        .await?;
    let took = t.elapsed();
    let status = r.status();
    let text = r.text().await?;
    assert!(status.is_client_error(), "{status}: {text}");
    assert!(text.contains("at most 500"), "{text}");
    assert!(took < Duration::from_secs(1), "the API took {took:?}");

    // Budgets: a visit budget of four billion is refused by name.
    let mut g = chain(2);
    g["nodes"]["n0"]["max_visits"] = json!(4_000_000_000u64);
    let body = json!({
        "graph": {"source": "g.yaml", "graph": g, "files": {}},
        "input": {}, "repo": repo.display().to_string(), "git_ref": "HEAD",
        "agent": {"backend": "scripted", "script": {}},
    });
    let r = http
        .post(format!("{}/v1/runs", stack.server))
        .json(&body)
        .send()
        .await?;
    let (status, text) = (r.status(), r.text().await?);
    assert!(status.is_client_error(), "{status}: {text}");
    assert!(text.contains("max_visits is above"), "{text}");

    // max_turns of four billion for the built-in agent.
    let wo: Value = serde_json::from_str(&std::fs::read_to_string(example(
        "factory-calc/work_order.json",
    ))?)?;
    let factory = stack.cli(&["graph", "check", &example("../graphs/factory/graph.yaml")])?;
    assert_eq!(factory.code, 0, "{}", factory.stderr);
    let body = json!({
        "graph": {"source": "g.yaml", "graph": chain(2), "files": {}},
        "input": {"work_order": wo}, "repo": repo.display().to_string(), "git_ref": "HEAD",
        "agent": {"backend": "anthropic", "model": "m", "max_turns": 4_000_000_000u64},
    });
    let r = http
        .post(format!("{}/v1/runs", stack.server))
        .json(&body)
        .send()
        .await?;
    let (status, text) = (r.status(), r.text().await?);
    assert!(status.is_client_error(), "{status}: {text}");
    assert!(text.contains("max_turns is 4000000000"), "{text}");

    // A fan-out wider than the limit: the run fails at once naming it, no job is published.
    let graph = fleet_tests::stack::workspace_root().join("graphs/bench/fanout.yaml");
    let input = stack.dir.path().join("wide.json");
    let items: Vec<u32> = (0..100_001).collect();
    std::fs::write(&input, serde_json::to_vec(&json!({ "items": items }))?)?;
    let script = stack.dir.path().join("none.json");
    std::fs::write(&script, "{}")?;
    let out = stack.cli(&[
        "submit",
        "--graph",
        &graph.display().to_string(),
        "--repo",
        &repo.display().to_string(),
        "--input",
        &input.display().to_string(),
        "--script",
        &script.display().to_string(),
    ])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let wide = out.stdout.trim().to_string();
    let status = stack.wait_run(&wide, Duration::from_secs(30)).await?;
    assert_eq!(status["status"], "failed", "{status}");
    let result = stack.get(&format!("/v1/runs/{wide}/result")).await?;
    assert_eq!(result["result"]["reason"], "fanout_too_wide", "{result}");
    assert_eq!(result["result"]["limit"], 100_000, "{result}");
    assert_eq!(status["jobs"].as_array().map(Vec::len), Some(0), "{status}");

    // Ten million items do not fit in a request: refused by size (axum's 2 MiB body limit)
    // before any parsing. Just past the limit, so the whole body is in the socket before the
    // server answers and closes (a body far past it races the close: a broken pipe).
    let huge = vec![b'1'; 2 * 1024 * 1024 + 1024];
    let r = http
        .post(format!("{}/v1/runs", stack.server))
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 413, "{}", r.text().await?);

    // The coordinator still serves: a normal run passes.
    let out = stack.cli(&[
        "submit",
        "--repo",
        &repo.display().to_string(),
        "--work-order",
        &example("factory-calc/work_order.json"),
        "--script",
        &example("factory-calc/script-pass.json"),
    ])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let run = out.stdout.trim().to_string();
    let status = stack.wait_run(&run, Duration::from_secs(120)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    Ok(())
}
