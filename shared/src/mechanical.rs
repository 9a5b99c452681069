//! Seed 001's Rebaser restriction, "only mechanical changes", as a rule the harness checks on
//! the diffs git computed: an adaptation is mechanical when every edit it makes is an edit the
//! sibling's own change made.
//!
//! An edit is found per hunk at the level of tokens (identifiers and numbers, string pieces,
//! single punctuation characters; whitespace ignored): the hunk's removed lines and its added
//! lines are aligned by their longest common token subsequence, and each maximal run of tokens
//! that does not align is one edit, `removed tokens → added tokens`. The sibling renaming `foo`
//! to `bar` makes the edit `foo → bar`; adding a parameter makes `∅ → , b`. An adaptation that
//! replaces `foo(1)` by `bar(1)` is mechanical; one that writes `bar(1) + 1`, deletes an assert,
//! reorders statements or adds any logic of its own makes an edit the sibling never made, and
//! is not. Whitespace-only changes are no edit at all.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Tokens of one hunk side beyond this are not aligned: the hunk is refused as too large.
pub const MAX_HUNK_TOKENS: usize = 4_000;

/// One hunk of a diff: the lines it removed and added (without their `-`/`+`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Hunk {
    pub file: String,
    /// The first line of the hunk on the new side (1-based), for reports.
    pub line: u32,
    pub removed: Vec<String>,
    pub added: Vec<String>,
    /// The file is binary (no lines): never mechanical.
    #[serde(default)]
    pub binary: bool,
}

/// One edit: a run of removed tokens replaced by a run of added tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Edit {
    pub removed: Vec<String>,
    pub added: Vec<String>,
}

/// An edit of the adaptation the sibling never made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub file: String,
    pub line: u32,
    pub edit: Option<Edit>,
    pub why: String,
}

/// The verdict on an adaptation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub mechanical: bool,
    /// Edits the sibling made (what the adaptation may repeat).
    pub allowed: Vec<Edit>,
    pub violations: Vec<Violation>,
}

/// The tokens of a line: identifiers and numbers (`[A-Za-z0-9_]+`), runs of other non-space
/// characters split one character each; whitespace separates and is dropped.
pub fn tokens(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for c in line.chars() {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

fn side_tokens(lines: &[String]) -> Vec<String> {
    lines.iter().flat_map(|l| tokens(l)).collect()
}

/// The edits that turn `a` into `b`: the runs that do not lie on a longest common
/// subsequence. None when either side is longer than [`MAX_HUNK_TOKENS`].
pub fn edits(a: &[String], b: &[String]) -> Option<Vec<Edit>> {
    if a.len() > MAX_HUNK_TOKENS || b.len() > MAX_HUNK_TOKENS {
        return None;
    }
    let (n, m) = (a.len(), b.len());
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0u16; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    let mut current = Edit::default();
    let flush = |e: &mut Edit, out: &mut Vec<Edit>| {
        if !e.removed.is_empty() || !e.added.is_empty() {
            out.push(std::mem::take(e));
        }
    };
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            flush(&mut current, &mut out);
            i += 1;
            j += 1;
        } else if j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j]) {
            current.added.push(b[j].clone());
            j += 1;
        } else {
            current.removed.push(a[i].clone());
            i += 1;
        }
    }
    flush(&mut current, &mut out);
    Some(out)
}

/// Judges `adaptation` against the `sibling`'s change: mechanical when every edit of every
/// adaptation hunk is among the sibling's edits.
pub fn judge(sibling: &[Hunk], adaptation: &[Hunk]) -> Verdict {
    let mut allowed = BTreeSet::new();
    for h in sibling.iter().filter(|h| !h.binary) {
        if let Some(es) = edits(&side_tokens(&h.removed), &side_tokens(&h.added)) {
            allowed.extend(es);
        }
    }
    let mut violations = Vec::new();
    for h in adaptation {
        let at = |edit: Option<Edit>, why: &str| Violation {
            file: h.file.clone(),
            line: h.line,
            edit,
            why: why.to_string(),
        };
        if h.binary {
            violations.push(at(None, "a binary file changed"));
            continue;
        }
        match edits(&side_tokens(&h.removed), &side_tokens(&h.added)) {
            None => violations.push(at(None, "the hunk is too large to align")),
            Some(es) => violations.extend(
                es.into_iter()
                    .filter(|e| !allowed.contains(e))
                    .map(|e| at(Some(e), "an edit the sibling's change did not make")),
            ),
        }
    }
    Verdict {
        mechanical: violations.is_empty(),
        allowed: allowed.into_iter().collect(),
        violations,
    }
}

#[cfg(test)]
mod tests;
