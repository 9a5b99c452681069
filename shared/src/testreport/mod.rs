//! Machine-readable test reports turned into structured results, and the judges of a test run.
//!
//! Two inputs: a JUnit XML document (pytest's `--junitxml`, cargo-nextest's JUnit) and the output
//! of libtest (`cargo test`: the human `test name ... ok` lines, or its JSON lines). Both parsers
//! read hostile input: they never panic, never recurse, and reject documents with more than
//! [`MAX_CASES`] test cases or deeper than [`MAX_DEPTH`] nesting levels.
//!
//! How pytest (7.2) writes xfail and xpass in JUnit: an xfailed test has
//! `<skipped type="pytest.xfail" message="REASON"/>`; a strict xpass is a
//! `<failure message="[XPASS(strict)] REASON">`, read here as [`CaseOutcome::Xpassed`]; a
//! non-strict xpass is written as a plain passing `<testcase/>`, so it reads as
//! [`CaseOutcome::Passed`] (JUnit cannot tell it apart).
//!
//! The judges are pure: [`judge_pass`] for a run that must pass, [`judge_fail`] for tests run
//! against stubs, which must all fail.
//!
//! The rooms: this file holds the report model ([`TestRunReport`], [`TestCase`],
//! [`CaseOutcome`], [`Counts`], [`ReportError`]), the bounds and the helpers both parsers share;
//! `junit.rs` the JUnit XML parser ([`parse_junit`]); `libtest.rs` the libtest parser
//! ([`parse_libtest`]); `judge.rs` the judges ([`judge_pass`], [`judge_fail`]) and pytest's
//! closing line ([`pytest_summary`]); `flaky.rs` several runs combined per test (stable or
//! flaky, [`flaky::combine`]) and whether their verdict stands ([`flaky::decide`]).

pub mod flaky;
mod judge;
mod junit;
mod libtest;

pub use judge::{judge_fail, judge_pass, pytest_summary, FailJudgement, PassJudgement};
pub use junit::parse_junit;
pub use libtest::{libtest_summary, parse_libtest};

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// More test cases than this in one report is an error.
pub const MAX_CASES: usize = 100_000;
/// More nested XML elements than this is an error.
pub const MAX_DEPTH: usize = 64;
/// A case's message keeps at most this many characters.
pub const MAX_MESSAGE_CHARS: usize = 500;
/// Reasons name at most this many ids.
const MAX_LISTED_IDS: usize = 10;
/// Raw text kept per failure element before the message is clipped.
const MAX_RAW_TEXT_BYTES: usize = 8 * MAX_MESSAGE_CHARS;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReportError {
    #[error("malformed xml at byte {position}: {message}")]
    Xml { position: u64, message: String },
    #[error("not a junit report: {0}")]
    NotJunit(String),
    #[error("truncated report: {0} elements left open")]
    Truncated(usize),
    #[error("a testcase has no name")]
    MissingName,
    #[error("too many test cases (more than {MAX_CASES})")]
    TooManyCases,
    #[error("xml nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("no test results and no `running N tests` line in the libtest output")]
    NoLibtestResults,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaseOutcome {
    Passed,
    Failed,
    Errored,
    Skipped,
    Xfailed,
    Xpassed,
}

impl CaseOutcome {
    /// When one test is reported twice (pytest writes a second `<testcase>` for a teardown error
    /// after a failed call), the higher rank wins.
    fn rank(self) -> u8 {
        match self {
            CaseOutcome::Passed => 0,
            CaseOutcome::Xfailed => 1,
            CaseOutcome::Skipped => 2,
            CaseOutcome::Xpassed => 3,
            CaseOutcome::Errored => 4,
            CaseOutcome::Failed => 5,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestCase {
    /// `classname::name` (JUnit, when classname is non-empty), else `name`; exact, so it can be
    /// compared across runs.
    pub id: String,
    pub outcome: CaseOutcome,
    /// At most [`MAX_MESSAGE_CHARS`] characters of the failure, error or skip message.
    pub message: String,
    pub seconds: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Every case that is not skipped.
    pub executed: usize,
    pub passed: usize,
    pub failed: usize,
    pub errored: usize,
    pub skipped: usize,
    pub xfailed: usize,
    pub xpassed: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestRunReport {
    /// `junit` or `libtest`.
    pub format: String,
    /// JUnit: one case per id (repeats merged). libtest: one case per result line, so the same
    /// name in two test binaries gives two cases with one id.
    pub cases: Vec<TestCase>,
}

impl TestRunReport {
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for case in &self.cases {
            match case.outcome {
                CaseOutcome::Passed => c.passed += 1,
                CaseOutcome::Failed => c.failed += 1,
                CaseOutcome::Errored => c.errored += 1,
                CaseOutcome::Skipped => c.skipped += 1,
                CaseOutcome::Xfailed => c.xfailed += 1,
                CaseOutcome::Xpassed => c.xpassed += 1,
            }
        }
        c.executed = self.cases.len() - c.skipped;
        c
    }

    pub fn ids(&self) -> BTreeSet<String> {
        self.cases.iter().map(|c| c.id.clone()).collect()
    }

    fn ids_with(&self, pred: impl Fn(&TestCase) -> bool) -> BTreeSet<String> {
        self.cases
            .iter()
            .filter(|c| pred(c))
            .map(|c| c.id.clone())
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Shared helpers

/// Trimmed, at most [`MAX_MESSAGE_CHARS`] characters.
fn clip(s: &str) -> String {
    let t = s.trim();
    match t.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((i, _)) => t[..i].trim_end().to_string(),
        None => t.to_string(),
    }
}

/// Appends as much of `s` as fits in `cap` bytes, on a character boundary.
fn push_capped(buf: &mut String, s: &str, cap: usize) {
    let room = cap.saturating_sub(buf.len());
    if s.len() <= room {
        buf.push_str(s);
        return;
    }
    let mut end = 0;
    for (i, ch) in s.char_indices() {
        if i + ch.len_utf8() > room {
            break;
        }
        end = i + ch.len_utf8();
    }
    buf.push_str(&s[..end]);
}

fn seconds_from(s: &str) -> f64 {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => v,
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests;
