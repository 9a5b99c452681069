//! One run of the tests with the language's pins: the canary laid down, stray processes killed,
//! the JUnit report read from the harness folder (never through a link, capped) or libtest's
//! lines from standard output, the canary taken out of it, and the runner's own summary
//! checked against it (pytest's closing line; for Haskell the harness runner's libtest line).

use super::{Observation, RunPlace, TestRunParams};
use crate::safe_fs;
use shared::lang::{self, ReportSource, RunLayout};
use shared::testreport::{self, CaseOutcome, TestRunReport};
use std::path::Path;
use std::time::Duration;

/// Reports above this size are refused (a runner does not write 32 MiB of XML for a test file).
const REPORT_CAP: usize = 32 * 1024 * 1024;

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
    let haskell = params.language == "haskell";
    let canary = (params.language == "python").then(|| lang::python_canary(&nonce(seed)));
    let hs_canary = haskell.then(|| lang::haskell_canary(&nonce(seed)));
    let test_modules = if haskell {
        let (root, paths) = (place.wt.dir.clone(), params.test_paths.clone());
        safe_fs::blocking(move || super::haskell::test_modules(&root, &paths)).await?
    } else {
        Vec::new()
    };
    let guard = (params.language == "python")
        .then(|| super::guarded::guard_for(&mounts.work, params, &nonce(seed)));
    let layout = RunLayout {
        guard: guard.clone(),
        work: mounts.work,
        harness: harness_mount.clone(),
        test_paths: params.test_paths.clone(),
        canary: canary
            .as_ref()
            .map(|(file, _)| format!("{harness_mount}/canary/{file}"))
            .or_else(|| hs_canary.clone()),
        test_modules,
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
            safe_fs::remove_beneath(&dir, lang::GUARD_RECORD).map_err(io)?;
            Ok::<(), String>(())
        })
        .await?;
    }
    let guarded = match guard {
        Some(g) => Some(super::guarded::prepare(place, params, g).await?),
        None => None,
    };
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
        .await;
    let mut findings = super::guarded::GuardFindings::default();
    if let Some(g) = &guarded {
        let (restored, record) = super::guarded::finish(place, g).await;
        restored?;
        if let Some(why) = record.verdict(exec.as_ref().is_ok_and(|e| !e.timed_out)) {
            findings.tampered.push(why);
        }
    }
    let exec = exec.map_err(|e| format!("the test command could not start: {e}"))?;
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
        // The Haskell runner's script exits 2 when ghc refused the modules: nothing ran.
        ReportSource::LibtestStdout if haskell && exec.exit_code == 2 && stdout.is_empty() => {
            Err(format!(
                "the test modules do not compile: {}",
                shared::text::tail(&stderr, 20, 2000)
            ))
        }
        ReportSource::LibtestStdout => {
            testreport::parse_libtest(&stdout).map_err(|e| format!("unreadable test output: {e}"))
        }
    };
    let mut exit_code = exec.exit_code;
    let report = match (report, &canary, &hs_canary) {
        (Ok(r), Some((file, _)), _) => {
            let tag = file.trim_end_matches(".py");
            take_canary(r, tag, &mut exit_code)
                .and_then(|r| summary_agrees(r, &stdout, timed_out))
                .map(|r| match &guarded {
                    Some(g) => super::guarded::take_planted(r, g, &mut findings, &mut exit_code),
                    None => r,
                })
        }
        (Ok(r), None, Some(tag)) => take_canary(r, tag, &mut exit_code)
            .and_then(|r| super::haskell::summary_agrees(r, &stdout, timed_out)),
        (r, _, _) => r,
    };
    if let Some(g) = &guarded {
        super::guarded::run_outside(place, &layout, g, &mut findings).await?;
    }
    let report = match report {
        Ok(_) if !findings.tampered.is_empty() => Err(format!(
            "the runner was tampered with: {}",
            findings.tampered.join("; ")
        )),
        r => r,
    };
    Ok(Observation {
        exec,
        timed_out,
        exit_code,
        report,
        stdout,
        stderr,
        tampered: findings.tampered,
        spec: findings.spec,
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
pub(super) fn summary_agrees(
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
