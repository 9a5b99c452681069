//! Write scopes: which paths a node's commit (or a factory patch) may change. Checked by the
//! harness on the changes git itself computed (libgit2's parsed deltas: both sides of a rename,
//! file modes), never on an agent's word or on diff header text. Pure: no I/O.

use crate::paths::normalize_relative;
use globset::{GlobSet, GlobSetBuilder};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Git file modes that matter here.
pub const MODE_SYMLINK: u32 = 0o120000;
pub const MODE_SUBMODULE: u32 = 0o160000;
pub const MODE_EXECUTABLE: u32 = 0o100755;
pub const MODE_FILE: u32 = 0o100644;

/// A node's write scope as the job carries it: globs already evaluated against the run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WriteScope {
    /// Paths (globs: `*` stays within a folder, `**` crosses folders) the node may add, change,
    /// delete or rename from or to. Empty: the node may change nothing.
    pub globs: Vec<String>,
    /// Symbolic links (mode 120000) may be added or changed.
    #[serde(default)]
    pub symlinks: bool,
    /// Submodules (gitlinks, mode 160000) may be added or changed.
    #[serde(default)]
    pub submodules: bool,
    /// A file's mode may change (e.g. the executable bit) or its type (file to link).
    #[serde(default)]
    pub mode_changes: bool,
}

/// How git saw one path change.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
    Renamed,
    Copied,
    TypeChange,
    Other,
}

/// One changed path, both sides. Paths are raw (as git stored them); modes are git's.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PathChange {
    pub kind: ChangeKind,
    pub old_path: Option<String>,
    pub new_path: Option<String>,
    pub old_mode: u32,
    pub new_mode: u32,
}

impl PathChange {
    /// The paths this change touches: both sides of a rename or copy.
    pub fn paths(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for p in [&self.old_path, &self.new_path].into_iter().flatten() {
            if !out.contains(&p.as_str()) {
                out.push(p);
            }
        }
        out
    }
}

/// Why a path is refused.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum ViolationReason {
    OutsideScope,
    Symlink,
    Submodule,
    ModeChange,
    BadPath,
    GitInternals,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    pub path: String,
    pub reason: ViolationReason,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = match self.reason {
            ViolationReason::OutsideScope => "outside the write scope",
            ViolationReason::Symlink => "a symlink",
            ViolationReason::Submodule => "a submodule",
            ViolationReason::ModeChange => "a mode change",
            ViolationReason::BadPath => "not a plain relative path",
            ViolationReason::GitInternals => "inside a .git folder",
        };
        write!(f, "`{}` ({why})", self.path)
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ScopeError {
    #[error("bad glob `{glob}` in the write scope: {reason}")]
    BadGlob { glob: String, reason: String },
}

/// A compiled scope.
pub struct ScopeMatcher {
    set: GlobSet,
    scope: WriteScope,
}

impl ScopeMatcher {
    pub fn new(scope: &WriteScope) -> Result<Self, ScopeError> {
        let mut b = GlobSetBuilder::new();
        for g in &scope.globs {
            let glob = globset::GlobBuilder::new(g.trim_start_matches("./"))
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| ScopeError::BadGlob {
                    glob: g.clone(),
                    reason: e.kind().to_string(),
                })?;
            b.add(glob);
        }
        let set = b.build().map_err(|e| ScopeError::BadGlob {
            glob: scope.globs.join(", "),
            reason: e.to_string(),
        })?;
        Ok(Self {
            set,
            scope: scope.clone(),
        })
    }

    /// Does the scope cover this (normalised, relative) path?
    pub fn covers(&self, path: &str) -> bool {
        self.set.is_match(path)
    }

    /// Every refused path of `changes`, sorted, each path and reason once.
    pub fn check(&self, changes: &[PathChange]) -> Vec<Violation> {
        let mut out = std::collections::BTreeSet::new();
        for c in changes {
            for raw in c.paths() {
                let path = match normalize_relative(raw) {
                    Ok(p) if p == raw.trim_start_matches("./") => p,
                    _ => {
                        out.insert(Violation {
                            path: raw.to_string(),
                            reason: ViolationReason::BadPath,
                        });
                        continue;
                    }
                };
                if path
                    .split('/')
                    .any(|part| part.eq_ignore_ascii_case(".git"))
                {
                    out.insert(Violation {
                        path: path.clone(),
                        reason: ViolationReason::GitInternals,
                    });
                }
                if !self.covers(&path) {
                    out.insert(Violation {
                        path: path.clone(),
                        reason: ViolationReason::OutsideScope,
                    });
                }
            }
            let shown = c
                .new_path
                .clone()
                .or_else(|| c.old_path.clone())
                .unwrap_or_default();
            let modes = [c.old_mode, c.new_mode];
            if !self.scope.symlinks && modes.contains(&MODE_SYMLINK) {
                out.insert(Violation {
                    path: shown.clone(),
                    reason: ViolationReason::Symlink,
                });
            }
            if !self.scope.submodules && modes.contains(&MODE_SUBMODULE) {
                out.insert(Violation {
                    path: shown.clone(),
                    reason: ViolationReason::Submodule,
                });
            }
            let both_sides = c.old_mode != 0 && c.new_mode != 0;
            let mode_changed = both_sides && c.old_mode != c.new_mode;
            if !self.scope.mode_changes && (mode_changed || c.kind == ChangeKind::TypeChange) {
                out.insert(Violation {
                    path: shown,
                    reason: ViolationReason::ModeChange,
                });
            }
        }
        out.into_iter().collect()
    }
}

/// Checks `changes` against `scope`: the refused paths, or an error for a bad glob.
pub fn check(scope: &WriteScope, changes: &[PathChange]) -> Result<Vec<Violation>, ScopeError> {
    Ok(ScopeMatcher::new(scope)?.check(changes))
}

/// One line for an error message: the first refused paths.
pub fn describe(violations: &[Violation]) -> String {
    let shown: Vec<String> = violations.iter().take(10).map(|v| v.to_string()).collect();
    let more = violations.len().saturating_sub(10);
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!("write scope violated: {}{tail}", shown.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(globs: &[&str]) -> WriteScope {
        WriteScope {
            globs: globs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn change(
        kind: ChangeKind,
        old: Option<&str>,
        new: Option<&str>,
        om: u32,
        nm: u32,
    ) -> PathChange {
        PathChange {
            kind,
            old_path: old.map(str::to_string),
            new_path: new.map(str::to_string),
            old_mode: om,
            new_mode: nm,
        }
    }

    fn modified(p: &str) -> PathChange {
        change(ChangeKind::Modified, Some(p), Some(p), MODE_FILE, MODE_FILE)
    }

    #[test]
    fn a_path_in_scope_passes_and_one_outside_is_named() {
        let s = scope(&["stack.py"]);
        assert!(check(&s, &[modified("stack.py")]).unwrap().is_empty());
        let v = check(&s, &[modified("stack.py"), modified("conftest.py")]).unwrap();
        assert_eq!(
            v,
            vec![Violation {
                path: "conftest.py".into(),
                reason: ViolationReason::OutsideScope
            }]
        );
    }

    #[test]
    fn star_stays_in_its_folder_and_double_star_crosses() {
        let s = scope(&["tests/*.py"]);
        assert!(check(&s, &[modified("tests/test_a.py")])
            .unwrap()
            .is_empty());
        assert!(!check(&s, &[modified("tests/sub/test_a.py")])
            .unwrap()
            .is_empty());
        let s = scope(&["tests/**"]);
        assert!(check(&s, &[modified("tests/sub/test_a.py")])
            .unwrap()
            .is_empty());
        assert!(!check(&s, &[modified("conftest.py")]).unwrap().is_empty());
    }

    #[test]
    fn both_sides_of_a_rename_must_be_in_scope() {
        let s = scope(&["stack.py"]);
        let rename = change(
            ChangeKind::Renamed,
            Some("tests/test_stack.py"),
            Some("stack.py"),
            MODE_FILE,
            MODE_FILE,
        );
        let v = check(&s, &[rename]).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].path, "tests/test_stack.py");
    }

    #[test]
    fn deletions_count() {
        let s = scope(&["stack.py"]);
        let del = change(
            ChangeKind::Deleted,
            Some("tests/test_stack.py"),
            None,
            MODE_FILE,
            0,
        );
        assert_eq!(check(&s, &[del]).unwrap().len(), 1);
    }

    #[test]
    fn symlinks_submodules_and_mode_changes_are_refused_unless_allowed() {
        let s = scope(&["**"]);
        let link = change(ChangeKind::Added, None, Some("x.py"), 0, MODE_SYMLINK);
        let sub = change(ChangeKind::Added, None, Some("vendor"), 0, MODE_SUBMODULE);
        let exec = change(
            ChangeKind::Modified,
            Some("run.sh"),
            Some("run.sh"),
            MODE_FILE,
            MODE_EXECUTABLE,
        );
        let typechange = change(
            ChangeKind::TypeChange,
            Some("a.py"),
            Some("a.py"),
            MODE_FILE,
            MODE_SYMLINK,
        );
        let v = check(
            &s,
            &[link.clone(), sub.clone(), exec.clone(), typechange.clone()],
        )
        .unwrap();
        let reasons: Vec<ViolationReason> = v.iter().map(|v| v.reason).collect();
        assert!(reasons.contains(&ViolationReason::Symlink));
        assert!(reasons.contains(&ViolationReason::Submodule));
        assert!(reasons.contains(&ViolationReason::ModeChange));
        let open = WriteScope {
            globs: vec!["**".into()],
            symlinks: true,
            submodules: true,
            mode_changes: true,
        };
        assert!(check(&open, &[link, sub, exec, typechange])
            .unwrap()
            .is_empty());
    }

    #[test]
    fn git_internals_and_odd_paths_are_refused_even_in_scope() {
        let s = scope(&["**"]);
        let v = check(&s, &[modified("sub/.git/hooks/pre-commit")]).unwrap();
        assert_eq!(v[0].reason, ViolationReason::GitInternals);
        for bad in ["../x.py", "/etc/passwd", "a/../../b", "a/./b"] {
            let v = check(&s, &[modified(bad)]).unwrap();
            assert!(
                v.iter().any(|v| v.reason == ViolationReason::BadPath),
                "{bad}: {v:?}"
            );
        }
    }

    #[test]
    fn an_empty_scope_refuses_every_change() {
        let s = scope(&[]);
        assert_eq!(check(&s, &[modified("a.py")]).unwrap().len(), 1);
        assert!(check(&s, &[]).unwrap().is_empty());
    }

    #[test]
    fn a_bad_glob_is_a_clear_error() {
        let e = check(&scope(&["a[.py"]), &[]).unwrap_err();
        assert!(e.to_string().contains("a[.py"), "{e}");
    }

    #[test]
    fn describe_names_paths_and_reasons() {
        let v = check(&scope(&["a.py"]), &[modified("b.py")]).unwrap();
        assert_eq!(
            describe(&v),
            "write scope violated: `b.py` (outside the write scope)"
        );
    }
}
