//! Paths resolved beneath a root: validated with `shared::paths::normalize_relative`, then the
//! parent opened one component at a time from a handle on the root, refusing symlinks; the errors
//! say which component was a link or not a regular file.

use super::{io_error, SafeFsError, OPEN_FLAGS};
use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, File, OpenOptions, OpenOptionsExt};
use shared::paths::{normalize_relative, PathError};
use std::io;
use std::path::Path;

/// The directory holding the final component of a validated relative path.
pub(super) struct Target {
    pub(super) parent: Dir,
    pub(super) name: String,
    /// The normalised relative path, as shown in errors.
    pub(super) rel: String,
}

pub(super) fn open_root(root: &Path) -> Result<Dir, SafeFsError> {
    Dir::open_ambient_dir(root, ambient_authority())
        .map_err(|e| io_error(&root.display().to_string(), e))
}

/// Validates `rel` and opens its parent directory one component at a time, refusing symlinks;
/// with `create`, missing directories are made on the way.
pub(super) fn resolve(root: &Path, rel: &str, create: bool) -> Result<Target, SafeFsError> {
    let rel = normalize_relative(rel).map_err(|e| match e {
        PathError::Empty => SafeFsError::EmptyPath,
        PathError::Absolute(_) | PathError::Drive(_) | PathError::Escapes(_) => {
            SafeFsError::Escapes(rel.to_string())
        }
    })?;
    let parts: Vec<&str> = rel.split('/').collect();
    let (name, parents) = parts.split_last().ok_or(SafeFsError::EmptyPath)?;
    let mut dir = open_root(root)?;
    let mut shown = String::new();
    for part in parents {
        if !shown.is_empty() {
            shown.push('/');
        }
        shown.push_str(part);
        dir = match dir.open_dir_nofollow(part) {
            Ok(sub) => sub,
            Err(e) if create && e.kind() == io::ErrorKind::NotFound => {
                match dir.create_dir(part) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(component_error(&dir, part, &shown, e)),
                }
                // Opened again without following: a symlink put there meanwhile is refused.
                dir.open_dir_nofollow(part)
                    .map_err(|e| component_error(&dir, part, &shown, e))?
            }
            Err(e) => return Err(component_error(&dir, part, &shown, e)),
        };
    }
    Ok(Target {
        parent: dir,
        name: (*name).to_string(),
        rel,
    })
}

pub(super) fn open_for_reading(dir: &Dir, name: impl AsRef<Path>) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options
        .read(true)
        .follow(FollowSymlinks::No)
        .custom_flags(OPEN_FLAGS);
    dir.open_with(name, &options)
}

/// The error for a component that could not be opened: a symlink if it is one, else the cause.
pub(super) fn component_error(dir: &Dir, name: &str, shown: &str, err: io::Error) -> SafeFsError {
    match dir.symlink_metadata(name) {
        Ok(meta) if meta.file_type().is_symlink() => SafeFsError::Symlink(shown.to_string()),
        _ => io_error(shown, err),
    }
}

/// The error for a final component that could not be opened for reading: a symlink, something
/// other than a regular file (a socket gives ENXIO), or the cause.
pub(super) fn final_error(dir: &Dir, name: &str, rel: &str, err: io::Error) -> SafeFsError {
    match dir.symlink_metadata(name) {
        Ok(meta) if meta.file_type().is_symlink() => SafeFsError::Symlink(rel.to_string()),
        Ok(meta) if !meta.is_file() => SafeFsError::NotRegular(rel.to_string()),
        _ => io_error(rel, err),
    }
}
