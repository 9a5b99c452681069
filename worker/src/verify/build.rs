//! `check_build`: the build command run by the harness, after the implementation policy
//! (`claims::policy` for Python, `claims::haskell` for Haskell) has refused code that reaches
//! the test runner's process.

use super::{bad_params, default_timeout, python};
use crate::harness::{Artifacts, StepOutcome};
use crate::safe_fs;
use crate::sandbox::Session;
use serde::Deserialize;
use serde_json::{json, Value};
use shared::messages::JobStatus;
use std::path::Path;
use std::time::Duration;

type PolicyCheck = fn(&str, &[String]) -> Result<Vec<crate::claims::policy::Forbidden>, String>;

/// Implementation code that reaches the test runner's process is refused before anything runs
/// it: for Python (`claims::policy`) and Haskell (`claims::haskell`) the code under test
/// shares the runner's process.
fn impl_policy(
    language: &str,
    impl_paths: &[String],
    allow: &[String],
    root: &Path,
) -> Option<StepOutcome> {
    let (defaults, check, ext): (&[&str], PolicyCheck, &str) = match language {
        "python" => (
            crate::claims::policy::PYTHON_FORBIDDEN,
            crate::claims::policy::python_forbidden,
            ".py",
        ),
        "haskell" => (
            crate::claims::haskell::HASKELL_FORBIDDEN,
            crate::claims::haskell::forbidden,
            ".hs",
        ),
        _ => return None,
    };
    let rules: Vec<String> = defaults
        .iter()
        .filter(|r| !allow.iter().any(|a| a == *r))
        .map(|r| r.to_string())
        .collect();
    let mut found = Vec::new();
    for path in impl_paths.iter().filter(|p| p.ends_with(ext)) {
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
        if let Ok(hits) = check(&source, &rules) {
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
