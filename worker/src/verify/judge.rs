//! `run_tests`: the frozen tests laid down again, one observed run, and the verdict per test
//! (`shared::testreport::judge_pass` / `judge_fail`), with failures described stably; a run
//! that disagrees with its expectation or the agent's claim is settled by reruns (`rerun.rs`).

use super::observe::observe;
use super::rerun::{self, Verdict};
use super::{bad_params, lay_down_frozen, Expect, RunPlace, TestRunParams};
use crate::harness::{Artifacts, StepOutcome};
use serde_json::{json, Value};
use shared::messages::JobStatus;
use shared::testreport::{self, flaky, CaseOutcome, TestRunReport};
use std::collections::BTreeSet;

/// Failure messages without what changes from run to run (object addresses), so the same
/// failure gives the same signature.
pub(super) fn stable_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find("0x") {
        out.push_str(&rest[..i]);
        let hex = rest[i + 2..]
            .bytes()
            .take_while(u8::is_ascii_hexdigit)
            .count();
        if hex > 0 {
            out.push_str("0x?");
        } else {
            out.push_str("0x");
        }
        rest = &rest[i + 2 + hex..];
    }
    out.push_str(rest);
    out
}

/// A test id's function name: `tests.test_x::TestA::test_b[1]` -> `test_b`.
fn short_name(id: &str) -> String {
    let last = id.rsplit("::").next().unwrap_or(id);
    last.split('[').next().unwrap_or(last).to_string()
}

/// Structured failures for the next agent (and stuck detection): one per test not passing.
fn failures(report: &TestRunReport, text: &str, missing: &[String]) -> Vec<Value> {
    let examples = shared::testfail::parse(text);
    let example_of = |name: &str| {
        examples
            .failures
            .iter()
            .find(|f| f.name == name)
            .and_then(|f| f.counterexample.clone())
    };
    let mut out: Vec<Value> = report
        .cases
        .iter()
        .filter(|c| c.outcome != CaseOutcome::Passed)
        .map(|c| {
            let name = short_name(&c.id);
            let kind = match c.outcome {
                CaseOutcome::Failed
                    if c.message.starts_with("AssertionError")
                        || c.message.starts_with("assert") =>
                {
                    "assertion"
                }
                CaseOutcome::Failed | CaseOutcome::Errored => "error",
                CaseOutcome::Skipped => "skipped",
                CaseOutcome::Xfailed => "xfailed",
                CaseOutcome::Xpassed => "xpassed",
                CaseOutcome::Passed => "passed",
            };
            json!({"name": name, "id": c.id, "kind": kind,
                   "message": shared::text::head(&c.message, 500),
                   "counterexample": example_of(&name)})
        })
        .collect();
    out.extend(missing.iter().map(|id| {
        json!({"name": short_name(id), "id": id, "kind": "missing",
               "message": "the frozen test did not run", "counterexample": null})
    }));
    out
}

/// `run_tests`: lay the frozen tests down, run once, judge by `expect`; rerun when the run
/// disagrees (see `rerun::settle`).
pub async fn run_tests(
    params: &Value,
    place: &RunPlace<'_>,
    seed: &str,
    art: &mut Artifacts<'_>,
) -> Result<StepOutcome, crate::blobs::BlobError> {
    let p: TestRunParams = match serde_json::from_value(params.clone()) {
        Ok(p) => p,
        Err(e) => return Ok(bad_params(e)),
    };
    if !(1..=flaky::MAX_RUNS).contains(&p.runs) {
        return Ok(bad_params(format!(
            "runs is {}, not between 1 and {}",
            p.runs,
            flaky::MAX_RUNS
        )));
    }
    if let Some(Err(e)) = p.claimed.as_ref().map(|c| c.check()) {
        return Ok(bad_params(e));
    }
    let mut laid = Vec::new();
    if let Some(frozen) = &p.frozen {
        match lay_down_frozen(place.wt, frozen, &p.test_paths).await {
            Ok(l) => laid = l,
            Err(e) => {
                return Ok(StepOutcome {
                    status: JobStatus::Error,
                    output: Value::Null,
                    error: Some(e),
                })
            }
        }
    }
    let obs = match observe(place, &p, seed).await {
        Ok(o) => o,
        Err(e) => {
            return Ok(StepOutcome {
                status: JobStatus::Error,
                output: Value::Null,
                error: Some(e),
            })
        }
    };
    let stdout_key = art
        .put("logs/tests.stdout", obs.stdout.clone().into_bytes())
        .await?;
    let stderr_key = art
        .put("logs/tests.stderr", obs.stderr.clone().into_bytes())
        .await?;
    let text = format!("{}\n{}", obs.stdout, obs.stderr);
    let allowed: BTreeSet<String> = p.allowed_skips.iter().cloned().collect();
    let frozen: Option<BTreeSet<String>> =
        p.frozen.as_ref().map(|f| f.tests.iter().cloned().collect());
    let mut output = json!({
        "command": p.command,
        "language": p.language,
        "expect": format!("{:?}", p.expect).to_lowercase(),
        "exit_code": obs.exec.exit_code,
        "timed_out": obs.timed_out,
        "frozen_files": laid,
        "stdout_tail": shared::text::tail(&obs.stdout, 200, 8000),
        "stderr_tail": shared::text::tail(&obs.stderr, 200, 8000),
        "logs": {"stdout": stdout_key, "stderr": stderr_key},
        "duration_seconds": obs.exec.duration.as_secs_f64(),
    });
    let (ok, error) = match &obs.report {
        Err(why) => {
            output["broken"] = json!(true);
            output["passed"] = json!(false);
            output["no_tests"] = json!(false);
            output["reasons"] = json!([why]);
            output["failures"] = json!([]);
            output["failure_signatures"] = json!(["broken"]);
            output["executed"] = json!([]);
            let ok = p.expect == Expect::Any;
            (ok, (!ok).then(|| format!("the test run is broken: {why}")))
        }
        Ok(report) => {
            let counts = report.counts();
            let pass = testreport::judge_pass(report, obs.exit_code, frozen.as_ref(), &allowed);
            let fail = testreport::judge_fail(report, obs.exit_code);
            let collection_error = report
                .cases
                .iter()
                .any(|c| c.outcome == CaseOutcome::Errored && !c.id.contains("::"));
            let fails = failures(report, &text, &pass.missing);
            output["executed"] = json!(report.ids());
            output["counts"] = json!(counts);
            output["passed"] = json!(pass.ok);
            output["no_tests"] = json!(counts.executed == 0);
            output["broken"] = json!(collection_error || obs.timed_out);
            output["trivial"] = json!(fail.trivial);
            output["missing"] = json!(pass.missing);
            output["unexpected"] = json!(pass.unexpected);
            output["passed_tests"] = json!(report
                .cases
                .iter()
                .filter(|c| c.outcome == CaseOutcome::Passed)
                .map(|c| short_name(&c.id))
                .collect::<Vec<_>>());
            output["failure_signatures"] = json!(fails
                .iter()
                .map(|f| format!(
                    "{}:{}:{}",
                    f["id"].as_str().unwrap_or_default(),
                    f["kind"].as_str().unwrap_or_default(),
                    shared::text::head(
                        &stable_message(f["message"].as_str().unwrap_or_default()),
                        120
                    )
                ))
                .collect::<Vec<_>>());
            output["failures"] = json!(fails);
            match p.expect {
                Expect::Pass => {
                    output["reasons"] = json!(pass.reasons);
                    (
                        pass.ok,
                        (!pass.ok).then(|| {
                            format!("the tests did not pass: {}", pass.reasons.join("; "))
                        }),
                    )
                }
                Expect::Fail => {
                    output["reasons"] = json!(fail.reasons);
                    (
                        fail.ok,
                        (!fail.ok).then(|| {
                            format!("the tests did not all fail: {}", fail.reasons.join("; "))
                        }),
                    )
                }
                Expect::Any => (true, None),
            }
        }
    };
    output["tampered"] = json!(obs.tampered);
    output["spec_checks"] = json!(obs.spec);
    output["runner_differs"] = json!(super::guarded::differing(&obs.spec));
    output["spec_failures"] = json!(super::guarded::failing(&obs.spec));
    if p.expect == Expect::Pass && !p.code_under_test.is_empty() {
        let (root, params) = (place.wt.dir.clone(), p.clone());
        let found =
            crate::safe_fs::blocking(move || super::signals::special_cases(&root, &params)).await;
        output["suspected_special_case"] = json!(found);
    }
    let (tampered, spec) = (obs.tampered.clone(), obs.spec.clone());
    let first = Verdict { obs, ok, error };
    let (mut ok, mut error) = match rerun::settle(&p, place, seed, art, first, &mut output).await? {
        Ok(v) => (v.ok, v.error),
        Err(e) => {
            return Ok(StepOutcome {
                status: JobStatus::Error,
                output: Value::Null,
                error: Some(e),
            })
        }
    };
    // Tampering fails any run; code that differs under the runner, or a spec check failing,
    // fails a run that otherwise passed (else its findings stay in the output, beside an
    // ordinary failure).
    let passed = ok && p.expect == super::Expect::Pass;
    if let Some(i) = super::guarded::integrity(&tampered, &spec, passed) {
        if ok || i.category == "runner_tampered" {
            ok = false;
            error = Some(i.why);
            output["category"] = json!(i.category);
        }
    }
    art.put_json("test_report.json", &output).await?;
    Ok(StepOutcome {
        status: if ok { JobStatus::Ok } else { JobStatus::Failed },
        output,
        error,
    })
}
