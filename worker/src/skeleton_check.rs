//! `check_skeleton`: after the types step, the build passes, every function of the impl file
//! is still a stub, and the design's declared examples and properties parse (the harness runs
//! them later as the spec's own checks).

use crate::git::Worktree;
use crate::harness::{excerpt, read_params, run_logged, Artifacts, StepOutcome, StepResult};
use crate::sandbox::Session;
use crate::verify::{default_timeout, python};
use serde::Deserialize;
use serde_json::{json, Value};
use shared::factory;
use shared::messages::JobStatus;
use shared::paths::normalize_relative;
use std::time::Duration;

/// `check_skeleton`'s parameters.
#[derive(Deserialize)]
struct SkeletonParams {
    #[serde(default = "default_timeout")]
    timeout_seconds: u64,
    #[serde(default = "no_build")]
    build_command: String,
    #[serde(default = "python")]
    language: String,
    #[serde(default)]
    impl_path: String,
    /// The design step's executable examples and properties: each must parse.
    #[serde(default)]
    declared_checks: Option<shared::speccheck::declared::Declared>,
}

/// What is wrong with the declared checks (empty: nothing); they must be readable and parse.
fn declared_problems(declared: Option<&shared::speccheck::declared::Declared>) -> Vec<String> {
    let Some(d) = declared else {
        return Vec::new();
    };
    match d.checks() {
        Err(e) => vec![e],
        Ok(c) => c
            .each()
            .filter(|(_, c)| !crate::verify::plant::parses(&c.check))
            .map(|(kind, c)| {
                let kind = match kind {
                    shared::speccheck::CheckKind::Example => "example",
                    shared::speccheck::CheckKind::Property => "property",
                };
                format!("the {kind} check `{}` does not parse as Python", c.name)
            })
            .collect(),
    }
}

fn no_build() -> String {
    "true".into()
}

/// The skeleton check: the build command passes and every function of the impl file is a stub.
pub async fn check_skeleton(
    params: &Value,
    wt: &Worktree,
    session: &dyn Session,
    art: &mut Artifacts<'_>,
) -> StepResult {
    let p: SkeletonParams = match read_params(params) {
        Ok(p) => p,
        Err(bad) => return Ok(bad),
    };
    let timeout = Duration::from_secs(p.timeout_seconds);
    let (build, language, impl_path) = (p.build_command, p.language, p.impl_path);
    let argv = factory::split_command(&build).unwrap_or_else(|_| vec!["false".into()]);
    let r = run_logged(session, &argv, timeout, "build", art).await?;
    let build_ok = r.exit_code == 0;
    let not_stubs = wt
        .blocking(move |wt| {
            match (
                crate::claims::language(&language),
                normalize_relative(&impl_path),
            ) {
                (Some(lang), Ok(rel)) => {
                    match crate::safe_fs::read_text_within(&wt.dir, &rel, 1 << 20) {
                        Ok(src) => lang
                            .not_stubbed(&src)
                            .unwrap_or_else(|e| vec![format!("unparsable: {e}")]),
                        Err(e) => vec![format!("cannot read {rel}: {e}")],
                    }
                }
                (None, _) => vec![format!("no stub checker for {language}")],
                (_, Err(e)) => vec![e.to_string()],
            }
        })
        .await;
    let bad_checks = declared_problems(p.declared_checks.as_ref());
    let ok = build_ok && not_stubs.is_empty() && bad_checks.is_empty();
    let output = json!({
        "build_ok": build_ok,
        "build": r,
        "not_stubs": not_stubs,
        "stubs_ok": not_stubs.is_empty(),
        "bad_checks": bad_checks,
    });
    let error = (!ok).then(|| {
        if !build_ok {
            format!("the build failed: {}", excerpt(&r))
        } else if !not_stubs.is_empty() {
            format!("functions are not stubs: {}", not_stubs.join(", "))
        } else {
            format!("the declared checks cannot run: {}", bad_checks.join("; "))
        }
    });
    Ok(StepOutcome {
        status: if ok { JobStatus::Ok } else { JobStatus::Failed },
        output,
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parameters_default_to_no_build_in_python() {
        let s: SkeletonParams = read_params(&json!({})).unwrap_or_else(|_| panic!("defaults"));
        assert_eq!(
            (
                s.build_command.as_str(),
                s.language.as_str(),
                s.timeout_seconds
            ),
            ("true", "python", 600)
        );
        assert!(s.declared_checks.is_none());
    }
}
