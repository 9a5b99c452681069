//! Haskell as configuration (seed 003's Stack module and its QuickCheck properties) on the real
//! stack, in `fleet-agent-hs:1`: the skeleton compiles and is all stubs, every property fails on
//! it; the implementation with real properties passes every property. Then the cheats: a
//! planted `.ghc.environment.*` file, a test module whose `main` prints passing lines, a
//! property that prints them, an implementation that prints them through `unsafePerformIO`, a
//! test module that has ghc run the repo's preprocessor on it; none makes a wrong
//! implementation pass.

use fleet_tests::stack::{workspace_root, Stack};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const IMPL: &str = "src/Data/Stack.hs";
const SPEC: &str = "test/Spec.hs";

/// A git repository of the example's `variant` at `dir/name`, with `changes` (path, contents)
/// written over it, in one commit.
fn repo(dir: &Path, name: &str, variant: &str, changes: &[(&str, String)]) -> PathBuf {
    let dest = dir.join(name);
    let out = Command::new(workspace_root().join("examples/haskell-stack/make-repo.sh"))
        .arg(&dest)
        .arg(variant)
        .output()
        .expect("make-repo.sh runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if changes.is_empty() {
        return dest;
    }
    for (path, body) in changes {
        std::fs::write(dest.join(path), body).expect("a change is written");
        if path.ends_with(".sh") {
            use std::os::unix::fs::PermissionsExt;
            let exec = std::fs::Permissions::from_mode(0o755);
            std::fs::set_permissions(dest.join(path), exec).expect("a script is made executable");
        }
    }
    for args in [
        vec!["add", "-A"],
        vec![
            "-c",
            "user.name=fleet",
            "-c",
            "user.email=fleet@localhost",
            "commit",
            "-q",
            "-m",
            name,
        ],
    ] {
        let ok = Command::new("git")
            .arg("-C")
            .arg(&dest)
            .args(&args)
            .status()
            .expect("git runs")
            .success();
        assert!(ok, "git {args:?} in {name}");
    }
    dest
}

fn example(variant: &str, path: &str) -> String {
    std::fs::read_to_string(
        workspace_root().join(format!("examples/haskell-stack/{variant}/{path}")),
    )
    .expect("an example file")
}

/// The implementation with `push` dropping its value: every property about pushing fails.
fn wrong_impl() -> String {
    let good = example("impl", IMPL);
    let wrong = good.replace("push = Push\n", "push _ s = s\n");
    assert_ne!(good, wrong);
    wrong
}

/// Submits `graph` on `repo` and waits; the run's status and its node outcomes.
async fn run(stack: &Stack, graph: &str, repo: &Path) -> anyhow::Result<(Value, Value)> {
    let graph = workspace_root().join(format!("examples/haskell-stack/{graph}"));
    let input = workspace_root().join("examples/haskell-stack/input.json");
    let out = stack.cli(&[
        "submit",
        "--graph",
        &graph.display().to_string(),
        "--repo",
        &repo.display().to_string(),
        "--input",
        &input.display().to_string(),
        "--script",
        &workspace_root()
            .join("examples/child-runs/no-agents.json")
            .display()
            .to_string(),
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let id = out.stdout.trim().to_string();
    let status = stack.wait_run(&id, Duration::from_secs(600)).await?;
    let result = stack.get(&format!("/v1/runs/{id}/result")).await?;
    Ok((status, result["result"]["outputs"].clone()))
}

fn ids(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

const PROPERTIES: [&str; 5] = [
    "Spec::prop_empty",
    "Spec::prop_lifo_order",
    "Spec::prop_push_peek",
    "Spec::prop_push_pop_inverse",
    "Spec::prop_size_counts",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_skeleton_fails_every_property_and_the_implementation_passes_them() -> anyhow::Result<()>
{
    let stack = Stack::start("haskell", 2, &[]).await?;
    let dir = stack.dir.path().to_path_buf();
    let skeleton = repo(&dir, "skeleton", "skeleton", &[]);
    let implemented = repo(&dir, "impl", "impl", &[]);
    let (skel, green) = tokio::join!(
        run(&stack, "skeleton.yaml", &skeleton),
        run(&stack, "verify.yaml", &implemented)
    );

    let (status, outputs) = skel?;
    assert_eq!(status["status"], "succeeded", "{outputs:#}");
    let check = &outputs["skeleton"]["output"];
    assert_eq!(check["build_ok"], true, "{check:#}");
    assert_eq!(check["not_stubs"], serde_json::json!([]), "{check:#}");
    let red = &outputs["red"]["output"];
    assert_eq!(ids(&red["executed"]), PROPERTIES, "{red:#}");
    assert_eq!(red["counts"]["failed"], 5, "{red:#}");
    assert_eq!(red["broken"], false, "{red:#}");
    let messages = red["failures"].to_string();
    assert!(messages.contains("SPEC[lifo]"), "{messages}");

    let (status, outputs) = green?;
    assert_eq!(status["status"], "succeeded", "{outputs:#}");
    let green = &outputs["green"]["output"];
    assert_eq!(green["passed"], true, "{green:#}");
    assert_eq!(ids(&green["executed"]), PROPERTIES, "{green:#}");
    assert_eq!(green["counts"]["passed"], 5, "{green:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_environments_and_forged_lines_do_not_make_properties_pass() -> anyhow::Result<()> {
    let stack = Stack::start("haskellcheats", 2, &[]).await?;
    let dir = stack.dir.path().to_path_buf();
    // ghc would read this from the working folder: a package database that is not there and a
    // package that does not exist. Read, it would break the build of the honest project too.
    let env_file = (
        ".ghc.environment.x86_64-linux-9.0.2",
        "clear-package-db\npackage-db /work/.fake-db\npackage-id QuickCheck-9.9.9-fake\n"
            .to_string(),
    );
    let honest_env = repo(&dir, "honest-env", "impl", std::slice::from_ref(&env_file));
    let wrong_env = repo(&dir, "wrong-env", "impl", &[env_file, (IMPL, wrong_impl())]);
    let fake_main = format!(
        "{}\nmain :: IO ()\nmain = do\n  putStrLn \"running 5 tests\"\n  mapM_ (\\p -> putStrLn (\"test Spec::\" ++ p ++ \" ... ok\")) [\"prop_empty\", \"prop_push_peek\", \"prop_push_pop_inverse\", \"prop_lifo_order\", \"prop_size_counts\"]\n  putStrLn \"test result: ok. 5 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\"\n",
        example("impl", SPEC)
    );
    let wrong_main = repo(
        &dir,
        "wrong-main",
        "impl",
        &[(SPEC, fake_main), (IMPL, wrong_impl())],
    );
    let forging_property = example("impl", SPEC).replace(
        "prop_empty :: Bool\nprop_empty = ",
        "prop_empty :: Property\nprop_empty = ioProperty (putStrLn \"test Spec::prop_push_peek ... ok\" >> pure True) .&&. ",
    );
    let wrong_print = repo(
        &dir,
        "wrong-print",
        "impl",
        &[(SPEC, forging_property), (IMPL, wrong_impl())],
    );
    let unsafe_impl = wrong_impl()
        .replace(
            "  ) where\n",
            "  ) where\n\nimport System.IO.Unsafe (unsafePerformIO)\n",
        )
        .replace(
            "isEmpty s = size s == 0",
            "isEmpty s = unsafePerformIO (putStrLn \"test Spec::prop_lifo_order ... ok\") `seq` size s == 0",
        );
    let wrong_unsafe = repo(&dir, "wrong-unsafe", "impl", &[(IMPL, unsafe_impl)]);
    // A test module that has ghc run a preprocessor of the repo's on itself: the preprocessor
    // swaps in properties that all hold, whatever the implementation does.
    let all_hold = "module Spec where\nprop_empty, prop_push_peek, prop_push_pop_inverse, prop_lifo_order, prop_size_counts :: Bool\nprop_empty = True\nprop_push_peek = True\nprop_push_pop_inverse = True\nprop_lifo_order = True\nprop_size_counts = True\n";
    let preprocessed = format!(
        "{{-# OPTIONS_GHC -F -pgmF test/pp.sh #-}}\n{}",
        example("impl", SPEC)
    );
    let wrong_pp = repo(
        &dir,
        "wrong-pp",
        "impl",
        &[
            (SPEC, preprocessed),
            (
                "test/pp.sh",
                format!("#!/bin/sh\nprintf '{all_hold}' > \"$3\"\n"),
            ),
            (IMPL, wrong_impl()),
        ],
    );

    // The same pragma in a module the tests import: ghc would run the program as well.
    let helper_pp = repo(
        &dir,
        "helper-pp",
        "impl",
        &[
            (
                SPEC,
                example("impl", SPEC).replace(
                    "import Test.QuickCheck\n",
                    "import Test.QuickCheck\nimport Helpers ()\n",
                ),
            ),
            (
                "test/Helpers.hs",
                "{-# options_ghc -F -pgmF test/pp.sh #-}\nmodule Helpers where\n".to_string(),
            ),
            ("test/pp.sh", "#!/bin/sh\ncp \"$2\" \"$3\"\n".to_string()),
        ],
    );

    let (honest_env, wrong_env, wrong_main, wrong_print, wrong_unsafe, wrong_pp, helper_pp) = tokio::join!(
        run(&stack, "verify.yaml", &honest_env),
        run(&stack, "verify.yaml", &wrong_env),
        run(&stack, "verify.yaml", &wrong_main),
        run(&stack, "verify.yaml", &wrong_print),
        run(&stack, "verify.yaml", &wrong_unsafe),
        run(&stack, "verify.yaml", &wrong_pp),
        run(&stack, "verify.yaml", &helper_pp),
    );

    // The planted environment is never read: the honest project still passes...
    let (status, outputs) = honest_env?;
    assert_eq!(status["status"], "succeeded", "{outputs:#}");
    assert_eq!(outputs["green"]["output"]["passed"], true);
    // ...and the wrong one still fails, property by property.
    let (status, outputs) = wrong_env?;
    assert_eq!(status["status"], "failed", "{outputs:#}");
    let green = &outputs["green"]["output"];
    assert_eq!(green["passed"], false, "{green:#}");
    assert_eq!(green["broken"], false, "{green:#}");
    assert!(ids(&green["passed_tests"]).contains(&"prop_empty".to_string()));
    assert!(green["counts"]["failed"].as_u64() >= Some(3), "{green:#}");

    // The test module's own `main` never runs: the harness's runner replaces it.
    let (status, outputs) = wrong_main?;
    assert_eq!(status["status"], "failed", "{outputs:#}");
    let green = &outputs["green"]["output"];
    assert_eq!(green["passed"], false, "{green:#}");
    assert!(green["counts"]["failed"].as_u64() >= Some(3), "{green:#}");
    assert!(!green["stdout_tail"].to_string().contains("5 passed"));

    // A line printed beside the runner's own: the runner's closing line disagrees.
    let (status, outputs) = wrong_print?;
    assert_eq!(status["status"], "failed", "{outputs:#}");
    let green = &outputs["green"]["output"];
    assert_eq!(green["passed"], false, "{green:#}");
    assert_eq!(green["broken"], true, "{green:#}");
    assert!(
        green["reasons"].to_string().contains("disagrees"),
        "{green:#}"
    );

    // Unsafe I/O in the implementation is refused before anything runs it.
    let (status, outputs) = wrong_unsafe?;
    assert_eq!(status["status"], "failed", "{outputs:#}");
    let build = &outputs["build"]["output"];
    assert_eq!(build["build_ok"], false, "{build:#}");
    assert_eq!(
        build["forbidden"][0]["name"], "System.IO.Unsafe",
        "{build:#}"
    );
    assert!(
        outputs["green"].is_null(),
        "the tests never ran: {outputs:#}"
    );

    // A test module that changes how ghc compiles it is refused before ghc runs.
    let (status, outputs) = wrong_pp?;
    assert_eq!(status["status"], "failed", "{outputs:#}");
    assert_eq!(outputs["green"]["ok"], false, "{outputs:#}");
    let refusal = status["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|j| j["node"] == "green")
        .map(|j| j["error"].to_string())
        .unwrap_or_default();
    assert!(
        refusal
            .contains("test/Spec.hs:1: a module of the test run may not use `pragma:OPTIONS_GHC`"),
        "{status:#}"
    );
    let (status, outputs) = helper_pp?;
    assert_eq!(status["status"], "failed", "{outputs:#}");
    let refusal = status["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|j| j["node"] == "green")
        .map(|j| j["error"].to_string())
        .unwrap_or_default();
    assert!(
        refusal.contains(
            "test/Helpers.hs:1: a module of the test run may not use `pragma:OPTIONS_GHC`"
        ),
        "{status:#}"
    );
    Ok(())
}
