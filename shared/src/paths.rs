//! Path rules shared by the work-order validator and the sandbox tools: a path given by a user or
//! an agent must stay inside its worktree.

use std::path::{Component, Path};
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PathError {
    #[error("path is empty")]
    Empty,
    #[error("path `{0}` is absolute")]
    Absolute(String),
    #[error("path `{0}` has a drive letter")]
    Drive(String),
    #[error("path `{0}` escapes the worktree")]
    Escapes(String),
}

/// Normalises a relative path (`a/./b/../c` → `a/c`) and refuses anything absolute, with a drive
/// letter, or whose normal form starts with `..`.
pub fn normalize_relative(path: &str) -> Result<String, PathError> {
    let trimmed = path.trim();
    if trimmed.is_empty() {
        return Err(PathError::Empty);
    }
    let bytes = trimmed.as_bytes();
    if bytes.len() >= 2 && bytes[1] == b':' && bytes[0].is_ascii_alphabetic() {
        return Err(PathError::Drive(path.to_string()));
    }
    if trimmed.starts_with('/') || trimmed.starts_with('\\') {
        return Err(PathError::Absolute(path.to_string()));
    }
    let unified = trimmed.replace('\\', "/");
    let mut parts: Vec<String> = Vec::new();
    for component in Path::new(&unified).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(PathError::Escapes(path.to_string()));
                }
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(PathError::Absolute(path.to_string()))
            }
        }
    }
    if parts.is_empty() {
        return Err(PathError::Empty);
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_normalises_relative_paths() {
        assert_eq!(normalize_relative("a/./b/../c.py").unwrap(), "a/c.py");
        assert_eq!(normalize_relative("src/x.py").unwrap(), "src/x.py");
    }

    #[test]
    fn refuses_escapes_absolute_and_drive_paths() {
        assert!(matches!(
            normalize_relative("../x"),
            Err(PathError::Escapes(_))
        ));
        assert!(matches!(
            normalize_relative("a/../../x"),
            Err(PathError::Escapes(_))
        ));
        assert!(matches!(
            normalize_relative("/etc/passwd"),
            Err(PathError::Absolute(_))
        ));
        assert!(matches!(
            normalize_relative("C:\\x"),
            Err(PathError::Drive(_))
        ));
        assert!(matches!(normalize_relative(""), Err(PathError::Empty)));
    }
}
