//! A Python run under the harness's guard: what is planted before it (twins, the spec's
//! checks), what is read after it (the guard's record, the twins' and checks' outcomes), and
//! the spec's checks run once more outside the test runner. Nothing here trusts the run:
//! every sign of tampering becomes `tampered`, which no verdict passes.

use super::plant::{self, Planting};
use super::{RunPlace, TestRunParams};
use crate::safe_fs;
use serde::{Deserialize, Serialize};
use shared::lang::{self, PythonGuard, RunLayout};
use shared::speccheck::{CheckKind, GuardRecord, SpecChecks};
use shared::testreport::{CaseOutcome, TestRunReport};
use std::time::Duration;

/// How one spec check went, in the runner's process and outside it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SpecOutcome {
    pub kind: CheckKind,
    pub name: String,
    /// In the test runner's process (`None`: not reported).
    pub inside: Option<bool>,
    /// In a plain interpreter (`None`: not run or not reported).
    pub outside: Option<bool>,
    pub message: String,
}

/// A verdict the harness's own evidence gives, over the tests' own: the category (issue 40's
/// A `runner_tampered`, B `runner_differs`, C `tests_miss_spec`) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Integrity {
    pub category: &'static str,
    pub why: String,
}

/// Spec checks that passed in one process and failed in the other.
pub fn differing(spec: &[SpecOutcome]) -> Vec<&str> {
    spec.iter()
        .filter(|s| s.inside.is_some() && s.outside.is_some() && s.inside != s.outside)
        .map(|s| s.name.as_str())
        .collect()
}

/// Spec checks that failed (or did not run) anywhere, with their messages.
pub fn failing(spec: &[SpecOutcome]) -> Vec<String> {
    spec.iter()
        .filter(|s| s.inside != Some(true) || s.outside == Some(false))
        .map(|s| format!("{}: {}", s.name, shared::text::head(&s.message, 200)))
        .collect()
}

/// The integrity verdict of a run: tampering first, then code that behaves differently
/// under the runner, then (only when the tests themselves passed) spec checks failing.
pub fn integrity(
    tampered: &[String],
    spec: &[SpecOutcome],
    tests_passed: bool,
) -> Option<Integrity> {
    if !tampered.is_empty() {
        return Some(Integrity {
            category: "runner_tampered",
            why: format!("the runner was tampered with: {}", tampered.join("; ")),
        });
    }
    let differs = differing(spec);
    if !differs.is_empty() {
        return Some(Integrity {
            category: "runner_differs",
            why: format!(
                "the code behaves one way under the test runner and another outside it: the spec's checks {} disagree",
                differs.join(", ")
            ),
        });
    }
    let failed = failing(spec);
    (tests_passed && !failed.is_empty()).then(|| Integrity {
        category: "tests_miss_spec",
        why: format!(
            "the tests pass over code that fails the spec's own checks, so they do not check what the spec names: {}",
            failed.join("; ")
        ),
    })
}

/// What the guard and the planted tests showed.
#[derive(Debug, Default)]
pub struct GuardFindings {
    pub tampered: Vec<String>,
    pub spec: Vec<SpecOutcome>,
}

/// The run's guard, prepared.
pub struct Guarded {
    pub guard: PythonGuard,
    pub planting: Planting,
    pub checks: Option<SpecChecks>,
    pub seed: u64,
}

/// The guard's settings for a run of `params` in a worktree mounted at `work`.
pub fn guard_for(work: &str, params: &TestRunParams, nonce: &str) -> PythonGuard {
    let work = work.trim_end_matches('/');
    let (mut tests, mut test_files) = (Vec::new(), Vec::new());
    for p in &params.test_paths {
        let p = p.trim_end_matches('/');
        if p.is_empty() || p == "." {
            continue;
        }
        match p.rsplit_once('/') {
            _ if !p.ends_with(".py") => tests.push(format!("{work}/{p}")),
            Some((dir, _)) => tests.push(format!("{work}/{dir}")),
            None => test_files.push(format!("{work}/{p}")),
        }
    }
    let mut allowed: Vec<String> = lang::PYTHON_ALLOWED_MODULES
        .iter()
        .map(|s| s.to_string())
        .collect();
    allowed.extend(params.allow.iter().cloned());
    let code_under_test = params
        .code_under_test
        .iter()
        .filter(|f| f.ends_with(".py"))
        .map(|f| format!("{work}/{}", f.trim_start_matches("./")))
        .collect();
    PythonGuard {
        nonce: nonce.to_string(),
        tests,
        test_files,
        code_under_test,
        allowed_modules: allowed,
        per_test: params.twins,
    }
}

/// Plants twins and (for a run that must pass) the spec's checks, host side.
pub async fn prepare(
    place: &RunPlace<'_>,
    params: &TestRunParams,
    guard: PythonGuard,
) -> Result<Guarded, String> {
    let checks = params.all_checks()?;
    if let Some(c) = &checks {
        c.validate()?;
        if let Some((_, bad)) = c.each().find(|(_, c)| !plant::parses(&c.check)) {
            return Err(format!("the spec check `{}` does not parse", bad.name));
        }
    }
    let seed = u64::from_str_radix(
        &shared::hashing::sha256_hex(guard.nonce.as_bytes())[..12],
        16,
    )
    .unwrap_or(1);
    let (root, paths, nonce, c) = (
        place.wt.dir.clone(),
        params.test_paths.clone(),
        guard.nonce.clone(),
        checks.clone(),
    );
    let twins = params.twins;
    let planting = safe_fs::blocking(move || {
        if !twins && c.is_none() {
            return Ok(Planting::default());
        }
        let files = plant::test_files(&root, &paths);
        plant::plant(&root, &files, c.as_ref(), &nonce, seed)
    })
    .await?;
    Ok(Guarded {
        guard,
        planting,
        checks,
        seed,
    })
}

/// Gives the planted files back and reads the guard's record.
pub async fn finish(place: &RunPlace<'_>, g: &Guarded) -> (Result<(), String>, GuardRecord) {
    let (root, planting) = (place.wt.dir.clone(), g.planting.clone());
    let restored = safe_fs::blocking(move || plant::restore(&root, &planting)).await;
    let record = read_record(place, lang::GUARD_RECORD, &g.guard.nonce).await;
    (restored, record)
}

async fn read_record(place: &RunPlace<'_>, file: &str, nonce: &str) -> GuardRecord {
    let (dir, file, nonce) = (
        place.harness_dir.to_path_buf(),
        file.to_string(),
        nonce.to_string(),
    );
    safe_fs::blocking(move || match safe_fs::read_capped(&dir, &file, 1 << 20) {
        Ok(r) => GuardRecord::parse(&String::from_utf8_lossy(&r.bytes), &nonce),
        Err(_) => GuardRecord::default(),
    })
    .await
}

/// Takes the planted tests out of the report: every twin must have failed, the spec's checks'
/// outcomes are kept. The exit code's failures that only planted tests caused are taken out.
pub fn take_planted(
    mut r: TestRunReport,
    g: &Guarded,
    findings: &mut GuardFindings,
    exit_code: &mut i64,
) -> TestRunReport {
    let p = &g.planting;
    for twin in &p.twins {
        let outcomes: Vec<CaseOutcome> = r
            .cases
            .iter()
            .filter(|c| plant::function_of(&c.id) == twin)
            .map(|c| c.outcome)
            .collect();
        if outcomes.is_empty() {
            findings
                .tampered
                .push(format!("a must-fail twin test did not run ({twin})"));
        } else if outcomes
            .iter()
            .any(|o| !matches!(o, CaseOutcome::Failed | CaseOutcome::Errored))
        {
            findings.tampered.push(format!(
                "a must-fail twin test was reported {:?} ({twin}): failing assertions were turned into passes",
                outcomes[0]
            ));
        }
    }
    for planted in &p.spec {
        let case = r
            .cases
            .iter()
            .find(|c| plant::function_of(&c.id) == planted.function);
        findings.spec.push(SpecOutcome {
            kind: planted.kind,
            name: planted.name.clone(),
            inside: case.map(|c| c.outcome == CaseOutcome::Passed),
            outside: None,
            message: case
                .map(|c| shared::text::head(&c.message, 300))
                .unwrap_or_else(|| "the check did not run".into()),
        });
    }
    r.cases.retain(|c| !p.owns(&c.id));
    let others_failed = r
        .cases
        .iter()
        .any(|c| matches!(c.outcome, CaseOutcome::Failed | CaseOutcome::Errored));
    if *exit_code == 1 && !others_failed {
        *exit_code = 0;
    }
    r
}

#[derive(Serialize)]
struct SoloCheck<'a> {
    name: &'a str,
    kind: CheckKind,
    check: &'a str,
    function: &'a str,
}

#[derive(Deserialize)]
struct SoloResults {
    nonce: String,
    results: Vec<SoloResult>,
}

#[derive(Deserialize)]
struct SoloResult {
    function: String,
    ok: bool,
    #[serde(default)]
    message: String,
}

/// The spec's checks run once more in a plain interpreter (no test runner), under the guard;
/// each outcome is set beside the runner's. Its own tampering is added to the findings.
pub async fn run_outside(
    place: &RunPlace<'_>,
    layout: &RunLayout,
    g: &Guarded,
    findings: &mut GuardFindings,
) -> Result<(), String> {
    let Some(checks) = &g.checks else {
        return Ok(());
    };
    let planted: Vec<SoloCheck> = checks
        .each()
        .zip(&g.planting.spec)
        .map(|((kind, c), p)| SoloCheck {
            name: &c.name,
            kind,
            check: &c.check,
            function: &p.function,
        })
        .collect();
    let spec = serde_json::json!({
        "nonce": g.guard.nonce, "setup": checks.setup, "checks": planted, "seed": g.seed,
        "cases": shared::speccheck::PROPERTY_CASES,
        "literals": serde_json::from_str::<serde_json::Value>(&g.planting.literals)
            .unwrap_or_default(),
    });
    let inv = lang::python_solo_invocation(layout, &g.guard);
    let mut files = inv.harness_files.clone();
    files.push((lang::SPEC_CHECKS_FILE.into(), spec.to_string()));
    let dir = place.harness_dir.to_path_buf();
    safe_fs::blocking(move || {
        for (name, body) in &files {
            safe_fs::write_beneath(&dir, name, body.as_bytes())
                .map_err(|e| format!("harness folder: {e}"))?;
        }
        for f in [lang::SPEC_RESULTS_FILE, lang::SOLO_GUARD_RECORD] {
            safe_fs::remove_beneath(&dir, f).map_err(|e| format!("harness folder: {e}"))?;
        }
        Ok::<(), String>(())
    })
    .await?;
    let mut argv: Vec<String> = ["timeout", "-s", "KILL", "120s"].map(String::from).to_vec();
    argv.extend(inv.argv);
    let exec = place
        .session
        .exec(&argv, None, Duration::from_secs(150))
        .await
        .map_err(|e| format!("the spec checks could not start outside the runner: {e}"))?;
    let record = read_record(place, lang::SOLO_GUARD_RECORD, &g.guard.nonce).await;
    if let Some(why) = record.verdict(true) {
        findings.tampered.push(format!("outside the runner: {why}"));
    }
    let (dir, nonce) = (place.harness_dir.to_path_buf(), g.guard.nonce.clone());
    let read = safe_fs::blocking(move || {
        safe_fs::read_capped(&dir, lang::SPEC_RESULTS_FILE, 1 << 20)
            .map_err(|e| e.to_string())
            .and_then(|r| {
                serde_json::from_slice::<SoloResults>(&r.bytes).map_err(|e| e.to_string())
            })
            .and_then(|s| {
                (s.nonce == nonce)
                    .then_some(s)
                    .ok_or_else(|| "results of another run".to_string())
            })
    })
    .await;
    let results = match read {
        Ok(r) => r.results,
        Err(why) => {
            findings.tampered.push(format!(
                "the spec checks outside the runner left no trustworthy results ({why}; exit {})",
                exec.exit_code
            ));
            return Ok(());
        }
    };
    for (o, p) in findings.spec.iter_mut().zip(&g.planting.spec) {
        if let Some(r) = results.iter().find(|r| r.function == p.function) {
            o.outside = Some(r.ok);
            if !r.ok && o.inside != Some(false) {
                o.message = shared::text::head(&r.message, 300);
            }
        }
    }
    Ok(())
}
