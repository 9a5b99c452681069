//! The factory's acceptance commands that run pytest are run by the harness's own pinned
//! runner under its guard (`verify::observe`): harness-owned configuration, canary, must-fail
//! twins planted among the tests, the guard's record, and the work order's own checks planted
//! with them and run again outside the runner. Their verdict comes from the report, never from
//! the exit code a patched runner could choose. Other commands run as the seed has them (argv,
//! exit code).

use crate::harness::{run_logged, Artifacts};
use crate::verify::{observe, Observation, RunPlace, TestRunParams};
use serde_json::{json, Value};
use shared::factory::{self, CmdResult, FailureBrief, Stage};
use shared::speccheck::SpecChecks;
use shared::testreport;
use shared::text;
use std::collections::BTreeSet;
use std::time::Duration;

/// What the acceptance commands gave.
pub struct AcceptanceRun {
    pub results: Vec<CmdResult>,
    pub brief: Option<FailureBrief>,
    /// `runner_tampered`, `runner_differs` or `tests_miss_spec`: why the run must end now.
    pub category: Option<&'static str>,
    /// The guard's findings of the pytest runs, for the output.
    pub findings: Vec<Value>,
}

/// The pytest arguments of a command, if it runs pytest: its test paths (files and folders,
/// `::` selections cut), or the worktree when it names none.
pub fn pytest_paths(argv: &[String]) -> Option<Vec<String>> {
    let rest = match argv {
        [py, m, pytest, rest @ ..]
            if py.starts_with("python") && m == "-m" && pytest == "pytest" =>
        {
            rest
        }
        [pytest, rest @ ..] if pytest == "pytest" => rest,
        _ => return None,
    };
    let mut paths = Vec::new();
    let mut skip_next = false;
    for a in rest {
        if skip_next {
            skip_next = false;
            continue;
        }
        if a.starts_with('-') {
            // Options that take a value in the next word.
            skip_next = matches!(a.as_str(), "-p" | "-k" | "-m" | "-c" | "-o" | "--rootdir");
            continue;
        }
        paths.push(a.split("::").next().unwrap_or(a).to_string());
    }
    if paths.is_empty() {
        paths.push(".".into());
    }
    Some(paths)
}

/// What the acceptance commands run with.
pub struct AcceptanceInputs<'a> {
    pub commands: &'a [String],
    /// The work order's own checks (planted in the first pytest run).
    pub checks: Option<&'a SpecChecks>,
    /// Modules code under test may import beyond the defaults.
    pub allow: &'a [String],
    /// The files the patch touched: the code under test the guard judges.
    pub written: &'a [String],
    pub seed: &'a str,
    pub timeout: Duration,
}

/// Runs the acceptance commands in order until one fails.
pub async fn run_acceptance(
    place: &RunPlace<'_>,
    inputs: AcceptanceInputs<'_>,
    art: &mut Artifacts<'_>,
) -> Result<AcceptanceRun, crate::runner::RunError> {
    let AcceptanceInputs {
        commands,
        checks,
        allow,
        written,
        seed,
        timeout,
    } = inputs;
    let mut run = AcceptanceRun {
        results: Vec::new(),
        brief: None,
        category: None,
        findings: Vec::new(),
    };
    // The work order's checks are planted in the first pytest run.
    let mut checks = checks.filter(|c| !c.is_empty());
    for (i, shown) in commands.iter().enumerate() {
        let argv = match factory::split_command(shown) {
            Ok(a) => a,
            Err(e) => {
                run.brief = Some(FailureBrief::new(
                    Stage::AcceptanceFailed,
                    Some(shown.clone()),
                    None,
                    &e,
                ));
                return Ok(run);
            }
        };
        let label = format!("acceptance_{i}");
        let Some(paths) = pytest_paths(&argv) else {
            let r = run_logged(place.session, &argv, timeout, &label, art).await?;
            let failed = r.exit_code != 0;
            if failed {
                run.brief = Some(FailureBrief::new(
                    Stage::AcceptanceFailed,
                    Some(shown.clone()),
                    Some(r.exit_code),
                    &crate::harness::excerpt(&r),
                ));
            }
            run.results.push(r);
            if failed {
                return Ok(run);
            }
            continue;
        };
        let params: TestRunParams = match serde_json::from_value(json!({
            "command": shown, "language": "python", "expect": "pass", "test_paths": paths,
            "timeout_seconds": timeout.as_secs(), "spec_checks": checks.take(), "allow": allow,
            "code_under_test": written,
        })) {
            Ok(p) => p,
            Err(e) => {
                run.brief = Some(FailureBrief::new(
                    Stage::AcceptanceFailed,
                    Some(shown.clone()),
                    None,
                    &format!("the test run's parameters: {e}"),
                ));
                return Ok(run);
            }
        };
        let obs = match observe(place, &params, &format!("{seed}:{i}")).await {
            Ok(o) => o,
            Err(why) => {
                run.brief = Some(FailureBrief::new(
                    Stage::AcceptanceFailed,
                    Some(shown.clone()),
                    None,
                    &format!("the tests could not run: {why}"),
                ));
                return Ok(run);
            }
        };
        let (result, brief, category, finding) = judged(shown, &argv, &obs, &label, art).await?;
        run.results.push(result);
        run.findings.push(finding);
        if brief.is_some() {
            run.brief = brief;
            run.category = category;
            return Ok(run);
        }
    }
    Ok(run)
}

type Judged = (CmdResult, Option<FailureBrief>, Option<&'static str>, Value);

/// One guarded pytest run judged: tampering first, then code that behaves differently under
/// the runner, then the tests' own verdict, then the work order's checks.
async fn judged(
    shown: &str,
    argv: &[String],
    obs: &Observation,
    label: &str,
    art: &mut Artifacts<'_>,
) -> Result<Judged, crate::runner::RunError> {
    let stdout_path = art
        .put(
            &format!("logs/{label}.stdout"),
            obs.stdout.clone().into_bytes(),
        )
        .await?;
    let stderr_path = art
        .put(
            &format!("logs/{label}.stderr"),
            obs.stderr.clone().into_bytes(),
        )
        .await?;
    let result = CmdResult {
        command: argv.to_vec(),
        exit_code: obs.exit_code,
        stdout_trunc: text::tail(&obs.stdout, 200, 8000),
        stderr_trunc: text::tail(&obs.stderr, 200, 8000),
        stdout_path,
        stderr_path,
        duration_seconds: obs.exec.duration.as_secs_f64(),
    };
    let finding = json!({"command": shown, "tampered": obs.tampered, "spec_checks": obs.spec});
    let verdict = obs
        .report
        .as_ref()
        .map(|r| testreport::judge_pass(r, obs.exit_code, None, &BTreeSet::new()));
    let brief = |stage, excerpt: &str| {
        Some(FailureBrief::new(
            stage,
            Some(shown.to_string()),
            Some(obs.exit_code),
            excerpt,
        ))
    };
    let tests_passed = matches!(&verdict, Ok(v) if v.ok);
    let out = match (
        crate::verify::guarded::integrity(&obs.tampered, &obs.spec, tests_passed),
        verdict,
    ) {
        (Some(i), _) => {
            let stage = match i.category {
                "runner_tampered" => Stage::RunnerTampered,
                "runner_differs" => Stage::RunnerDiffers,
                _ => Stage::TestsMissSpec,
            };
            (brief(stage, &i.why), Some(i.category))
        }
        (None, Err(why)) => (brief(Stage::AcceptanceFailed, why), None),
        (None, Ok(v)) if !v.ok => {
            let why = format!(
                "{}\n{}",
                v.reasons.join("\n"),
                text::tail(&obs.stdout, 20, 1000)
            );
            (brief(Stage::AcceptanceFailed, &why), None)
        }
        (None, Ok(_)) => (None, None),
    };
    Ok((result, out.0, out.1, finding))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn pytest_commands_are_recognised_with_their_paths() {
        assert_eq!(
            pytest_paths(&argv(
                "python -m pytest -q -p no:cacheprovider tests/test_calc.py"
            )),
            Some(vec!["tests/test_calc.py".to_string()])
        );
        assert_eq!(
            pytest_paths(&argv("pytest -k mul tests/t.py::test_x")),
            Some(vec!["tests/t.py".to_string()])
        );
        assert_eq!(
            pytest_paths(&argv("python -m pytest -q")),
            Some(vec![".".to_string()])
        );
        assert_eq!(pytest_paths(&argv("python -c 'import calc'")), None);
    }
}
