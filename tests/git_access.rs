//! Git for the nodes that ask (`worktree.git`, seed 001's Merger and Rebaser, seed 003's merge
//! agent), on the real stack: the node's worktree has a `.git` of its own with the branches it
//! named and nothing else (an object of another run that the same worker's mirror holds cannot
//! be read from it); a merge done with git inside the container becomes the harness's commit
//! of the files; nodes that did not ask have no `.git`; and the agent's git cannot carry a file
//! past the node's write scope.

use fleet_tests::stack::Stack;
use fleet_tests::submit::{git, git_repo, submit_yaml};
use serde_json::{json, Value};
use std::time::Duration;

/// A run that only checks out its repository: the worker's mirror then holds its objects.
const LOOK: &str = r#"
name: look
start: look
defaults: {image: "fleet-agent-py:1"}
nodes:
  look:
    kind: command
    commands: ["true"]
    worktree: {from: base, mode: ro}
    routes: [{to: done}]
  done: {kind: exit, status: look.ok}
"#;

const MERGE: &str = r#"
name: git-access
start: fork
defaults: {image: "fleet-agent-py:1"}
nodes:
  fork:
    kind: command
    commands: ["true"]
    worktree: {from: base, mode: ro}
    routes: [{to: [left, right]}]
  left:
    kind: command
    commands: ["sh -c 'echo left > left.txt'"]
    worktree: {from: base, mode: rw, commit: true}
    writes: ["'left.txt'"]
    routes: [{to: both}]
  right:
    kind: command
    commands: ["sh -c 'echo right > right.txt; test ! -e .git'"]
    worktree: {from: base, mode: rw, commit: true}
    writes: ["'right.txt'"]
    routes: [{to: both}]
  both:
    kind: join
    wait_for: [left, right]
    routes: [{to: merger}]
  merger:
    kind: command
    commands:
      - "git for-each-ref --format=%(refname:short)"
      - "git rev-list --all"
      - "sh -c 'git cat-file -e {{ input.secret }} && echo leaked || echo sealed'"
      - "sh -c 'git cat-file -e {{ input.own }} && echo present || echo missing'"
      - "git status --porcelain"
      - "git merge --no-edit right"
    worktree: {from: left, mode: rw, commit: true, git: [base, left, right]}
    writes: WRITES
    routes:
      - {to: scope_violation, when: merger.output.scope_violation}
      - {to: check, when: merger.ok}
      - {to: failed}
  check:
    kind: command
    commands: ["test -e left.txt", "test -e right.txt", "sh -c 'test ! -e .git'"]
    worktree: {from: merger, mode: ro}
    routes: [{to: done}]
  done: {kind: exit, status: check.ok}
  failed: {kind: exit, status: "false"}
  scope_violation: {kind: exit, status: "false"}
"#;

fn stdout(result: &Value, node: &str, i: usize) -> String {
    result["outputs"][node]["output"]["results"][i]["stdout_trunc"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_asks_gets_git_with_its_branches_and_nothing_else() -> anyhow::Result<()> {
    let stack = Stack::start("gitaccess", 1, &[]).await?;
    let dir = stack.dir.path().to_path_buf();

    // Another run's repository, with a secret, goes through the same worker first.
    let other = git_repo(
        &dir,
        "other",
        &[("secret.txt", "the other team's secret\n")],
    )?;
    let secret = git(&other, &["rev-parse", "HEAD:secret.txt"])?;
    let look = submit_yaml(&stack, "look", LOOK, &other, &json!({}))?;
    let status = stack.wait_run(&look, Duration::from_secs(120)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");

    let repo = git_repo(&dir, "work", &[("README.md", "work\n")])?;
    let base = git(&repo, &["rev-parse", "HEAD"])?;
    let own = git(&repo, &["rev-parse", "HEAD:README.md"])?;
    let graph = MERGE.replace("WRITES", r#"["'right.txt'"]"#);
    let run = submit_yaml(
        &stack,
        "merge",
        &graph,
        &repo,
        &json!({"secret": secret, "own": own}),
    )?;
    let status = stack.wait_run(&run, Duration::from_secs(180)).await?;
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?["result"].clone();
    assert_eq!(status["status"], "succeeded", "{result} {status}");
    assert_eq!(result["exit"], "done", "{result}");

    // The named branches, and only the run's commits: base, left's and right's.
    let refs: Vec<String> = stdout(&result, "merger", 0)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(refs, ["base", "left", "right"], "{result}");
    let commits: Vec<String> = stdout(&result, "merger", 1)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(commits.len(), 3, "{commits:?}");
    assert!(commits.contains(&base), "{commits:?}");
    // The other run's object is in the worker's mirror, not in the job's git directory.
    assert_eq!(stdout(&result, "merger", 2).trim(), "sealed", "{result}");
    // The start is checked out with a matching index: nothing to commit.
    // ... while the run's own objects are (the same check can fail).
    assert_eq!(stdout(&result, "merger", 3).trim(), "present", "{result}");
    // The start is checked out with a matching index: nothing to commit.
    assert_eq!(stdout(&result, "merger", 4).trim(), "", "{result}");
    // The merge made in the container became the harness's commit of the files: `check`, on
    // the merger's commit, found both files and no `.git`.
    assert!(
        stdout(&result, "merger", 5).contains("right.txt"),
        "{result}"
    );
    assert_eq!(result["outputs"]["check"]["ok"], true, "{result}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_git_cannot_carry_a_file_past_the_write_scope() -> anyhow::Result<()> {
    let stack = Stack::start("gitaccess-scope", 1, &[]).await?;
    let repo = git_repo(stack.dir.path(), "work", &[("README.md", "work\n")])?;
    // The merger may change nothing: the merge brings right.txt in.
    let graph = MERGE.replace("WRITES", "[]");
    let run = submit_yaml(
        &stack,
        "scope",
        &graph,
        &repo,
        &json!({"secret": "0000", "own": "0000"}),
    )?;
    let status = stack.wait_run(&run, Duration::from_secs(180)).await?;
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?["result"].clone();
    assert_eq!(status["status"], "failed", "{result}");
    assert_eq!(result["exit"], "scope_violation", "{result}");
    let violation = result["outputs"]["merger"]["output"]["scope_violation"].to_string();
    assert!(violation.contains("right.txt"), "{violation}");
    assert!(!violation.contains(".git"), "{violation}");
    Ok(())
}
