//! The hybrid TDD graph's result (seed 000): `HybridResult`, assembled by the harness from the
//! run's history. Verdicts here are the harness's derived fields, never an agent's word.

use crate::engine::{Outcome, RunState};
use crate::ids::NodeId;
use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};

fn last<'a>(state: &'a RunState, node: &str) -> Option<&'a Outcome> {
    state.last_outcome(&NodeId::new(node))
}

fn all<'a>(state: &'a RunState, node: &'a str) -> impl Iterator<Item = &'a Outcome> + 'a {
    state
        .history
        .iter()
        .filter(move |o| o.node.as_str() == node)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// `type_fix_budget_exhausted` → `TypeFixBudgetExhausted`; the success exit is `Success`.
pub fn exit_variant(exit: &NodeId, success: bool) -> String {
    if success {
        return "Success".into();
    }
    exit.as_str()
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The coverage report recomputed from the tests agent's properties and the spec.
fn coverage(spec_fns: &[Value], tests: Option<&Outcome>) -> Value {
    let props = tests
        .and_then(|t| t.output.get("properties"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let fn_names: Vec<String> = spec_fns
        .iter()
        .filter_map(|f| f["name"].as_str().map(str::to_string))
        .collect();
    let sketches: Vec<String> = spec_fns
        .iter()
        .flat_map(|f| f["properties"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect();
    let covered_fns: BTreeSet<String> = props
        .iter()
        .flat_map(|p| strings(&p["target_functions"]))
        .collect();
    let covered_sketches: BTreeSet<String> = props
        .iter()
        .filter_map(|p| p["covers_sketch"].as_str().map(str::to_string))
        .collect();
    let examples_total: usize = spec_fns
        .iter()
        .map(|f| f["examples"].as_array().map(Vec::len).unwrap_or(0))
        .sum();
    let examples_covered: BTreeSet<String> = props
        .iter()
        .flat_map(|p| p["covers_examples"].as_array().cloned().unwrap_or_default())
        .map(|e| format!("{}#{}", e["function"], e["index"]))
        .collect();
    json!({
        "functions_covered": fn_names.iter().filter(|f| covered_fns.contains(*f)).collect::<Vec<_>>(),
        "functions_uncovered": fn_names.iter().filter(|f| !covered_fns.contains(*f)).collect::<Vec<_>>(),
        "sketches_covered": sketches.iter().filter(|s| covered_sketches.contains(*s)).collect::<Vec<_>>(),
        "sketches_uncovered": sketches.iter().filter(|s| !covered_sketches.contains(*s)).collect::<Vec<_>>(),
        "examples_covered": examples_covered.len(),
        "examples_total": examples_total,
        "self_reported": tests.map(|t| t.output["coverage"].clone()),
    })
}

/// The fix loop's understanding: failure patterns over every validation, fixes tried, what was
/// learned, and whether the loop converges.
pub fn understanding(state: &RunState) -> Value {
    let mut patterns: BTreeMap<String, (Value, usize)> = BTreeMap::new();
    for v in all(state, "validate").filter(|o| !o.ok) {
        let mut seen = BTreeSet::new();
        for f in v.output["failures"].as_array().cloned().unwrap_or_default() {
            let signature = format!(
                "{}:{}",
                f["name"].as_str().unwrap_or(""),
                f["kind"].as_str().unwrap_or("")
            );
            if seen.insert(signature.clone()) {
                let entry = patterns.entry(signature.clone()).or_insert((f.clone(), 0));
                entry.1 += 1;
            }
        }
    }
    let failures_seen: Vec<Value> = patterns
        .iter()
        .map(|(sig, (f, n))| {
            json!({"signature": sig, "test": f["name"], "category": f["kind"],
            "message": f["message"], "occurrences": n})
        })
        .collect();
    let mut fixes = Vec::new();
    let mut learnings = Vec::new();
    for f in all(state, "fix") {
        for c in f.output["changes"].as_array().cloned().unwrap_or_default() {
            learnings.push(format!(
                "{}: {} — {}",
                c["function"].as_str().unwrap_or(""),
                c["fix_type"].as_str().unwrap_or(""),
                c["what_changed"].as_str().unwrap_or("")
            ));
            fixes.push(c);
        }
    }
    let converging = last(state, "fix")
        .map(|f| {
            f.output["changes"]
                .as_array()
                .is_some_and(|c| !c.is_empty())
        })
        .unwrap_or(true);
    json!({
        "failures_seen": failures_seen,
        "fixes_applied": fixes,
        "learnings": learnings,
        "converging": converging,
    })
}

fn witness(state: &RunState) -> Value {
    let reports: Vec<&Outcome> = all(state, "witness").filter(|o| o.ok).collect();
    let mut concerns = BTreeSet::new();
    for r in &reports {
        concerns.extend(strings(&r.output["concerns"]));
    }
    let latest = reports.last();
    json!({
        "observations": reports.iter().map(|r| r.output["observation"].clone()).collect::<Vec<_>>(),
        "narrative": latest.map(|r| r.output["narrative"].clone()).unwrap_or(json!("")),
        "concerns": concerns,
        "suggestions": latest.map(|r| r.output["suggestions"].clone()).unwrap_or(json!([])),
        "pending": state.pending_jobs().filter(|(_, j)| j.node.as_str() == "witness").count(),
    })
}

/// The verification lattice: each check, what was expected, what the harness saw.
fn lattice(state: &RunState) -> Vec<Value> {
    let row = |check: &str, node: &str, expected: &str, blocking: bool, passed: Option<bool>| {
        json!({"check": check, "node": node, "expected": expected, "blocking": blocking,
            "passed": passed})
    };
    let ok = |n: &str| last(state, n).map(|o| o.ok);
    let derived = |n: &str, k: &str| last(state, n).map(|o| o.derived[k].clone());
    vec![
        row(
            "typeHoles(types)",
            "type_adversary",
            "none or minor",
            true,
            derived("type_adversary", "verdict").map(|v| v != "TypeSystemHasHoles"),
        ),
        row(
            "build(skeleton)",
            "skeleton",
            "PASS",
            true,
            last(state, "skeleton").map(|o| o.output["build_ok"] == true),
        ),
        row(
            "stubs(skeleton)",
            "skeleton",
            "all stubs",
            true,
            last(state, "skeleton").map(|o| o.output["stubs_ok"] == true),
        ),
        row(
            "tests(skeleton)",
            "verify_tdd",
            "FAIL",
            true,
            ok("verify_tdd"),
        ),
        row(
            "coverage(tests)",
            "tests",
            "claims match disk",
            true,
            ok("tests"),
        ),
        row(
            "claims(impl)",
            "impl",
            "claims match disk",
            true,
            ok("impl"),
        ),
        row(
            "build(impl)",
            "impl_build",
            "PASS (run by the harness)",
            true,
            ok("impl_build"),
        ),
        row("tests(merged)", "validate", "PASS", true, ok("validate")),
        row(
            "build(fix)",
            "fix_build",
            "PASS (run by the harness after each fix)",
            true,
            ok("fix_build"),
        ),
        row(
            "claims(fix.build_passed)",
            "fix_build",
            "the fix agent's build claim matches the harness's build",
            false,
            last(state, "fix_build").map(|o| o.derived["claim_honest"] == true),
        ),
        row(
            "claims(tests.self_verified)",
            "verify_tdd",
            "the tests agent's claim that its tests fail on the stubs holds",
            false,
            last(state, "tests")
                .map(|t| t.output["self_verified"] != true || ok("verify_tdd").unwrap_or(false)),
        ),
        row(
            "mutants(impl)",
            "mutation_score",
            "caught (mutants executed by the harness)",
            last(state, "mutation_score").is_some(),
            last(state, "mutation_score").map(|o| o.output["verdict"] == "TestSuiteRobust"),
        ),
    ]
}

/// The mutation verdict from the mutants the harness executed; the LLM adversary's reasoning is
/// attached as advisory and its own counts never decide anything.
fn mutation_result(state: &RunState) -> Value {
    let llm = last(state, "mutation").map(|o| o.output.clone());
    match last(state, "mutation_score") {
        None => json!({"verdict": null, "executed": false, "llm_advisory": llm}),
        Some(o) => {
            let t = &o.output;
            json!({
                "verdict": t["verdict"],
                "executed": true,
                "tried": t["tried"], "killed": t["killed"], "survived": t["survived"],
                "timed_out": t["timed_out"], "unviable": t["unviable"], "score": t["score"],
                "survivors": t["survivors"],
                "critical": t["critical"],
                "strengthened": state.visits.get(&NodeId::new("strengthen")).copied().unwrap_or(0),
                "llm_advisory": llm,
            })
        }
    }
}

/// The test ids any test run of the run found flaky (its `output.flaky_tests`), sorted, at most
/// [`crate::batch::flaky::MAX_FLAKY_LISTED`].
pub fn flaky_tests(state: &RunState) -> Vec<String> {
    let ids: BTreeSet<String> = state
        .history
        .iter()
        .flat_map(|o| strings(&o.output["flaky_tests"]))
        .collect();
    ids.into_iter()
        .take(crate::batch::flaky::MAX_FLAKY_LISTED)
        .collect()
}

/// `HybridResult`: success, the exit variant, spec, recomputed coverage, understanding, both
/// adversaries with their derived verdicts, the witness, the lattice, branches and total cost.
pub fn assemble(state: &RunState, exit: &NodeId, success: bool, at: DateTime<Utc>) -> Value {
    let spec_fns = last(state, "types")
        .and_then(|t| t.output["functions"].as_array().cloned())
        .unwrap_or_default();
    let adversary = |node: &str| {
        last(state, node).map(|o| {
            json!({"output": o.output, "verdict": o.derived["verdict"],
            "critical": o.derived.get("critical").cloned().unwrap_or(Value::Null)})
        })
    };
    let mut branches = Map::new();
    let run = state.run_id.as_str();
    for (name, node) in [
        ("skeleton", "skeleton"),
        ("tests", "tests"),
        ("impl", "impl"),
    ] {
        if let Some(c) = last(state, node).and_then(|o| o.commit.clone()) {
            branches.insert(format!("{name}-{run}"), json!(c));
        }
    }
    let merged =
        state.history.iter().rev().find(|o| {
            (o.node.as_str() == "fix" || o.node.as_str() == "merge") && o.commit.is_some()
        });
    if let Some(c) = merged.and_then(|o| o.commit.clone()) {
        branches.insert(format!("merge-{run}"), json!(c));
    }
    let failure = (!success).then(|| {
        // The last failed job (joins and approvals are not jobs: they have no worker).
        state
            .history
            .iter()
            .rev()
            .find(|o| !o.ok && !o.worker.is_empty())
            .map(|o| {
                json!({"node": o.node, "status": o.status, "error": o.error,
                "claim_errors": o.output.get("claim_errors").cloned().unwrap_or(Value::Null),
                "scope_violation": o.output.get("scope_violation").cloned().unwrap_or(Value::Null),
                "reasons": o.output.get("reasons").cloned().unwrap_or(Value::Null),
                "derived": o.derived})
            })
    });
    let undeclared: Map<String, Value> = ["types", "tests", "impl", "fix"]
        .iter()
        .filter_map(|n| {
            let o = last(state, n)?;
            let found = o.output.get("undeclared_definitions").cloned()?;
            Some((n.to_string(), found))
        })
        .collect();
    json!({
        "success": success,
        "exit": exit_variant(exit, success),
        "spec": spec_fns,
        "tests_coverage": coverage(&spec_fns, last(state, "tests")),
        "understanding": understanding(state),
        "type_adversary": adversary("type_adversary"),
        "mutation_adversary": mutation_result(state),
        "witness": witness(state),
        "verification": lattice(state),
        // Claims in the other direction: definitions on disk no claim declared (reported).
        "undeclared_definitions": undeclared,
        // Tests the harness's reruns found flaky, in any test run of the run (the exit
        // `flaky_tests` when one decided nothing).
        "flaky_tests": flaky_tests(state),
        // Lines of the impl that branch on the tests' or the spec's literals, from the last
        // passing-run check (a signal for a person; the spec's checks decide).
        "suspected_special_case": crate::special_case::last_reported(state.history.iter().map(|o| &o.output)),
        "attempts": state.visits.get(&NodeId::new("fix")).copied().unwrap_or(0),
        "visits": state.visits,
        "branches": branches,
        "failure": failure.flatten(),
        "total_cost": state.usage.cost_usd,
        "usage": state.usage,
        "started_utc": state.created_at,
        "ended_utc": at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_names_become_variants() {
        assert_eq!(
            exit_variant(&NodeId::new("type_fix_budget_exhausted"), false),
            "TypeFixBudgetExhausted"
        );
        assert_eq!(
            exit_variant(&NodeId::new("stuck_on_pattern"), false),
            "StuckOnPattern"
        );
        assert_eq!(exit_variant(&NodeId::new("done"), true), "Success");
    }

    #[test]
    fn coverage_is_recomputed_from_properties_and_spec() {
        let spec = vec![
            json!({"name": "push", "examples": [{}, {}], "properties": [{"name": "inverse"}]}),
            json!({"name": "size", "examples": [{}], "properties": [{"name": "counts"}]}),
        ];
        let tests = Outcome {
            job_id: crate::ids::JobId::new("j"),
            node: NodeId::new("tests"),
            visit: 1,
            ok: true,
            status: crate::messages::JobStatus::Ok,
            output: json!({"properties": [{"name": "t1", "target_functions": ["push"],
                "covers_sketch": "inverse", "covers_examples": [{"function": "push", "index": 0}]}],
                "coverage": {}}),
            derived: json!({}),
            error: None,
            commit: None,
            artifacts: Default::default(),
            usage: Default::default(),
            worker: String::new(),
            execution: String::new(),
            started_at: DateTime::UNIX_EPOCH,
            finished_at: DateTime::UNIX_EPOCH,
            container_seconds: 0.0,
            branch: None,
            cached_from: None,
            events: Vec::new(),
        };
        let c = coverage(&spec, Some(&tests));
        assert_eq!(c["functions_uncovered"], json!(["size"]));
        assert_eq!(c["sketches_uncovered"], json!(["counts"]));
        assert_eq!(c["examples_covered"], 1);
        assert_eq!(c["examples_total"], 3);
    }
}
