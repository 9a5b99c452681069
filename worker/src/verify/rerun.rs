//! Reruns of a test run that disagrees with its expectation or with the agent's claim: the
//! frozen tests laid down again before each, in the same container (so state a test keeps in
//! `/tmp` is seen by the next run, as on a developer's machine), up to the node's `runs`. The
//! runs are combined per test (`shared::testreport::flaky`): a verdict that would depend on
//! which run is believed is not given; the step fails with `verdict: "flaky"`, the flaky tests
//! listed in its output and in `flaky.json`. A run that agrees is never rerun, and neither is
//! one that timed out or left no report to trust (a hang would cost its whole timeout again; a
//! report refused for its integrity is a verdict on its own).

use super::observe::observe;
use super::{lay_down_frozen, Expect, Observation, RunPlace, TestRunParams};
use crate::harness::Artifacts;
use serde_json::{json, Value};
use shared::testreport::flaky::{self, Combined, Decision, Expectation};
use shared::testreport::{self, TestRunReport};
use std::collections::BTreeSet;

/// At most this many flaky ids are named in the step's error.
const NAMED_IN_ERROR: usize = 10;
/// At most this many flaky tests (and stable blockers) are listed in the step's output, which
/// travels with the run's state; `flaky_count` says how many there were, and `flaky.json`
/// lists every one.
const LISTED_IN_OUTPUT: usize = 100;

/// Whether one run met the expectation (a run without a trusted report meets only `any`).
pub(super) fn met(
    p: &TestRunParams,
    obs: &Observation,
    frozen: Option<&BTreeSet<String>>,
    allowed: &BTreeSet<String>,
) -> bool {
    match (&obs.report, p.expect) {
        (_, Expect::Any) => true,
        (Err(_), _) => false,
        (Ok(r), Expect::Pass) => testreport::judge_pass(r, obs.exit_code, frozen, allowed).ok,
        (Ok(r), Expect::Fail) => testreport::judge_fail(r, obs.exit_code).ok,
    }
}

/// Why the first run is rerun: it missed the expectation, or the agent's claim disagrees with
/// it. Nothing when it timed out or has no trusted report.
pub(super) fn reasons_to_rerun(
    p: &TestRunParams,
    first: &Observation,
    first_ok: bool,
) -> Vec<String> {
    let Ok(report) = &first.report else {
        return Vec::new();
    };
    if first.timed_out {
        return Vec::new();
    }
    let mut why = Vec::new();
    if !first_ok && p.expect != Expect::Any {
        why.push(format!(
            "the run did not meet the expectation ({})",
            format!("{:?}", p.expect).to_lowercase()
        ));
    }
    if let Some(claim) = &p.claimed {
        let d = flaky::claim_disagreements(Some(report), claim);
        if !d.is_empty() {
            why.push(format!("the agent's claim disagrees: {}", d.join(", ")));
        }
    }
    why
}

fn expectation<'a>(
    p: &TestRunParams,
    frozen: Option<&'a BTreeSet<String>>,
    allowed: &'a BTreeSet<String>,
) -> Expectation<'a> {
    match p.expect {
        Expect::Pass => Expectation::Pass {
            frozen,
            allowed_skips: allowed,
        },
        Expect::Fail => Expectation::Fail,
        Expect::Any => Expectation::Any,
    }
}

fn verdict_word(ok: bool) -> &'static str {
    if ok {
        "pass"
    } else {
        "fail"
    }
}

/// One run as `flaky.json` shows it.
fn run_summary(n: usize, obs: &Observation, ok: bool) -> Value {
    json!({
        "run": n,
        "met_expectation": ok,
        "exit_code": obs.exit_code,
        "timed_out": obs.timed_out,
        "counts": obs.report.as_ref().ok().map(TestRunReport::counts),
        "no_report": obs.report.as_ref().err(),
    })
}

/// The first run and its verdict; once settled, the verdict the step gives.
pub(super) struct Verdict {
    pub obs: Observation,
    pub ok: bool,
    pub error: Option<String>,
}

/// The first run's verdict, settled: as it is when nothing calls for a rerun; otherwise after
/// the reruns, kept when it stands and replaced by a flaky failure when it would depend on the
/// run. Adds `runs`, `run_verdicts`, `flaky`, `flaky_tests` (`flaky_count`), `verdict` (and,
/// after reruns, `rerun_because` and `stability`) to `output`. `Err` is a rerun that could not be made (the
/// frozen tests not laid down, the command not started): an infrastructure error.
pub(super) async fn settle(
    p: &TestRunParams,
    place: &RunPlace<'_>,
    seed: &str,
    art: &mut Artifacts<'_>,
    first: Verdict,
    output: &mut Value,
) -> Result<Result<Verdict, String>, crate::blobs::BlobError> {
    let allowed: BTreeSet<String> = p.allowed_skips.iter().cloned().collect();
    let frozen: Option<BTreeSet<String>> =
        p.frozen.as_ref().map(|f| f.tests.iter().cloned().collect());
    let why = reasons_to_rerun(p, &first.obs, first.ok);
    if why.is_empty() || p.runs <= 1 {
        output["runs"] = json!(1);
        output["run_verdicts"] = json!([first.ok]);
        output["flaky"] = json!(false);
        output["flaky_tests"] = json!([]);
        output["flaky_count"] = json!(0);
        output["verdict"] = json!(verdict_word(first.ok));
        return Ok(Ok(first));
    }
    let Verdict {
        obs: first,
        ok: first_ok,
        error: first_error,
    } = first;
    tracing::info!(runs = p.runs, reasons = ?why, "test run disagrees; running it again");
    let mut runs = vec![first];
    let mut verdicts = vec![first_ok];
    for n in 2..=p.runs as usize {
        if let Some(f) = &p.frozen {
            if let Err(e) = lay_down_frozen(place.wt, f, &p.test_paths).await {
                return Ok(Err(e));
            }
        }
        let obs = match observe(place, p, &format!("{seed}:run{n}")).await {
            Ok(o) => o,
            Err(e) => return Ok(Err(e)),
        };
        art.put(
            &format!("logs/tests_run{n}.stdout"),
            obs.stdout.clone().into_bytes(),
        )
        .await?;
        art.put(
            &format!("logs/tests_run{n}.stderr"),
            obs.stderr.clone().into_bytes(),
        )
        .await?;
        verdicts.push(met(p, &obs, frozen.as_ref(), &allowed));
        runs.push(obs);
    }
    let reports: Vec<Option<&TestRunReport>> =
        runs.iter().map(|o| o.report.as_ref().ok()).collect();
    let combined = flaky::combine(&reports);
    let expect = expectation(p, frozen.as_ref(), &allowed);
    let decision = flaky::decide(&combined, &verdicts, expect);
    let flaky_ids = combined.flaky_ids();
    output["runs"] = json!(runs.len());
    output["rerun_because"] = json!(why);
    output["run_verdicts"] = json!(verdicts);
    output["flaky"] = json!(decision == Decision::Flaky);
    output["flaky_tests"] = json!(flaky_ids.iter().take(LISTED_IN_OUTPUT).collect::<Vec<_>>());
    output["flaky_count"] = json!(flaky_ids.len());
    output["stability"] = stability(&combined, &flaky::stable_blockers(&combined, expect));
    let summaries: Vec<Value> = runs
        .iter()
        .zip(&verdicts)
        .enumerate()
        .map(|(i, (o, ok))| run_summary(i + 1, o, *ok))
        .collect();
    art.put_json(
        "flaky.json",
        &json!({"decision": decision, "rerun_because": output["rerun_because"],
                "runs": summaries, "combined": combined}),
    )
    .await?;
    tracing::info!(
        runs = runs.len(),
        flaky = flaky_ids.len(),
        decision = ?decision,
        "test run settled after reruns"
    );
    match decision {
        Decision::Stands => {
            output["verdict"] = json!(verdict_word(first_ok));
            let error = match (first_error, flaky_ids.is_empty()) {
                (Some(e), false) => Some(format!(
                    "{e} (stable in {} runs; flaky as well: {})",
                    runs.len(),
                    named(&flaky_ids)
                )),
                (e, _) => e,
            };
            Ok(Ok(Verdict {
                obs: runs.swap_remove(0),
                ok: first_ok,
                error,
            }))
        }
        Decision::Flaky => {
            output["verdict"] = json!("flaky");
            let met_count = verdicts.iter().filter(|v| **v).count();
            let what = if flaky_ids.is_empty() {
                "no single test differed, the runs as a whole did (exit code or report)".into()
            } else {
                format!("flaky tests: {}", named(&flaky_ids))
            };
            let reason = format!(
                "flaky: {met_count} of {} runs met the expectation and no stable test decides \
                 the verdict; {what}",
                runs.len()
            );
            let mut reasons = vec![json!(reason.clone())];
            reasons.extend(output["reasons"].as_array().cloned().unwrap_or_default());
            output["reasons"] = json!(reasons);
            Ok(Ok(Verdict {
                obs: runs.swap_remove(0),
                ok: false,
                error: Some(reason),
            }))
        }
    }
}

/// Up to [`NAMED_IN_ERROR`] ids, then how many more.
fn named(ids: &[String]) -> String {
    let mut s = ids
        .iter()
        .take(NAMED_IN_ERROR)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if ids.len() > NAMED_IN_ERROR {
        s.push_str(&format!(" and {} more", ids.len() - NAMED_IN_ERROR));
    }
    s
}

/// The per-test picture in the step's output: counts of stable tests, the flaky ones with what
/// each run saw, whether the runs as a whole differed, and the stable tests that decide.
fn stability(c: &Combined, blockers: &[String]) -> Value {
    json!({
        "reported_runs": c.reported_runs,
        "stable_pass": c.stable_pass.len(),
        "stable_fail": c.stable_fail.len(),
        "stable_other": c.stable_other.len(),
        "flaky": c.flaky.iter().take(LISTED_IN_OUTPUT).collect::<Vec<_>>(),
        "unstable_runs": c.unstable_runs,
        "stable_blockers": blockers.iter().take(LISTED_IN_OUTPUT).collect::<Vec<_>>(),
    })
}
