//! The bounds a render keeps besides fuel: what it emits (the capped formatter, counting output
//! and captured blocks alike) and what it binds (every `set`, `with` and loop item measured and
//! charged to the render's budget through the `fleet_bound` and `fleet_items` filters).

use super::{invalid, BOUND, EMITTED};
use crate::limits::{MAX_LOOP_ITEMS, MAX_RENDERED_BYTES, MAX_TEMPLATE_VALUE_BYTES};
use minijinja::value::ValueKind;
use minijinja::State;
use std::fmt::Write as _;

pub(super) fn too_large() -> minijinja::Error {
    invalid(format!(
        "the values this evaluation builds pass {MAX_TEMPLATE_VALUE_BYTES} bytes \
         (shared::limits::MAX_TEMPLATE_VALUE_BYTES)"
    ))
}

pub(super) fn too_much_output() -> String {
    format!(
        "the rendered output passes {MAX_RENDERED_BYTES} bytes \
         (shared::limits::MAX_RENDERED_BYTES)"
    )
}

/// A `fmt::Write` that refuses to go past `left` bytes.
pub(super) struct Capped<'a, W: std::fmt::Write> {
    pub(super) out: &'a mut W,
    pub(super) left: usize,
    pub(super) written: usize,
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

pub(super) fn temp_usize(state: &State, key: &str) -> usize {
    state.get_temp(key).and_then(|v| v.as_usize()).unwrap_or(0)
}

/// Writes `{{ value }}` (no auto-escaping, as the default formatter does for our templates),
/// counting what the render emitted so far, into its output and into captured blocks
/// (`{% set x %}...{% endset %}`) alike.
pub(super) fn capped_formatter(
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
pub(super) fn measure(value: &minijinja::Value, limit: usize) -> Option<usize> {
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
pub(super) fn charge(state: &State, value: &minijinja::Value) -> Result<(), minijinja::Error> {
    let used = temp_usize(state, BOUND);
    let size =
        measure(value, MAX_TEMPLATE_VALUE_BYTES.saturating_sub(used)).ok_or_else(too_large)?;
    state.set_temp(BOUND, minijinja::Value::from(used + size));
    Ok(())
}

/// Refuses a value larger than `MAX_TEMPLATE_VALUE_BYTES` before a builtin walks it whole.
pub(super) fn within_bound(value: &minijinja::Value) -> Result<(), minijinja::Error> {
    measure(value, MAX_TEMPLATE_VALUE_BYTES)
        .map(|_| ())
        .ok_or_else(too_large)
}

/// `{% set x = e %}` becomes `{% set x = (e)|fleet_bound %}`: the value, unchanged, once
/// charged.
pub(super) fn bound_filter(
    state: &State,
    value: minijinja::Value,
) -> Result<minijinja::Value, minijinja::Error> {
    charge(state, &value)?;
    Ok(value)
}

/// `{% for x in e %}` becomes `{% for x in (e)|fleet_items %}`: the items, collected (at most
/// `MAX_LOOP_ITEMS`), each charged. What cannot be iterated is passed on for minijinja to
/// report.
pub(super) fn items_filter(
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
