//! A tree of child runs, 1 + 3 + 9, each run one agent turn against the fake LLM server (a
//! fixed delay per call) then a spawn of its children: the wall time from submit to the root's
//! end against the tree's critical path (three agent jobs, one per level) and against the sum
//! of every agent job (what running the thirteen one after another would take).
//!
//! Usage: fleet-bench tree [--delay-ms D] [--concurrency C]

use fleet_tests::fake_llm::{FakeLlm, ScriptedReply};
use fleet_tests::stack::{make_calc_repo, Stack};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const GRAPH: &str = r#"
name: tree-bench
start: think
defaults:
  image: fleet-agent-py:1
  tree: {max_depth: 2, max_runs: 13}
nodes:
  think:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    with: {name: "input.name"}
    routes: [{to: kids}]
  kids:
    kind: spawn
    over: "input.children or []"
    routes:
      - {to: done, when: kids.ok}
      - {to: failed}
  done: {kind: exit, status: "true"}
  failed: {kind: exit, status: "false"}
"#;

/// Seconds between two RFC 3339 times of a job view.
fn seconds(job: &Value) -> f64 {
    let at = |k: &str| {
        job[k]
            .as_str()
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
    };
    match (at("started_at"), at("ended_at")) {
        (Some(a), Some(b)) => (b - a).num_milliseconds() as f64 / 1e3,
        _ => 0.0,
    }
}

pub async fn run(delay_ms: usize, concurrency: usize) -> anyhow::Result<()> {
    let delay = Duration::from_millis(delay_ms as u64);
    let submit = json!({"summary": "planned"});
    let replies = (0..13)
        .map(|_| ScriptedReply::tool_use("submit", submit.clone()))
        .collect();
    let llm = FakeLlm::start_with(replies, 0, delay).await?;
    let env = [
        ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
        ("ANTHROPIC_API_KEY", "k"),
    ];
    let stack = Stack::start_with("benchtree", 2, concurrency, &env).await?;
    let dir = stack.dir.path().join("tree-bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("graph.yaml"), GRAPH)?;
    std::fs::write(dir.join("prompt.md"), "Plan {{ params.name }}.")?;
    std::fs::write(
        dir.join("schema.json"),
        r#"{"type": "object", "required": ["summary"], "properties": {"summary": {"type": "string"}}}"#,
    )?;
    let leaf = |name: String| json!({"name": name});
    let mid = |i: usize| {
        json!({"name": format!("c{i}"),
               "children": (0..3).map(|j| leaf(format!("c{i}{j}"))).collect::<Vec<_>>()})
    };
    let input = json!({"name": "root", "children": (0..3).map(mid).collect::<Vec<_>>()});
    let input_path = dir.join("input.json");
    std::fs::write(&input_path, serde_json::to_vec(&input)?)?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();

    let t = Instant::now();
    let out = stack.cli(&[
        "submit",
        "--graph",
        &dir.join("graph.yaml").display().to_string(),
        "--repo",
        &repo,
        "--input",
        &input_path.display().to_string(),
        "--llm-api",
        "anthropic",
        "--llm-model",
        "claude-haiku-4-5",
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let root = out.stdout.trim().to_string();
    let status = stack
        .wait_run_every(&root, Duration::from_secs(600), Duration::from_millis(20))
        .await?;
    let wall = t.elapsed().as_secs_f64();
    anyhow::ensure!(status["status"] == "succeeded", "{status}");

    // Every run's agent job, by run; the critical path is the longest root → leaf chain.
    let think = |st: &Value| {
        st["jobs"]
            .as_array()
            .and_then(|j| j.iter().find(|j| j["node"] == "think").map(seconds))
            .unwrap_or(0.0)
    };
    let mut runs = 1;
    let mut sum = think(&status);
    let mut critical: f64 = 0.0;
    for child in status["children"].as_array().into_iter().flatten() {
        let c = stack
            .get(&format!(
                "/v1/runs/{}",
                child["run_id"].as_str().unwrap_or_default()
            ))
            .await?;
        runs += 1;
        sum += think(&c);
        let mut deepest: f64 = 0.0;
        for grandchild in c["children"].as_array().into_iter().flatten() {
            let g = stack
                .get(&format!(
                    "/v1/runs/{}",
                    grandchild["run_id"].as_str().unwrap_or_default()
                ))
                .await?;
            runs += 1;
            sum += think(&g);
            deepest = deepest.max(think(&g));
        }
        critical = critical.max(think(&c) + deepest);
    }
    critical += think(&status);
    anyhow::ensure!(runs == 13, "the tree has {runs} runs");
    let ideal = 3.0 * delay.as_secs_f64();
    println!("# fleet-bench tree: 1 + 3 + 9 runs, one agent call of {delay_ms} ms each, 2 workers x {concurrency} jobs\n");
    println!("| measure | seconds |\n|---|---|");
    println!("| wall, submit to the root's end | {wall:.2} |");
    println!("| critical path of agent jobs (3 levels, measured) | {critical:.2} |");
    println!("| critical path of LLM delays alone (3 x {delay_ms} ms) | {ideal:.2} |");
    println!("| sum of the 13 agent jobs (one after another) | {sum:.2} |");
    println!(
        "\noverhead beyond the critical path: {:.2} s ({:.2} s per level); speed-up over one after another: {:.1}x",
        wall - critical,
        (wall - critical) / 3.0,
        sum / wall
    );
    Ok(())
}
