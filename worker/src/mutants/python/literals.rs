//! Text helpers of the walk: Python integer literals read and written in their own base, a
//! replacement kept from gluing two words together, and the one-line snippets of descriptions.

pub(super) fn is_not_implemented(raise: &str) -> bool {
    raise.contains("NotImplementedError")
}

/// A Python integer literal: its magnitude, its base prefix as written (`""`, `"0x"`, `"0X"`,
/// ...) and its radix. `None` for complex and long literals and for overflow.
pub(super) fn parse_int(literal: &str) -> Option<(u128, &str, u32)> {
    let t = literal.trim();
    let (prefix, digits, radix) = match t.get(..2).map(str::to_ascii_lowercase).as_deref() {
        Some("0x") => (&t[..2], &t[2..], 16),
        Some("0o") => (&t[..2], &t[2..], 8),
        Some("0b") => (&t[..2], &t[2..], 2),
        _ => ("", t, 10),
    };
    let digits: String = digits.chars().filter(|&c| c != '_').collect();
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u128::from_str_radix(&digits, radix)
        .ok()
        .map(|v| (v, prefix, radix))
}

pub(super) fn format_int(v: i128, prefix: &str, radix: u32) -> String {
    let sign = if v < 0 { "-" } else { "" };
    let m = v.unsigned_abs();
    match radix {
        16 => format!("{sign}{prefix}{m:x}"),
        8 => format!("{sign}{prefix}{m:o}"),
        2 => format!("{sign}{prefix}{m:b}"),
        _ => format!("{sign}{m}"),
    }
}

fn is_word(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Adds a space where the replacement would run into a neighbouring word (`if(x):` flipped is
/// `if not ((x)):`, not `ifnot ((x)):`).
pub(super) fn unglued(src: &str, start: usize, end: usize, replacement: String) -> String {
    let before = src[..start].chars().next_back().is_some_and(is_word);
    let after = src[end..].chars().next().is_some_and(is_word);
    let lead = before && replacement.chars().next().is_some_and(is_word);
    let trail = after && replacement.chars().next_back().is_some_and(is_word);
    match (lead, trail) {
        (false, false) => replacement,
        (l, t) => format!(
            "{}{replacement}{}",
            if l { " " } else { "" },
            if t { " " } else { "" }
        ),
    }
}

/// One line, whitespace collapsed, at most 60 characters.
pub(super) fn snippet(s: &str) -> String {
    const MAX: usize = 60;
    let one_line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= MAX {
        one_line
    } else {
        let mut cut: String = one_line.chars().take(MAX - 1).collect();
        cut.push('…');
        cut
    }
}
