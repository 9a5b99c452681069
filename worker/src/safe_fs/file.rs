//! One file beneath a root: read through a cap (regular files only, never through a link),
//! written in place or replaced through a temporary name, removed.

use super::resolve::{final_error, open_for_reading, resolve};
use super::{io_error, SafeFsError, OPEN_FLAGS};
use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, File, MetadataExt, OpenOptions, OpenOptionsExt};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// At most `cap` bytes of a file; `size` is the file's size when it was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capped {
    pub bytes: Vec<u8>,
    pub truncated: bool,
    pub size: u64,
}

/// Reads at most `cap` bytes of the regular file `rel` beneath `root`, refusing symlinks in any
/// component, non-regular files and escaping paths; streams (never reads more than cap+1 bytes).
pub fn read_capped(root: &Path, rel: &str, cap: usize) -> Result<Capped, SafeFsError> {
    read_capped_inner(root, rel, cap).map(|(_, capped)| capped)
}

/// The same, as UTF-8 text (lossy) when not truncated; `Err` when larger than cap.
pub fn read_text_within(root: &Path, rel: &str, cap: usize) -> Result<String, SafeFsError> {
    let (rel, capped) = read_capped_inner(root, rel, cap)?;
    if capped.truncated {
        return Err(SafeFsError::TooLarge {
            path: rel,
            limit: cap,
        });
    }
    Ok(match String::from_utf8(capped.bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// Writes `bytes` to `rel` beneath root, creating parent directories, replacing a file, a symlink
/// or a FIFO at the final component (never following it), refusing symlinked parents.
///
/// An existing regular file with a single link is rewritten in place (its owner and mode stay,
/// like `std::fs::write`); a symlink, FIFO, socket, device or hard-linked file there is replaced
/// by a new regular file through a rename, so whatever it pointed to is left untouched. New files
/// and directories get the process's owner and default mode.
pub fn write_beneath(root: &Path, rel: &str, bytes: &[u8]) -> Result<(), SafeFsError> {
    let target = resolve(root, rel, true)?;
    let (parent, name, rel) = (&target.parent, target.name.as_str(), target.rel.as_str());

    let mut existing = OpenOptions::new();
    existing
        .write(true)
        .follow(FollowSymlinks::No)
        .custom_flags(OPEN_FLAGS);
    match parent.open_with(name, &existing) {
        Ok(file) => {
            let meta = file.metadata().map_err(|e| io_error(rel, e))?;
            if meta.is_file() && meta.nlink() == 1 {
                file.set_len(0).map_err(|e| io_error(rel, e))?;
                return write_all(&file, bytes, rel);
            }
            if meta.is_dir() {
                return Err(SafeFsError::NotRegular(rel.to_string()));
            }
            drop(file);
            replace(parent, name, rel, bytes)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mut fresh = OpenOptions::new();
            fresh
                .write(true)
                .create_new(true)
                .follow(FollowSymlinks::No)
                .custom_flags(OPEN_FLAGS);
            match parent.open_with(name, &fresh) {
                Ok(file) => write_all(&file, bytes, rel),
                // Something appeared in between: replace it, whatever it is.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    replace(parent, name, rel, bytes)
                }
                Err(e) => Err(io_error(rel, e)),
            }
        }
        Err(e) => match parent.symlink_metadata(name) {
            Ok(meta) if meta.is_dir() => Err(SafeFsError::NotRegular(rel.to_string())),
            // A symlink (ELOOP), a FIFO without a reader or a socket (ENXIO), a device: the
            // entry is replaced, never opened through.
            Ok(meta) if !meta.is_file() => replace(parent, name, rel, bytes),
            _ => Err(io_error(rel, e)),
        },
    }
}

/// Removes the file or symlink at rel (not following), Ok if absent.
pub fn remove_beneath(root: &Path, rel: &str) -> Result<(), SafeFsError> {
    let target = match resolve(root, rel, false) {
        Ok(target) => target,
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e),
    };
    match target.parent.remove_file(&target.name) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => match target.parent.symlink_metadata(&target.name) {
            Ok(meta) if meta.is_dir() => Err(SafeFsError::NotRegular(target.rel)),
            _ => Err(io_error(&target.rel, e)),
        },
    }
}

fn read_capped_inner(root: &Path, rel: &str, cap: usize) -> Result<(String, Capped), SafeFsError> {
    let target = resolve(root, rel, false)?;
    let rel = target.rel;
    let file = open_for_reading(&target.parent, &target.name)
        .map_err(|e| final_error(&target.parent, &target.name, &rel, e))?;
    let meta = file.metadata().map_err(|e| io_error(&rel, e))?;
    if !meta.is_file() {
        return Err(SafeFsError::NotRegular(rel));
    }
    let (bytes, truncated) = read_up_to(&file, cap as u64, &rel)?;
    Ok((
        rel,
        Capped {
            bytes,
            truncated,
            size: meta.len(),
        },
    ))
}
/// Reads at most `cap` bytes (and one more, to tell whether there was more).
pub(super) fn read_up_to(file: &File, cap: u64, rel: &str) -> Result<(Vec<u8>, bool), SafeFsError> {
    let mut bytes = Vec::new();
    let mut reader = file.take(cap.saturating_add(1));
    reader
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(rel, e))?;
    let truncated = bytes.len() as u64 > cap;
    if truncated {
        bytes.truncate(cap as usize);
    }
    Ok((bytes, truncated))
}

fn write_all(mut file: &File, bytes: &[u8], rel: &str) -> Result<(), SafeFsError> {
    file.write_all(bytes).map_err(|e| io_error(rel, e))
}

/// Writes a new file beside `name` and renames it over `name`, which is replaced whatever it is
/// (except a directory), never followed.
fn replace(parent: &Dir, name: &str, rel: &str, bytes: &[u8]) -> Result<(), SafeFsError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut options = OpenOptions::new();
    options
        .write(true)
        .create_new(true)
        .follow(FollowSymlinks::No)
        .custom_flags(OPEN_FLAGS);
    for _ in 0..16 {
        let temp = format!(
            ".safe-fs-{}-{}.tmp",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let file = match parent.open_with(&temp, &options) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_error(rel, e)),
        };
        let written = write_all(&file, bytes, rel);
        drop(file);
        let renamed = written.and_then(|()| {
            parent
                .rename(&temp, parent, name)
                .map_err(|e| match parent.symlink_metadata(name) {
                    Ok(meta) if meta.is_dir() => SafeFsError::NotRegular(rel.to_string()),
                    _ => io_error(rel, e),
                })
        });
        if renamed.is_err() {
            let _ = parent.remove_file(&temp);
        }
        return renamed;
    }
    Err(io_error(
        rel,
        io::Error::new(io::ErrorKind::AlreadyExists, "no free temporary name"),
    ))
}
