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

/// Compiles an expression. A `}}` outside strings and brackets ends a `{{ }}` block, which an
/// expression never has, and minijinja 2.24 panics ("empty lexer stack") when text follows it
/// (`}} x`): it is refused first.
fn compile<'e>(expr: &'e str) -> Result<minijinja::Expression<'e, 'e>, ExprError> {
    let error = |message: String| ExprError::Compile {
        expr: expr.to_string(),
        message,
    };
    if closes_a_block(expr) {
        return Err(error("`}}` outside brackets ends a template block".into()));
    }
    env()
        .compile_expression(expr)
        .map_err(|e| error(e.to_string()))
}

/// Whether `}}` occurs outside the expression's strings and brackets, where minijinja's lexer
/// reads it as the end of a block.
fn closes_a_block(expr: &str) -> bool {
    let mut quote = None;
    let mut depth = 0isize;
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(_), '\\') => {
                chars.next();
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '}') if depth == 0 && chars.peek() == Some(&'}') => return true,
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth -= 1,
            (None, _) => {}
        }
    }
    false
}

pub fn compile_check(expr: &str) -> Result<(), ExprError> {
    compile(expr).map(|_| ())
}

/// Evaluates an expression; undefined becomes JSON null.
pub fn eval(expr: &str, ctx: &Value) -> Result<Value, ExprError> {
    let value = compile(expr)?
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
    compile(expr)?
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
pub(crate) mod tests {
    use super::*;
    use crate::schema::tests::{arb_json, arb_text, cases, timed, CASE_LIMIT};
    use proptest::prelude::*;
    use serde_json::json;

    const EXPR_TOKENS: &[&str] = &[
        "a",
        "b.c",
        "input",
        "visits.x",
        "last.output",
        "output",
        "item",
        "loop",
        "(",
        ")",
        "[",
        "]",
        "{",
        "}",
        ",",
        ":",
        ".",
        "|",
        "not",
        "and",
        "or",
        "in",
        "is",
        "==",
        "!=",
        "<",
        ">=",
        "+",
        "-",
        "*",
        "/",
        "//",
        "%",
        "**",
        "~",
        "if",
        "else",
        "1",
        "0",
        "-1",
        "2.5",
        "1e308",
        "99999999999999999999999",
        "'s'",
        "\"q\"",
        "'",
        "none",
        "true",
        "range(99999)",
        "range",
        "length",
        "list",
        "map",
        "attribute='x'",
        "join",
        "default",
        "flatten",
        "difference",
        "tojson_pretty",
        "factory_failure_brief",
        "selectattr",
        "sort",
        "unique",
        "dict",
        "namespace",
        "'x' * 999999",
        "[1, 2] * 99999",
        "9 ** 99",
    ];
    const TEMPLATE_TOKENS: &[&str] = &[
        "{{",
        "}}",
        "{%",
        "%}",
        "{#",
        "#}",
        "for",
        "in",
        "endfor",
        "if",
        "elif",
        "else",
        "endif",
        "set",
        "=",
        "macro",
        "m()",
        "endmacro",
        "call",
        "endcall",
        "include",
        "import",
        "extends",
        "block",
        "endblock",
        "raw",
        "endraw",
        "filter",
        "upper",
        "endfilter",
        "with",
        "endwith",
        "recursive",
        "loop(x)",
        "-",
        "\n",
        "text",
    ];

    /// Expressions: anything, soups of expression tokens, or expressions the graphs use.
    pub(crate) fn arb_expr() -> impl Strategy<Value = String> {
        let soup = |sep: &'static str| {
            prop::collection::vec(prop::sample::select(EXPR_TOKENS), 0..12)
                .prop_map(move |t| t.join(sep))
        };
        prop_oneof![
            arb_text(),
            soup(" "),
            soup(""),
            prop::sample::select(vec![
                "(visits.fix or 0) >= input.spec.strictness.max_fix_attempts",
                "fix and (fix.output.changes | length) == 0",
                "output.properties | map(attribute='name') | list",
                "validate.output.failure_signatures if not validate.ok else none",
                "fns | map(attribute='props') | flatten | map(attribute='name') | difference(covered)",
                "factory_failure_brief(last)",
                "input.work_order.context_files",
                "range(100000) | list | length",
                "((((((((((((((((((((((((((((((((((((((((1))))))))))))))))))))))))))))))))))))))",
            ])
            .prop_map(str::to_string),
        ]
    }

    /// Templates: anything, soups of template and expression tokens, or known hard cases.
    pub(crate) fn arb_template() -> impl Strategy<Value = String> {
        let token = prop_oneof![
            prop::sample::select(TEMPLATE_TOKENS),
            prop::sample::select(EXPR_TOKENS)
        ];
        prop_oneof![
            arb_text(),
            prop::collection::vec(token, 0..24).prop_map(|t| t.join(" ")),
            prop::sample::select(vec![
                "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
                "{% for f in files %}{{ f }}{% endfor %}{{ input.x }}",
                "{% include 'other.j2' %}{% extends 'base.j2' %}",
                "{{ factory_failure_brief(last) | tojson_pretty }}",
            ])
            .prop_map(str::to_string),
        ]
    }

    /// A run context: any JSON, or the shape the engine builds.
    fn arb_ctx() -> impl Strategy<Value = Value> {
        prop_oneof![
            arb_json(),
            (arb_json(), arb_json(), arb_json()).prop_map(|(input, last, out)| {
                json!({"input": input, "visits": {"x": 1}, "last": last, "a": out, "files": [out]})
            }),
        ]
    }

    proptest! {
        #![proptest_config(cases(256))]

        /// Graphs are the submitter's: any expression compiles or is refused, and evaluates
        /// to a value or an error, quickly.
        #[test]
        fn any_expression_compiles_and_evaluates_or_fails(expr in arb_expr(), ctx in arb_ctx()) {
            let ((compiles, value, truth), took) = timed(|| {
                (compile_check(&expr), eval(&expr, &ctx), eval_bool(&expr, &ctx))
            });
            prop_assert!(took < CASE_LIMIT, "{expr:?}: {took:?}");
            let compile_error = |r: &Result<(), ExprError>| matches!(r, Err(ExprError::Compile { .. }));
            prop_assert_eq!(compile_error(&compiles), matches!(value, Err(ExprError::Compile { .. })));
            prop_assert_eq!(compile_error(&compiles), matches!(truth, Err(ExprError::Compile { .. })));
        }

        #[test]
        fn any_template_renders_or_fails(template in arb_template(), ctx in arb_ctx()) {
            let ((vars, rendered), took) = timed(|| {
                (template_variables("t", &template), render("t", &template, &ctx))
            });
            prop_assert!(took < CASE_LIMIT, "{template:?}: {took:?}");
            if vars.is_err() {
                prop_assert!(rendered.is_err(), "{template:?} renders but does not parse");
            }
        }
    }

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
    fn a_block_end_in_an_expression_is_refused_not_a_panic() {
        // minijinja panicked with "empty lexer stack" on each of these.
        for expr in ["}} ", "a }} b", "x -}}y", "'s' }}}", "(a) }} b"] {
            assert!(
                matches!(eval(expr, &json!({})), Err(ExprError::Compile { .. })),
                "{expr}"
            );
        }
        // ... and refused this one anyway.
        assert!(env().compile_expression("a }}").is_err());
        // Inside a string or brackets it is text or two braces.
        assert_eq!(
            eval("'}} ' ~ \"\\\"}}\"", &json!({})).unwrap(),
            json!("}} \"}}")
        );
        assert_eq!(eval("{'a': {'b': 1}}.a.b", &json!({})).unwrap(), json!(1));
        assert_eq!(eval("[{'b': 1}][0].b", &json!({})).unwrap(), json!(1));
    }

    #[test]
    fn templates_report_their_variables() {
        let vars = template_variables("t", "{{ input.x }} {% for f in files %}{{ f }}{% endfor %}")
            .unwrap();
        assert!(vars.contains("input") && vars.contains("files"));
        assert!(!vars.contains("f"));
    }
}
