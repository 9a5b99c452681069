//! Expressions: conditions over outputs and visits, missing chains, our filters, refused
//! expressions.

use super::*;

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
