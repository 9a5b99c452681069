//! expr tests: the strategies other modules' property tests share (`arb_expr`,
//! `arb_template`) and the property tests that any expression or template evaluates or fails
//! quickly; `eval.rs` expressions; `bounds.rs` the bounds on renders (fuel, output, bound
//! values, refused constructs) and the guard's rewriting.

mod bounds;
mod eval;

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
