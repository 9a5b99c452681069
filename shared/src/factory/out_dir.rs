//! The seed's preflight rule for a local output directory: it may not lie inside the product
//! repository (its artifacts would dirty the tree the run hashes, checks for cleanliness and
//! rolls back). The caller resolves both paths on disk; the rule itself is pure.

use std::path::{Component, Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum OutDirError {
    #[error(
        "the out dir `{given}` (resolved: `{resolved}`) lies inside the repository `{repo}`; \
         give an out dir outside the repository"
    )]
    InsideRepo {
        given: String,
        resolved: String,
        repo: String,
    },
}

/// `rest` (components that do not exist yet, so none of them is a symlink) joined onto the
/// canonical path `existing`, lexically: `.` is dropped and `..` removes the previous
/// component, as the file system will once the directories are created.
pub fn resolve_below(existing: &Path, rest: &Path) -> PathBuf {
    let mut out = existing.to_path_buf();
    for c in rest.components() {
        match c {
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => out = PathBuf::from(c.as_os_str()),
        }
    }
    out
}

/// Refuses an out dir that is the repository or lies below it. `out` and `repo` are resolved
/// paths (symlinks followed); `given` is the out dir as the user wrote it, for the message.
pub fn check_out_dir(given: &Path, out: &Path, repo: &Path) -> Result<(), OutDirError> {
    if out.starts_with(repo) {
        return Err(OutDirError::InsideRepo {
            given: given.display().to_string(),
            resolved: out.display().to_string(),
            repo: repo.display().to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_rest_follows_dot_and_dot_dot() {
        assert_eq!(
            resolve_below(Path::new("/tmp"), Path::new("new/../repo/./out")),
            PathBuf::from("/tmp/repo/out")
        );
        assert_eq!(
            resolve_below(Path::new("/tmp/a"), Path::new("")),
            PathBuf::from("/tmp/a")
        );
        assert_eq!(
            resolve_below(Path::new("/"), Path::new("../x")),
            PathBuf::from("/x")
        );
    }

    #[test]
    fn an_out_dir_inside_the_repo_or_equal_to_it_is_refused() {
        let repo = Path::new("/work/repo");
        for out in ["/work/repo", "/work/repo/out", "/work/repo/a/b"] {
            let err = check_out_dir(Path::new("given"), Path::new(out), repo).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(out) && msg.contains("`/work/repo`"), "{msg}");
            assert!(msg.contains("`given`"), "{msg}");
        }
        for out in ["/work/repo-out", "/work", "/tmp/out"] {
            assert!(
                check_out_dir(Path::new(out), Path::new(out), repo).is_ok(),
                "{out}"
            );
        }
    }
}
