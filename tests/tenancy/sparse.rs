//! Item 4: a sparse file gets past the disk quota. `truncate -s 8G` allocates no block, so a
//! quota counted in blocks let it stay in the worktree, where the commit and the factory's tree
//! hash would read all 8 GiB into the worker. The quota now counts a file's length: the job
//! ends `disk_quota_exceeded` naming the limit, the worker stays up, and the next run on it
//! (another team's, say) passes.

use fleet_tests::stack::{make_calc_repo, Stack};
use serde_json::{json, Value};
use std::time::Duration;

const RUN_TIMEOUT: Duration = Duration::from_secs(120);

fn graph(dir: &std::path::Path, name: &str, command: &str) -> anyhow::Result<String> {
    let d = dir.join(name);
    std::fs::create_dir_all(&d)?;
    let yaml = format!(
        "name: {name}\nstart: work\nnodes:\n  work:\n    kind: command\n    image: fleet-agent-py:1\n    \
         timeout_seconds: 120\n    worktree: {{from: base, mode: rw, commit: true}}\n    writes: [\"'**'\"]\n    \
         commands: {}\n    routes: [{{to: done}}]\n  done: {{kind: exit, status: work.ok}}\n",
        serde_json::to_string(&[command])?
    );
    std::fs::write(d.join("graph.yaml"), yaml)?;
    Ok(d.join("graph.yaml").display().to_string())
}

fn submit(stack: &Stack, graph: &str, tag: &str) -> anyhow::Result<String> {
    let repo = make_calc_repo(&stack.dir.path().join(tag))?;
    let input = stack.dir.path().join(format!("{tag}-input.json"));
    std::fs::write(&input, serde_json::to_vec(&json!({ "case": tag }))?)?;
    let script = stack.dir.path().join(format!("{tag}-script.json"));
    std::fs::write(&script, b"{}")?;
    let out = stack.cli(&[
        "submit",
        "--graph",
        graph,
        "--repo",
        &repo.display().to_string(),
        "--input",
        &input.display().to_string(),
        "--script",
        &script.display().to_string(),
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    Ok(out.stdout.trim().to_string())
}

fn error_of(status: &Value) -> String {
    status["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| j["node"] == "work"))
        .and_then(|j| j["error"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_file_counts_its_length_against_the_disk_quota() -> anyhow::Result<()> {
    let stack = Stack::start("tensparse", 1, &[("FLEET_JOB_DISK_MB", "50")]).await?;
    let dir = stack.dir.path().to_path_buf();
    let attack = graph(&dir, "sparse", "truncate -s 8G big.bin && echo made")?;
    let run = submit(&stack, &attack, "sparse")?;
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "failed", "{status}");
    let error = error_of(&status);
    assert!(
        error.starts_with("disk_quota_exceeded: ") && error.contains("(52428800 bytes)"),
        "{status}"
    );
    // The worker survived and serves the next run.
    let honest = graph(&dir, "honest", "echo fine > note.txt")?;
    let run = submit(&stack, &honest, "honest")?;
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    Ok(())
}
