//! Deterministic truncation of text for prompts and summaries.

/// Keeps the tail of `text`: at most `max_lines` lines and `max_chars` characters, whichever is
/// shorter (the seed's "last 200 lines or last 8000 chars").
pub fn tail(text: &str, max_lines: usize, max_chars: usize) -> String {
    let mut start = 0;
    let mut newlines = 0;
    for (i, ch) in text.char_indices().rev() {
        if ch == '\n' && i + 1 < text.len() {
            newlines += 1;
            if newlines >= max_lines {
                start = i + 1;
                break;
            }
        }
    }
    let by_lines = &text[start..];
    let count = by_lines.chars().count();
    if count <= max_chars {
        return by_lines.to_string();
    }
    by_lines.chars().skip(count - max_chars).collect()
}

/// Keeps the head of `text` up to `max_chars` characters, marking the cut.
pub fn head(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max_chars).collect();
    out.push_str("\n[truncated]");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_last_lines() {
        let text = (1..=10)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(tail(&text, 3, 1000), "8\n9\n10");
    }

    #[test]
    fn tail_keeps_last_chars() {
        assert_eq!(tail("abcdefgh", 100, 3), "fgh");
    }

    #[test]
    fn head_marks_the_cut() {
        assert_eq!(head("abcdef", 3), "abc\n[truncated]");
        assert_eq!(head("abc", 3), "abc");
    }
}
