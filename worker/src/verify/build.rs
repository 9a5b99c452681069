//! `check_build`: the build command run by the harness, after the implementation policy
//! (`claims::policy` for Python, `claims::haskell` for Haskell) has refused code that reaches
//! the test runner's process.

use super::{bad_params, default_timeout, python};
use crate::claims::policy::{self, Allowances, Forbidden};
use crate::harness::{Artifacts, StepOutcome};
use crate::safe_fs;
use crate::sandbox::Session;
use serde::Deserialize;
use serde_json::{json, Value};
use shared::messages::JobStatus;
use std::path::Path;
use std::time::Duration;

/// One language's policy over a source, the run's allowances applied.
type PolicyCheck = Box<dyn Fn(&str) -> Result<Vec<Forbidden>, String> + Send>;

/// The language's policy and the extension of the files it owns. Python's is an allow-list
/// widened by `allow` (and the project's own modules); Haskell's a deny-list that `allow`
/// shortens. `*` turns either off.
fn policy_for(
    language: &str,
    impl_paths: &[String],
    allow: &[String],
    root: &Path,
) -> Option<(PolicyCheck, &'static str)> {
    match language {
        "python" => {
            let dirs: Vec<String> = impl_paths
                .iter()
                .filter_map(|p| p.rsplit_once('/').map(|(d, _)| d.to_string()))
                .collect();
            let allowances = Allowances {
                allow: allow.to_vec(),
                local_modules: policy::local_modules(root, &dirs),
            };
            Some((
                Box::new(move |s| policy::python_refusals(s, &allowances)),
                ".py",
            ))
        }
        "haskell" => {
            let rules: Vec<String> = crate::claims::haskell::HASKELL_FORBIDDEN
                .iter()
                .filter(|r| !allow.iter().any(|a| a == *r || a == "*"))
                .map(|r| r.to_string())
                .collect();
            Some((
                Box::new(move |s| crate::claims::haskell::forbidden(s, &rules)),
                ".hs",
            ))
        }
        _ => None,
    }
}

/// Implementation code that reaches the test runner's process is refused before anything runs
/// it: for Python (`claims::policy`) and Haskell (`claims::haskell`) the code under test
/// shares the runner's process. Ok: the Python files the policy could not parse (the build
/// reports a syntax error; a file the build accepts is refused after it).
fn impl_policy(
    language: &str,
    impl_paths: &[String],
    allow: &[String],
    root: &Path,
) -> Result<Vec<String>, StepOutcome> {
    let Some((check, ext)) = policy_for(language, impl_paths, allow, root) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    let mut unparsable = Vec::new();
    for path in impl_paths.iter().filter(|p| p.ends_with(ext)) {
        let source = match safe_fs::read_text_within(root, path, 1 << 20) {
            Ok(s) => s,
            Err(e) if e.is_not_found() => continue,
            Err(e) => {
                return Err(StepOutcome {
                    status: JobStatus::Failed,
                    output: json!({"build_ok": false, "forbidden": [{"path": path, "why": e.to_string()}]}),
                    error: Some(format!("cannot read the implementation: {e}")),
                })
            }
        };
        match check(&source) {
            Ok(hits) => found.extend(hits.into_iter().map(|h| (path.clone(), h))),
            Err(_) if language == "python" && !allow.iter().any(|a| a == "*") => {
                unparsable.push(path.clone())
            }
            Err(_) => {}
        }
    }
    if found.is_empty() {
        return Ok(unparsable);
    }
    let shown: Vec<String> = found
        .iter()
        .take(10)
        .map(|(p, h)| format!("`{}` ({}, {p}:{})", h.name, h.rule, h.line))
        .collect();
    Err(StepOutcome {
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

/// A build that passed over Python the policy could not parse: refused (code the policy
/// cannot read is code it cannot clear).
fn unreadable(paths: &[String], output: Value) -> StepOutcome {
    let mut output = output;
    output["forbidden"] = json!(paths
        .iter()
        .map(|p| json!({"path": p, "name": p, "rule": "unparsable", "line": 0}))
        .collect::<Vec<_>>());
    StepOutcome {
        status: JobStatus::Failed,
        output,
        error: Some(format!(
            "the implementation builds but the policy cannot parse it: {}",
            paths.join(", ")
        )),
    }
}

/// `check_build`: the build command, run by the harness (an agent's `build_passed` is a claim).
pub async fn check_build(
    params: &Value,
    root: &Path,
    session: &dyn Session,
    art: &mut Artifacts<'_>,
) -> Result<StepOutcome, crate::runner::RunError> {
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
        /// Names the policy allows beyond its defaults (e.g. `open` for a file format; `*`
        /// turns it off).
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
    let unparsable = match refused {
        Ok(unparsable) => unparsable,
        Err(refused) => return Ok(refused),
    };
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
    if ok && !unparsable.is_empty() {
        return Ok(unreadable(&unparsable, output));
    }
    Ok(StepOutcome {
        status: if ok { JobStatus::Ok } else { JobStatus::Failed },
        error: (!ok).then(|| format!("the build failed with exit code {code}")),
        output,
    })
}
