//! Which repository paths on the coordinator's own disk a submission may name. A coordinator
//! serving tokens (`fleet coordinator` without `--open-api`) opens none unless an admin
//! allow-lists roots (`FLEET_REPO_ROOTS`, absolute paths separated by `:`); a path is taken
//! only when, with every symlink resolved, it lies beneath one of them. The open API (local
//! use) and the embedded mode take any path unless roots are given.

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
        if roots.iter().any(|root| real.starts_with(root)) {
            Ok(())
        } else {
            Err(format!(
                "repository `{}` is not beneath a root this coordinator allows (FLEET_REPO_ROOTS)",
                shared::text::head(repo, 200)
            ))
        }
    }
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
