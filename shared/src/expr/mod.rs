//! Route conditions, job parameters and prompt templates: Jinja expressions and templates
//! (minijinja) over the run context, a JSON value. Pure and deterministic.
//!
//! Graphs are the submitter's, so evaluation is bounded (`shared::limits`): every render and
//! every expression runs on `TEMPLATE_FUEL` instructions; a render emits at most
//! `MAX_RENDERED_BYTES` (output and captured blocks together); every value a template binds
//! (`set`, `with`, the items of a `for` loop) is measured and the render refused once they sum
//! past `MAX_TEMPLATE_VALUE_BYTES` (the template is rewritten before it is compiled so each
//! binding passes through that check), as is an expression whose value is larger; a loop
//! iterates at most `MAX_LOOP_ITEMS` items. `namespace()`, macros and recursive loops, the
//! constructs that let a value double on every step without a binding, are refused.
//!
//! Builtin filters that walk or copy a whole value (`join`, `list`, `sort`, `string`, ...) are
//! replaced by bounded versions. What this cannot bound from inside the process: minijinja's
//! own operators within one expression allocate before anything can look at their result
//! (`'x' * n` up to minijinja's 100 MB, `a ~ b` of two values each within the bound, `s ~ seq`
//! printing a lazily repeated sequence such as `[1] * 10**12`). A memory limit on the process
//! that renders stays the backstop for those.
//!
//! The rooms: this file holds the API ([`eval`], [`eval_bool`], [`compile_check`], [`render`],
//! [`template_variables`]), the shared environment and the errors; `budget.rs` the bounds on
//! output and on bound values (the capped formatter, value measuring, the `fleet_bound` and
//! `fleet_items` filters); `filters.rs` the filters and functions graphs may use (our own, and
//! the bounded versions of minijinja's builtins); `guard.rs` the rewriting of templates before
//! they compile (every binding charged, refused statements).

mod budget;
mod filters;
mod guard;

use budget::{bound_filter, capped_formatter, items_filter, measure, too_large, too_much_output};
use filters::{
    add_bounded_builtins, difference, flatten, join, no_namespace, tojson, tojson_pretty,
    NO_NAMESPACE,
};
use guard::guard;

use crate::limits::{MAX_RENDERED_BYTES, MAX_TEMPLATE_VALUE_BYTES, TEMPLATE_FUEL};
use minijinja::{Environment, ErrorKind, UndefinedBehavior};
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

/// The filter every value a template binds passes through (inserted by `guard`).
const BOUND_FILTER: &str = "fleet_bound";
/// The filter every `for` loop's iterable passes through (inserted by `guard`).
const ITEMS_FILTER: &str = "fleet_items";
/// Per-render counters, kept in minijinja's temps (fresh for every render).
const EMITTED: &str = "fleet.emitted";
const BOUND: &str = "fleet.bound";

fn env() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        // `a.b.c` on a missing `a` is undefined rather than an error, so conditions can test
        // outputs of nodes that have not run yet.
        env.set_undefined_behavior(UndefinedBehavior::Chainable);
        env.set_keep_trailing_newline(true);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_formatter(capped_formatter);
        env.add_filter("tojson_pretty", tojson_pretty);
        env.add_filter("tojson", tojson);
        env.add_filter("flatten", flatten);
        env.add_filter("difference", difference);
        env.add_filter("join", join);
        add_bounded_builtins(&mut env);
        env.add_filter(BOUND_FILTER, bound_filter);
        env.add_filter(ITEMS_FILTER, items_filter);
        env.add_function("namespace", no_namespace);
        env.add_function(
            crate::factory::FAILURE_BRIEF_FUNCTION,
            crate::factory::failure_brief_function,
        );
        env
    })
}

fn invalid(message: String) -> minijinja::Error {
    minijinja::Error::new(ErrorKind::InvalidOperation, message)
}

/// minijinja's error, with the bounds named.
fn describe(e: &minijinja::Error) -> String {
    match e.kind() {
        ErrorKind::OutOfFuel => format!(
            "the evaluation ran out of fuel: it needs more than {TEMPLATE_FUEL} instructions \
             (shared::limits::TEMPLATE_FUEL)"
        ),
        _ => e.to_string(),
    }
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
    let compiled = env()
        .compile_expression(expr)
        .map_err(|e| error(e.to_string()))?;
    if compiled.undeclared_variables(false).contains("namespace") {
        return Err(error(
            "namespace() is not available in graph expressions".into(),
        ));
    }
    Ok(compiled)
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

/// Evaluates an expression; undefined becomes JSON null. A value larger than
/// `MAX_TEMPLATE_VALUE_BYTES` is refused before it is converted.
pub fn eval(expr: &str, ctx: &Value) -> Result<Value, ExprError> {
    let error = |message: String| ExprError::Eval {
        expr: expr.to_string(),
        message,
    };
    let value = compile(expr)?
        .eval(minijinja::Value::from_serialize(ctx))
        .map_err(|e| error(describe(&e)))?;
    if value.is_undefined() || value.is_none() {
        return Ok(Value::Null);
    }
    if measure(&value, MAX_TEMPLATE_VALUE_BYTES).is_none() {
        return Err(error(too_large().to_string()));
    }
    serde_json::to_value(&value).map_err(|e| error(e.to_string()))
}

pub fn eval_bool(expr: &str, ctx: &Value) -> Result<bool, ExprError> {
    compile(expr)?
        .eval(minijinja::Value::from_serialize(ctx))
        .map(|v| v.is_true())
        .map_err(|e| ExprError::Eval {
            expr: expr.to_string(),
            message: describe(&e),
        })
}

/// An `io::Write` into memory that refuses to grow past `MAX_RENDERED_BYTES`: raw text in a
/// loop is stopped as it is written, not after.
#[derive(Default)]
struct CappedBuffer {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for CappedBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDERED_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other(too_much_output()));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Renders a template within the bounds (fuel, output, bound values); see the module doc.
pub fn render(name: &str, template: &str, ctx: &Value) -> Result<String, ExprError> {
    let error = |message: String| ExprError::Template {
        name: name.to_string(),
        message,
    };
    let guarded = guard(template).map_err(error)?;
    let tmpl = env()
        .template_from_str(&guarded)
        .map_err(|e| error(describe(&e)))?;
    if tmpl.undeclared_variables(false).contains("namespace") {
        return Err(error(NO_NAMESPACE.into()));
    }
    let mut out = CappedBuffer::default();
    let rendered = tmpl
        .render_captured_to(minijinja::Value::from_serialize(ctx), &mut out)
        .map(|_| ());
    match rendered {
        Ok(()) => String::from_utf8(out.bytes).map_err(|e| error(e.to_string())),
        Err(_) if out.overflowed => Err(error(too_much_output())),
        Err(e) => Err(error(describe(&e))),
    }
}

/// Top-level variables a template reads, for the static checker. A template that uses what
/// graph templates may not (macros, recursive loops, `namespace()`, includes) is refused here,
/// so at submission.
pub fn template_variables(name: &str, template: &str) -> Result<BTreeSet<String>, ExprError> {
    let error = |message: String| ExprError::Template {
        name: name.to_string(),
        message,
    };
    let guarded = guard(template).map_err(error)?;
    let tmpl = env()
        .template_from_named_str(name, &guarded)
        .map_err(|e| error(e.to_string()))?;
    let vars: BTreeSet<String> = tmpl.undeclared_variables(false).into_iter().collect();
    if vars.contains("namespace") {
        return Err(error(NO_NAMESPACE.into()));
    }
    Ok(vars)
}

#[cfg(test)]
pub(crate) mod tests;
