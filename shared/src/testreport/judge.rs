//! The judges of a test run, pure functions of a report and an exit code: [`judge_pass`] (the
//! frozen set ran, nothing failed, skipped or xfailed, the exit code agrees) and [`judge_fail`]
//! (every test fails on the stubs); and [`pytest_summary`], pytest's closing line.

use super::{CaseOutcome, Counts, TestRunReport, MAX_LISTED_IDS};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassJudgement {
    pub ok: bool,
    pub reasons: Vec<String>,
    /// Frozen tests that did not run.
    pub missing: Vec<String>,
    /// Tests that ran but are not frozen.
    pub unexpected: Vec<String>,
    /// Tests whose outcome is not a pass (allowed skips excepted).
    pub not_passed: Vec<String>,
    pub counts: Counts,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailJudgement {
    pub ok: bool,
    pub reasons: Vec<String>,
    /// Tests that passed (or xpassed) although they must fail.
    pub trivial: Vec<String>,
    pub counts: Counts,
}

/// `1 test`, `3 tests`.
fn tests(n: usize) -> String {
    if n == 1 {
        "1 test".to_string()
    } else {
        format!("{n} tests")
    }
}

/// Up to [`MAX_LISTED_IDS`] ids, then how many more.
fn id_list(ids: &BTreeSet<String>) -> String {
    let mut s = ids
        .iter()
        .take(MAX_LISTED_IDS)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if ids.len() > MAX_LISTED_IDS {
        s.push_str(&format!(" and {} more", ids.len() - MAX_LISTED_IDS));
    }
    s
}

/// Pushes `"N tests <what>: ids"` when `ids` is not empty.
fn reason_for(reasons: &mut Vec<String>, ids: &BTreeSet<String>, what: &str) {
    if !ids.is_empty() {
        reasons.push(format!("{} {what}: {}", tests(ids.len()), id_list(ids)));
    }
}

/// A run that must pass: the report parsed, every frozen test ran and nothing else appeared
/// (when `frozen` is Some), nothing failed, errored, was skipped (except ids listed in
/// `allowed_skips`), xfailed or xpassed, at least one test executed, and the exit code is 0.
/// Reasons are short lowercase sentences naming counts and up to 10 ids.
pub fn judge_pass(
    report: &TestRunReport,
    exit_code: i64,
    frozen: Option<&BTreeSet<String>>,
    allowed_skips: &BTreeSet<String>,
) -> PassJudgement {
    let counts = report.counts();
    let mut reasons = Vec::new();
    if counts.executed == 0 {
        reasons.push("no test executed".to_string());
    }
    let of = |outcome: CaseOutcome| report.ids_with(|c| c.outcome == outcome);
    let failed = of(CaseOutcome::Failed);
    let errored = of(CaseOutcome::Errored);
    let skipped: BTreeSet<String> = of(CaseOutcome::Skipped)
        .into_iter()
        .filter(|id| !allowed_skips.contains(id))
        .collect();
    let xfailed = of(CaseOutcome::Xfailed);
    let xpassed = of(CaseOutcome::Xpassed);
    reason_for(&mut reasons, &failed, "failed");
    reason_for(&mut reasons, &errored, "errored");
    reason_for(&mut reasons, &skipped, "skipped");
    reason_for(&mut reasons, &xfailed, "xfailed");
    reason_for(&mut reasons, &xpassed, "xpassed");

    let mut missing = BTreeSet::new();
    let mut unexpected = BTreeSet::new();
    if let Some(frozen) = frozen {
        let ran = report.ids();
        missing = frozen.difference(&ran).cloned().collect();
        unexpected = ran.difference(frozen).cloned().collect();
        if !missing.is_empty() {
            reasons.push(format!(
                "{} of the frozen tests did not run: {}",
                missing.len(),
                id_list(&missing)
            ));
        }
        reason_for(&mut reasons, &unexpected, "ran outside the frozen set");
    }
    if exit_code != 0 {
        reasons.push(format!("the test command exited with code {exit_code}"));
    }

    let not_passed: BTreeSet<String> = report.ids_with(|c| match c.outcome {
        CaseOutcome::Passed => false,
        CaseOutcome::Skipped => !allowed_skips.contains(&c.id),
        _ => true,
    });
    PassJudgement {
        ok: reasons.is_empty(),
        reasons,
        missing: missing.into_iter().collect(),
        unexpected: unexpected.into_iter().collect(),
        not_passed: not_passed.into_iter().collect(),
        counts,
    }
}

/// pytest's closing line, e.g. `2 failed, 5 passed, 1 skipped in 0.31s` (also framed with
/// `=`): its counts by word (`passed`, `failed`, `error`/`errors`, `skipped`, `xfailed`,
/// `xpassed`, `deselected`, `warnings`...). `None` when the output has no such line. Only the
/// last one counts.
pub fn pytest_summary(output: &str) -> Option<std::collections::BTreeMap<String, usize>> {
    for line in output.lines().rev() {
        let l = line.trim().trim_matches('=').trim();
        let Some((counts, time)) = l.rsplit_once(" in ") else {
            continue;
        };
        let time = time.split_whitespace().next().unwrap_or_default();
        if !time.ends_with('s') || time.trim_end_matches('s').parse::<f64>().is_err() {
            continue;
        }
        let mut found = std::collections::BTreeMap::new();
        let mut ok = !counts.trim().is_empty();
        for item in counts.split(", ") {
            match item.trim().split_once(' ') {
                Some((n, word)) if n.parse::<usize>().is_ok() && !word.contains(' ') => {
                    *found.entry(word.to_string()).or_insert(0) += n.parse::<usize>().unwrap_or(0);
                }
                _ => ok = false,
            }
        }
        if ok {
            return Some(found);
        }
    }
    None
}

/// Tests run against stubs (the skeleton) must all fail: ok when at least one test executed,
/// none passed, none skipped/xfailed, no collection error (errored cases whose id has no `::`)
/// and the exit code is non-zero.
pub fn judge_fail(report: &TestRunReport, exit_code: i64) -> FailJudgement {
    let counts = report.counts();
    let mut reasons = Vec::new();
    if counts.executed == 0 {
        reasons.push("no test executed".to_string());
    }
    let trivial =
        report.ids_with(|c| matches!(c.outcome, CaseOutcome::Passed | CaseOutcome::Xpassed));
    let skipped = report.ids_with(|c| c.outcome == CaseOutcome::Skipped);
    let xfailed = report.ids_with(|c| c.outcome == CaseOutcome::Xfailed);
    let collection = report.ids_with(|c| c.outcome == CaseOutcome::Errored && !c.id.contains("::"));
    reason_for(&mut reasons, &trivial, "passed but must fail");
    reason_for(&mut reasons, &skipped, "skipped");
    reason_for(&mut reasons, &xfailed, "xfailed");
    if !collection.is_empty() {
        reasons.push(format!(
            "{} collection {}: {}",
            collection.len(),
            if collection.len() == 1 {
                "error"
            } else {
                "errors"
            },
            id_list(&collection)
        ));
    }
    if exit_code == 0 {
        reasons.push("the test command exited with code 0 although the tests must fail".into());
    }
    FailJudgement {
        ok: reasons.is_empty(),
        reasons,
        trivial: trivial.into_iter().collect(),
        counts,
    }
}
