//! The bounded FailureBrief: the only feedback a failed attempt gives the next SE attempt. Every
//! brief, whichever step failed (the SE's own output, TR's scope check or `git apply`, PO's
//! verification or acceptance), is built by [`FailureBrief::new`]: the same fields, the excerpt
//! cut to the last 40 lines and at most [`EXCERPT_CHARS`] characters, and the constraints
//! reminder.

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
            command,
            exit_code,
            primary_error_excerpt: text::tail(excerpt, EXCERPT_LINES, EXCERPT_CHARS),
            constraints_reminder: CONSTRAINTS_REMINDER.to_string(),
        }
    }
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
