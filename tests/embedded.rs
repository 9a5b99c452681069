//! The embedded mode's sandbox choice: Docker when it is there; otherwise a refusal that names
//! the way out, and host processes only when asked for by name.

use fleet_tests::stack::{example, make_calc_repo, run_cli, workspace_root};

#[test]
fn without_docker_fleet_run_refuses_unless_the_local_process_sandbox_is_named() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let repo = make_calc_repo(dir.path())?.display().to_string();
    let graph = workspace_root()
        .join("graphs/bench/noop-command.yaml")
        .display()
        .to_string();
    let input = dir.path().join("input.json");
    std::fs::write(&input, "{}")?;
    let script = example("factory-calc/script-pass.json");
    let out_dir = dir.path().join("out").display().to_string();
    let input = input.display().to_string();
    let args = [
        "run", "--graph", &graph, "--repo", &repo, "--input", &input, "--script", &script, "--out",
        &out_dir,
    ];
    let no_docker = vec![(
        "DOCKER_HOST".to_string(),
        "unix:///nonexistent/docker.sock".to_string(),
    )];

    let refused = run_cli(&args, &no_docker)?;
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("docker is not available"),
        "{}",
        refused.stderr
    );
    assert!(
        refused.stderr.contains("--sandbox local-process"),
        "{}",
        refused.stderr
    );
    assert!(!dir.path().join("out/runs").exists(), "nothing ran");

    let mut local_args = args.to_vec();
    local_args.extend(["--sandbox", "local-process"]);
    let local = run_cli(&local_args, &no_docker)?;
    assert_eq!(local.code, 0, "{}", local.stderr);
    assert!(local.stdout.contains(": SUCCEEDED"), "{}", local.stdout);
    Ok(())
}
