//! What a submission is, on the real stack: the run id follows everything that changes what
//! runs (an edited graph is a new run, the same submission the same run, an id claimed with
//! other contents is refused), artifacts are served only for their own run, templates are
//! evaluated within bounds (a doubling string is refused or fails its run cleanly, and the
//! coordinator serves on), a script that cannot drive the graph is refused at submit, and a
//! remembered repository pack never skips the clean-tree preflight nor outlives its commit.

use fleet_tests::stack::{example, make_calc_repo, workspace_root, Stack};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const RUN_TIMEOUT: Duration = Duration::from_secs(180);

/// A copy of `graphs/factory` (graph, schemas, templates) under `dir`; returns the graph file.
fn copy_factory_graph(dir: &Path) -> anyhow::Result<PathBuf> {
    let from = workspace_root().join("graphs/factory");
    let to = dir.join("factory-graph");
    for sub in ["schemas", "templates"] {
        std::fs::create_dir_all(to.join(sub))?;
        for entry in std::fs::read_dir(from.join(sub))? {
            let entry = entry?;
            std::fs::copy(entry.path(), to.join(sub).join(entry.file_name()))?;
        }
    }
    std::fs::copy(from.join("graph.yaml"), to.join("graph.yaml"))?;
    Ok(to.join("graph.yaml"))
}

fn cli_submit(
    stack: &Stack,
    graph: &Path,
    repo: &str,
    script: &str,
) -> anyhow::Result<fleet_tests::stack::CliOutput> {
    stack.cli(&[
        "submit",
        "--graph",
        &graph.display().to_string(),
        "--repo",
        repo,
        "--work-order",
        &example("factory-calc/work_order.json"),
        "--script",
        script,
    ])
}

async fn get_status(stack: &Stack, path: &str) -> anyhow::Result<(u16, String)> {
    let r = reqwest::get(format!("{}{path}", stack.server)).await?;
    Ok((r.status().as_u16(), r.text().await?))
}

/// The graph bundle of a graph file, as the CLI sends it.
fn bundle(graph: &Path) -> anyhow::Result<Value> {
    let dir = graph.parent().unwrap_or(Path::new(".")).to_path_buf();
    let yaml = std::fs::read_to_string(graph)?;
    let bundle = shared::graph::load_bundle(&graph.display().to_string(), &yaml, |rel| {
        std::fs::read_to_string(dir.join(rel)).map_err(|e| e.to_string())
    })
    .map_err(|es| anyhow::anyhow!("{es:?}"))?;
    Ok(serde_json::to_value(bundle)?)
}

fn factory_body(graph: &Value, repo: &str, script: &str) -> anyhow::Result<Value> {
    let wo: Value = serde_json::from_str(&std::fs::read_to_string(example(
        "factory-calc/work_order.json",
    ))?)?;
    let script: Value = serde_json::from_str(&std::fs::read_to_string(example(&format!(
        "factory-calc/{script}"
    )))?)?;
    Ok(json!({
        "graph": graph, "input": {"work_order": wo}, "repo": repo, "git_ref": "HEAD",
        "agent": {"backend": "scripted", "script": script},
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_id_follows_the_contents_and_a_claimed_id_is_not_answered_with_another_run(
) -> anyhow::Result<()> {
    // No workers: these runs only need to exist.
    let stack = Stack::start("ident", 0, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let graph = copy_factory_graph(stack.dir.path())?;
    let pass = example("factory-calc/script-pass.json");

    let first = cli_submit(&stack, &graph, &repo, &pass)?;
    assert_eq!(first.code, 0, "{}", first.stderr);
    let run_a = first.stdout.trim().to_string();
    assert_eq!(run_a.len(), 12, "{run_a}");

    // The identical submission returns the same run.
    let again = cli_submit(&stack, &graph, &repo, &pass)?;
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.stdout.trim(), run_a);
    assert!(again.stderr.contains("exists"), "{}", again.stderr);

    // Another script (same work order, repo and graph) is another run.
    let other_script = cli_submit(
        &stack,
        &graph,
        &repo,
        &example("factory-calc/script-always-fail.json"),
    )?;
    assert_eq!(other_script.code, 0, "{}", other_script.stderr);
    assert_ne!(other_script.stdout.trim(), run_a);

    // Editing the graph bundle (here its prompt template) makes a new run, not the old one.
    let template = graph.parent().unwrap().join("templates/se.md.j2");
    let mut text = std::fs::read_to_string(&template)?;
    text.push_str("\nKeep the diff minimal.\n");
    std::fs::write(&template, text)?;
    let edited = cli_submit(&stack, &graph, &repo, &pass)?;
    assert_eq!(edited.code, 0, "{}", edited.stderr);
    let run_b = edited.stdout.trim().to_string();
    assert_ne!(run_b, run_a, "an edited graph returned the old run");
    assert!(!edited.stderr.contains("exists"), "{}", edited.stderr);
    let status = stack.get(&format!("/v1/runs/{run_b}")).await?;
    assert_eq!(
        status["meta"]["submission_hash"].as_str().map(str::len),
        Some(64),
        "{status}"
    );

    // Claiming the first run's id with the edited contents is refused with a conflict that
    // names the run; the same contents under that id return it.
    let edited_bundle = bundle(&graph)?;
    let mut claim = factory_body(&edited_bundle, &repo, "script-pass.json")?;
    claim["run_id"] = json!(run_a);
    let (code, answer) = stack.post_answer("/v1/runs", &claim).await?;
    assert_eq!(code, 409, "{answer}");
    let msg = answer["error"].as_str().unwrap_or_default();
    assert!(
        msg.contains(&format!("run `{run_a}` exists with different contents")),
        "{answer}"
    );
    let mut same = factory_body(&edited_bundle, &repo, "script-pass.json")?;
    same["run_id"] = json!(run_b);
    let (code, answer) = stack.post_answer("/v1/runs", &same).await?;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["run_id"], json!(run_b), "{answer}");
    assert_eq!(answer["created"], json!(false), "{answer}");

    // A chosen id: created once, returned for the same contents, refused for others.
    let mut chosen = factory_body(&edited_bundle, &repo, "script-pass.json")?;
    chosen["run_id"] = json!("my-run-1");
    let (code, answer) = stack.post_answer("/v1/runs", &chosen).await?;
    assert_eq!(code, 201, "{answer}");
    assert_eq!(answer["run_id"], "my-run-1");
    let (code, answer) = stack.post_answer("/v1/runs", &chosen).await?;
    assert_eq!((code, &answer["created"]), (200, &json!(false)), "{answer}");
    let mut other = factory_body(&edited_bundle, &repo, "script-always-fail.json")?;
    other["run_id"] = json!("my-run-1");
    let (code, answer) = stack.post_answer("/v1/runs", &other).await?;
    assert_eq!(code, 409, "{answer}");
    // The stored run is still the first one's.
    let stored = stack.get("/v1/runs/my-run-1").await?;
    assert_eq!(stored["run_id"], "my-run-1");

    // An id that could not name a run is refused.
    let mut bad = factory_body(&edited_bundle, &repo, "script-pass.json")?;
    bad["run_id"] = json!("../x");
    let (code, answer) = stack.post_answer("/v1/runs", &bad).await?;
    assert_eq!(code, 400, "{answer}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_are_served_only_for_their_own_run() -> anyhow::Result<()> {
    let stack = Stack::start("artif", 1, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let wo = example("factory-calc/work_order.json");
    let submit = |script: &str| {
        stack.cli(&[
            "submit",
            "--repo",
            &repo,
            "--work-order",
            &wo,
            "--script",
            &example(&format!("factory-calc/{script}")),
        ])
    };
    let a = submit("script-pass.json")?;
    assert_eq!(a.code, 0, "{}", a.stderr);
    let run_a = a.stdout.trim().to_string();
    let b = submit("script-always-fail.json")?;
    assert_eq!(b.code, 0, "{}", b.stderr);
    let run_b = b.stdout.trim().to_string();
    let status = stack.wait_run(&run_a, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let key = format!("runs/{run_a}/run_summary.json");

    // Run A's own key: served by the run's route (full or relative key) and by the CLI.
    let (code, body) = get_status(&stack, &format!("/v1/runs/{run_a}/artifacts/{key}")).await?;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(&run_a), "{body}");
    let (code, rel) = get_status(
        &stack,
        &format!("/v1/runs/{run_a}/artifacts/run_summary.json"),
    )
    .await?;
    assert_eq!((code, &rel), (200, &body));
    let cli = stack.cli(&["artifacts", &run_a, "--get", &key])?;
    assert_eq!(cli.code, 0, "{}", cli.stderr);
    assert!(cli.stdout.contains(&run_a), "{}", cli.stdout);

    // Another run's key under run B: refused, whatever it names.
    let (code, body) = get_status(&stack, &format!("/v1/runs/{run_b}/artifacts/{key}")).await?;
    assert_eq!(code, 404, "{body}");
    assert!(
        body.contains(&format!("does not belong to run `{run_b}`")),
        "{body}"
    );
    // And through the CLI: `fleet artifacts B --get <A's key>` is refused.
    let cross = stack.cli(&["artifacts", &run_b, "--get", &key])?;
    assert_ne!(cross.code, 0, "{}", cross.stdout);
    assert!(
        cross.stderr.contains("does not belong to run"),
        "{}",
        cross.stderr
    );
    // A run that does not exist: refused, on both routes.
    let (code, body) = get_status(&stack, &format!("/v1/runs/nosuchrun/artifacts/{key}")).await?;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("run `nosuchrun` not found"), "{body}");
    let (code, body) = get_status(&stack, "/v1/artifacts/runs/nosuchrun/run_summary.json").await?;
    assert_eq!(code, 404, "{body}");
    let cli = stack.cli(&[
        "artifacts",
        "nosuchrun",
        "--get",
        "runs/nosuchrun/run_summary.json",
    ])?;
    assert_ne!(cli.code, 0, "{}", cli.stdout);
    // Keys that climb out of the run's folder or are absolute: refused before any read.
    for bad in [
        format!("runs%2F{run_a}%2F..%2F{run_b}%2Fstate.json"),
        "%2Fetc%2Fpasswd".to_string(),
        format!("runs%2F{run_a}%2F%2Fx"),
    ] {
        let (code, body) = get_status(&stack, &format!("/v1/runs/{run_a}/artifacts/{bad}")).await?;
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(body.contains("invalid artifact key"), "{body}");
    }
    let (code, body) = get_status(
        &stack,
        &format!("/v1/artifacts/runs%2F{run_a}%2F..%2F{run_b}%2Fstate.json"),
    )
    .await?;
    assert_eq!(code, 400, "{body}");
    Ok(())
}

/// A graph of one command node whose command is `command` (a template), then an exit.
fn command_graph(command: &str) -> Value {
    json!({
        "source": "g.yaml",
        "graph": {
            "name": "tmpl", "start": "c",
            "defaults": {"image": "fleet-agent-py:1", "timeout_seconds": 60},
            "nodes": {
                "c": {"kind": "command", "commands": [command],
                      "worktree": {"from": "base", "mode": "ro"}, "routes": [{"to": "done"}]},
                "done": {"kind": "exit", "status": "c.ok"},
            },
        },
        "files": {},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_that_doubles_a_string_is_refused_or_fails_cleanly_and_others_run(
) -> anyhow::Result<()> {
    let stack = Stack::start("tmpl", 1, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let empty_script = json!({"backend": "scripted", "script": {}});
    let body = |command: &str| {
        json!({"graph": command_graph(command), "input": {}, "repo": repo,
               "agent": empty_script})
    };

    // A string doubled sixty times through a namespace: refused by the checker at submit.
    let doubling = "{% set ns = namespace(s='x') %}{% for i in range(60) %}\
                    {% set ns.s = ns.s ~ ns.s %}{% endfor %}echo {{ ns.s }}";
    let t = Instant::now();
    let (code, answer) = stack.post_answer("/v1/runs", &body(doubling)).await?;
    assert_eq!(code, 400, "{answer}");
    assert!(
        answer.to_string().contains("namespace() is not available"),
        "{answer}"
    );
    // The same by straight-line sets: evaluated when the run starts, within its bounds.
    let straight = format!(
        "{{% set s = 'x' %}}{}echo {{{{ s|length }}}}",
        "{% set s = s ~ s %}".repeat(60)
    );
    let (code, answer) = stack.post_answer("/v1/runs", &body(&straight)).await?;
    assert_eq!(code, 400, "{answer}");
    assert!(
        answer.to_string().contains("the run cannot start")
            && answer.to_string().contains("MAX_TEMPLATE_VALUE_BYTES"),
        "{answer}"
    );
    // Nested ranges run out of fuel.
    let nested = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}\
                  {% endfor %}echo done";
    let (code, answer) = stack.post_answer("/v1/runs", &body(nested)).await?;
    assert_eq!(code, 400, "{answer}");
    assert!(answer.to_string().contains("ran out of fuel"), "{answer}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());

    // A prompt template that doubles a string, rendered by the worker: the job fails with the
    // bound named, and the run ends.
    let graph = copy_factory_graph(stack.dir.path())?;
    std::fs::write(
        graph.parent().unwrap().join("templates/se.md.j2"),
        format!(
            "{{{{ params.work_order.id }}}}{{% set s = 'x' %}}{}{{{{ s|length }}}}",
            "{% set s = s ~ s %}".repeat(60)
        ),
    )?;
    let out = cli_submit(
        &stack,
        &graph,
        &repo,
        &example("factory-calc/script-pass.json"),
    )?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let run = out.stdout.trim().to_string();
    let status = stack.wait_run(&run, RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "failed", "{status}");
    let errors: Vec<String> = status["jobs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|j| j["error"].as_str().map(str::to_string))
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("MAX_TEMPLATE_VALUE_BYTES")),
        "{errors:?}"
    );

    // The coordinator serves on: a normal run passes.
    let ok = stack.cli(&[
        "submit",
        "--repo",
        &repo,
        "--work-order",
        &example("factory-calc/work_order.json"),
        "--script",
        &example("factory-calc/script-pass.json"),
    ])?;
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let status = stack.wait_run(ok.stdout.trim(), RUN_TIMEOUT).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_that_cannot_drive_the_graph_is_refused_at_submit() -> anyhow::Result<()> {
    let stack = Stack::start("script", 0, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    for (script, needle) in [
        (json!({}), "the agent script has no steps"),
        (json!({"se": []}), "has no steps"),
        (json!({"review": [{"output": {}}]}), "no steps for it"),
    ] {
        let path = stack.dir.path().join("script.json");
        std::fs::write(&path, serde_json::to_vec(&script)?)?;
        let out = stack.cli(&[
            "submit",
            "--repo",
            &repo,
            "--work-order",
            &example("factory-calc/work_order.json"),
            "--script",
            &path.display().to_string(),
        ])?;
        assert_ne!(out.code, 0, "{script} was accepted: {}", out.stdout);
        assert!(out.stderr.contains(needle), "{script}: {}", out.stderr);
    }
    let runs = stack.get("/v1/runs").await?;
    assert_eq!(runs, json!([]), "nothing was created");
    Ok(())
}

fn git(repo: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("git")
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_is_checked_clean_every_time_and_packed_again_when_its_commit_moves(
) -> anyhow::Result<()> {
    // The coordinator remembers the pack of a repository's commit (a batch's runs share it):
    // the clean-tree preflight still runs on every submission, and a new commit is a new pack.
    let stack = Stack::start("subrepo", 0, &[]).await?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let graph = copy_factory_graph(stack.dir.path())?;
    let pass = example("factory-calc/script-pass.json");
    let first = cli_submit(&stack, &graph, &repo, &pass)?;
    assert_eq!(first.code, 0, "{}", first.stderr);
    let run_a = first.stdout.trim().to_string();
    let head_a = git(&repo, &["rev-parse", "HEAD"])?;
    let view = stack.get(&format!("/v1/runs/{run_a}")).await?;
    assert_eq!(view["repo"]["base_commit"], head_a.as_str(), "{view}");

    // Dirty after a remembered pack: still refused.
    std::fs::write(format!("{repo}/stray.txt"), "x")?;
    let dirty = cli_submit(&stack, &graph, &repo, &pass)?;
    assert_ne!(dirty.code, 0);
    assert!(
        dirty.stderr.contains("not clean") && dirty.stderr.contains("stray.txt"),
        "{}",
        dirty.stderr
    );

    // Committed: a new commit, a new run on it (never the remembered pack of the old one).
    git(&repo, &["add", "stray.txt"])?;
    git(
        &repo,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "stray",
        ],
    )?;
    let head_b = git(&repo, &["rev-parse", "HEAD"])?;
    assert_ne!(head_a, head_b);
    let second = cli_submit(&stack, &graph, &repo, &pass)?;
    assert_eq!(second.code, 0, "{}", second.stderr);
    let run_b = second.stdout.trim().to_string();
    assert_ne!(run_a, run_b);
    let view = stack.get(&format!("/v1/runs/{run_b}")).await?;
    assert_eq!(view["repo"]["base_commit"], head_b.as_str(), "{view}");
    Ok(())
}
