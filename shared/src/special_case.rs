//! Special-casing signals: lines a patch or an implementation adds that compare against, branch
//! on, key a dict by or return a literal the tests or the spec's examples show. A signal for a
//! person (and for the harness's own checks over unseen inputs), not a verdict: honest code
//! may share a constant with its tests. Pure, on text: literals are read with a small
//! Python-like tokenizer (numbers, quoted strings), lines classified by their tokens.

use crate::paths::normalize_relative;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeSet;

/// Numbers too common to point at anything.
const COMMON_NUMBERS: &[&str] = &["-1", "0", "1", "2"];

/// Signals reported at most (the rest are counted by the caller, if at all).
pub const MAX_SIGNALS: usize = 50;

/// One line a patch adds, numbered in the new file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddedLine {
    pub path: String,
    pub line: usize,
    pub text: String,
}

/// One suspected special case: the added line, the literal, and why the line is suspect
/// (`comparison`, `branch`, `dict_key`, `return_after_branch`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SuspectedSpecialCase {
    pub path: String,
    pub line: usize,
    pub literal: String,
    pub why: String,
}

/// The lines a unified diff adds, per file (the `+++` side), numbered by the hunk headers.
/// Hunk bodies are read by their line counts, so an added line starting `++` is never taken
/// for a header.
pub fn added_lines(diff: &str) -> Vec<AddedLine> {
    let mut out = Vec::new();
    let mut path: Option<String> = None;
    let (mut old_left, mut new_left, mut new_line) = (0usize, 0usize, 0usize);
    for raw in diff.lines() {
        if old_left > 0 || new_left > 0 {
            match raw.chars().next() {
                Some('+') => {
                    if let Some(p) = &path {
                        out.push(AddedLine {
                            path: p.clone(),
                            line: new_line,
                            text: raw[1..].to_string(),
                        });
                    }
                    new_line += 1;
                    new_left = new_left.saturating_sub(1);
                }
                Some('-') => old_left = old_left.saturating_sub(1),
                Some('\\') => {}
                _ => {
                    new_line += 1;
                    old_left = old_left.saturating_sub(1);
                    new_left = new_left.saturating_sub(1);
                }
            }
            continue;
        }
        if let Some(rest) = raw.strip_prefix("+++ ") {
            let p = rest.trim_end().trim_matches('"');
            path = match p.strip_prefix("b/") {
                Some(p) => normalize_relative(p).ok(),
                None if p == "/dev/null" => None,
                None => normalize_relative(p).ok(),
            };
        } else if let Some((old, new)) = hunk_counts(raw) {
            (old_left, new_left) = (old.1, new.1);
            new_line = new.0;
        }
    }
    out
}

/// `@@ -a,b +c,d @@` → ((a, b), (c, d)); a missing count is 1.
fn hunk_counts(line: &str) -> Option<((usize, usize), (usize, usize))> {
    let body = line.strip_prefix("@@ -")?;
    let (ranges, _) = body.split_once(" @@")?;
    let (old, new) = ranges.split_once(" +")?;
    let range = |r: &str| -> Option<(usize, usize)> {
        match r.split_once(',') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => Some((r.parse().ok()?, 1)),
        }
    };
    Some((range(old)?, range(new)?))
}

/// A literal as this module writes it: numbers in decimal (`12`, `-10`, `2.5`), strings
/// quoted (`"abc"`).
#[derive(Clone, Debug, PartialEq)]
enum Token {
    Literal(String),
    /// An identifier, keyword or operator character run (for classifying a line).
    Word(String),
    Punct(char),
}

fn number(text: &str, negative: bool) -> Option<String> {
    let t = text.replace('_', "").to_ascii_lowercase();
    let value = if let Some(h) = t.strip_prefix("0x") {
        i128::from_str_radix(h, 16).ok()?.to_string()
    } else if let Some(b) = t.strip_prefix("0b") {
        i128::from_str_radix(b, 2).ok()?.to_string()
    } else if let Some(o) = t.strip_prefix("0o") {
        i128::from_str_radix(o, 8).ok()?.to_string()
    } else if let Ok(i) = t.parse::<i128>() {
        i.to_string()
    } else {
        let f: f64 = t.trim_end_matches('j').parse().ok()?;
        if !f.is_finite() {
            return None;
        }
        format!("{f}")
    };
    Some(if negative && value != "0" {
        format!("-{value}")
    } else {
        value
    })
}

/// Python-like tokens of one text (strings may span lines: triple quotes).
fn tokens(text: &str) -> Vec<Token> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '#' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '"' || ch == '\'' {
            let triple = c.get(i + 1) == Some(&ch) && c.get(i + 2) == Some(&ch);
            let quote = if triple { 3 } else { 1 };
            i += quote;
            let mut s = String::new();
            while i < c.len() {
                if c[i] == '\\' && i + 1 < c.len() {
                    s.push(c[i + 1]);
                    i += 2;
                } else if c[i] == ch
                    && (!triple || (c.get(i + 1) == Some(&ch) && c.get(i + 2) == Some(&ch)))
                {
                    i += quote;
                    break;
                } else if c[i] == '\n' && !triple {
                    break;
                } else {
                    s.push(c[i]);
                    i += 1;
                }
            }
            out.push(Token::Literal(format!("{s:?}")));
        } else if ch.is_ascii_digit()
            || (ch == '.' && c.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            let start = i;
            while i < c.len()
                && (c[i].is_ascii_alphanumeric()
                    || c[i] == '_'
                    || c[i] == '.'
                    || ((c[i] == '+' || c[i] == '-')
                        && matches!(c[i - 1], 'e' | 'E')
                        && !c[start..i].iter().any(|x| matches!(x, 'x' | 'X'))))
            {
                i += 1;
            }
            let negative = matches!(out.last(), Some(Token::Punct('-')))
                && !matches!(
                    out.get(out.len().wrapping_sub(2)),
                    Some(Token::Literal(_))
                        | Some(Token::Word(_))
                        | Some(Token::Punct(')' | ']' | '}'))
                );
            let lexeme: String = c[start..i].iter().collect();
            if let Some(n) = number(&lexeme, negative) {
                if negative {
                    out.pop();
                }
                out.push(Token::Literal(n));
            }
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            // String prefixes (`f'`, `rb"`) belong to the string that follows.
            let prefix = word.len() <= 2
                && word.chars().all(|x| "rbfuRBFU".contains(x))
                && matches!(c.get(i), Some('"' | '\''));
            if !prefix {
                out.push(Token::Word(word));
            }
        } else {
            if !ch.is_whitespace() {
                out.push(Token::Punct(ch));
            }
            i += 1;
        }
    }
    out
}

/// Does a literal say something (not a common number, not a one-character string)?
fn telling(literal: &str) -> bool {
    match literal.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        Some(inner) => inner.chars().count() >= 2,
        None => !COMMON_NUMBERS.contains(&literal),
    }
}

/// The telling literals of a text (test files, acceptance commands' inline code).
pub fn literals(text: &str) -> BTreeSet<String> {
    tokens(text)
        .into_iter()
        .filter_map(|t| match t {
            Token::Literal(l) if telling(&l) => Some(l),
            _ => None,
        })
        .collect()
}

/// The telling literals of examples given as JSON: its numbers, its strings, and the literals
/// inside strings written as code (`"multiply(3, 4) == 12"`).
pub fn literals_of_json(value: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::Number(n) => {
                let lexeme = n.to_string();
                let (neg, digits) = match lexeme.strip_prefix('-') {
                    Some(d) => (true, d),
                    None => (false, lexeme.as_str()),
                };
                if let Some(l) = number(digits, neg).filter(|l| telling(l)) {
                    out.insert(l);
                }
            }
            Value::String(s) => {
                let quoted = format!("{s:?}");
                if telling(&quoted) {
                    out.insert(quoted);
                }
                out.extend(literals(s));
            }
            Value::Array(a) => stack.extend(a),
            Value::Object(o) => stack.extend(o.values()),
            _ => {}
        }
    }
    out
}

/// How a line uses its literals: `branch` (`if`/`elif`/`case`/`while`), `comparison`, or
/// `dict_key` for the literal before a `:` in a dict; `None` for none of these.
fn classify(toks: &[Token], at: usize) -> Option<&'static str> {
    let first = match toks.first() {
        Some(Token::Word(w)) => w.as_str(),
        _ => "",
    };
    if matches!(first, "if" | "elif" | "case" | "while") {
        return Some("branch");
    }
    let compares = toks.windows(2).any(|w| {
        matches!(
            (&w[0], &w[1]),
            (Token::Punct('=' | '!' | '<' | '>'), Token::Punct('=')) | (Token::Punct('<' | '>'), _)
        )
    }) || toks
        .iter()
        .any(|t| matches!(t, Token::Word(w) if w == "in" || w == "is"));
    if compares && !matches!(first, "for" | "def") {
        return Some("comparison");
    }
    let before_colon = matches!(toks.get(at + 1), Some(Token::Punct(':')));
    let in_dict = at == 0
        || toks[..at]
            .iter()
            .any(|t| matches!(t, Token::Punct('{' | ',')));
    (before_colon && in_dict && first != "lambda").then_some("dict_key")
}

/// The signals the last output that reported them holds (`[]`: none), outputs oldest first:
/// a run's outcomes, where a later check (after a fix) replaces an earlier one.
pub fn last_reported<'a>(outputs: impl DoubleEndedIterator<Item = &'a Value>) -> Value {
    outputs
        .rev()
        .find_map(|o| o.get("suspected_special_case").filter(|v| v.is_array()))
        .cloned()
        .unwrap_or_else(|| Value::Array(Vec::new()))
}

/// Added lines that compare against, branch on, key a dict by or return (right after such a
/// branch) a literal in `known`; at most [`MAX_SIGNALS`], in file and line order.
pub fn suspected(added: &[AddedLine], known: &BTreeSet<String>) -> Vec<SuspectedSpecialCase> {
    let mut out: Vec<SuspectedSpecialCase> = Vec::new();
    let mut last_branch: Option<(&str, usize)> = None;
    for a in added {
        let toks = tokens(&a.text);
        let after_branch = last_branch == Some((a.path.as_str(), a.line.saturating_sub(1)));
        let returns = matches!(toks.first(), Some(Token::Word(w)) if w == "return");
        let mut branch = false;
        for (at, t) in toks.iter().enumerate() {
            let Token::Literal(l) = t else { continue };
            if !known.contains(l) {
                continue;
            }
            let why =
                classify(&toks, at).or((returns && after_branch).then_some("return_after_branch"));
            if let Some(why) = why {
                branch |= why == "branch";
                let s = SuspectedSpecialCase {
                    path: a.path.clone(),
                    line: a.line,
                    literal: l.clone(),
                    why: why.to_string(),
                };
                if !out.contains(&s) && out.len() < MAX_SIGNALS {
                    out.push(s);
                }
            }
        }
        last_branch = branch.then_some((a.path.as_str(), a.line));
    }
    out
}

/// What the acceptance commands run: test files named, folders named, whether a runner was
/// started on the whole repository, and code given inline (`python -c "..."`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TestTargets {
    pub files: BTreeSet<String>,
    pub dirs: BTreeSet<String>,
    pub whole_repo: bool,
    pub inline: Vec<String>,
}

/// A test file by its name (`test_*.py`, `*_test.py`, `conftest.py`).
pub fn is_test_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".py")
        && (name.starts_with("test_") || name.ends_with("_test.py") || name == "conftest.py")
}

/// The targets of the acceptance commands (argv split with shell rules; unsplittable commands
/// are skipped).
pub fn test_targets(commands: &[String]) -> TestTargets {
    let mut t = TestTargets::default();
    for command in commands {
        let Ok(argv) = crate::factory::split_command(command) else {
            continue;
        };
        let mut named = false;
        let mut args = argv.iter().skip(1).peekable();
        while let Some(arg) = args.next() {
            if arg == "-c" {
                if let Some(code) = args.next() {
                    t.inline.push(code.clone());
                    named = true;
                }
                continue;
            }
            if arg.starts_with('-') {
                continue;
            }
            let path = arg.split("::").next().unwrap_or(arg);
            let Ok(rel) = normalize_relative(path) else {
                continue;
            };
            if rel.ends_with(".py") {
                t.files.insert(rel);
                named = true;
            } else if arg.contains('/') || rel == "tests" || rel == "test" {
                t.dirs.insert(rel.trim_end_matches('/').to_string());
                named = true;
            }
        }
        let runner = argv.iter().any(|a| a.contains("pytest") || a == "unittest");
        t.whole_repo |= runner && !named;
    }
    t
}

#[cfg(test)]
mod tests;
