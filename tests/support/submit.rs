//! Submitting a graph written by the test: a git repository of given files, the graph and its
//! input in the stack's folder, `fleet submit` with an empty script.

use crate::stack::Stack;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A git repository at `dir/name` holding `files` (path, contents) in one commit.
pub fn git_repo(dir: &Path, name: &str, files: &[(&str, &str)]) -> anyhow::Result<PathBuf> {
    let dest = dir.join(name);
    for (path, text) in files {
        let file = dest.join(path);
        std::fs::create_dir_all(file.parent().expect("a file has a folder"))?;
        std::fs::write(file, text)?;
    }
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "-A"],
        &[
            "-c",
            "user.name=test",
            "-c",
            "user.email=test@localhost",
            "commit",
            "-q",
            "-m",
            "test repository",
        ],
    ] {
        let out = Command::new("git")
            .arg("-C")
            .arg(&dest)
            .args(args)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(dest)
}

/// `git -C repo args`, its standard output trimmed.
pub fn git(repo: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Submits the graph `yaml` (saved as `name`) on `repo` with `input`; the run's id.
pub fn submit_yaml(
    stack: &Stack,
    name: &str,
    yaml: &str,
    repo: &Path,
    input: &Value,
) -> anyhow::Result<String> {
    let dir = stack.dir.path().join(format!("graph-{name}"));
    std::fs::create_dir_all(&dir)?;
    let graph = dir.join("graph.yaml");
    std::fs::write(&graph, yaml)?;
    let input_file = dir.join("input.json");
    std::fs::write(&input_file, serde_json::to_vec(input)?)?;
    let out = submit_files(stack, &graph, repo, &input_file, &[])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    Ok(out.stdout.trim().to_string())
}

/// `fleet submit` of the `graph`, `repo` and `input` given, with an empty script beside the
/// graph, as the holder of `token`; the CLI's output, whatever its exit.
pub fn submit_as(
    stack: &Stack,
    graph: &Path,
    repo: &Path,
    input: &Path,
    token: &str,
) -> anyhow::Result<crate::stack::CliOutput> {
    submit_files(stack, graph, repo, input, &[("FLEET_TOKEN", token)])
}

/// `fleet submit` with `env`, writing an empty `script.json` beside the graph if it has none.
fn submit_files(
    stack: &Stack,
    graph: &Path,
    repo: &Path,
    input: &Path,
    env: &[(&str, &str)],
) -> anyhow::Result<crate::stack::CliOutput> {
    let script = graph
        .parent()
        .expect("a graph file has a folder")
        .join("script.json");
    if !script.exists() {
        std::fs::write(&script, "{}")?;
    }
    cli_submit(stack, graph, repo, input, &script, env)
}

/// `fleet submit` of the files given, as they are; the CLI's output, whatever its exit.
fn cli_submit(
    stack: &Stack,
    graph: &Path,
    repo: &Path,
    input: &Path,
    script: &Path,
    env: &[(&str, &str)],
) -> anyhow::Result<crate::stack::CliOutput> {
    stack.cli_env(
        &[
            "submit",
            "--graph",
            &graph.display().to_string(),
            "--repo",
            &repo.display().to_string(),
            "--input",
            &input.display().to_string(),
            "--script",
            &script.display().to_string(),
        ],
        env,
    )
}

/// `fleet submit` of the graph, repository, input and script files given (none written),
/// failing unless the run was created; the run's id.
pub fn submit_with_script(
    stack: &Stack,
    graph: &Path,
    repo: &Path,
    input: &Path,
    script: &Path,
) -> anyhow::Result<String> {
    let out = cli_submit(stack, graph, repo, input, script, &[])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    Ok(out.stdout.trim().to_string())
}

/// As `submit_as`, failing unless the run was created; the run's id.
pub fn submit_run_as(
    stack: &Stack,
    graph: &Path,
    repo: &Path,
    input: &Path,
    token: &str,
) -> anyhow::Result<String> {
    let out = submit_as(stack, graph, repo, input, token)?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    Ok(out.stdout.trim().to_string())
}
