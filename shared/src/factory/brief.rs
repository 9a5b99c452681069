//! The bounded FailureBrief: the only feedback a failed attempt gives the next SE attempt. Every
//! brief, whichever step failed (the SE's own output, TR's scope check or `git apply`, PO's
//! verification or acceptance), is built by [`FailureBrief::new`]: the same fields, the excerpt
//! cut to the last 40 lines and at most [`EXCERPT_CHARS`] characters, and the constraints
//! reminder. Host paths of the worker (its job folders under `--work-dir`) never reach a brief:
//! [`strip_host_paths`] rewrites them the way the job sees them, relative to its worktree.

use super::{Stage, CONSTRAINTS_REMINDER};
use crate::engine::Outcome;
use crate::messages::JobStatus;
use crate::text;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Characters of `primary_error_excerpt` at most (after the last 40 lines are kept).
pub const EXCERPT_CHARS: usize = 2000;
/// Lines of `primary_error_excerpt` at most.
pub const EXCERPT_LINES: usize = 40;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FailureBrief {
    pub stage: Stage,
    pub command: Option<String>,
    pub exit_code: Option<i64>,
    pub primary_error_excerpt: String,
    pub constraints_reminder: String,
}

impl FailureBrief {
    pub fn new(
        stage: Stage,
        command: Option<String>,
        exit_code: Option<i64>,
        excerpt: &str,
    ) -> Self {
        Self {
            stage,
            command: command.map(|c| strip_host_paths(&c)),
            exit_code,
            primary_error_excerpt: text::tail(
                &strip_host_paths(excerpt),
                EXCERPT_LINES,
                EXCERPT_CHARS,
            ),
            constraints_reminder: CONSTRAINTS_REMINDER.to_string(),
        }
    }
}

/// Is `name` a worker's job folder: `<job id>-a<attempt>-e<execution>-<nonce>`?
fn is_job_folder(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mut parts = name.rsplitn(4, '-');
    let (Some(nonce), Some(exec), Some(attempt), Some(job)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    !job.is_empty()
        && !nonce.is_empty()
        && nonce.bytes().all(|b| b.is_ascii_alphanumeric())
        && exec.strip_prefix('e').is_some_and(digits)
        && attempt.strip_prefix('a').is_some_and(digits)
}

/// One absolute path as the job sees it, or `None` when it is not the worker's.
fn job_view(path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split('/').collect();
    let rest = |from: usize| parts[from.min(parts.len())..].join("/");
    for i in 0..parts.len().saturating_sub(1) {
        if parts[i] == "jobs" && is_job_folder(parts[i + 1]) {
            let inside = rest(i + 3);
            return Some(match parts.get(i + 2).copied() {
                // The worktree: what the agent and its commands call the current folder.
                Some("wt") if inside.is_empty() => ".".to_string(),
                Some("wt") => inside,
                // The harness folder is `/fleet` in the job's container.
                Some("harness") => format!("/fleet/{inside}").trim_end_matches('/').to_string(),
                None | Some("") => "<job>".to_string(),
                Some(_) => format!("<job>/{}", rest(i + 2)),
            });
        }
        // A commit's checkout shared by its read-only jobs: its files are their worktree.
        if parts[i] == "git"
            && parts[i + 1] == "checkouts"
            && parts.get(i + 2).is_some_and(|c| is_commit_id(c))
        {
            let inside = rest(i + 4);
            return Some(match parts.get(i + 3).copied() {
                Some("wt") if inside.is_empty() => ".".to_string(),
                Some("wt") => inside,
                _ => format!("<shared checkout>/{}", rest(i + 3))
                    .trim_end_matches('/')
                    .to_string(),
            });
        }
        if parts[i] == "git" && parts[i + 1] == "mirror.git" {
            let inside = rest(i + 2);
            return Some(
                format!("<git mirror>/{inside}")
                    .trim_end_matches('/')
                    .to_string(),
            );
        }
    }
    None
}

fn is_commit_id(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Characters that end a path in free text (error messages, tool and runner output).
fn ends_path(c: char) -> bool {
    c.is_whitespace()
        || matches!(
            c,
            '"' | '\''
                | '`'
                | ':'
                | ','
                | ';'
                | '('
                | ')'
                | '['
                | ']'
                | '{'
                | '}'
                | '<'
                | '>'
                | '|'
                | '='
        )
}

/// `text` with every host path of a worker's job folder rewritten as the job sees it: a path
/// in its worktree relative to the worktree (`/tmp/fleet-worker-w1/jobs/r.po.1-a1-e1-ab12cd/wt/src/x.py`
/// becomes `src/x.py`, the worktree itself `.`), its harness folder as `/fleet/...`, anything
/// else of the job folder as `<job>/...`, the worker's git mirror as `<git mirror>/...`. Any
/// other text is left as it is. Whatever the worker's `--work-dir`, its layout is recognised by
/// the job folder's name.
pub fn strip_host_paths(text: &str) -> String {
    if !text.contains("/jobs/") && !text.contains("/mirror.git") && !text.contains("/checkouts/") {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut prev: Option<char> = None;
    while let Some(i) = rest.find('/') {
        let before = &rest[..i];
        let boundary = before.chars().next_back().or(prev).is_none_or(ends_path);
        out.push_str(before);
        let candidate = &rest[i..];
        let len = candidate.find(ends_path).unwrap_or(candidate.len());
        let path = &candidate[..len];
        if boundary {
            match job_view(path) {
                Some(view) => out.push_str(&view),
                None => out.push_str(path),
            }
        } else {
            out.push_str(path);
        }
        prev = path
            .chars()
            .next_back()
            .or(before.chars().next_back())
            .or(prev);
        rest = &candidate[len..];
    }
    out.push_str(rest);
    out
}

/// A brief as a step reported it: only the stage is required; the rest is rebuilt.
#[derive(Deserialize)]
struct Reported {
    stage: Stage,
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    exit_code: Option<i64>,
    #[serde(default)]
    primary_error_excerpt: String,
}

/// The brief of a failed step from its parts: the brief the step reported, passed through
/// [`FailureBrief::new`] again (so its bound and reminder hold whoever wrote it), or one made
/// from the job's status and error (an agent output that broke its schema is
/// `llm_output_invalid`, anything else `exception`). `None` when the step did not fail.
fn brief_of(
    ok: bool,
    status: Option<JobStatus>,
    output: &Value,
    error: Option<&str>,
) -> Option<FailureBrief> {
    if ok {
        return None;
    }
    if let Some(r) = output
        .get("failure_brief")
        .and_then(|b| serde_json::from_value::<Reported>(b.clone()).ok())
    {
        return Some(FailureBrief::new(
            r.stage,
            r.command,
            r.exit_code,
            &r.primary_error_excerpt,
        ));
    }
    let stage = match status {
        Some(JobStatus::OutputInvalid) => Stage::LlmOutputInvalid,
        _ => Stage::Exception,
    };
    let msg = match (error, status) {
        (Some(e), _) => e.to_string(),
        (None, Some(s)) => format!("{s:?}"),
        (None, None) => "the step failed".to_string(),
    };
    Some(FailureBrief::new(stage, None, None, &msg))
}

/// The FailureBrief a failed outcome stands for (see [`brief_for_next_attempt`]).
pub fn failure_brief_of(o: &Outcome) -> Option<FailureBrief> {
    brief_of(o.ok, Some(o.status), &o.output, o.error.as_deref())
}

/// The brief the next SE attempt receives, from the run context's view of the step that failed
/// (`last`: `{ok, status, output, error, ...}`). `None` when there is no such step (the first
/// attempt) or it did not fail.
pub fn brief_for_next_attempt(last: &Value) -> Option<FailureBrief> {
    let view = last.as_object()?;
    let ok = view.get("ok").and_then(Value::as_bool).unwrap_or(false);
    let status = view
        .get("status")
        .and_then(|s| serde_json::from_value::<JobStatus>(s.clone()).ok());
    let output = view.get("output").unwrap_or(&Value::Null);
    let error = view.get("error").and_then(Value::as_str);
    brief_of(ok, status, output, error)
}

/// The name graphs call [`failure_brief_function`] by.
pub const FAILURE_BRIEF_FUNCTION: &str = "factory_failure_brief";

/// `factory_failure_brief(last)` in graph expressions: [`brief_for_next_attempt`] over the
/// context's `last`; none on the first attempt. Registered in the expression environment
/// (`shared::expr`) under [`FAILURE_BRIEF_FUNCTION`].
pub fn failure_brief_function(
    last: Option<minijinja::Value>,
) -> Result<minijinja::Value, minijinja::Error> {
    let none = minijinja::Value::from(());
    let Some(last) = last.filter(|v| !v.is_undefined() && !v.is_none()) else {
        return Ok(none);
    };
    let view = serde_json::to_value(&last).map_err(|e| {
        minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!("{FAILURE_BRIEF_FUNCTION}: cannot read `last`: {e}"),
        )
    })?;
    Ok(brief_for_next_attempt(&view)
        .map(|b| minijinja::Value::from_serialize(&b))
        .unwrap_or(none))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn failed_se(error: &str) -> Value {
        json!({"node": "se", "ok": false, "status": "output_invalid", "output": null,
               "error": error, "visit": 1})
    }

    #[test]
    fn a_megabyte_of_error_gives_a_bounded_brief_with_the_reminder() {
        // One long line, and many short lines: both bounds hold.
        let one_line = "x".repeat(1 << 20);
        let many_lines = "error: boom\n".repeat((1 << 20) / 12);
        for error in [one_line, many_lines] {
            let b = brief_for_next_attempt(&failed_se(&error)).expect("a failed step");
            assert_eq!(b.stage, Stage::LlmOutputInvalid);
            assert_eq!(b.command, None);
            assert_eq!(b.exit_code, None);
            assert!(b.primary_error_excerpt.chars().count() <= EXCERPT_CHARS);
            assert!(b.primary_error_excerpt.lines().count() <= EXCERPT_LINES);
            assert!(
                error.ends_with(&b.primary_error_excerpt),
                "the tail is kept"
            );
            assert_eq!(b.constraints_reminder, CONSTRAINTS_REMINDER);
            let bytes = serde_json::to_vec(&b).unwrap().len();
            assert!(
                bytes <= 2 * EXCERPT_CHARS + CONSTRAINTS_REMINDER.len() + 200,
                "{bytes} bytes"
            );
            // The same construction as every other brief.
            assert_eq!(
                b,
                FailureBrief::new(Stage::LlmOutputInvalid, None, None, &error)
            );
        }
    }

    #[test]
    fn a_reported_brief_is_rebuilt_with_its_bound_and_the_reminder() {
        let huge = "y".repeat(100_000);
        let last = json!({"ok": false, "status": "failed", "error": "acceptance_failed: ...",
            "output": {"failure_brief": {"stage": "acceptance_failed", "command": "python -c x",
                "exit_code": 1, "primary_error_excerpt": huge}}});
        let b = brief_for_next_attempt(&last).unwrap();
        assert_eq!(
            b,
            FailureBrief::new(
                Stage::AcceptanceFailed,
                Some("python -c x".into()),
                Some(1),
                &huge
            )
        );
        assert_eq!(b.primary_error_excerpt.chars().count(), EXCERPT_CHARS);
        // Already bounded briefs pass unchanged.
        let made = FailureBrief::new(
            Stage::PatchApplyFailed,
            Some("git apply".into()),
            Some(1),
            "e",
        );
        let last = json!({"ok": false, "status": "failed", "output": {"failure_brief": made}});
        assert_eq!(brief_for_next_attempt(&last), Some(made));
    }

    const WT: &str = "/tmp/fleet-worker-w1/jobs/r1.po.1-a2-e1-0a1b2c/wt";

    #[test]
    fn host_paths_of_the_worker_become_worktree_relative() {
        let cases = [
            (
                format!("{WT}/calc.py:3: AssertionError"),
                "calc.py:3: AssertionError".to_string(),
            ),
            (
                format!("cannot open '{WT}/src/a b.py'"),
                "cannot open 'src/a b.py'".into(),
            ),
            (format!("cd {WT} && pytest"), "cd . && pytest".into()),
            (format!("{WT}/"), ".".into()),
            (
                "E   File \"/var/lib/fleet/work/jobs/r.tr.1-a1-e12-ff00ff/wt/pkg/m.py\", line 4"
                    .into(),
                "E   File \"pkg/m.py\", line 4".into(),
            ),
            (
                "--junitxml=/srv/w/jobs/r.po.1-a1-e1-abcdef/harness/out/report.xml".into(),
                "--junitxml=/fleet/out/report.xml".into(),
            ),
            (
                "lock /srv/w/jobs/r.po.1-a1-e1-abcdef/git/index.lock".into(),
                "lock <job>/git/index.lock".into(),
            ),
            (
                "bad object in /tmp/fleet-worker-x/git/mirror.git/objects/pack".into(),
                "bad object in <git mirror>/objects/pack".into(),
            ),
            (
                format!(
                    "E   File \"/srv/w/git/checkouts/{}/wt/pkg/m.py\", line 4",
                    "ab12".repeat(10)
                ),
                "E   File \"pkg/m.py\", line 4".into(),
            ),
            (
                format!(
                    "lock /srv/w/git/checkouts/{}/git/index.lock",
                    "0f".repeat(20)
                ),
                "lock <shared checkout>/git/index.lock".into(),
            ),
            (
                "/srv/w/git/checkouts/notacommit/wt/x".into(),
                "/srv/w/git/checkouts/notacommit/wt/x".into(),
            ),
            // Not the worker's: left alone (the container's own paths among them).
            (
                "/work/calc.py:3: boom".into(),
                "/work/calc.py:3: boom".into(),
            ),
            (
                "see /home/u/jobs/notes.txt".into(),
                "see /home/u/jobs/notes.txt".into(),
            ),
            (
                "a/jobs/x-a1-e1-ab/wt/f".into(),
                "a/jobs/x-a1-e1-ab/wt/f".into(),
            ),
            ("".into(), "".into()),
        ];
        for (text, want) in cases {
            assert_eq!(strip_host_paths(&text), want, "{text}");
            assert_eq!(strip_host_paths(&want), want, "idempotent: {want}");
        }
    }

    #[test]
    fn a_brief_carries_no_host_path() {
        let excerpt = format!(
            "Traceback:\n  {WT}/tests/test_calc.py:7: in test_add\nE assert 3 == 4\n\
             error: could not open '{WT}/calc.py': Permission denied"
        );
        let b = FailureBrief::new(
            Stage::VerifyFailed,
            Some(format!("python -m pytest {WT}/tests")),
            Some(1),
            &excerpt,
        );
        let json = serde_json::to_string(&b).unwrap();
        assert!(!json.contains("/tmp/"), "{json}");
        assert!(!json.contains("fleet-worker"), "{json}");
        assert!(b
            .primary_error_excerpt
            .contains("tests/test_calc.py:7: in test_add"));
        assert!(b.primary_error_excerpt.contains("could not open 'calc.py'"));
        assert_eq!(b.command.as_deref(), Some("python -m pytest tests"));
        // Through the reported-brief and job-error paths as well.
        let last = json!({"ok": false, "status": "error", "error": excerpt});
        let b = brief_for_next_attempt(&last).unwrap();
        assert!(!b.primary_error_excerpt.contains("/tmp/"), "{b:?}");
    }

    #[test]
    fn job_folders_are_recognised_by_name() {
        assert!(is_job_folder("r1.po.1-a2-e1-0a1b2c"));
        assert!(is_job_folder("run-with-dashes.se.3-a1-e10-ffffff"));
        assert!(!is_job_folder("notes"));
        assert!(!is_job_folder("x-a1-e1-"));
        assert!(!is_job_folder("-a1-e1-ab"));
        assert!(!is_job_folder("x-b1-e1-ab"));
        assert!(!is_job_folder("x-a1-ex-ab"));
    }

    #[test]
    fn no_brief_before_the_first_attempt_or_after_a_success() {
        assert_eq!(brief_for_next_attempt(&Value::Null), None);
        assert_eq!(
            brief_for_next_attempt(&json!({"ok": true, "status": "ok", "output": {}})),
            None
        );
        let b = brief_for_next_attempt(&json!({"ok": false, "status": "error", "error": null}))
            .unwrap();
        assert_eq!(b.stage, Stage::Exception);
        assert_eq!(b.primary_error_excerpt, "Error");
    }

    fn env() -> minijinja::Environment<'static> {
        // The expression environment's settings (`shared::expr`) with the function registered.
        let mut env = minijinja::Environment::new();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
        env.add_function(FAILURE_BRIEF_FUNCTION, failure_brief_function);
        env
    }

    fn eval(env: &minijinja::Environment<'_>, expr: &str, ctx: &Value) -> Value {
        let v = env
            .compile_expression(expr)
            .unwrap()
            .eval(minijinja::Value::from_serialize(ctx))
            .unwrap();
        if v.is_undefined() || v.is_none() {
            Value::Null
        } else {
            serde_json::to_value(&v).unwrap()
        }
    }

    /// The expression the shipped factory graph gives the SE as `failure_brief`.
    fn graph_expression() -> String {
        let graph: Value =
            serde_yaml::from_str(include_str!("../../../graphs/factory/graph.yaml")).unwrap();
        graph["nodes"]["se"]["with"]["failure_brief"]
            .as_str()
            .expect("se.with.failure_brief")
            .to_string()
    }

    #[test]
    fn the_factory_graph_builds_the_se_brief_with_this_function() {
        let env = env();
        let expr = graph_expression();
        assert!(expr.contains(FAILURE_BRIEF_FUNCTION), "{expr}");
        // First attempt: no brief.
        assert_eq!(eval(&env, &expr, &json!({"visits": {}})), Value::Null);
        // After an SE output that broke the schema with a megabyte of error.
        let error = format!("output breaks the schema: {}", "z".repeat(1 << 20));
        let brief = eval(&env, &expr, &json!({"last": failed_se(&error)}));
        let expected = FailureBrief::new(Stage::LlmOutputInvalid, None, None, &error);
        assert_eq!(brief, serde_json::to_value(&expected).unwrap());
        // After a harness step that reported its own brief.
        let made = FailureBrief::new(
            Stage::PatchApplyFailed,
            Some("git apply".into()),
            Some(1),
            "e",
        );
        let last = json!({"ok": false, "status": "failed", "output": {"failure_brief": made}});
        assert_eq!(
            eval(&env, &expr, &json!({"last": last})),
            serde_json::to_value(&made).unwrap()
        );
    }

    #[test]
    fn the_expression_environment_has_the_function() {
        assert_eq!(
            crate::expr::eval(&format!("{FAILURE_BRIEF_FUNCTION} is defined"), &json!({})).unwrap(),
            json!(true),
            "register it in shared/src/expr.rs: \
             env.add_function(\"{FAILURE_BRIEF_FUNCTION}\", crate::factory::failure_brief_function);"
        );
    }
}
