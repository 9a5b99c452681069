//! Several runs of one test suite combined per test ([`combine`]): a test is *stable* when every
//! run that produced a report saw it the same way (passing, failing, skipped...), and *flaky*
//! when the runs disagree, including a test that is in one run's report and not in another's
//! (it vanished, or was renamed: a parametrized id with a random part is a new test each run).
//! A failure and an error are the same for this (both are "not passing"); a pass and a skip,
//! or a failure and an xpass, are not.
//!
//! [`decide`] says whether the runs' verdict stands or would be decided by chance: the verdict
//! stands when every run judged the same and no test or run differed, when every run passed,
//! or when the tests that were stable already decide it (a stable failure, a frozen test that
//! never ran, a test that passes on the stubs in every run); otherwise it is
//! [`Decision::Flaky`] and no pass or fail is given. [`claim_disagreements`] compares one run
//! with what an agent claimed of its own run (a whole-run "pass"/"fail" or per-test outcomes).
//!
//! Pure and reusable: the harness's `run_tests` calls it, and anything that reruns tests (a
//! dataset's acceptance tests) can.

use super::{CaseOutcome, TestRunReport, MAX_LISTED_IDS};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Runs of a disagreeing test run, the first included, when nothing says otherwise.
pub const DEFAULT_RUNS: u32 = 3;
/// At most this many runs.
pub const MAX_RUNS: u32 = 10;
/// A per-test claim names at most this many tests.
pub const MAX_CLAIMED_TESTS: usize = 10_000;

/// What one run showed of one test, with outcomes that judge alike merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Seen {
    Passed,
    /// Failed or errored.
    Failed,
    Skipped,
    Xfailed,
    Xpassed,
    /// Not in this run's report.
    Missing,
}

impl From<CaseOutcome> for Seen {
    fn from(o: CaseOutcome) -> Self {
        match o {
            CaseOutcome::Passed => Seen::Passed,
            CaseOutcome::Failed | CaseOutcome::Errored => Seen::Failed,
            CaseOutcome::Skipped => Seen::Skipped,
            CaseOutcome::Xfailed => Seen::Xfailed,
            CaseOutcome::Xpassed => Seen::Xpassed,
        }
    }
}

/// A test that did not behave the same in every run: what each run (with a report) saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlakyTest {
    pub id: String,
    pub seen: Vec<Seen>,
}

/// Every test of several runs, sorted into stable ones and flaky ones. Ids are sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Combined {
    /// Runs given.
    pub runs: usize,
    /// Runs that produced a report; tests are compared over these only.
    pub reported_runs: usize,
    pub stable_pass: Vec<String>,
    /// Failed or errored in every run.
    pub stable_fail: Vec<String>,
    /// Skipped, xfailed or xpassed in every run, with the outcome.
    pub stable_other: BTreeMap<String, Seen>,
    pub flaky: Vec<FlakyTest>,
    /// Some runs produced a report and others none (timed out, killed): the suite as a whole
    /// behaved differently.
    pub unstable_runs: bool,
}

impl Combined {
    pub fn flaky_ids(&self) -> Vec<String> {
        self.flaky.iter().map(|f| f.id.clone()).collect()
    }
}

/// What a test shows in one report. A test reported twice in one run (libtest: the same name
/// in two test binaries) counts as its least passing outcome.
fn seen_in(report: &TestRunReport) -> BTreeMap<&str, Seen> {
    let mut out: BTreeMap<&str, Seen> = BTreeMap::new();
    for c in &report.cases {
        let s = Seen::from(c.outcome);
        out.entry(c.id.as_str())
            .and_modify(|old| {
                if rank(s) > rank(*old) {
                    *old = s;
                }
            })
            .or_insert(s);
    }
    out
}

fn rank(s: Seen) -> u8 {
    match s {
        Seen::Passed => 0,
        Seen::Xfailed => 1,
        Seen::Skipped => 2,
        Seen::Xpassed => 3,
        Seen::Failed => 4,
        Seen::Missing => 5,
    }
}

/// Combines runs, each with its report or `None` when it produced none that could be trusted.
pub fn combine(runs: &[Option<&TestRunReport>]) -> Combined {
    let reported: Vec<BTreeMap<&str, Seen>> = runs.iter().flatten().map(|r| seen_in(r)).collect();
    let ids: BTreeSet<&str> = reported.iter().flat_map(|m| m.keys().copied()).collect();
    let mut c = Combined {
        runs: runs.len(),
        reported_runs: reported.len(),
        unstable_runs: !reported.is_empty() && reported.len() < runs.len(),
        ..Combined::default()
    };
    for id in ids {
        let seen: Vec<Seen> = reported
            .iter()
            .map(|m| m.get(id).copied().unwrap_or(Seen::Missing))
            .collect();
        let first = seen[0];
        if seen.iter().any(|s| *s != first) {
            c.flaky.push(FlakyTest {
                id: id.to_string(),
                seen,
            });
            continue;
        }
        match first {
            Seen::Passed => c.stable_pass.push(id.to_string()),
            Seen::Failed => c.stable_fail.push(id.to_string()),
            other => {
                c.stable_other.insert(id.to_string(), other);
            }
        }
    }
    c
}

/// What the runs were expected to show.
#[derive(Debug, Clone, Copy)]
pub enum Expectation<'a> {
    /// Every test passes; with `frozen`, exactly those tests run.
    Pass {
        frozen: Option<&'a BTreeSet<String>>,
        allowed_skips: &'a BTreeSet<String>,
    },
    /// Every test fails (tests run against stubs).
    Fail,
    /// No expectation.
    Any,
}

/// The tests that, having behaved the same in every run with a report, make the expectation
/// fail on their own: for `Pass`, stable failures, stable skips (not allowed), xfails and
/// xpasses, frozen tests that never ran and tests outside the frozen set that always ran; for
/// `Fail`, tests that pass (or xpass, skip, xfail) on the stubs every time and stable
/// collection errors. Sorted, each with why.
pub fn stable_blockers(c: &Combined, expect: Expectation<'_>) -> Vec<String> {
    let mut out = Vec::new();
    match expect {
        Expectation::Any => {}
        Expectation::Pass {
            frozen,
            allowed_skips,
        } => {
            out.extend(c.stable_fail.iter().map(|id| format!("{id}: failed")));
            for (id, seen) in &c.stable_other {
                if !(*seen == Seen::Skipped && allowed_skips.contains(id)) {
                    out.push(format!("{id}: {}", word(*seen)));
                }
            }
            if let (Some(frozen), true) = (frozen, c.reported_runs > 0) {
                let ran: BTreeSet<&str> = c
                    .stable_pass
                    .iter()
                    .chain(&c.stable_fail)
                    .chain(c.stable_other.keys())
                    .chain(c.flaky.iter().map(|f| &f.id))
                    .map(String::as_str)
                    .collect();
                for id in frozen.iter().filter(|id| !ran.contains(id.as_str())) {
                    out.push(format!("{id}: never ran"));
                }
                let stable = c
                    .stable_pass
                    .iter()
                    .chain(&c.stable_fail)
                    .chain(c.stable_other.keys());
                for id in stable.filter(|id| !frozen.contains(*id)) {
                    out.push(format!("{id}: ran outside the frozen set"));
                }
            }
        }
        Expectation::Fail => {
            out.extend(c.stable_pass.iter().map(|id| format!("{id}: passed")));
            for (id, seen) in &c.stable_other {
                out.push(format!("{id}: {}", word(*seen)));
            }
            out.extend(
                c.stable_fail
                    .iter()
                    .filter(|id| !id.contains("::"))
                    .map(|id| format!("{id}: collection error")),
            );
        }
    }
    out.sort();
    out
}

fn word(s: Seen) -> &'static str {
    match s {
        Seen::Passed => "passed",
        Seen::Failed => "failed",
        Seen::Skipped => "skipped",
        Seen::Xfailed => "xfailed",
        Seen::Xpassed => "xpassed",
        Seen::Missing => "missing",
    }
}

/// Whether a verdict may be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The first run's verdict stands: the runs agree, all passed, or stable tests decide it.
    Stands,
    /// The verdict would depend on which run is believed: none is given.
    Flaky,
}

/// Decides from the combined runs and each run's own verdict (`true`: the run met the
/// expectation) whether the verdict stands or is left to chance. Every run passing stands
/// (a test that flickered without changing any run's verdict is listed, not held against it).
pub fn decide(c: &Combined, verdicts: &[bool], expect: Expectation<'_>) -> Decision {
    if verdicts.iter().all(|v| *v) {
        return Decision::Stands;
    }
    let verdicts_differ = verdicts.iter().any(|v| *v != verdicts[0]);
    let differs = verdicts_differ || !c.flaky.is_empty() || c.unstable_runs;
    if !differs || !stable_blockers(c, expect).is_empty() {
        Decision::Stands
    } else {
        Decision::Flaky
    }
}

/// A whole-run claim: the agent says its own run passed, or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WholeClaim {
    Pass,
    Fail,
}

/// What an agent claimed of its own test run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Claim {
    Whole(WholeClaim),
    /// Test id → the outcome the agent says it saw.
    PerTest(BTreeMap<String, Seen>),
}

impl Claim {
    /// Refuses a claim naming more than [`MAX_CLAIMED_TESTS`] tests.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Claim::PerTest(m) if m.len() > MAX_CLAIMED_TESTS => Err(format!(
                "the claim names {} tests, more than {MAX_CLAIMED_TESTS}",
                m.len()
            )),
            _ => Ok(()),
        }
    }
}

/// Where a run disagrees with the claim: the tests (up to [`MAX_LISTED_IDS`], then how many
/// more), or `the run produced no report`. Empty when they agree. A whole "pass" disagrees
/// with any failing, erroring or xpassing test; a whole "fail" with any passing or xpassing
/// test; a per-test claim with any named test whose outcome differs (absent is `missing`).
pub fn claim_disagreements(report: Option<&TestRunReport>, claim: &Claim) -> Vec<String> {
    let Some(report) = report else {
        return vec!["the run produced no report".into()];
    };
    let seen = seen_in(report);
    let ids: Vec<String> = match claim {
        Claim::Whole(w) => seen
            .iter()
            .filter(|(_, s)| match w {
                WholeClaim::Pass => matches!(s, Seen::Failed | Seen::Xpassed),
                WholeClaim::Fail => matches!(s, Seen::Passed | Seen::Xpassed),
            })
            .map(|(id, s)| format!("{id} {}", word(*s)))
            .collect(),
        Claim::PerTest(m) => m
            .iter()
            .filter_map(|(id, claimed)| {
                let s = seen.get(id.as_str()).copied().unwrap_or(Seen::Missing);
                (s != *claimed).then(|| format!("{id} {} (claimed {})", word(s), word(*claimed)))
            })
            .collect(),
    };
    let more = ids.len().saturating_sub(MAX_LISTED_IDS);
    let mut out: Vec<String> = ids.into_iter().take(MAX_LISTED_IDS).collect();
    if more > 0 {
        out.push(format!("and {more} more"));
    }
    out
}
