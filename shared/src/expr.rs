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

use crate::limits::{MAX_LOOP_ITEMS, MAX_RENDERED_BYTES, MAX_TEMPLATE_VALUE_BYTES, TEMPLATE_FUEL};
use minijinja::value::{Rest, ValueKind};
use minijinja::{Environment, ErrorKind, State, UndefinedBehavior};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt::Write as _;
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

fn too_large() -> minijinja::Error {
    invalid(format!(
        "the values this evaluation builds pass {MAX_TEMPLATE_VALUE_BYTES} bytes \
         (shared::limits::MAX_TEMPLATE_VALUE_BYTES)"
    ))
}

fn too_much_output() -> String {
    format!(
        "the rendered output passes {MAX_RENDERED_BYTES} bytes \
         (shared::limits::MAX_RENDERED_BYTES)"
    )
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

/// A `fmt::Write` that refuses to go past `left` bytes.
struct Capped<'a, W: std::fmt::Write> {
    out: &'a mut W,
    left: usize,
    written: usize,
}

impl<W: std::fmt::Write> std::fmt::Write for Capped<'_, W> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if s.len() > self.left {
            self.left = 0;
            return Err(std::fmt::Error);
        }
        self.left -= s.len();
        self.written += s.len();
        self.out.write_str(s)
    }
}

fn temp_usize(state: &State, key: &str) -> usize {
    state.get_temp(key).and_then(|v| v.as_usize()).unwrap_or(0)
}

/// Writes `{{ value }}` (no auto-escaping, as the default formatter does for our templates),
/// counting what the render emitted so far, into its output and into captured blocks
/// (`{% set x %}...{% endset %}`) alike.
fn capped_formatter(
    out: &mut minijinja::Output,
    state: &State,
    value: &minijinja::Value,
) -> Result<(), minijinja::Error> {
    let emitted = temp_usize(state, EMITTED);
    let mut capped = Capped {
        out,
        left: MAX_RENDERED_BYTES.saturating_sub(emitted),
        written: 0,
    };
    let wrote = write!(capped, "{value}");
    let total = emitted + capped.written;
    state.set_temp(EMITTED, minijinja::Value::from(total));
    wrote.map_err(|_| invalid(too_much_output()))
}

/// The size of a value, deep, as the memory it would take unshared: a value's own size plus
/// the bytes of a string, and for a container its items (a map's keys and values). `None` once
/// it passes `limit`; a lazy sequence of a trillion items is walked only that far.
fn measure(value: &minijinja::Value, limit: usize) -> Option<usize> {
    fn own(v: &minijinja::Value) -> usize {
        std::mem::size_of::<minijinja::Value>()
            + match v.kind() {
                ValueKind::String => v.as_str().map_or(0, str::len),
                ValueKind::Bytes => v.as_bytes().map_or(0, <[u8]>::len),
                _ => 0,
            }
    }
    fn children(v: &minijinja::Value) -> Option<minijinja::value::ValueIter> {
        match v.kind() {
            ValueKind::Seq | ValueKind::Iterable | ValueKind::Map => v.try_iter().ok(),
            _ => None,
        }
    }
    let mut total = own(value);
    let mut stack: Vec<(minijinja::Value, minijinja::value::ValueIter)> = Vec::new();
    if let Some(it) = children(value) {
        stack.push((value.clone(), it));
    }
    while total <= limit {
        let Some((parent, iter)) = stack.last_mut() else {
            return Some(total);
        };
        let Some(item) = iter.next() else {
            stack.pop();
            continue;
        };
        let mut items = vec![];
        if parent.kind() == ValueKind::Map {
            if let Ok(v) = parent.get_item(&item) {
                items.push(v);
            }
        }
        items.insert(0, item);
        for item in items {
            total = total.saturating_add(own(&item));
            if let Some(it) = children(&item) {
                stack.push((item, it));
            }
        }
    }
    None
}

/// Charges a bound value to the render's budget.
fn charge(state: &State, value: &minijinja::Value) -> Result<(), minijinja::Error> {
    let used = temp_usize(state, BOUND);
    let size =
        measure(value, MAX_TEMPLATE_VALUE_BYTES.saturating_sub(used)).ok_or_else(too_large)?;
    state.set_temp(BOUND, minijinja::Value::from(used + size));
    Ok(())
}

/// Refuses a value larger than `MAX_TEMPLATE_VALUE_BYTES` before a builtin walks it whole.
fn within_bound(value: &minijinja::Value) -> Result<(), minijinja::Error> {
    measure(value, MAX_TEMPLATE_VALUE_BYTES)
        .map(|_| ())
        .ok_or_else(too_large)
}

/// minijinja's builtin filters that walk or copy a whole value, each behind `within_bound`: a
/// lazily repeated sequence (`[1] * 10**12`) is refused instead of collected, sorted or
/// printed.
fn add_bounded_builtins(env: &mut Environment<'static>) {
    use minijinja::filters as f;
    use minijinja::value::Kwargs;
    type V = minijinja::Value;
    type R = Result<V, minijinja::Error>;
    env.add_filter("list", |s: &State, v: V| -> R {
        within_bound(&v)?;
        f::list(s, v)
    });
    env.add_filter("sort", |s: &State, v: V, k: Kwargs| -> R {
        within_bound(&v)?;
        f::sort(s, v, k)
    });
    env.add_filter("unique", |s: &State, v: V, k: Kwargs| -> R {
        within_bound(&v)?;
        f::unique(s, v, k)
    });
    env.add_filter("reverse", |v: V| -> R {
        within_bound(&v)?;
        f::reverse(&v)
    });
    env.add_filter("sum", |s: &State, v: V| -> R {
        within_bound(&v)?;
        f::sum(s, v)
    });
    env.add_filter("min", |s: &State, v: V| -> R {
        within_bound(&v)?;
        f::min(s, v)
    });
    env.add_filter("max", |s: &State, v: V| -> R {
        within_bound(&v)?;
        f::max(s, v)
    });
    env.add_filter("string", |s: &State, v: V| -> R {
        within_bound(&v)?;
        f::string(s, &v)
    });
    env.add_filter("pprint", |v: V| -> Result<String, minijinja::Error> {
        within_bound(&v)?;
        Ok(f::pprint(&v))
    });
    env.add_filter("dictsort", |v: V, k: Kwargs| -> R {
        within_bound(&v)?;
        f::dictsort(&v, k)
    });
    env.add_filter("batch", |s: &State, v: V, n: usize, fill: Option<V>| -> R {
        within_bound(&v)?;
        f::batch(s, v, n, fill)
    });
    env.add_filter("slice", |s: &State, v: V, n: usize, fill: Option<V>| -> R {
        within_bound(&v)?;
        f::slice(s, v, n, fill)
    });
}

/// `{% set x = e %}` becomes `{% set x = (e)|fleet_bound %}`: the value, unchanged, once
/// charged.
fn bound_filter(
    state: &State,
    value: minijinja::Value,
) -> Result<minijinja::Value, minijinja::Error> {
    charge(state, &value)?;
    Ok(value)
}

/// `{% for x in e %}` becomes `{% for x in (e)|fleet_items %}`: the items, collected (at most
/// `MAX_LOOP_ITEMS`), each charged. What cannot be iterated is passed on for minijinja to
/// report.
fn items_filter(
    state: &State,
    value: minijinja::Value,
) -> Result<minijinja::Value, minijinja::Error> {
    if value.is_undefined() || value.is_none() {
        return Ok(value);
    }
    let Ok(iter) = value.try_iter() else {
        return Ok(value);
    };
    let mut items = Vec::new();
    for item in iter {
        if items.len() == MAX_LOOP_ITEMS {
            return Err(invalid(format!(
                "a loop over more than {MAX_LOOP_ITEMS} items (shared::limits::MAX_LOOP_ITEMS)"
            )));
        }
        charge(state, &item)?;
        items.push(item);
    }
    Ok(minijinja::Value::from(items))
}

/// `namespace()` is the one way a value survives from one loop iteration to the next; with
/// it, `{% set ns.s = ns.s ~ ns.s %}` doubles a string per iteration.
fn no_namespace(_args: Rest<minijinja::Value>) -> Result<minijinja::Value, minijinja::Error> {
    Err(invalid(NO_NAMESPACE.into()))
}

const NO_NAMESPACE: &str = "namespace() is not available in graph templates: a value may not \
                            grow from one loop iteration to the next";

fn tojson_pretty(value: minijinja::Value) -> Result<String, minijinja::Error> {
    measure(&value, MAX_TEMPLATE_VALUE_BYTES).ok_or_else(too_large)?;
    Ok(serde_json::to_string_pretty(&value).unwrap_or_default())
}

/// minijinja's `join`, bounded: the joined string plus a value's size per item stays below
/// `MAX_TEMPLATE_VALUE_BYTES` (a sequence repeated a trillion times is not walked to its end).
fn join(
    value: minijinja::Value,
    joiner: Option<String>,
) -> Result<minijinja::Value, minijinja::Error> {
    let joiner = joiner.unwrap_or_default();
    let iter = value
        .try_iter()
        .map_err(|e| invalid(format!("cannot join a value of type {}: {e}", value.kind())))?;
    let mut joined = String::new();
    let mut out = Capped {
        out: &mut joined,
        left: MAX_TEMPLATE_VALUE_BYTES,
        written: 0,
    };
    for (i, item) in iter.enumerate() {
        // Each item counts as a value's size too, so a trillion empty strings stop early.
        out.left = out
            .left
            .saturating_sub(std::mem::size_of::<minijinja::Value>());
        if out.left == 0 {
            return Err(too_large());
        }
        let wrote = if i > 0 {
            out.write_str(&joiner)
        } else {
            Ok(())
        };
        let wrote = wrote.and_then(|_| match item.as_str() {
            Some(s) => out.write_str(s),
            None => write!(out, "{item}"),
        });
        wrote.map_err(|_| too_large())?;
    }
    Ok(minijinja::Value::from(joined))
}

/// `[[a], [b, c]] | flatten` → `[a, b, c]`.
fn flatten(v: minijinja::Value) -> Result<minijinja::Value, minijinja::Error> {
    let mut out = Vec::new();
    for item in v.try_iter()? {
        match item.try_iter() {
            Ok(inner) if item.kind() == ValueKind::Seq => out.extend(inner),
            _ => out.push(item),
        }
        if out.len() > MAX_LOOP_ITEMS {
            return Err(invalid(format!(
                "flatten: more than {MAX_LOOP_ITEMS} items (shared::limits::MAX_LOOP_ITEMS)"
            )));
        }
    }
    Ok(minijinja::Value::from(out))
}

/// `a | difference(b)`: the items of `a` not in `b`, in order.
fn difference(
    a: minijinja::Value,
    b: minijinja::Value,
) -> Result<minijinja::Value, minijinja::Error> {
    let too_many = || {
        invalid(format!(
            "difference: more than {MAX_LOOP_ITEMS} items (shared::limits::MAX_LOOP_ITEMS)"
        ))
    };
    let other: Vec<minijinja::Value> = if b.is_undefined() || b.is_none() {
        Vec::new()
    } else {
        b.try_iter()?.take(MAX_LOOP_ITEMS + 1).collect()
    };
    if other.len() > MAX_LOOP_ITEMS {
        return Err(too_many());
    }
    let mut out = Vec::new();
    for (i, x) in a.try_iter()?.enumerate() {
        // Quadratic: both sides are capped, and so are the comparisons.
        if i >= MAX_LOOP_ITEMS || i.saturating_mul(other.len()) > 100 * MAX_LOOP_ITEMS {
            return Err(too_many());
        }
        if !other.contains(&x) {
            out.push(x);
        }
    }
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

/// Statements a graph template may not use, and why.
fn refused_statement(keyword: &str) -> Option<&'static str> {
    match keyword {
        "macro" | "call" => Some("macros are not available in graph templates: a recursive macro doubles a value on every call"),
        "include" | "import" | "from" | "extends" => {
            Some("a graph template stands alone: include, import and extends are not available")
        }
        _ => None,
    }
}

/// Rewrites a template so that every value it binds is charged to the render's budget:
/// `{% set x = e %}` → `{% set x = (e)|fleet_bound %}`, `{% with a = e %}` likewise,
/// `{% for x in e %}` → `{% for x in (e)|fleet_items %}`; refuses macros, includes and
/// recursive loops. Text, comments, `{{ }}` blocks and `{% raw %}` blocks are left as they
/// are; a tag that does not end is left for minijinja to report.
fn guard(template: &str) -> Result<Cow<'_, str>, String> {
    let mut out = String::new();
    let mut copied = 0;
    let mut i = 0;
    while let Some(found) = template[i..].find('{') {
        let at = i + found;
        let rest = &template[at..];
        if rest.starts_with("{#") {
            match rest.find("#}") {
                Some(e) => i = at + e + 2,
                None => break,
            }
        } else if rest.starts_with("{{") {
            match tag_end(template, at + 2, "}}") {
                Some(e) => i = e + 2,
                None => break,
            }
        } else if rest.starts_with("{%") {
            let Some(end) = tag_end(template, at + 2, "%}") else {
                break;
            };
            let inner = &template[at + 2..end];
            i = end + 2;
            if tag_keyword(inner) == "raw" {
                match raw_end(template, i) {
                    Some(e) => i = e,
                    None => break,
                }
                continue;
            }
            if let Some(rewritten) = guard_tag(inner)? {
                out.push_str(&template[copied..at + 2]);
                out.push_str(&rewritten);
                copied = end;
            }
        } else {
            i = at + 1;
        }
    }
    if copied == 0 {
        return Ok(Cow::Borrowed(template));
    }
    out.push_str(&template[copied..]);
    Ok(Cow::Owned(out))
}

/// Where `close` ends the tag whose body starts at `from`: outside strings and brackets.
fn tag_end(s: &str, from: usize, close: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut quote = None;
    let mut depth = 0usize;
    let mut i = from;
    while i < bytes.len() {
        let c = bytes[i];
        match quote {
            Some(q) => {
                if c == b'\\' {
                    i += 1;
                } else if c == q {
                    quote = None;
                }
            }
            None => {
                if depth == 0 && bytes[i..].starts_with(close.as_bytes()) {
                    return Some(i);
                }
                match c {
                    b'\'' | b'"' => quote = Some(c),
                    b'(' | b'[' | b'{' => depth += 1,
                    b')' | b']' | b'}' => depth = depth.saturating_sub(1),
                    _ => {}
                }
            }
        }
        i += 1;
    }
    None
}

/// The end (past `%}`) of the `{% endraw %}` after `from`.
fn raw_end(s: &str, from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(found) = s[i..].find("{%") {
        let at = i + found;
        let end = s[at + 2..].find("%}")? + at + 2;
        if tag_keyword(&s[at + 2..end]) == "endraw" {
            return Some(end + 2);
        }
        i = at + 2;
    }
    None
}

/// The inside of a tag without its whitespace control (`-`, `+`) and surrounding blanks:
/// (offset of the body in `inner`, the body).
fn tag_body(inner: &str) -> (usize, &str) {
    let start = inner.len() - inner.trim_start_matches(['-', '+']).len();
    let body = &inner[start..];
    let body = body.trim_end();
    let body = body.strip_suffix(['-', '+']).unwrap_or(body);
    (start, body)
}

fn tag_keyword(inner: &str) -> &str {
    let body = tag_body(inner).1.trim_start();
    let end = body
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(body.len());
    &body[..end]
}

/// Top-level tokens of a tag body: (offset, word) for identifiers and (offset, "=") for a lone
/// assignment sign and (offset, ",") for commas, outside strings and brackets.
fn top_level(body: &str) -> Vec<(usize, &str)> {
    let bytes = body.as_bytes();
    let mut out = Vec::new();
    let mut quote = None;
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if let Some(q) = quote {
            if c == b'\\' {
                i += 1;
            } else if c == q {
                quote = None;
            }
            i += 1;
            continue;
        }
        match c {
            b'\'' | b'"' => quote = Some(c),
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ if depth > 0 => {}
            b',' => out.push((i, ",")),
            b'=' => {
                let prev = i.checked_sub(1).map(|p| bytes[p]);
                let next = bytes.get(i + 1).copied();
                if !matches!(prev, Some(b'=' | b'!' | b'<' | b'>')) && next != Some(b'=') {
                    out.push((i, "="));
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                out.push((start, &body[start..i]));
                continue;
            }
            c if c.is_ascii_digit() => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The rewritten inside of one `{% %}` tag, if it binds a value; an error for a refused one.
fn guard_tag(inner: &str) -> Result<Option<String>, String> {
    let (offset, body) = tag_body(inner);
    let keyword = tag_keyword(inner);
    if let Some(why) = refused_statement(keyword) {
        return Err(why.to_string());
    }
    let tokens = top_level(body);
    // (start, end) of each expression to wrap, in `body`, and the filter to wrap it in.
    let mut wraps: Vec<(usize, usize, &str)> = Vec::new();
    match keyword {
        "set" => {
            if let Some(&(eq, _)) = tokens.iter().find(|(_, t)| *t == "=") {
                wraps.push((eq + 1, body.len(), BOUND_FILTER));
            }
        }
        "with" => {
            // `with a = e1, b = e2`: each value runs from its `=` to the next top-level comma
            // that is followed by another `name =`.
            let eqs: Vec<usize> = tokens
                .iter()
                .filter(|(_, t)| *t == "=")
                .map(|(at, _)| *at)
                .collect();
            for (n, &eq) in eqs.iter().enumerate() {
                let end = match eqs.get(n + 1) {
                    Some(&next) => tokens
                        .iter()
                        .filter(|(at, t)| *t == "," && *at > eq && *at < next)
                        .map(|(at, _)| *at)
                        .next_back()
                        .unwrap_or(next),
                    None => body.len(),
                };
                wraps.push((eq + 1, end, BOUND_FILTER));
            }
        }
        "for" => {
            if tokens.iter().any(|(_, t)| *t == "recursive") {
                return Err(
                    "recursive loops are not available in graph templates: each level \
                            may double a value"
                        .into(),
                );
            }
            if let Some(&(at_in, _)) = tokens.iter().find(|(_, t)| *t == "in") {
                let start = at_in + 2;
                let end = tokens
                    .iter()
                    .find(|(at, t)| *at > start && *t == "if")
                    .map_or(body.len(), |(at, _)| *at);
                wraps.push((start, end, ITEMS_FILTER));
            }
        }
        _ => {}
    }
    if wraps.is_empty() {
        return Ok(None);
    }
    let mut out = String::with_capacity(inner.len() + 32);
    out.push_str(&inner[..offset]);
    let mut copied = 0;
    for (start, end, filter) in wraps {
        out.push_str(&body[copied..start]);
        out.push_str(" (");
        out.push_str(&body[start..end]);
        out.push_str(")|");
        out.push_str(filter);
        out.push(' ');
        copied = end;
    }
    out.push_str(&body[copied..]);
    out.push_str(&inner[offset + body.len()..]);
    Ok(Some(out))
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

    /// Renders with a deadline: every attack below must end, with an error, well within it.
    fn render_quickly(template: &str, ctx: &Value) -> Result<String, ExprError> {
        let (rendered, took) = timed(|| render("t", template, ctx));
        assert!(
            took < std::time::Duration::from_secs(5),
            "{template}: {took:?}"
        );
        rendered
    }

    fn refused(template: &str, needle: &str) {
        match render_quickly(template, &json!({})) {
            Err(e) => assert!(e.to_string().contains(needle), "{template}: {e}"),
            Ok(out) => panic!("{template} rendered {} bytes", out.len()),
        }
    }

    #[test]
    fn the_doubling_loop_of_the_issue_is_bounded() {
        // minijinja scopes a `set` inside a loop body to the iteration (as Jinja does): every
        // iteration doubles the outer `'x'` once and forgets it.
        let doubling = "{% set s = 'x' %}{% for i in range(60) %}{% set s = s ~ s %}{% endfor %}";
        assert_eq!(render_quickly(doubling, &json!({})).unwrap(), "");
        assert_eq!(
            render_quickly(&format!("{doubling}{{{{ s|length }}}}"), &json!({})).unwrap(),
            "1"
        );
        // What carries a value across iterations is a namespace: refused, at check time too.
        let ns = "{% set ns = namespace(s='x') %}{% for i in range(60) %}\
                  {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}";
        refused(ns, "namespace() is not available");
        assert!(template_variables("t", ns)
            .unwrap_err()
            .to_string()
            .contains("namespace"));
        assert!(compile_check("namespace(a=1)").is_err());
    }

    #[test]
    fn doubling_a_string_sixty_times_is_refused_quickly() {
        let bound = "MAX_TEMPLATE_VALUE_BYTES";
        // Straight-line sets.
        refused(
            &format!(
                "{{% set s = 'x' %}}{}{{{{ s }}}}",
                "{% set s = s ~ s %}".repeat(60)
            ),
            bound,
        );
        // Nested `with` blocks.
        refused(
            &format!(
                "{{% with s = 'x' %}}{}{{{{ s }}}}{}{{% endwith %}}",
                "{% with s = s ~ s %}".repeat(60),
                "{% endwith %}".repeat(60)
            ),
            bound,
        );
        // Nested loops over one doubled item each.
        refused(
            &format!(
                "{{% for s in ['x'] %}}{}{{{{ s }}}}{}{{% endfor %}}",
                "{% for s in [s ~ s] %}".repeat(60),
                "{% endfor %}".repeat(60)
            ),
            bound,
        );
        // Captured blocks: counted as they are emitted.
        refused(
            &format!(
                "{{% set s %}}x{{% endset %}}{}{{{{ s }}}}",
                "{% set s %}{{ s }}{{ s }}{% endset %}".repeat(60)
            ),
            "MAX_RENDERED_BYTES",
        );
        // Nested lists walked by a consumer.
        refused(
            &format!(
                "{{% set s = ['x'] %}}{}{{{{ s|join }}}}",
                "{% set s = [s, s] %}".repeat(60)
            ),
            bound,
        );
        // minijinja's own repetition (up to 100 MB), then one doubling.
        refused(
            "{% set s = 'x' * 50000000 %}{% set s = s ~ s %}{{ s|length }}",
            bound,
        );
        // A sequence repeated a trillion times, joined or looped over.
        refused("{{ (['x'] * 1000000000000)|join }}", bound);
        refused(
            "{% for x in ['x'] * 1000000000000 %}{% endfor %}",
            "MAX_LOOP_ITEMS",
        );
        for filter in [
            "list", "sort", "unique", "reverse", "sum", "max", "string", "pprint",
        ] {
            refused(&format!("{{{{ ([1] * 1000000000000)|{filter} }}}}"), bound);
        }
        // Recursion doubles per call: macros and recursive loops are refused before running.
        let mac = "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% else %}{{ s|length }}\
                   {% endif %}{% endmacro %}{{ d('x', 60) }}";
        refused(mac, "macros are not available");
        assert!(template_variables("t", mac).is_err());
        let rec = "{% for s in ['x'] recursive %}{{ loop([s ~ s]) }}{% endfor %}";
        refused(rec, "recursive loops");
        assert!(template_variables("t", rec).is_err());
        // An expression cannot bind, but its value is measured.
        let (v, took) = timed(|| eval("('x' * 40000000) ~ ('x' * 40000000)", &json!({})));
        assert!(took < std::time::Duration::from_secs(5));
        assert!(v.unwrap_err().to_string().contains(bound));
    }

    #[test]
    fn nested_ranges_run_out_of_fuel() {
        refused(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "ran out of fuel",
        );
        let (v, took) = timed(|| {
            eval(
                "range(100000) | list | difference(range(100000) | list)",
                &json!({}),
            )
        });
        assert!(took < std::time::Duration::from_secs(5));
        assert!(v.unwrap_err().to_string().contains("MAX_LOOP_ITEMS"));
    }

    #[test]
    fn the_rendered_output_is_bounded() {
        let text = "x".repeat(100);
        refused(
            &format!("{{% for i in range(100000) %}}{text}{{% endfor %}}"),
            "MAX_RENDERED_BYTES",
        );
        let big = json!({"s": "y".repeat(600 * 1024)});
        assert!(render_quickly("{{ s }}{{ s }}", &big)
            .unwrap_err()
            .to_string()
            .contains("MAX_RENDERED_BYTES"));
        assert_eq!(render_quickly("{{ s }}", &big).unwrap().len(), 600 * 1024);
    }

    #[test]
    fn guarded_templates_render_as_before() {
        let ctx = json!({"xs": [1, 2, 3], "d": {"a": 1, "b": 2}, "s": "a %} b"});
        for (template, expected) in [
            ("{% set a, b = 1, 2 %}{{ a }}{{ b }}", "12"),
            ("{% set a = xs | length if xs else 0 -%}\n{{ a }}", "3"),
            ("{%- set a = '%}' -%} {{ a }}", "%}"),
            (
                "{% with a = 1, b = [2, 3] %}{{ a }}{{ b | length }}{% endwith %}",
                "12",
            ),
            (
                "{% for x in xs if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% endfor %}",
                "1/2:2 2/2:3 ",
            ),
            ("{% for x in [] %}a{% else %}empty{% endfor %}", "empty"),
            (
                "{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}",
                "a=1;b=2;",
            ),
            ("{% for k in d %}{{ k }}{% endfor %}", "ab"),
            ("{% for c in 'ab' %}{{ c }}.{% endfor %}", "a.b."),
            ("{% for x in missing.thing %}a{% endfor %}", ""),
            ("{% set x %}cap{{ xs[0] }}{% endset %}{{ x }}", "cap1"),
            ("{% raw %}{% macro m() %}{% endraw %}", "{% macro m() %}"),
            (
                "{{ '{% macro m() %}' }}{# {% macro %} #}",
                "{% macro m() %}",
            ),
            ("{{ s }}{% if s == 'x' %}y{% endif %}", "a %} b"),
            (
                "{{ xs | join(', ') }} {{ none }} {{ [none] | join }}",
                "1, 2, 3 None None",
            ),
            (
                "{{ xs | reverse | list }} {{ xs | sort(reverse=true) | first }} {{ xs | sum }}",
                "[3, 2, 1] 3 6",
            ),
            (
                "{{ [2, 1, 2] | unique | list }} {{ d | dictsort | first | join('=') }} \
                 {{ xs | batch(2) | list | length }} {{ xs | max }}{{ xs | min }} {{ 1 | string }}",
                "[2, 1] a=1 2 31 1",
            ),
        ] {
            assert_eq!(render("t", template, &ctx).unwrap(), expected, "{template}");
        }
    }

    #[test]
    fn templates_report_their_variables() {
        let vars = template_variables("t", "{{ input.x }} {% for f in files %}{{ f }}{% endfor %}")
            .unwrap();
        assert!(vars.contains("input") && vars.contains("files"));
        assert!(!vars.contains("f"));
    }
}
