//! The hybrid TDD graph (seed 000) on the real stack with scripted agents, and the graph
//! language features it relies on: joins held through a coordinator crash, the blind barrier,
//! approvals.

use fleet_tests::stack::{example, workspace_root, Stack};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const RUN_TIMEOUT: Duration = Duration::from_secs(180);

fn graph() -> String {
    workspace_root()
        .join("graphs/hybrid-tdd/graph.yaml")
        .display()
        .to_string()
}

fn make_repo(stack: &Stack) -> anyhow::Result<String> {
    let dest = stack.dir.path().join("stack-repo");
    let out =
        std::process::Command::new(workspace_root().join("examples/hybrid-stack/make-repo.sh"))
            .arg(&dest)
            .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(dest.display().to_string())
}

fn write_json(stack: &Stack, name: &str, v: &Value) -> anyhow::Result<String> {
    let p = stack.dir.path().join(name);
    std::fs::write(&p, serde_json::to_vec_pretty(v)?)?;
    Ok(p.display().to_string())
}

fn read_example(name: &str) -> anyhow::Result<Value> {
    Ok(serde_json::from_str(&std::fs::read_to_string(example(
        &format!("hybrid-stack/{name}"),
    ))?)?)
}

/// Submits a hybrid run; `strictness` overrides merge into the example's.
async fn submit(stack: &Stack, script: Value, strictness: Value) -> anyhow::Result<String> {
    let repo = make_repo(stack)?;
    let mut input = read_example("input.json")?;
    for (k, v) in strictness.as_object().cloned().unwrap_or_default() {
        input["spec"]["strictness"][k] = v;
    }
    let input = write_json(stack, "input.json", &input)?;
    let script = write_json(stack, "script.json", &script)?;
    let out = stack.cli(&[
        "submit",
        "--graph",
        &graph(),
        "--repo",
        &repo,
        "--input",
        &input,
        "--script",
        &script,
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    Ok(out.stdout.trim().to_string())
}

async fn finish(stack: &Stack, run: &str) -> anyhow::Result<(Value, Value)> {
    let status = stack.wait_run(run, RUN_TIMEOUT).await?;
    let result = stack.get(&format!("/v1/runs/{run}/result")).await?["result"].clone();
    Ok((status, result))
}

fn interval(
    logs: &Value,
    node: &str,
) -> (
    chrono::DateTime<chrono::FixedOffset>,
    chrono::DateTime<chrono::FixedOffset>,
) {
    let e = logs
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["node"] == node)
        .unwrap_or_else(|| panic!("no {node} in {logs}"));
    let t = |k: &str| chrono::DateTime::parse_from_rfc3339(e[k].as_str().unwrap()).unwrap();
    (t("started_at"), t("finished_at"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_happy_path_succeeds_with_a_complete_result_and_parallel_blind_branches(
) -> anyhow::Result<()> {
    let stack = Stack::start("hyok", 2, &[]).await?;
    let run = submit(&stack, read_example("script-happy.json")?, json!({})).await?;
    let (status, r) = finish(&stack, &run).await?;
    assert_eq!(status["status"], "succeeded", "{r}");
    assert_eq!(r["success"], true);
    assert_eq!(r["exit"], "Success");
    for field in [
        "spec",
        "tests_coverage",
        "understanding",
        "type_adversary",
        "mutation_adversary",
        "witness",
        "verification",
        "total_cost",
        "attempts",
        "branches",
    ] {
        assert!(!r[field].is_null(), "HybridResult lacks {field}: {r}");
    }
    assert_eq!(r["spec"].as_array().unwrap().len(), 5);
    assert_eq!(r["type_adversary"]["verdict"], "TypeSystemSound");
    // The verdict comes from mutants the harness executed, not from the agent's counts.
    let m = &r["mutation_adversary"];
    assert_eq!(m["verdict"], "TestSuiteRobust", "{m}");
    assert_eq!(m["executed"], true);
    assert!(m["tried"].as_u64().unwrap() >= 10, "{m}");
    assert_eq!(m["survived"], 0, "{m}");
    assert_eq!(r["tests_coverage"]["sketches_uncovered"], json!([]));
    assert_eq!(r["tests_coverage"]["examples_covered"], 6);
    // Every check that ran passed; the fix checks did not run (no fix was needed).
    let checks = r["verification"].as_array().unwrap();
    let ran = |name: &str| checks.iter().find(|c| c["check"] == name).unwrap()["passed"].clone();
    assert_eq!(ran("build(impl)"), true);
    assert_eq!(ran("mutants(impl)"), true);
    assert_eq!(ran("build(fix)"), Value::Null);
    assert!(
        checks.iter().all(|c| c["passed"] != false),
        "{}",
        r["verification"]
    );
    assert_eq!(
        r["branches"].as_object().unwrap().len(),
        4,
        "skeleton, tests, impl, merge"
    );
    assert_eq!(r["understanding"]["converging"], true);
    assert!(r["witness"]["observations"].as_array().is_some());
    // The witness is an observer: reports that arrive after the exit are attached to the result.
    let deadline = Instant::now() + Duration::from_secs(30);
    let r = loop {
        let r = stack.get(&format!("/v1/runs/{run}/result")).await?["result"].clone();
        if r["advisory_pending"]
            .as_array()
            .is_none_or(|p| p.is_empty())
        {
            break r;
        }
        assert!(Instant::now() < deadline, "the witness never reported: {r}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let reported = r["witness"]["observations"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0)
        + usize::from(r["observers"]["witness"].is_object());
    assert!(reported >= 1, "{r}");
    assert_eq!(
        status["visits"]["witness"], 3,
        "types, tests and impl were observed"
    );

    // Tests and impl ran at overlapping times, on fresh worktrees of the skeleton.
    let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
    let (ts, te) = interval(&logs, "tests");
    let (is, ie) = interval(&logs, "impl");
    assert!(
        ts < ie && is < te,
        "tests [{ts}, {te}] and impl [{is}, {ie}] did not overlap"
    );
    // The harness ran the tests on the skeleton and saw them fail, then pass on the merge.
    let verify = stack
        .node_artifact_json(&run, "verify_tdd", 1, "test_report.json")
        .await?;
    assert_eq!(verify["passed"], false);
    assert!(verify["failures"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["message"]
            .as_str()
            .unwrap_or("")
            .contains("NotImplementedError")));
    let validate = stack
        .node_artifact_json(&run, "validate", 1, "test_report.json")
        .await?;
    assert_eq!(validate["counts"]["passed"], 7);
    // Every frozen test ran (the set recorded on the skeleton), and nothing else.
    assert_eq!(validate["executed"], verify["executed"]);
    assert_eq!(validate["executed"].as_array().unwrap().len(), 7);
    assert_eq!(validate["missing"], json!([]));
    assert_eq!(validate["unexpected"], json!([]));
    // The impl's prompt never mentions the tests' names beyond the echo of sketch names.
    let impl_prompt = stack
        .node_artifact_text(&run, "impl", 1, "prompt.md")
        .await?;
    assert!(!impl_prompt.contains("test_push_then_pop_returns_item"));
    assert!(
        impl_prompt.contains("push_pop_inverse"),
        "the echo carries sketch names"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tests_that_pass_on_the_skeleton_are_rejected_with_feedback_then_succeed(
) -> anyhow::Result<()> {
    let stack = Stack::start("hytriv", 2, &[]).await?;
    let run = submit(
        &stack,
        read_example("script-trivial-then-ok.json")?,
        json!({}),
    )
    .await?;
    let (status, r) = finish(&stack, &run).await?;
    assert_eq!(status["status"], "succeeded", "{r}");
    assert_eq!(status["visits"]["tests"], 2);
    assert_eq!(status["visits"]["verify_tdd"], 2);
    assert_eq!(status["visits"]["impl"], 1, "only the tests agent re-runs");
    let first = stack
        .node_artifact_json(&run, "verify_tdd", 1, "test_report.json")
        .await?;
    assert_eq!(
        first["passed"], true,
        "the trivial tests passed on the stubs"
    );
    let prompt = stack
        .node_artifact_text(&run, "tests", 2, "prompt.md")
        .await?;
    assert!(prompt.contains("Prior Attempt Rejected"), "{prompt}");
    assert!(prompt.contains("Tests passed on skeleton. Tests are trivial or broken."));
    assert!(prompt.contains("test_push_then_pop_returns_item, test_pop_returns_last_pushed"));
    let prompt1 = stack
        .node_artifact_text(&run, "tests", 1, "prompt.md")
        .await?;
    assert!(!prompt1.contains("Prior Attempt Rejected"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_type_hole_routes_to_the_types_fix_until_its_budget_is_exhausted(
) -> anyhow::Result<()> {
    let stack = Stack::start("hyhole", 2, &[]).await?;
    let run = submit(
        &stack,
        read_example("script-type-holes.json")?,
        json!({"max_fix_attempts": 2}),
    )
    .await?;
    let (status, r) = finish(&stack, &run).await?;
    assert_eq!(status["status"], "failed");
    assert_eq!(r["exit"], "TypeFixBudgetExhausted", "{r}");
    assert_eq!(status["visits"]["types"], 3, "the design and two fixes");
    assert_eq!(status["visits"]["type_adversary"], 3);
    assert!(status["visits"]["tests"].is_null(), "never forked");
    assert_eq!(r["type_adversary"]["verdict"], "TypeSystemHasHoles");
    let fix_prompt = stack
        .node_artifact_text(&run, "types", 2, "prompt.md")
        .await?;
    assert!(
        fix_prompt.contains("fix attempt 1") && fix_prompt.contains("the internal list is public"),
        "{fix_prompt}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fix_loop_repeating_one_failure_pattern_ends_stuck() -> anyhow::Result<()> {
    // The impl pops and peeks at the bottom. Fix 1 repairs peek but not pop; fix 2 still pops
    // the bottom and breaks is_empty. The set of failing tests differs in every round, but
    // test_pop_returns_last_pushed fails the same way three times: stuck, per test.
    let stack = Stack::start("hystuck", 2, &[]).await?;
    let run = submit(
        &stack,
        read_example("script-stuck.json")?,
        json!({"max_fix_attempts": 5}),
    )
    .await?;
    let (status, r) = finish(&stack, &run).await?;
    let mut failing = Vec::new();
    let mut stuck_signatures = Vec::new();
    for v in 1..=3 {
        let report = stack
            .node_artifact_json(&run, "validate", v, "test_report.json")
            .await?;
        let mut names: Vec<String> = report["failures"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        failing.push(names);
        stuck_signatures.extend(
            report["failure_signatures"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
                .filter(|s| s.contains("::test_pop_returns_last_pushed:"))
                .map(str::to_string),
        );
    }
    assert_eq!(
        failing,
        vec![
            vec!["test_peek_keeps_the_top", "test_pop_returns_last_pushed"],
            vec!["test_pop_returns_last_pushed"],
            vec![
                "test_new_stack_is_empty",
                "test_pop_returns_last_pushed",
                "test_push_then_pop_returns_item"
            ],
        ],
        "the failures as a whole never repeat"
    );
    // `assert s.pop() == 2` failed the same way each time; pytest's message names the object
    // (`<stack.Stack object at 0x...>`), whose address differs in every run, and must not make
    // the signatures differ.
    assert_eq!(stuck_signatures.len(), 3, "{stuck_signatures:?}");
    assert!(
        stuck_signatures.iter().all(|s| *s == stuck_signatures[0]),
        "one failure, one signature (worker/src/verify.rs's failure_signatures must not carry \
         the memory addresses in pytest's message): {stuck_signatures:#?}"
    );
    assert_eq!(status["status"], "failed");
    assert_eq!(r["exit"], "StuckOnPattern", "{r}");
    assert_eq!(status["visits"]["validate"], 3);
    assert_eq!(status["visits"]["fix"], 2);
    assert_eq!(
        status["visits"]["fix_build"], 2,
        "the harness built each fix"
    );
    let seen = r["understanding"]["failures_seen"].as_array().unwrap();
    assert_eq!(seen.len(), 4, "{seen:?}");
    for s in seen {
        let expected = if s["test"] == "test_pop_returns_last_pushed" {
            3
        } else {
            1
        };
        assert_eq!(s["occurrences"], expected, "{s}");
    }
    assert_eq!(
        r["understanding"]["fixes_applied"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    assert_eq!(r["attempts"], 2);
    // The fix agent's second prompt carries what was tried and seen before.
    let p = stack
        .node_artifact_text(&run, "fix", 2, "prompt.md")
        .await?;
    assert!(
        p.contains("Previous fixes tried")
            && p.contains("pop: pop from the end (LogicFix)")
            && p.contains("peek: return the last item (LogicFix)"),
        "{p}"
    );
    assert!(p.contains("test_pop_returns_last_pushed"));
    assert!(p.contains("validation 1: test_pop_returns_last_pushed, test_peek_keeps_the_top"));
    Ok(())
}

/// The script's tests file without the named test functions (and their claimed properties).
fn without_tests(script: &mut Value, names: &[&str]) {
    let file = &mut script["tests"][0]["files"]["tests/test_stack.py"];
    let kept: Vec<&str> = file
        .as_str()
        .unwrap()
        .split("\n\n\n")
        .filter(|block| {
            !names
                .iter()
                .any(|n| block.starts_with(&format!("def {n}():")))
        })
        .collect();
    *file = json!(kept.join("\n\n\n"));
    script["tests"][0]["output"]["properties"]
        .as_array_mut()
        .unwrap()
        .retain(|p| !names.iter().any(|n| p["name"] == *n));
}

/// The survivors of an executed mutation round, as `(function, mutation_type)`.
fn survivors(m: &Value) -> Vec<(String, String)> {
    let mut s: Vec<(String, String)> = m["survivors"]
        .as_array()
        .unwrap_or_else(|| panic!("no survivors list: {m}"))
        .iter()
        .map(|s| {
            (
                s["function"].as_str().unwrap_or("").to_string(),
                s["mutation_type"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    s.sort();
    s
}

fn peek_off_by_one() -> Vec<(String, String)> {
    vec![("peek".to_string(), "OffByOne".to_string())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn surviving_mutants_block_in_blocking_mode_and_only_advise_otherwise() -> anyhow::Result<()>
{
    // script-survivors.json's tests only peek at a one-item stack: `_items[-1]` -> `_items[0]`
    // survives (an OffByOne, not critical); every other mutant of the impl is killed.
    let stack = Stack::start("hymut", 2, &[]).await?;

    // Advisory: the executed survivor is reported, the run succeeds.
    let advisory = submit(
        &stack,
        read_example("script-survivors.json")?,
        json!({"mutation_blocking": false}),
    )
    .await?;
    let (status, r) = finish(&stack, &advisory).await?;
    assert_eq!(
        status["status"], "succeeded",
        "a non-critical survivor only advises: {r}"
    );
    let m = &r["mutation_adversary"];
    assert_eq!(m["executed"], true, "{m}");
    assert_eq!(m["verdict"], "TestSuiteHasGaps", "{m}");
    assert_eq!(m["survived"], 1, "{m}");
    assert!(m["tried"].as_u64().unwrap() >= 10, "{m}");
    assert_eq!(survivors(m), peek_off_by_one(), "{m}");
    assert_eq!(m["critical"], json!([]));
    assert_eq!(m["strengthened"], 0);
    assert!(status["visits"]["strengthen"].is_null());

    // Blocking: the survivors go to the tests agent, whose added test kills the mutant; the
    // mutants run again against the strengthened suite, which becomes the frozen set.
    let strengthened = submit(
        &stack,
        read_example("script-survivors.json")?,
        json!({"mutation_blocking": true}),
    )
    .await?;
    let (status, r) = finish(&stack, &strengthened).await?;
    assert_eq!(status["status"], "succeeded", "{r}");
    assert_eq!(r["exit"], "Success");
    let m = &r["mutation_adversary"];
    assert_eq!(m["verdict"], "TestSuiteRobust", "{m}");
    assert_eq!(m["survived"], 0, "{m}");
    assert_eq!(m["strengthened"], 1, "{m}");
    assert_eq!(status["visits"]["mutants"], 2);
    assert_eq!(status["visits"]["mutation_score"], 2);
    assert_eq!(status["visits"]["recheck"], 1);
    let prompt = stack
        .node_artifact_text(&strengthened, "strengthen", 1, "prompt.md")
        .await?;
    assert!(
        prompt.contains("`peek`") && prompt.contains("(OffByOne)"),
        "the survivor reached the tests agent: {prompt}"
    );
    let state = stack
        .artifact_json(&format!("runs/{strengthened}/state.json"))
        .await?;
    let first = state["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["node"] == "mutation_score")
        .unwrap();
    assert_eq!(survivors(&first["output"]), peek_off_by_one());
    // The strengthened suite kept every frozen test and added one.
    let verify = stack
        .node_artifact_json(&strengthened, "verify_tdd", 1, "test_report.json")
        .await?;
    let recheck = stack
        .node_artifact_json(&strengthened, "recheck", 1, "test_report.json")
        .await?;
    assert_eq!(recheck["passed"], true);
    let executed = |v: &Value| -> Vec<String> {
        v["executed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_string())
            .collect()
    };
    let (before, after) = (executed(&verify), executed(&recheck));
    assert!(before.iter().all(|t| after.contains(t)), "{after:?}");
    assert_eq!(after.len(), before.len() + 1, "{after:?}");
    assert!(after
        .iter()
        .any(|t| t.ends_with("::test_peek_sees_the_last_of_two")));

    // Blocking, and the added test kills nothing: the same survivor after every round of the
    // budget, then the run fails.
    let mut script = read_example("script-survivors.json")?;
    let file = &mut script["strengthen"][0]["files"]["tests/test_stack.py"];
    let useless = format!(
        "{}\n\ndef test_push_accepts_none():\n    s = Stack()\n    s.push(None)\n    assert s.pop() is None\n",
        read_example("script-survivors.json")?["tests"][0]["files"]["tests/test_stack.py"]
            .as_str()
            .unwrap()
    );
    *file = json!(useless);
    let added = &mut script["strengthen"][0]["output"]["properties"][6];
    added["name"] = json!("test_push_accepts_none");
    added["target_functions"] = json!(["push", "pop"]);
    let exhausted = submit(
        &stack,
        script,
        json!({"mutation_blocking": true, "max_fix_attempts": 2}),
    )
    .await?;
    let (status, r) = finish(&stack, &exhausted).await?;
    assert_eq!(status["status"], "failed");
    assert_eq!(r["exit"], "MutantsSurvived", "{r}");
    let m = &r["mutation_adversary"];
    assert_eq!(m["verdict"], "TestSuiteHasGaps", "{m}");
    assert_eq!(survivors(m), peek_off_by_one(), "{m}");
    assert_eq!(m["critical"], json!([]));
    assert_eq!(m["strengthened"], 2, "the budget");
    assert_eq!(status["visits"]["mutants"], 3);

    // Without the empty-stack tests, removing pop's and peek's guards goes unnoticed: critical
    // survivors fail the run even in advisory mode, though the LLM adversary claims none.
    let mut script = read_example("script-survivors.json")?;
    without_tests(
        &mut script,
        &["test_pop_empty_raises", "test_peek_empty_raises"],
    );
    script["mutation"][0]["output"]["survivors"] = json!([]);
    let critical = submit(&stack, script, json!({"mutation_blocking": false})).await?;
    let (status, r) = finish(&stack, &critical).await?;
    assert_eq!(status["status"], "failed");
    assert_eq!(r["exit"], "CriticalMutantSurvived", "{r}");
    let m = &r["mutation_adversary"];
    let critical: Vec<(String, String)> = survivors(&json!({"survivors": m["critical"]}));
    assert_eq!(
        critical,
        vec![
            ("peek".to_string(), "RemovedCheck".to_string()),
            ("pop".to_string(), "RemovedCheck".to_string()),
        ],
        "{m}"
    );
    assert_eq!(
        survivors(m),
        vec![
            ("peek".to_string(), "OffByOne".to_string()),
            ("peek".to_string(), "RemovedCheck".to_string()),
            ("pop".to_string(), "RemovedCheck".to_string()),
        ],
        "{m}"
    );
    assert_eq!(m["survived"], 3, "{m}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unimplemented_property_sketch_blocks_when_coverage_is_required() -> anyhow::Result<()> {
    let stack = Stack::start("hycov", 2, &[]).await?;
    let mut script = read_example("script-happy.json")?;
    script["tests"][0]["output"]["properties"][0]["covers_sketch"] = Value::Null;
    let run = submit(&stack, script, json!({"require_coverage": true})).await?;
    let (status, r) = finish(&stack, &run).await?;
    assert_eq!(status["status"], "failed");
    assert_eq!(r["exit"], "CoverageEnforcementFailed", "{r}");
    assert_eq!(
        r["tests_coverage"]["sketches_uncovered"],
        json!(["push_pop_inverse"])
    );
    // The harness derived the uncovered sketch itself (the agent claimed full coverage).
    // The mirror of the final state is written just after the run is seen to end: wait for it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let verify = loop {
        let state = stack
            .artifact_json(&format!("runs/{run}/state.json"))
            .await?;
        let found = state["history"]
            .as_array()
            .and_then(|h| h.iter().find(|o| o["node"] == "verify_tdd").cloned());
        match found {
            Some(v) => break v,
            None if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            None => anyhow::bail!("the state mirror never showed verify_tdd: {state}"),
        }
    };
    assert_eq!(verify["derived"]["uncovered"], json!(["push_pop_inverse"]));
    assert_eq!(
        r["tests_coverage"]["self_reported"]["sketches_uncovered"],
        json!([])
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_function_that_is_not_on_disk_is_caught() -> anyhow::Result<()> {
    let stack = Stack::start("hyclaim", 2, &[]).await?;
    let run = submit(&stack, read_example("script-ghost-claim.json")?, json!({})).await?;
    let (status, r) = finish(&stack, &run).await?;
    assert_eq!(status["status"], "failed");
    assert_eq!(r["exit"], "ClaimedFunctionNotOnDisk", "{r}");
    let errors = r["failure"]["claim_errors"]
        .as_array()
        .expect("structured claim errors");
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["kind"], "missing_definition");
    assert_eq!(errors[0]["name"], "is_empty");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_of_the_impl_is_reachable_from_the_tests_container() -> anyhow::Result<()> {
    let stack = Stack::start("hyblind", 2, &[]).await?;
    let script = read_example("script-blind.json")?;
    let delay = script["tests"][0]["delay_seconds"].as_f64().unwrap();
    let run = submit(&stack, script, json!({})).await?;
    let (status, _) = finish(&stack, &run).await?;
    assert_eq!(status["status"], "succeeded");
    // The impl had written its marker before the tests agent searched: the tests agent waits
    // `delay` seconds after its job started (and after its container was up) before searching.
    let logs = stack.get(&format!("/v1/runs/{run}/logs")).await?;
    let (_, impl_end) = interval(&logs, "impl");
    let (tests_start, _) = interval(&logs, "tests");
    assert!(
        impl_end < tests_start + chrono::Duration::milliseconds((delay * 1000.0) as i64),
        "impl finished before the search: impl ended {impl_end}, tests started {tests_start}"
    );
    let transcript = stack
        .node_artifact_json(&run, "tests", 1, "transcript.json")
        .await?;
    let results: Vec<String> = transcript
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["tool"] == "run_command")
        .map(|e| e["result"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(results.len(), 3, "{transcript}");
    let stdout = |r: &str| {
        r.split("stdout:\n")
            .nth(1)
            .unwrap_or("")
            .split("\nstderr:")
            .next()
            .unwrap_or("")
            .trim()
            .to_string()
    };
    // Whole file system: no readable file holds the impl's marker.
    assert_eq!(stdout(&results[0]), "grep-done", "{}", results[0]);
    // No git directory or pack anywhere in the container, so no object of any branch.
    assert_eq!(stdout(&results[1]), "find-done", "{}", results[1]);
    assert!(
        results[2].contains("not a git repository"),
        "{}",
        results[2]
    );
    // And the impl was really there to find: the merged tests passed against it.
    let report = stack
        .node_artifact_json(&run, "validate", 1, "test_report.json")
        .await?;
    assert_eq!(report["passed"], true);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_killed_between_two_join_arrivals_still_fires_the_join_once(
) -> anyhow::Result<()> {
    let mut stack = Stack::start("hyjoin", 2, &[]).await?;
    let mut script = read_example("script-happy.json")?;
    script["tests"][0]["delay_seconds"] = json!(0.2);
    script["impl"][0]["delay_seconds"] = json!(6.0);
    let run = submit(&stack, script, json!({})).await?;
    // Wait for the first arrival (tests) to be applied, then kill the coordinator.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = stack.get(&format!("/v1/runs/{run}")).await?;
        let tests_done = s["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["node"] == "tests" && j["state"] == "done");
        if tests_done {
            assert_eq!(s["joins"]["join"]["arrived"], json!(["tests"]), "{s}");
            break;
        }
        assert!(Instant::now() < deadline, "tests never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stack.kill_coordinator()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stack.restart_coordinator().await?;
    let (status, r) = finish(&stack, &run).await?;
    assert_eq!(status["status"], "succeeded", "{r}");
    assert_eq!(status["joins"]["join"]["fired"], 1);
    assert_eq!(
        status["visits"]["verify_tdd"], 1,
        "the join's successor ran once"
    );
    assert_eq!(status["visits"]["join"], 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_node_pauses_the_run_until_approved_through_the_cli() -> anyhow::Result<()> {
    let stack = Stack::start("approve", 1, &[]).await?;
    let repo = make_repo(&stack)?;
    let input = write_json(&stack, "input.json", &json!({}))?;
    let script = write_json(&stack, "script.json", &json!({}))?;
    let graph = workspace_root()
        .join("graphs/review/graph.yaml")
        .display()
        .to_string();
    let out = stack.cli(&[
        "submit", "--graph", &graph, "--repo", &repo, "--input", &input, "--script", &script,
    ])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let run = out.stdout.trim().to_string();

    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = stack.get(&format!("/v1/runs/{run}")).await?;
    assert_eq!(s["status"], "running");
    assert_eq!(s["awaiting_approval"], json!(["review"]));
    assert_eq!(s["jobs"], json!([]), "nothing runs before the decision");
    let chart = stack.cli(&["graph", "show", &graph, "--run", &run])?;
    assert!(
        chart.stdout.contains("class review waiting"),
        "{}",
        chart.stdout
    );

    let approve = stack.cli(&[
        "approve",
        &run,
        "review",
        "--comment",
        "looks right",
        "--by",
        "ana",
    ])?;
    assert_eq!(approve.code, 0, "{}", approve.stderr);
    assert_eq!(approve.stdout.trim(), "review: decided");
    let again = stack.cli(&["approve", &run, "review", "--reject"])?;
    assert_eq!(
        again.stdout.trim(),
        "review: already decided",
        "a second decision changes nothing"
    );

    let done = stack.wait_run(&run, Duration::from_secs(60)).await?;
    assert_eq!(done["status"], "succeeded");
    assert_eq!(done["approvals"]["review"]["decision"]["by"], "ana");
    assert_eq!(done["visits"]["checks"], 1, "the approved path ran once");
    Ok(())
}
