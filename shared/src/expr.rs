//! Route conditions, job parameters and prompt templates: Jinja expressions and templates
//! (minijinja) over the run context, a JSON value. Pure and deterministic.

use minijinja::{Environment, UndefinedBehavior};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::OnceLock;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ExprError {
    #[error("invalid expression `{expr}`: {message}")]
    Compile { expr: String, message: String },
    #[error("expression `{expr}` failed: {message}")]
    Eval { expr: String, message: String },
    #[error("template `{name}` failed: {message}")]
    Template { name: String, message: String },
}

fn env() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        // `a.b.c` on a missing `a` is undefined rather than an error, so conditions can test
        // outputs of nodes that have not run yet.
        env.set_undefined_behavior(UndefinedBehavior::Chainable);
        env.set_keep_trailing_newline(true);
        env.add_filter("tojson_pretty", |v: minijinja::Value| {
            serde_json::to_string_pretty(&v).unwrap_or_default()
        });
        env.add_filter("flatten", flatten);
        env.add_filter("difference", difference);
        env.add_function(
            crate::factory::FAILURE_BRIEF_FUNCTION,
            crate::factory::failure_brief_function,
        );
        env
    })
}

/// `[[a], [b, c]] | flatten` → `[a, b, c]`.
fn flatten(v: minijinja::Value) -> Result<minijinja::Value, minijinja::Error> {
    let mut out = Vec::new();
    for item in v.try_iter()? {
        match item.try_iter() {
            Ok(inner) if item.kind() == minijinja::value::ValueKind::Seq => out.extend(inner),
            _ => out.push(item),
        }
    }
    Ok(minijinja::Value::from(out))
}

/// `a | difference(b)`: the items of `a` not in `b`, in order.
fn difference(
    a: minijinja::Value,
    b: minijinja::Value,
) -> Result<minijinja::Value, minijinja::Error> {
    let other: Vec<minijinja::Value> = if b.is_undefined() || b.is_none() {
        Vec::new()
    } else {
        b.try_iter()?.collect()
    };
    let out: Vec<minijinja::Value> = a.try_iter()?.filter(|x| !other.contains(x)).collect();
    Ok(minijinja::Value::from(out))
}

pub fn compile_check(expr: &str) -> Result<(), ExprError> {
    env()
        .compile_expression(expr)
        .map(|_| ())
        .map_err(|e| ExprError::Compile {
            expr: expr.to_string(),
            message: e.to_string(),
        })
}

/// Evaluates an expression; undefined becomes JSON null.
pub fn eval(expr: &str, ctx: &Value) -> Result<Value, ExprError> {
    let compiled = env()
        .compile_expression(expr)
        .map_err(|e| ExprError::Compile {
            expr: expr.to_string(),
            message: e.to_string(),
        })?;
    let value = compiled
        .eval(minijinja::Value::from_serialize(ctx))
        .map_err(|e| ExprError::Eval {
            expr: expr.to_string(),
            message: e.to_string(),
        })?;
    if value.is_undefined() || value.is_none() {
        return Ok(Value::Null);
    }
    serde_json::to_value(&value).map_err(|e| ExprError::Eval {
        expr: expr.to_string(),
        message: e.to_string(),
    })
}

pub fn eval_bool(expr: &str, ctx: &Value) -> Result<bool, ExprError> {
    let compiled = env()
        .compile_expression(expr)
        .map_err(|e| ExprError::Compile {
            expr: expr.to_string(),
            message: e.to_string(),
        })?;
    compiled
        .eval(minijinja::Value::from_serialize(ctx))
        .map(|v| v.is_true())
        .map_err(|e| ExprError::Eval {
            expr: expr.to_string(),
            message: e.to_string(),
        })
}

pub fn render(name: &str, template: &str, ctx: &Value) -> Result<String, ExprError> {
    env()
        .render_str(template, minijinja::Value::from_serialize(ctx))
        .map_err(|e| ExprError::Template {
            name: name.to_string(),
            message: e.to_string(),
        })
}

/// Top-level variables a template reads, for the static checker.
pub fn template_variables(name: &str, template: &str) -> Result<BTreeSet<String>, ExprError> {
    let tmpl = env()
        .template_from_named_str(name, template)
        .map_err(|e| ExprError::Template {
            name: name.to_string(),
            message: e.to_string(),
        })?;
    Ok(tmpl.undeclared_variables(false).into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conditions_see_outputs_and_visits() {
        let ctx = json!({"po": {"ok": false}, "visits": {"se": 1}, "input": {"max": 2}});
        assert!(eval_bool("not po.ok and visits.se < input.max", &ctx).unwrap());
        assert!(!eval_bool("tr.ok", &ctx).unwrap());
    }

    #[test]
    fn missing_chains_are_null() {
        let ctx = json!({});
        assert_eq!(
            eval("last.output.failure_brief", &ctx).unwrap(),
            Value::Null
        );
    }

    #[test]
    fn flatten_and_difference_compute_uncovered_sketches() {
        let ctx = json!({"fns": [{"props": [{"name": "a"}, {"name": "b"}]}, {"props": [{"name": "c"}]}],
                         "covered": ["b", null]});
        let v = eval(
            "fns | map(attribute='props') | flatten | map(attribute='name') | difference(covered)",
            &ctx,
        )
        .unwrap();
        assert_eq!(v, json!(["a", "c"]));
    }

    #[test]
    fn bad_expressions_are_refused() {
        assert!(compile_check("a ==").is_err());
    }

    #[test]
    fn templates_report_their_variables() {
        let vars = template_variables("t", "{{ input.x }} {% for f in files %}{{ f }}{% endfor %}")
            .unwrap();
        assert!(vars.contains("input") && vars.contains("files"));
        assert!(!vars.contains("f"));
    }
}
