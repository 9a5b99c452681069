//! Filters and functions of graph templates: our own (`tojson`, `tojson_pretty`, `flatten`,
//! `difference`, a bounded `join`), minijinja's builtins that walk a whole value put behind
//! `within_bound`, and `namespace()` refused.

use super::budget::{measure, too_large, within_bound, Capped};
use super::invalid;
use crate::limits::{MAX_LOOP_ITEMS, MAX_TEMPLATE_VALUE_BYTES};
use minijinja::value::{Rest, ValueKind};
use minijinja::{Environment, State};
use std::fmt::Write as _;

/// minijinja's builtin filters that walk or copy a whole value, each behind `within_bound`: a
/// lazily repeated sequence (`[1] * 10**12`) is refused instead of collected, sorted or
/// printed.
pub(super) fn add_bounded_builtins(env: &mut Environment<'static>) {
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

/// `namespace()` is the one way a value survives from one loop iteration to the next; with
/// it, `{% set ns.s = ns.s ~ ns.s %}` doubles a string per iteration.
pub(super) fn no_namespace(
    _args: Rest<minijinja::Value>,
) -> Result<minijinja::Value, minijinja::Error> {
    Err(invalid(NO_NAMESPACE.into()))
}

pub(super) const NO_NAMESPACE: &str =
    "namespace() is not available in graph templates: a value may not \
                            grow from one loop iteration to the next";

/// A value as one line of JSON: text an agent gave becomes a quoted, escaped string literal
/// (valid in Python and JSON) in a generated file.
pub(super) fn tojson(value: minijinja::Value) -> Result<String, minijinja::Error> {
    measure(&value, MAX_TEMPLATE_VALUE_BYTES).ok_or_else(too_large)?;
    Ok(serde_json::to_string(&value).unwrap_or_default())
}

pub(super) fn tojson_pretty(value: minijinja::Value) -> Result<String, minijinja::Error> {
    measure(&value, MAX_TEMPLATE_VALUE_BYTES).ok_or_else(too_large)?;
    Ok(serde_json::to_string_pretty(&value).unwrap_or_default())
}

/// minijinja's `join`, bounded: the joined string plus a value's size per item stays below
/// `MAX_TEMPLATE_VALUE_BYTES` (a sequence repeated a trillion times is not walked to its end).
pub(super) fn join(
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
pub(super) fn flatten(v: minijinja::Value) -> Result<minijinja::Value, minijinja::Error> {
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
pub(super) fn difference(
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
