//! Which repository paths on the coordinator's own disk a submission may name. A coordinator
//! serving tokens (`fleet coordinator` without `--open-api`) opens none unless an admin
//! allow-lists roots (`FLEET_REPO_ROOTS`, absolute paths separated by `:`); a path is taken
//! only when, with every symlink resolved, it lies beneath one of them, and so does every place
//! git would read for it (a `.git` file's directory, a common directory, borrowed object
//! stores). The open API (local use) and the embedded mode take any path unless roots are
//! given.

use std::path::{Path, PathBuf};

/// The allow-list, read once when the coordinator starts.
#[derive(Clone, Debug, Default)]
pub struct RepoRoots {
    /// Canonical roots; `None` when none were given.
    roots: Option<Vec<PathBuf>>,
}

impl RepoRoots {
    /// `FLEET_REPO_ROOTS`: roots that do not exist are left out (with a warning).
    pub fn from_env() -> RepoRoots {
        let Ok(text) = std::env::var("FLEET_REPO_ROOTS") else {
            return RepoRoots::default();
        };
        RepoRoots::new(text.split(':').filter(|s| !s.trim().is_empty()))
    }

    pub fn new<'a>(roots: impl IntoIterator<Item = &'a str>) -> RepoRoots {
        let roots = roots
            .into_iter()
            .filter_map(|r| match Path::new(r.trim()).canonicalize() {
                Ok(p) if Path::new(r.trim()).is_absolute() => Some(p),
                _ => {
                    tracing::warn!(root = %r, "repository root left out: not an absolute path that exists");
                    None
                }
            })
            .collect();
        RepoRoots { roots: Some(roots) }
    }

    /// Whether the coordinator may open `repo`; `open` says whether the API is open (local
    /// use). The error says why not.
    pub fn check(&self, repo: &str, open: bool) -> Result<(), String> {
        let roots = match &self.roots {
            None if open => return Ok(()),
            None => {
                return Err(format!(
                    "this coordinator opens no repository path on its own disk (`{}`): an admin \
                     allow-lists roots with FLEET_REPO_ROOTS",
                    shared::text::head(repo, 200)
                ))
            }
            Some(roots) => roots,
        };
        let path = Path::new(repo);
        if !path.is_absolute() {
            return Err(format!(
                "repository `{}` is not an absolute path",
                shared::text::head(repo, 200)
            ));
        }
        // Every symlink resolved: a link beneath a root that leads out of it is outside.
        let real = path
            .canonicalize()
            .map_err(|e| format!("repository `{}`: {e}", shared::text::head(repo, 200)))?;
        let beneath = |p: &Path| roots.iter().any(|root| p.starts_with(root));
        if !beneath(&real) {
            return Err(format!(
                "repository `{}` is not beneath a root this coordinator allows (FLEET_REPO_ROOTS)",
                shared::text::head(repo, 200)
            ));
        }
        // Where git itself would read: a `.git` file's directory, a worktree's common
        // directory, borrowed object stores (alternates). Each must be beneath a root too.
        for (what, path) in git_indirections(&real) {
            let resolved = path.canonicalize().unwrap_or(path.clone());
            if !beneath(&resolved) {
                return Err(format!(
                    "repository `{}`: its {what} `{}` is not beneath a root this coordinator \
                     allows (FLEET_REPO_ROOTS)",
                    shared::text::head(repo, 200),
                    shared::text::head(&path.display().to_string(), 200)
                ));
            }
        }
        Ok(())
    }
}

/// The places git reads for the repository at `real` beyond the folder itself: the directory
/// a `.git` file names, a linked worktree's common directory, and every object store listed in
/// `objects/info/alternates` (relative entries resolved as git does). Bounded reads.
fn git_indirections(real: &Path) -> Vec<(&'static str, PathBuf)> {
    let read = |p: &Path| -> Option<String> {
        let meta = std::fs::metadata(p).ok()?;
        (meta.is_file() && meta.len() <= 64 * 1024).then(|| std::fs::read_to_string(p).ok())?
    };
    let mut out = Vec::new();
    let dot_git = real.join(".git");
    let gitdir = match read(&dot_git) {
        Some(text) => {
            let named = text.trim().strip_prefix("gitdir:").unwrap_or("").trim();
            let dir = real.join(named);
            out.push(("git directory", dir.clone()));
            dir
        }
        None if dot_git.is_dir() => dot_git,
        None => real.to_path_buf(),
    };
    let mut object_dirs = vec![gitdir.join("objects")];
    if let Some(common) = read(&gitdir.join("commondir")) {
        let common = gitdir.join(common.trim());
        out.push(("common git directory", common.clone()));
        object_dirs.push(common.join("objects"));
    }
    for objects in object_dirs {
        if let Some(list) = read(&objects.join("info/alternates")) {
            for line in list.lines().map(str::trim) {
                if !line.is_empty() && !line.starts_with('#') {
                    out.push(("borrowed object store", objects.join(line)));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_roots_only_the_open_api_takes_a_path() {
        let none = RepoRoots::default();
        assert!(none.check("/any/where", true).is_ok());
        let e = none.check("/any/where", false).unwrap_err();
        assert!(e.contains("FLEET_REPO_ROOTS"), "{e}");
    }

    #[test]
    fn a_root_that_does_not_exist_or_is_relative_is_left_out() {
        let roots = RepoRoots::new(["/no/such/root", "relative/x"]);
        assert!(roots.check("/no/such/root/repo", true).is_err());
    }
}
