//! Touched files computed from unified-diff headers; the LLM's own file list is never trusted.

use crate::paths::{normalize_relative, PathError};
use std::collections::BTreeSet;
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DiffError {
    #[error("the diff has no file headers")]
    NoHeaders,
    #[error("bad path in diff header: {0}")]
    BadPath(#[from] PathError),
}

fn strip_prefix(path: &str) -> Option<&str> {
    let path = path.split('\t').next().unwrap_or(path).trim();
    if path == "/dev/null" {
        return None;
    }
    Some(
        path.strip_prefix("a/")
            .or_else(|| path.strip_prefix("b/"))
            .unwrap_or(path),
    )
}

/// Paths touched by a unified diff, from `diff --git a/X b/Y` lines (both sides), with
/// `+++ b/X` and `--- a/X` lines as fallback. Sorted and normalised.
pub fn touched_files(diff: &str) -> Result<Vec<String>, DiffError> {
    let mut found = BTreeSet::new();
    let mut git_headers = false;
    for line in diff.lines() {
        if let Some(rest) = line.strip_prefix("diff --git ") {
            git_headers = true;
            // `a/X b/Y`: split at the last " b/" so paths with spaces survive.
            if let Some(idx) = rest.rfind(" b/") {
                let (a, b) = (&rest[..idx], &rest[idx + 1..]);
                for side in [a, b] {
                    if let Some(p) = strip_prefix(side) {
                        found.insert(normalize_relative(p)?);
                    }
                }
            }
        }
    }
    if !git_headers {
        for line in diff.lines() {
            let side = line
                .strip_prefix("+++ ")
                .or_else(|| line.strip_prefix("--- "));
            if let Some(p) = side.and_then(strip_prefix) {
                found.insert(normalize_relative(p)?);
            }
        }
    }
    if found.is_empty() {
        return Err(DiffError::NoHeaders);
    }
    Ok(found.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_git_headers() {
        let d = "diff --git a/src/x.py b/src/x.py\n--- a/src/x.py\n+++ b/src/x.py\n@@ -1 +1 @@\n-a\n+b\n";
        assert_eq!(touched_files(d).unwrap(), vec!["src/x.py"]);
    }

    #[test]
    fn renames_touch_both_sides() {
        let d = "diff --git a/old.py b/new.py\nrename from old.py\nrename to new.py\n";
        assert_eq!(touched_files(d).unwrap(), vec!["new.py", "old.py"]);
    }

    #[test]
    fn falls_back_to_plus_minus_headers() {
        let d = "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-a\n+b\n--- /dev/null\n+++ b/new.py\n";
        assert_eq!(touched_files(d).unwrap(), vec!["a.py", "new.py"]);
    }

    #[test]
    fn refuses_escaping_paths_and_headerless_text() {
        assert!(matches!(
            touched_files("--- a/../etc/passwd\n+++ b/../etc/passwd\n"),
            Err(DiffError::BadPath(_))
        ));
        assert_eq!(touched_files("just text"), Err(DiffError::NoHeaders));
    }
}
