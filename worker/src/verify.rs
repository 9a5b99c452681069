//! Test runs the harness judges itself: the runner is started with the language's pins
//! (`shared::lang`), writes a machine-readable report into the harness folder (outside the
//! worktree), stray processes are killed before the report is read (never following a link,
//! with a size cap), a harness-owned canary must show up failing, and the verdict comes from the
//! per-test outcomes (`shared::testreport`), never from the exit code alone. Frozen tests are
//! laid down again from the tests' commit before every run. Host-side file work (laying tests
//! down, the harness folder, reading and parsing the report, the policy's parse) runs on the
//! blocking pool.

use crate::git::Worktree;
use crate::harness::{Artifacts, StepOutcome};
use crate::safe_fs;
use crate::sandbox::{ExecOutput, Session};
use serde::Deserialize;
use serde_json::{json, Value};
use shared::lang::{self, ReportSource, RunLayout};
use shared::messages::JobStatus;
use shared::scope::{ScopeMatcher, WriteScope};
use shared::testreport::{self, CaseOutcome, TestRunReport};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

/// Reports above this size are refused (a runner does not write 32 MiB of XML for a test file).
const REPORT_CAP: usize = 32 * 1024 * 1024;

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
}

fn python() -> String {
    "python".into()
}
fn default_timeout() -> u64 {
    600
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

fn nonce(seed: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let pid = std::process::id();
    shared::hashing::sha256_hex(format!("{seed}:{t}:{pid}").as_bytes())[..16].to_string()
}

/// Runs the test command once with the language's pins and reads its report.
pub async fn observe(
    place: &RunPlace<'_>,
    params: &TestRunParams,
    seed: &str,
) -> Result<Observation, String> {
    let argv = shared::factory::split_command(&params.command)
        .map_err(|e| format!("bad test command: {e}"))?;
    let mounts = place.session.mounts();
    let harness_mount = mounts.harness.ok_or("the session has no harness folder")?;
    let canary = (params.language == "python").then(|| lang::python_canary(&nonce(seed)));
    let layout = RunLayout {
        work: mounts.work,
        harness: harness_mount.clone(),
        test_paths: params.test_paths.clone(),
        canary: canary
            .as_ref()
            .map(|(file, _)| format!("{harness_mount}/canary/{file}")),
    };
    let inv = lang::test_invocation(&params.language, &argv, &layout).map_err(|e| e.to_string())?;
    {
        let io = |e: safe_fs::SafeFsError| format!("harness folder: {e}");
        let dir = place.harness_dir.to_path_buf();
        let mut files = inv.harness_files.clone();
        if let Some((file, body)) = &canary {
            files.push((format!("canary/{file}"), body.clone()));
        }
        let report = inv.report_file.clone();
        safe_fs::blocking(move || {
            for (name, body) in &files {
                safe_fs::write_beneath(&dir, name, body.as_bytes()).map_err(io)?;
            }
            if let Some(report) = &report {
                safe_fs::remove_beneath(&dir, report).map_err(io)?;
            }
            Ok::<(), String>(())
        })
        .await?;
    }
    // The runner ends itself a little before the container's own deadline would.
    let limit = params.timeout_seconds.max(1);
    let mut full = Vec::new();
    if place.session.isolated() {
        // Everything the run left behind dies in the same exec, right as the runner ends, so
        // no daemon gets to rewrite the report in between.
        full.extend(
            [
                "sh",
                "-c",
                "\"$@\"; rc=$?; kill -9 -1 2>/dev/null; exit $rc",
                "fleet-test-run",
            ]
            .map(String::from),
        );
    }
    full.extend([
        "timeout".to_string(),
        "-s".into(),
        "KILL".into(),
        format!("{limit}s"),
    ]);
    full.extend(inv.argv);
    let exec = place
        .session
        .exec(&full, None, Duration::from_secs(limit + 30))
        .await
        .map_err(|e| format!("the test command could not start: {e}"))?;
    if let Err(e) = place.session.kill_strays().await {
        tracing::warn!(error = %e, "could not kill processes left by the test run");
    }
    let timed_out =
        exec.timed_out || (exec.exit_code == 137 && exec.duration >= Duration::from_secs(limit));
    let stdout = String::from_utf8_lossy(&exec.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&exec.stderr).into_owned();
    let report = match inv.report {
        ReportSource::JunitFile => {
            let (dir, file) = (place.harness_dir.to_path_buf(), inv.report_file.clone());
            safe_fs::blocking(move || read_junit(&dir, file.as_deref())).await
        }
        ReportSource::LibtestStdout => {
            testreport::parse_libtest(&stdout).map_err(|e| format!("unreadable test output: {e}"))
        }
    };
    let mut exit_code = exec.exit_code;
    let report = match (report, &canary) {
        (Ok(r), Some((file, _))) => {
            let tag = file.trim_end_matches(".py");
            take_canary(r, tag, &mut exit_code).and_then(|r| summary_agrees(r, &stdout, timed_out))
        }
        (r, _) => r,
    };
    Ok(Observation {
        exec,
        timed_out,
        exit_code,
        report,
        stdout,
        stderr,
    })
}

fn read_junit(harness_dir: &Path, file: Option<&str>) -> Result<TestRunReport, String> {
    let file = file.ok_or("no report file")?;
    let read =
        match safe_fs::read_capped(harness_dir, file, REPORT_CAP) {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Err(
                "the runner wrote no report: the process ended before the tests ran, or was killed"
                    .into(),
            ),
            Err(e) => return Err(format!("the report cannot be read: {e}")),
        };
    if read.truncated {
        return Err(format!("the report is larger than {REPORT_CAP} bytes"));
    }
    testreport::parse_junit(&String::from_utf8_lossy(&read.bytes))
        .map_err(|e| format!("the report does not parse: {e}"))
}

/// The canary must be in the report, failed; it is then taken out, and an exit code of 1 that
/// only it caused becomes 0.
fn take_canary(
    mut r: TestRunReport,
    tag: &str,
    exit_code: &mut i64,
) -> Result<TestRunReport, String> {
    let found: Vec<CaseOutcome> = r
        .cases
        .iter()
        .filter(|c| c.id.contains(tag))
        .map(|c| c.outcome)
        .collect();
    if found != [CaseOutcome::Failed] {
        return Err(
            "the report does not show the harness's canary test failing: it was not written by an honest test run"
                .into(),
        );
    }
    r.cases.retain(|c| !c.id.contains(tag));
    let others_failed = r
        .cases
        .iter()
        .any(|c| matches!(c.outcome, CaseOutcome::Failed | CaseOutcome::Errored));
    if *exit_code == 1 && !others_failed {
        *exit_code = 0;
    }
    Ok(r)
}

/// pytest's own closing line (`2 failed, 5 passed in 0.31s`) must agree with the report: a
/// report rewritten after the run, or written by something else, says other numbers.
fn summary_agrees(
    r: TestRunReport,
    stdout: &str,
    timed_out: bool,
) -> Result<TestRunReport, String> {
    if timed_out {
        return Ok(r);
    }
    let Some(summary) = testreport::pytest_summary(stdout) else {
        return Err("the runner printed no closing summary: its report cannot be trusted".into());
    };
    let c = r.counts();
    let said = |k: &str| summary.get(k).copied().unwrap_or(0);
    let failures_said = said("failed") + said("error") + said("errors");
    // The canary is one of the failures pytest counted.
    let agrees = said("passed") == c.passed
        && said("skipped") == c.skipped
        && said("xfailed") == c.xfailed
        && failures_said > c.failed + c.errored;
    if agrees {
        Ok(r)
    } else {
        Err(format!(
            "the runner's summary ({}) disagrees with its report ({} passed, {} failed, {} errors, {} skipped): the report was not written by this run",
            summary
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect::<Vec<_>>()
                .join(", "),
            c.passed,
            c.failed,
            c.errored,
            c.skipped
        ))
    }
}

/// Failure messages without what changes from run to run (object addresses), so the same
/// failure gives the same signature.
fn stable_message(message: &str) -> String {
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

/// `run_tests`: lay the frozen tests down, run once, judge by `expect`.
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
    art.put_json("test_report.json", &output).await?;
    Ok(StepOutcome {
        status: if ok { JobStatus::Ok } else { JobStatus::Failed },
        output,
        error,
    })
}

/// Implementation code that reaches the test runner's process is refused before anything runs
/// it (`claims::policy`): for Python the code under test shares the runner's process.
fn impl_policy(
    language: &str,
    impl_paths: &[String],
    allow: &[String],
    root: &Path,
) -> Option<StepOutcome> {
    if language != "python" {
        return None;
    }
    let rules: Vec<String> = crate::claims::policy::PYTHON_FORBIDDEN
        .iter()
        .filter(|r| !allow.iter().any(|a| a == *r))
        .map(|r| r.to_string())
        .collect();
    let mut found = Vec::new();
    for path in impl_paths.iter().filter(|p| p.ends_with(".py")) {
        let source = match safe_fs::read_text_within(root, path, 1 << 20) {
            Ok(s) => s,
            Err(e) if e.is_not_found() => continue,
            Err(e) => {
                return Some(StepOutcome {
                    status: JobStatus::Failed,
                    output: json!({"build_ok": false, "forbidden": [{"path": path, "why": e.to_string()}]}),
                    error: Some(format!("cannot read the implementation: {e}")),
                })
            }
        };
        // Unparsable sources are the build's to report.
        if let Ok(hits) = crate::claims::policy::python_forbidden(&source, &rules) {
            found.extend(hits.into_iter().map(|h| (path.clone(), h)));
        }
    }
    if found.is_empty() {
        return None;
    }
    let shown: Vec<String> = found
        .iter()
        .take(10)
        .map(|(p, h)| format!("`{}` ({p}:{})", h.name, h.line))
        .collect();
    Some(StepOutcome {
        status: JobStatus::Failed,
        output: json!({
            "build_ok": false,
            "forbidden": found.iter().map(|(p, h)| json!({"path": p, "name": h.name, "rule": h.rule, "line": h.line})).collect::<Vec<_>>(),
        }),
        error: Some(format!(
            "the implementation references what code under test may not: {}",
            shown.join(", ")
        )),
    })
}

/// `check_build`: the build command, run by the harness (an agent's `build_passed` is a claim).
pub async fn check_build(
    params: &Value,
    root: &Path,
    session: &dyn Session,
    art: &mut Artifacts<'_>,
) -> Result<StepOutcome, crate::blobs::BlobError> {
    #[derive(Deserialize)]
    struct BuildParams {
        build_command: String,
        #[serde(default = "default_timeout")]
        timeout_seconds: u64,
        #[serde(default = "python")]
        language: String,
        /// Implementation files checked against the language's policy before the build.
        #[serde(default)]
        impl_paths: Vec<String>,
        /// Entries of the policy the run allows after all (e.g. `open` for a file format).
        #[serde(default)]
        allow: Vec<String>,
    }
    let p: BuildParams = match serde_json::from_value(params.clone()) {
        Ok(p) => p,
        Err(e) => return Ok(bad_params(e)),
    };
    let refused = {
        let (language, paths, allow, root) = (
            p.language.clone(),
            p.impl_paths.clone(),
            p.allow.clone(),
            root.to_path_buf(),
        );
        safe_fs::blocking(move || impl_policy(&language, &paths, &allow, &root)).await
    };
    if let Some(refused) = refused {
        return Ok(refused);
    }
    let argv = match shared::factory::split_command(&p.build_command) {
        Ok(a) => a,
        Err(e) => return Ok(bad_params(format!("bad build command: {e}"))),
    };
    let timeout = Duration::from_secs(p.timeout_seconds.max(1));
    let r = crate::harness::run_logged(session, &argv, timeout, "build", art).await?;
    let _ = session.kill_strays().await;
    let (ok, code) = (r.exit_code == 0, r.exit_code);
    let output = json!({
        "build_ok": ok,
        "exit_code": code,
        "stdout_tail": r.stdout_trunc,
        "stderr_tail": r.stderr_trunc,
    });
    Ok(StepOutcome {
        status: if ok { JobStatus::Ok } else { JobStatus::Failed },
        error: (!ok).then(|| format!("the build failed with exit code {code}")),
        output,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::testreport::TestCase;

    fn report(outcomes: &[CaseOutcome]) -> TestRunReport {
        TestRunReport {
            format: "junit".into(),
            cases: outcomes
                .iter()
                .enumerate()
                .map(|(i, o)| TestCase {
                    id: format!("tests.t::test_{i}"),
                    outcome: *o,
                    message: String::new(),
                    seconds: 0.0,
                })
                .collect(),
        }
    }

    #[test]
    fn a_report_that_disagrees_with_the_runners_summary_is_refused() {
        use CaseOutcome::*;
        let r = report(&[Passed, Passed]);
        assert!(summary_agrees(r.clone(), "1 failed, 2 passed in 0.10s\n", false).is_ok());
        // A daemon rewrote failures into passes after pytest printed the truth.
        let e = summary_agrees(r.clone(), "2 failed, 1 passed in 0.10s\n", false).unwrap_err();
        assert!(e.contains("disagrees"), "{e}");
        // A forger that printed nothing.
        assert!(summary_agrees(r.clone(), "", false).is_err());
        // The canary's failure must be among those pytest counted.
        assert!(summary_agrees(r, "2 passed in 0.10s\n", false).is_err());
    }

    #[test]
    fn object_addresses_do_not_change_a_failure_signature() {
        assert_eq!(
            stable_message("assert <stack.Stack object at 0x7f3a2b> == 2"),
            stable_message("assert <stack.Stack object at 0x7f99c0> == 2")
        );
        assert_eq!(stable_message("0x"), "0x");
    }
}
