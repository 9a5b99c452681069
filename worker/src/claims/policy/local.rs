//! The project's own top-level modules, read from the worktree: code may import them.

use super::tables;
use crate::safe_fs;
use std::collections::BTreeSet;
use std::path::Path;

/// Files looked at, at most, when listing a project's modules.
const MAX_FILES: usize = 5_000;

/// Bytes read, at most (the walk reads the files it keeps).
const MAX_BYTES: u64 = 64 << 20;

/// Top-level modules of the project at `root`: `*.py` files and packages (folders with an
/// `__init__.py`) at the root, under `src/`, and in each of `dirs` (the folders of the files
/// being checked). Not test modules (`test*`, `conftest`), not names of the standard library.
pub fn local_modules(root: &Path, dirs: &[String]) -> BTreeSet<String> {
    let mut bases: Vec<String> = vec![String::new(), "src/".into()];
    for d in dirs {
        let d = d.trim_matches('/');
        if !d.is_empty() {
            bases.push(format!("{d}/"));
        }
    }
    let module_of = |path: &str| -> Option<String> {
        bases.iter().find_map(|b| {
            let rest = path.strip_prefix(b.as_str())?;
            match rest.split_once('/') {
                None => rest.strip_suffix(".py").map(str::to_string),
                Some((pkg, "__init__.py")) => Some(pkg.to_string()),
                Some(_) => None,
            }
        })
    };
    let keep = |path: &str| module_of(path).is_some();
    let Ok((files, _cut)) = safe_fs::regular_files_where(root, keep, MAX_FILES, MAX_BYTES) else {
        return BTreeSet::new();
    };
    files
        .iter()
        .filter_map(|(p, _)| module_of(p))
        .filter(|m| {
            !m.starts_with("test")
                && m != "conftest"
                && !tables::allowed_module(m)
                && !tables::known_module(m)
                && !m.is_empty()
        })
        .collect()
}
