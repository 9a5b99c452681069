//! Rewriting a template before it compiles: every value it binds passes through the budget
//! filters, and the statements graph templates may not use (macros, includes, recursive loops)
//! are refused.

use super::{BOUND_FILTER, ITEMS_FILTER};
use std::borrow::Cow;

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
pub(super) fn guard(template: &str) -> Result<Cow<'_, str>, String> {
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
