//! Test runs the harness judges itself: the runner is started with the language's pins
//! (`shared::lang`), writes a machine-readable report into the harness folder (outside the
//! worktree), stray processes are killed before the report is read (never following a link,
//! with a size cap), a harness-owned canary must show up failing, and the verdict comes from the
//! per-test outcomes (`shared::testreport`), never from the exit code alone. Frozen tests are
//! laid down again from the tests' commit before every run. Host-side file work (laying tests
//! down, the harness folder, reading and parsing the report, the policy's parse) runs on the
//! blocking pool.
//!
//! `observe.rs` runs the tests once and reads the report (canary, summary); `judge.rs` is the
//! `run_tests` op and its verdict; `rerun.rs` reruns a run that disagrees with its expectation
//! or with the agent's claim and keeps a verdict that would depend on the run from being given
//! (`shared::testreport::flaky`); `build.rs` is `check_build` with the implementation policy;
//! `haskell.rs` finds a Haskell run's test modules and properties on the host and checks its
//! runner's closing line.

mod build;
pub mod guarded;
mod haskell;
mod judge;
mod observe;
pub mod plant;
mod rerun;
pub mod signals;
#[cfg(test)]
mod tests;

pub use build::check_build;
pub use judge::run_tests;
pub use observe::observe;

use crate::git::Worktree;
use crate::harness::StepOutcome;
use crate::sandbox::{ExecOutput, Session};
use serde::Deserialize;
use serde_json::Value;
use shared::messages::JobStatus;
use shared::scope::{ScopeMatcher, WriteScope};
use shared::testreport::flaky::{self, Claim};
use shared::testreport::TestRunReport;
use std::path::Path;

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    #[default]
    Pass,
    Fail,
    Any,
}

/// The tests frozen at verify-TDD: the commit holding them and the test ids that ran there.
#[derive(Clone, Debug, Deserialize)]
pub struct Frozen {
    pub commit: String,
    #[serde(default)]
    pub tests: Vec<String>,
}

/// `run_tests`' parameters (the node's `with`).
#[derive(Clone, Debug, Deserialize)]
pub struct TestRunParams {
    pub command: String,
    #[serde(default = "python")]
    pub language: String,
    #[serde(default)]
    pub expect: Expect,
    /// The run's test files (paths or globs, relative to the worktree).
    #[serde(default)]
    pub test_paths: Vec<String>,
    #[serde(default)]
    pub frozen: Option<Frozen>,
    #[serde(default)]
    pub allowed_skips: Vec<String>,
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u64,
    /// Runs of a test run that disagrees with `expect` or with `claimed`, the first included,
    /// 1 to `MAX_RUNS` (1: never rerun); a run that agrees is never rerun.
    #[serde(default = "default_runs")]
    pub runs: u32,
    /// What the agent claimed of its own run (`pass`, `fail`, or test id → outcome).
    #[serde(default)]
    pub claimed: Option<Claim>,
    /// The spec's own checks: planted among the tests of a run that must pass, and run once
    /// more outside the runner (`verify::guarded`).
    #[serde(default)]
    pub spec_checks: Option<shared::speccheck::SpecChecks>,
    /// Checks a design step declared (the hybrid types step's examples and properties), run
    /// as the spec's own beside `spec_checks`.
    #[serde(default)]
    pub declared_checks: Option<shared::speccheck::declared::Declared>,
    /// Modules code under test may import beyond the language's defaults (Python).
    #[serde(default)]
    pub allow: Vec<String>,
    /// The files agents wrote (relative to the worktree): the runner guard judges what code
    /// in them does. Empty: every file of the worktree but the tests.
    #[serde(default)]
    pub code_under_test: Vec<String>,
    /// Must-fail twins planted and the runner compared after every test (true); mutant runs,
    /// whose implementation a guarded run validated, keep the guard's start and end only.
    #[serde(default = "yes")]
    pub twins: bool,
}

impl TestRunParams {
    /// Every spec check of the run: the spec's and the design step's, for a run that must pass.
    pub fn all_checks(&self) -> Result<Option<shared::speccheck::SpecChecks>, String> {
        if self.expect != Expect::Pass {
            return Ok(None);
        }
        let declared = match &self.declared_checks {
            Some(d) => d.checks()?,
            None => Default::default(),
        };
        let all = self
            .spec_checks
            .clone()
            .unwrap_or_default()
            .merged(declared);
        Ok((!all.is_empty()).then_some(all))
    }
}

fn yes() -> bool {
    true
}

pub(crate) fn python() -> String {
    "python".into()
}
pub(crate) fn default_timeout() -> u64 {
    600
}
fn default_runs() -> u32 {
    flaky::DEFAULT_RUNS
}

/// Where a test run happens: the session, its worktree on the host and the harness folder.
pub struct RunPlace<'a> {
    pub session: &'a dyn Session,
    pub wt: &'a Worktree,
    /// Host path of the harness folder mounted into the session.
    pub harness_dir: &'a Path,
}

/// What one pinned run showed.
pub struct Observation {
    pub exec: ExecOutput,
    pub timed_out: bool,
    /// The exit code with the canary's expected failure taken out.
    pub exit_code: i64,
    pub report: Result<TestRunReport, String>,
    pub stdout: String,
    pub stderr: String,
    /// Signs the runner was tampered with (the guard's record, twins that passed): a run with
    /// any is never a pass, and its report is refused.
    pub tampered: Vec<String>,
    /// The spec's checks, in the runner and outside it.
    pub spec: Vec<guarded::SpecOutcome>,
}

pub fn bad_params(e: impl std::fmt::Display) -> StepOutcome {
    StepOutcome {
        status: JobStatus::Error,
        output: Value::Null,
        error: Some(format!("bad parameters: {e}")),
    }
}

/// Lays the frozen test files down again from the tests' commit (on the blocking pool).
pub async fn lay_down_frozen(
    wt: &Worktree,
    frozen: &Frozen,
    test_paths: &[String],
) -> Result<Vec<String>, String> {
    let scope = WriteScope {
        globs: test_paths.to_vec(),
        ..Default::default()
    };
    let commit = frozen.commit.clone();
    wt.blocking(move |wt| {
        let matcher = ScopeMatcher::new(&scope).map_err(|e| e.to_string())?;
        wt.restore_paths(&commit, &|p| matcher.covers(p))
            .map_err(|e| format!("cannot lay down the frozen tests: {e}"))
    })
    .await
}
