//! The paths a unified diff names, read without git: `diff --git` headers, `---` / `+++` lines
//! and `rename` / `copy` lines. Hunks are skipped by the line counts of their `@@` headers, so a
//! removed line that starts with `-- ` is never taken for a header. Used where the submission is
//! checked (no git there): to derive a SWE-bench item's write scope from its gold patch and to
//! keep the test patch's files out of it. The harness itself applies patches with libgit2 and
//! checks scopes on libgit2's parse, so this reading never decides a verdict.

use crate::paths::normalize_relative;
use std::collections::BTreeSet;
use thiserror::Error;

/// One file of a patch: the path before and after (`None` for `/dev/null`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PatchFile {
    pub old_path: Option<String>,
    pub new_path: Option<String>,
}

impl PatchFile {
    /// Both sides, once each.
    pub fn paths(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for p in [&self.old_path, &self.new_path].into_iter().flatten() {
            if !out.contains(&p.as_str()) {
                out.push(p);
            }
        }
        out
    }

    /// The file is created by the patch (it has no old side).
    pub fn is_added(&self) -> bool {
        self.old_path.is_none() && self.new_path.is_some()
    }
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PatchError {
    #[error("the patch names no file (no `diff --git` or `---`/`+++` headers)")]
    NoFiles,
    #[error("patch line {line}: {message}")]
    Bad { line: usize, message: String },
}

fn bad(line: usize, message: impl Into<String>) -> PatchError {
    PatchError::Bad {
        line,
        message: message.into(),
    }
}

/// Every file the patch changes, in order. Refused, naming the line: a path that is quoted
/// wrongly, has no `a/` / `b/` prefix, or is not a plain relative path (absolute, `..`, `./`,
/// a `.git` component); a malformed or cut-short hunk; a `diff --git` header whose paths cannot
/// be told apart. A patch naming no file is refused too.
pub fn patch_files(diff: &str) -> Result<Vec<PatchFile>, PatchError> {
    let lines: Vec<&str> = diff.split('\n').collect();
    let mut files: Vec<(usize, PatchFile)> = Vec::new();
    let mut open: Option<(usize, PatchFile)> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].strip_suffix('\r').unwrap_or(lines[i]);
        let number = i + 1;
        if let Some(rest) = line.strip_prefix("diff --git ") {
            files.extend(open.take());
            let (old_path, new_path) = git_header(rest, number)?;
            open = Some((number, PatchFile { old_path, new_path }));
        } else if let (Some(old), Some(new)) = (
            line.strip_prefix("--- "),
            lines.get(i + 1).and_then(|l| l.strip_prefix("+++ ")),
        ) {
            let new = new.strip_suffix('\r').unwrap_or(new);
            let file = open.get_or_insert_with(|| (number, PatchFile::default()));
            file.1.old_path = side(old, number)?;
            file.1.new_path = side(new, number + 1)?;
            i += 2;
            continue;
        } else if let Some(at) = line.strip_prefix("@@ ") {
            i = skip_hunk(&lines, i, at)?;
            continue;
        } else if let Some(file) = open.as_mut() {
            let plain = |p: &str| unquote(p, number).map(Some);
            if let Some(p) = line
                .strip_prefix("rename from ")
                .or(line.strip_prefix("copy from "))
            {
                file.1.old_path = plain(p)?;
            } else if let Some(p) = line
                .strip_prefix("rename to ")
                .or(line.strip_prefix("copy to "))
            {
                file.1.new_path = plain(p)?;
            }
        }
        i += 1;
    }
    files.extend(open);
    if files.is_empty() {
        return Err(PatchError::NoFiles);
    }
    files
        .into_iter()
        .map(|(line, f)| {
            if f.old_path.is_none() && f.new_path.is_none() {
                return Err(bad(line, "the file header names no path that can be read"));
            }
            for p in f.paths() {
                plain_path(p, line)?;
            }
            Ok(f)
        })
        .collect()
}

/// Every path the patch touches (both sides of renames), sorted.
pub fn patch_paths(diff: &str) -> Result<BTreeSet<String>, PatchError> {
    Ok(patch_files(diff)?
        .iter()
        .flat_map(|f| f.paths().into_iter().map(str::to_string))
        .collect())
}

/// A path as git writes it must already be plain: relative, normalised, no `.git` component.
fn plain_path(path: &str, line: usize) -> Result<(), PatchError> {
    let refuse = || bad(line, format!("`{path}` is not a plain relative path"));
    match normalize_relative(path) {
        Ok(n) if n == path => {}
        _ => return Err(refuse()),
    }
    if path
        .split('/')
        .any(|c| c.eq_ignore_ascii_case(".git") || c.is_empty())
        || path.chars().any(char::is_control)
    {
        return Err(refuse());
    }
    Ok(())
}

/// `a/X b/Y` of a `diff --git` line: quoted tokens, or two halves told apart by being equal or
/// by a single ` b/`. Paths given later by `---`/`+++` or `rename` lines win.
fn git_header(rest: &str, line: usize) -> Result<(Option<String>, Option<String>), PatchError> {
    if rest.starts_with('"') || rest.ends_with('"') {
        let (first, second) = split_quoted(rest, line)?;
        return Ok((
            Some(strip_prefix(&first, line)?),
            Some(strip_prefix(&second, line)?),
        ));
    }
    let halves = if rest.len() % 2 == 1 && rest.as_bytes().get(rest.len() / 2) == Some(&b' ') {
        let (a, b) = (&rest[..rest.len() / 2], &rest[rest.len() / 2 + 1..]);
        (a.get(2..) == b.get(2..)).then_some((a, b))
    } else {
        None
    };
    let halves = halves.or_else(|| {
        let mut found = rest.match_indices(" b/");
        match (found.next(), found.next()) {
            (Some((at, _)), None) => Some((&rest[..at], &rest[at + 1..])),
            _ => None,
        }
    });
    match halves {
        Some((a, b)) => Ok((Some(strip_prefix(a, line)?), Some(strip_prefix(b, line)?))),
        None => Ok((None, None)),
    }
}

/// Two tokens, each quoted or bare (a bare one ends at the first space).
fn split_quoted(rest: &str, line: usize) -> Result<(String, String), PatchError> {
    let mut tokens = Vec::new();
    let mut s = rest.trim_start();
    while !s.is_empty() {
        if s.starts_with('"') {
            let end = closing_quote(s).ok_or_else(|| bad(line, "an unterminated quoted path"))?;
            tokens.push(unquote(&s[..=end], line)?);
            s = s[end + 1..].trim_start();
        } else {
            let end = s.find(' ').unwrap_or(s.len());
            tokens.push(s[..end].to_string());
            s = s[end..].trim_start();
        }
    }
    match <[String; 2]>::try_from(tokens) {
        Ok([a, b]) => Ok((a, b)),
        Err(_) => Err(bad(line, "a `diff --git` header with other than two paths")),
    }
}

/// The index of the quote closing the quoted string that starts `s`.
fn closing_quote(s: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i),
            _ => {}
        }
    }
    None
}

/// A `---` / `+++` side: `/dev/null` is no file; otherwise the path without its prefix, cut at
/// a tab (git adds one after paths with spaces; other tools a date).
fn side(raw: &str, line: usize) -> Result<Option<String>, PatchError> {
    let raw = if raw.starts_with('"') {
        let end = closing_quote(raw).ok_or_else(|| bad(line, "an unterminated quoted path"))?;
        unquote(&raw[..=end], line)?
    } else {
        raw.split('\t').next().unwrap_or_default().to_string()
    };
    if raw == "/dev/null" {
        return Ok(None);
    }
    strip_prefix(&raw, line).map(Some)
}

/// `a/x/y.py` → `x/y.py` (git's one stripped component, `-p1`).
fn strip_prefix(path: &str, line: usize) -> Result<String, PatchError> {
    match path.split_once('/') {
        Some((_, rest)) if !rest.is_empty() => Ok(rest.to_string()),
        _ => Err(bad(
            line,
            format!("`{path}` has no `a/` or `b/` prefix (write the patch as `git diff` does)"),
        )),
    }
}

/// A path as git quotes it (C-style, octal bytes for non-ASCII); a bare one is returned as is.
fn unquote(raw: &str, line: usize) -> Result<String, PatchError> {
    let Some(inner) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) else {
        return Ok(raw.to_string());
    };
    let mut bytes = Vec::with_capacity(inner.len());
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0u8; 4];
            bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        let escaped = chars
            .next()
            .ok_or_else(|| bad(line, "a quoted path ends in `\\`"))?;
        let byte = match escaped {
            '\\' => b'\\',
            '"' => b'"',
            'a' => 7,
            'b' => 8,
            'f' => 12,
            'n' => b'\n',
            'r' => b'\r',
            't' => b'\t',
            'v' => 11,
            '0'..='3' => {
                let mut value = escaped as u32 - '0' as u32;
                for _ in 0..2 {
                    match chars.next() {
                        Some(d @ '0'..='7') => value = value * 8 + (d as u32 - '0' as u32),
                        _ => return Err(bad(line, "a bad octal escape in a quoted path")),
                    }
                }
                value as u8
            }
            other => {
                return Err(bad(
                    line,
                    format!("an unknown escape `\\{other}` in a path"),
                ))
            }
        };
        bytes.push(byte);
    }
    String::from_utf8(bytes).map_err(|_| bad(line, "a quoted path that is not UTF-8"))
}

/// Skips the hunk whose header (after `@@ `) is at `lines[at]`; returns the index after it.
fn skip_hunk(lines: &[&str], at: usize, header: &str) -> Result<usize, PatchError> {
    let number = at + 1;
    let malformed = || bad(number, "a malformed hunk header");
    let ranges = header.split(" @@").next().ok_or_else(malformed)?;
    let mut parts = ranges.split(' ');
    let count = |part: Option<&str>, sign: char| -> Result<u64, PatchError> {
        let range = part
            .and_then(|p| p.strip_prefix(sign))
            .ok_or_else(malformed)?;
        let mut nums = range.splitn(2, ',');
        let start = nums.next().unwrap_or_default();
        start.parse::<u64>().map_err(|_| malformed())?;
        match nums.next() {
            Some(n) => n.parse::<u64>().map_err(|_| malformed()),
            None => Ok(1),
        }
    };
    let (mut old, mut new) = (count(parts.next(), '-')?, count(parts.next(), '+')?);
    let mut i = at + 1;
    while old > 0 || new > 0 {
        let Some(raw) = lines.get(i) else {
            return Err(bad(number, "the hunk is cut short"));
        };
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let (takes_old, takes_new) = match line.as_bytes().first() {
            Some(b' ') | None => (true, true),
            Some(b'-') => (true, false),
            Some(b'+') => (false, true),
            Some(b'\\') => (false, false),
            Some(_) => {
                return Err(bad(
                    i + 1,
                    "a line in a hunk that is not ` `, `-`, `+` or `\\`",
                ))
            }
        };
        if (takes_old && old == 0) || (takes_new && new == 0) {
            return Err(bad(number, "the hunk is longer than its header says"));
        }
        old -= u64::from(takes_old);
        new -= u64::from(takes_new);
        i += 1;
    }
    // A `\ No newline at end of file` right after the last line belongs to the hunk.
    while lines.get(i).is_some_and(|l| l.starts_with('\\')) {
        i += 1;
    }
    // What follows a hunk is another hunk, a header or the end, never more hunk lines.
    let next = lines.get(i).copied().unwrap_or_default();
    let more = next.starts_with('+')
        || next.starts_with(' ')
        || (next.starts_with('-') && !next.starts_with("--- "));
    if more {
        return Err(bad(number, "the hunk is longer than its header says"));
    }
    Ok(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(diff: &str) -> Vec<String> {
        patch_paths(diff).unwrap().into_iter().collect()
    }

    #[test]
    fn reads_git_diffs_new_files_deletions_and_renames() {
        let diff = "diff --git a/src/x.py b/src/x.py\nindex 1..2 100644\n--- a/src/x.py\n+++ b/src/x.py\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n\
diff --git a/t/new.py b/t/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/t/new.py\n@@ -0,0 +1 @@\n+x\n\
diff --git a/gone.py b/gone.py\ndeleted file mode 100644\n--- a/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n\
diff --git a/old name.py b/new name.py\nsimilarity index 100%\nrename from old name.py\nrename to new name.py\n";
        let files = patch_files(diff).unwrap();
        assert_eq!(files.len(), 4);
        assert!(files[1].is_added());
        assert_eq!(files[2].new_path, None);
        assert_eq!(files[3].old_path.as_deref(), Some("old name.py"));
        assert_eq!(
            paths(diff),
            [
                "gone.py",
                "new name.py",
                "old name.py",
                "src/x.py",
                "t/new.py"
            ]
        );
    }

    #[test]
    fn a_removed_line_that_looks_like_a_header_stays_in_its_hunk() {
        let diff =
            "--- a/q.sql\n+++ b/q.sql\n@@ -1,3 +1 @@\n keep\n--- a/etc/passwd\n-+++ b/etc/passwd\n";
        assert_eq!(paths(diff), ["q.sql"]);
        // Counted lines: the header says 3 old lines, the hunk has 3.
        let short = "--- a/q.sql\n+++ b/q.sql\n@@ -1,3 +1,3 @@\n keep\n";
        assert!(matches!(
            patch_files(short),
            Err(PatchError::Bad { line: 3, .. })
        ));
    }

    #[test]
    fn quoted_paths_and_mode_only_changes_are_read() {
        let diff = "diff --git \"a/caf\\303\\251.py\" \"b/caf\\303\\251.py\"\nold mode 100644\nnew mode 100755\n";
        assert_eq!(paths(diff), ["café.py"]);
        let spaced = "diff --git a/a b/c.py b/a b/c.py\nold mode 100644\nnew mode 100755\n";
        assert_eq!(paths(spaced), ["a b/c.py"]);
        let tabbed = "--- a/with space.py\t\n+++ b/with space.py\t\n@@ -1 +1 @@\n-a\n+b\n";
        assert_eq!(paths(tabbed), ["with space.py"]);
    }

    #[test]
    fn hostile_paths_and_headers_are_refused_naming_the_line() {
        for (diff, line) in [
            ("--- a/../etc/passwd\n+++ b/../etc/passwd\n", 1),
            ("--- a//abs\n+++ b//abs\n", 1),
            ("diff --git a/.git/config b/.git/config\n", 1),
            ("x\n--- noprefix\n+++ noprefix\n", 2),
            ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n+c\n", 3),
            ("--- a/x\n+++ b/x\n@@ nonsense @@\n", 3),
            ("diff --git \"a/x b/x\n", 1),
        ] {
            match patch_files(diff) {
                Err(PatchError::Bad { line: l, .. }) => assert_eq!(l, line, "{diff:?}"),
                other => panic!("{diff:?}: {other:?}"),
            }
        }
        assert_eq!(patch_files("just text\n"), Err(PatchError::NoFiles));
        assert_eq!(patch_files(""), Err(PatchError::NoFiles));
    }

    fn arb_diff() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let pieces = prop::sample::select(vec![
            "diff --git a/x b/x\n",
            "--- a/x\n",
            "+++ b/x\n",
            "--- /dev/null\n",
            "@@ -1,2 +1 @@\n",
            "@@ -0,0 +1 @@\n",
            " ctx\n",
            "-old\n",
            "+new\n",
            "\\ No newline at end of file\n",
            "rename from \"a\\\\\n",
            "diff --git \"a/\\377\" b/y\n",
            "\n",
        ]);
        prop_oneof![
            4 => prop::collection::vec(pieces, 0..24).prop_map(|p| p.concat()),
            1 => crate::schema::tests::arb_text(),
        ]
    }

    proptest::proptest! {
        #![proptest_config(crate::schema::tests::cases(512))]

        /// Patches come from datasets: any text is read or refused, never a panic.
        #[test]
        fn any_text_is_read_or_refused_without_panicking(diff in arb_diff()) {
            if let Ok(files) = patch_files(&diff) {
                for p in files.iter().flat_map(|f| f.paths()) {
                    proptest::prop_assert!(!p.starts_with('/') && !p.split('/').any(|c| c == ".."));
                }
            }
        }
    }
}
