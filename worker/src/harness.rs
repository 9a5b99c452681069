//! Steps the harness itself runs (never the LLM): the factory's patch application with scope
//! enforcement (its verification and acceptance, PO, are in `acceptance.rs`), generic command
//! nodes, the skeleton check and git steps.
//! Every command is an argv run in the job's container, never through a shell. libgit2 and
//! reads of the worktree run on the blocking pool.

use crate::blobs::Blobs;
use crate::git::Worktree;
use crate::sandbox::Session;
use crate::verify::bad_params;
use serde::Deserialize;
use serde_json::{json, Value};
use shared::factory::{self, CmdResult, FailureBrief, Stage};
use shared::messages::JobStatus;
use shared::scope::WriteScope;
use shared::text;
use std::collections::BTreeMap;
use std::time::Duration;

/// What a harness step produced.
pub struct StepOutcome {
    pub status: JobStatus,
    pub output: Value,
    pub error: Option<String>,
}

impl StepOutcome {
    /// This outcome's status and error over `base`'s, with this output's fields added to
    /// `base`'s output (the agent's own output is kept beside the harness's verdict).
    pub fn merged_into(self, base: StepOutcome) -> StepOutcome {
        let mut output = match base.output {
            Value::Object(m) => Value::Object(m),
            Value::Null => json!({}),
            other => json!({"output": other}),
        };
        if let (Some(into), Value::Object(from)) = (output.as_object_mut(), self.output) {
            into.extend(from);
        }
        StepOutcome {
            status: self.status,
            output,
            error: self.error,
        }
    }
}

/// Artifacts of one job: written under its prefix, recorded by name.
pub struct Artifacts<'a> {
    pub blobs: &'a Blobs,
    pub prefix: &'a str,
    pub written: BTreeMap<String, String>,
    /// Events the job's trusted code recorded (tool errors and retries, claims, gates...).
    pub events: Vec<shared::tracking::JobEvent>,
}

impl Artifacts<'_> {
    pub async fn put(
        &mut self,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<String, crate::blobs::BlobError> {
        let key = format!("{}{name}", self.prefix);
        self.blobs.put(&key, bytes).await?;
        self.written.insert(name.to_string(), key.clone());
        Ok(key)
    }

    /// Writes every `(name, bytes)` at once (each is one request to the store); their keys,
    /// in order. None is recorded unless all were written.
    pub async fn put_all(
        &mut self,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<Vec<String>, crate::blobs::BlobError> {
        let blobs = self.blobs;
        let mut named = Vec::with_capacity(files.len());
        let mut puts = Vec::with_capacity(files.len());
        for (name, bytes) in files {
            let key = format!("{}{name}", self.prefix);
            named.push((name, key.clone()));
            puts.push(async move { blobs.put(&key, bytes).await });
        }
        futures::future::try_join_all(puts).await?;
        Ok(named
            .into_iter()
            .map(|(name, key)| {
                self.written.insert(name, key.clone());
                key
            })
            .collect())
    }

    pub async fn put_json(
        &mut self,
        name: &str,
        value: &Value,
    ) -> Result<String, crate::blobs::BlobError> {
        let bytes = serde_json::to_vec_pretty(value).expect("json value serializes");
        self.put(name, bytes).await
    }
}

pub(crate) type StepResult = Result<StepOutcome, crate::runner::RunError>;

/// The op's parameters (the node's `with`, evaluated), read into its own type; a parameter of
/// the wrong type is a clear `bad parameters` error, never a silent default.
pub(crate) fn read_params<T: serde::de::DeserializeOwned>(
    params: &Value,
) -> Result<T, StepOutcome> {
    serde_json::from_value(params.clone()).map_err(bad_params)
}

/// `apply_patch`'s parameters.
#[derive(Deserialize)]
struct ApplyPatchParams {
    /// The SE's diff; missing reads as empty (refused: no file headers).
    #[serde(default)]
    unified_diff: String,
    #[serde(default)]
    attempt_index: Value,
    /// What the policy and special-casing checks read of the work order.
    #[serde(flatten)]
    checks: crate::patch_checks::PatchCheckParams,
}

/// A git node's parameters.
#[derive(Deserialize)]
struct GitParams {
    /// A node that made no commit gives `null` here: nothing of it to apply.
    #[serde(default)]
    commits: Vec<Option<String>>,
    #[serde(default)]
    message: Option<String>,
}

pub(crate) fn failed(output: Value, brief: &FailureBrief) -> StepOutcome {
    let mut output = output;
    output["failure_brief"] = json!(brief);
    StepOutcome {
        status: JobStatus::Failed,
        output,
        error: Some(format!(
            "{}: {}",
            serde_json::to_value(brief.stage)
                .unwrap_or_default()
                .as_str()
                .unwrap_or(""),
            text::head(&brief.primary_error_excerpt, 300)
        )),
    }
}

pub use crate::acceptance::factory_verify;

/// TR: the paths the patch changes, as libgit2 parses it (both sides of renames, modes), must be
/// inside the node's write scope (the work order's `allowed_files`); then `git apply`; then the
/// policy for code written by agents on the Python files it touched (`patch_checks`).
pub async fn apply_patch(
    params: &Value,
    scope: Option<&WriteScope>,
    wt: &Worktree,
    art: &mut Artifacts<'_>,
) -> StepResult {
    let p: ApplyPatchParams = match read_params(params) {
        Ok(p) => p,
        Err(bad) => return Ok(bad),
    };
    let (diff, attempt, checks) = (p.unified_diff, p.attempt_index, p.checks);
    let patch_path = art
        .put("proposed_patch.diff", diff.clone().into_bytes())
        .await?;
    let mut output = json!({
        "attempt_index": attempt, "patch_path": patch_path,
        "touched_files": [], "apply_ok": false,
    });
    let refuse = |msg: &str| FailureBrief::new(Stage::PatchScopeViolation, None, None, msg);
    let parsed = {
        let diff = diff.clone();
        crate::safe_fs::blocking(move || crate::git::patch_changes(&diff)).await
    };
    let changes = match parsed {
        Ok(c) if c.is_empty() => {
            let brief = refuse("the diff has no file headers");
            return finish_apply(output, Some(brief), "", art).await;
        }
        Ok(c) => c,
        Err(e) => {
            // Not a patch libgit2 can read: it cannot apply either.
            let msg = e.to_string();
            let brief = FailureBrief::new(
                Stage::PatchApplyFailed,
                Some("git apply --whitespace=nowarn".into()),
                Some(1),
                &msg,
            );
            return finish_apply(output, Some(brief), &msg, art).await;
        }
    };
    let touched: std::collections::BTreeSet<&str> =
        changes.iter().flat_map(|c| c.paths()).collect();
    output["touched_files"] = json!(touched);
    let Some(scope) = scope else {
        let brief = refuse("the node has no write scope");
        return finish_apply(output, Some(brief), "", art).await;
    };
    match shared::scope::check(scope, &changes) {
        Ok(v) if v.is_empty() => {}
        Ok(v) => {
            output["scope_violation"] = json!({"violations": v});
            let brief = refuse(&shared::scope::describe(&v));
            return finish_apply(output, Some(brief), "", art).await;
        }
        Err(e) => {
            let brief = refuse(&e.to_string());
            return finish_apply(output, Some(brief), "", art).await;
        }
    }
    let touched: Vec<String> = changes.iter().filter_map(|c| c.new_path.clone()).collect();
    let base = crate::patch_checks::read_base(wt, touched, checks).await;
    let applied = diff.clone();
    match wt.blocking(move |wt| wt.apply_patch(&applied)).await {
        Ok(()) => {
            output["apply_ok"] = json!(true);
            let refused = crate::patch_checks::judge(wt, base, diff, &mut output).await;
            finish_apply(output, refused, "", art).await
        }
        Err(e) => {
            let msg = e.to_string();
            let brief = FailureBrief::new(
                Stage::PatchApplyFailed,
                Some("git apply --whitespace=nowarn".into()),
                Some(1),
                &msg,
            );
            finish_apply(output, Some(brief), &msg, art).await
        }
    }
}

async fn finish_apply(
    output: Value,
    brief: Option<FailureBrief>,
    stderr: &str,
    art: &mut Artifacts<'_>,
) -> StepResult {
    let apply_result = json!({
        "apply_ok": output["apply_ok"],
        "touched_files": output["touched_files"],
        "stderr_excerpt": text::tail(stderr, 40, 2000),
        "policy_refused": output["policy_refused"],
        "suspected_special_case": output["suspected_special_case"],
    });
    art.put_json("apply_result.json", &apply_result).await?;
    match brief {
        None => Ok(StepOutcome {
            status: JobStatus::Ok,
            output,
            error: None,
        }),
        Some(b) => {
            art.put_json("failure_brief.json", &json!(b)).await?;
            Ok(failed(output, &b))
        }
    }
}

/// Runs one argv in the container and stores its full logs as artifacts.
pub(crate) async fn run_logged(
    session: &dyn Session,
    argv: &[String],
    timeout: Duration,
    label: &str,
    art: &mut Artifacts<'_>,
) -> Result<CmdResult, crate::runner::RunError> {
    // A sandbox that fails the exec (a container gone, Docker unreachable) is an
    // infrastructure failure of the job, never the command's exit code: a verdict made of it
    // would be kept by the step cache and served to every later run with the same inputs.
    let out = session.exec(argv, None, timeout).await?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.timed_out {
        stderr.push_str(&format!("\n[timed out after {}s]", timeout.as_secs()));
    }
    // Both at once: the container is removed only once the step's last write is done.
    let mut keys = art
        .put_all(vec![
            (format!("logs/{label}.stdout"), stdout.clone().into_bytes()),
            (format!("logs/{label}.stderr"), stderr.clone().into_bytes()),
        ])
        .await?
        .into_iter();
    let (stdout_path, stderr_path) = (
        keys.next().unwrap_or_default(),
        keys.next().unwrap_or_default(),
    );
    Ok(CmdResult {
        command: argv.to_vec(),
        exit_code: out.exit_code,
        stdout_trunc: text::tail(&stdout, 200, 8000),
        stderr_trunc: text::tail(&stderr, 200, 8000),
        stdout_path,
        stderr_path,
        duration_seconds: out.duration.as_secs_f64(),
    })
}

pub(crate) fn excerpt(r: &CmdResult) -> String {
    let both = format!("{}\n{}", r.stdout_trunc, r.stderr_trunc);
    text::tail(both.trim(), 40, 2000)
}

/// A command node: each rendered command split with shell rules and run; ok when all exit 0.
pub async fn commands(
    commands: &[String],
    timeout: Duration,
    session: &dyn Session,
    art: &mut Artifacts<'_>,
) -> StepResult {
    let mut results = Vec::new();
    for (i, command) in commands.iter().enumerate() {
        let argv = match factory::split_command(command) {
            Ok(a) => a,
            Err(e) => {
                return Ok(StepOutcome {
                    status: JobStatus::Failed,
                    output: json!({"results": results}),
                    error: Some(e),
                })
            }
        };
        let r = run_logged(session, &argv, timeout, &format!("command_{i}"), art).await?;
        let ok = r.exit_code == 0;
        results.push(r);
        if !ok {
            return Ok(StepOutcome {
                status: JobStatus::Failed,
                output: json!({"results": results}),
                error: Some(format!("`{command}` failed")),
            });
        }
    }
    Ok(StepOutcome {
        status: JobStatus::Ok,
        output: json!({"results": results}),
        error: None,
    })
}

/// A git node: cherry-pick (or squash-merge, or rebase) the given commits onto the worktree.
pub fn git_step(
    op: shared::graph::GitOp,
    params: &Value,
    spec: &shared::messages::JobSpec,
    wt: &Worktree,
) -> Result<StepOutcome, crate::git::GitError> {
    let node = spec.node.as_str();
    let GitParams { commits, message } = match read_params(params) {
        Ok(p) => p,
        Err(bad) => return Ok(bad),
    };
    let commits: Vec<String> = commits.into_iter().flatten().collect();
    let message =
        message.unwrap_or_else(|| format!("{node}: {} of {} commit(s)", op.name(), commits.len()));
    let message = format!(
        "{message}\n\nSession: {}\nNode: {node}\nCost: $0.0000\n",
        spec.run_id
    );
    let squash = (op == shared::graph::GitOp::SquashMerge).then_some(message.as_str());
    let op = op.name();
    Ok(match wt.cherry_pick(&commits, squash)? {
        crate::git::PickOutcome::Applied { head, applied } => StepOutcome {
            status: JobStatus::Ok,
            output: json!({"op": op, "head": head, "applied": applied, "conflicts": []}),
            error: None,
        },
        crate::git::PickOutcome::Conflict {
            commit,
            paths,
            applied,
        } => StepOutcome {
            status: JobStatus::Failed,
            error: Some(format!(
                "{op} of {commit} conflicts in {}",
                paths.join(", ")
            )),
            output: json!({"op": op, "applied": applied,
                "conflicts": [{"commit": commit, "paths": paths}]}),
        },
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MechanicalParams {
    sibling_from: String,
    sibling_to: String,
    since: String,
}

/// Hunks a mechanical check reads from each diff at most.
const MAX_MECHANICAL_HUNKS: usize = 10_000;

/// The Rebaser's restriction: the worktree's commit (its base) changes, since `since`, only
/// what the sibling's change (`sibling_from` → `sibling_to`) changed, edit for edit. Ok when
/// mechanical; failed, with each violating edit, when not.
pub fn check_mechanical(
    params: &Value,
    wt: &Worktree,
) -> Result<StepOutcome, crate::git::GitError> {
    let MechanicalParams {
        sibling_from,
        sibling_to,
        since,
    } = match read_params(params) {
        Ok(p) => p,
        Err(bad) => return Ok(bad),
    };
    let read = |from: &str, to: &str| match wt.hunks(from, to, MAX_MECHANICAL_HUNKS) {
        Ok(h) => Ok(Some(h)),
        Err(crate::git::GitError::TooLarge(_)) => Ok(None),
        Err(e) => Err(e),
    };
    let verdict = match (read(&sibling_from, &sibling_to)?, read(&since, &wt.base())?) {
        (Some(sibling), Some(adaptation)) => shared::mechanical::judge(&sibling, &adaptation),
        _ => shared::mechanical::Verdict {
            mechanical: false,
            allowed: Vec::new(),
            violations: vec![shared::mechanical::Violation {
                file: String::new(),
                line: 0,
                edit: None,
                why: format!("a diff has more than {MAX_MECHANICAL_HUNKS} hunks"),
            }],
        },
    };
    let output = serde_json::to_value(&verdict).expect("a verdict serializes");
    Ok(if verdict.mechanical {
        StepOutcome {
            status: JobStatus::Ok,
            output,
            error: None,
        }
    } else {
        StepOutcome {
            status: JobStatus::Failed,
            error: Some(format!(
                "{} edit(s) the sibling's change did not make",
                verdict.violations.len()
            )),
            output,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_written_at_once_are_recorded_by_name_with_their_keys_in_order() {
        let blobs = Blobs::from_store(
            std::sync::Arc::new(object_store::memory::InMemory::new()),
            "t",
        );
        let mut art = Artifacts {
            blobs: &blobs,
            prefix: "runs/r/n/1/",
            written: Default::default(),
            events: Vec::new(),
        };
        let keys = art
            .put_all(vec![
                ("logs/a.stdout".into(), b"out".to_vec()),
                ("logs/a.stderr".into(), b"err".to_vec()),
            ])
            .await
            .unwrap();
        assert_eq!(
            keys,
            ["runs/r/n/1/logs/a.stdout", "runs/r/n/1/logs/a.stderr"]
        );
        assert_eq!(art.written["logs/a.stderr"], "runs/r/n/1/logs/a.stderr");
        assert_eq!(blobs.get(&keys[0]).await.unwrap(), b"out");
        assert_eq!(blobs.get(&keys[1]).await.unwrap(), b"err");
    }

    #[test]
    fn op_parameters_are_typed_and_a_wrong_type_is_a_clear_error() {
        let bad = read_params::<ApplyPatchParams>(&json!({"unified_diff": ["x"]}))
            .err()
            .expect("a list is not a diff");
        assert_eq!(bad.status, JobStatus::Error);
        assert!(bad.error.unwrap().starts_with("bad parameters: "));
        let g: GitParams = read_params(&json!({"commits": ["a", null, "b"]}))
            .unwrap_or_else(|_| panic!("commits"));
        assert_eq!(g.commits.into_iter().flatten().count(), 2);
        assert!(read_params::<ApplyPatchParams>(&json!({"unified_diff": 3})).is_err());
    }
}
