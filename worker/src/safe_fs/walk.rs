//! Walks of every regular file beneath a root: no link followed, other types skipped, entries
//! in name order so a cut is deterministic, bounded in files, bytes, depth and entries.

use super::file::read_up_to;
use super::resolve::{open_for_reading, open_root};
use super::{io_error, SafeFsError};
use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, FileType};
use std::ffi::OsString;
use std::io;
use std::path::Path;

/// Directories deeper than this are not walked by [`regular_files`] (the walk is marked cut).
const MAX_WALK_DEPTH: usize = 256;

/// Directory entries of any kind that [`regular_files`] looks at before it gives up (cut).
const MAX_WALK_ENTRIES: usize = 1_000_000;

/// (relative path with '/', bytes) of files, as [`regular_files`] returns them.
pub type Files = Vec<(String, Vec<u8>)>;

/// Walks regular files beneath root (not following symlinks, skipping other types), at most
/// `max_files` entries and `max_bytes` total read; returns (relative path with '/', bytes) sorted
/// by path, plus a flag telling whether limits cut the walk.
///
/// Directories are walked in name order, so which files a cut keeps is deterministic. A file that
/// does not fit in the bytes left is skipped (not read) and the walk goes on; reaching
/// `max_files` ends it. Directories deeper than 256 levels, or more than a million entries in
/// all, also cut the walk. Names that are not UTF-8 are converted lossily. Entries that vanish
/// or change type while walking are skipped.
pub fn regular_files(
    root: &Path,
    max_files: usize,
    max_bytes: u64,
) -> Result<(Files, bool), SafeFsError> {
    regular_files_where(root, |_| true, max_files, max_bytes)
}

/// [`regular_files`], keeping only the files whose relative path `keep` accepts (the others are
/// neither read nor counted).
pub fn regular_files_where(
    root: &Path,
    keep: impl Fn(&str) -> bool,
    max_files: usize,
    max_bytes: u64,
) -> Result<(Files, bool), SafeFsError> {
    struct Frame {
        dir: Dir,
        prefix: String,
        entries: std::vec::IntoIter<(OsString, FileType)>,
    }

    let root_dir = open_root(root)?;
    let mut visited = 0usize;
    let mut cut = false;
    let mut total = 0u64;
    let mut out: Files = Vec::new();

    let entries = list_dir(&root_dir, "", &mut visited, &mut cut)?;
    let mut stack = vec![Frame {
        dir: root_dir,
        prefix: String::new(),
        entries,
    }];

    'walk: loop {
        let depth = stack.len();
        let Some(frame) = stack.last_mut() else {
            break;
        };
        let Some((name, file_type)) = frame.entries.next() else {
            stack.pop();
            continue;
        };
        let rel = format!("{}{}", frame.prefix, name.to_string_lossy());
        if file_type.is_dir() {
            if depth >= MAX_WALK_DEPTH {
                cut = true;
                continue;
            }
            let sub = match frame.dir.open_dir_nofollow(&name) {
                Ok(sub) => sub,
                Err(e) if vanished_or_swapped(&e) => continue,
                Err(e) => return Err(io_error(&rel, e)),
            };
            let prefix = format!("{rel}/");
            let entries = list_dir(&sub, &rel, &mut visited, &mut cut)?;
            stack.push(Frame {
                dir: sub,
                prefix,
                entries,
            });
        } else if file_type.is_file() {
            if !keep(&rel) {
                continue;
            }
            if out.len() >= max_files {
                cut = true;
                break 'walk;
            }
            let file = match open_for_reading(&frame.dir, &name) {
                Ok(file) => file,
                Err(e) if vanished_or_swapped(&e) => continue,
                Err(e) => return Err(io_error(&rel, e)),
            };
            let meta = file.metadata().map_err(|e| io_error(&rel, e))?;
            if !meta.is_file() {
                continue;
            }
            let left = max_bytes - total;
            if meta.len() > left {
                cut = true;
                continue;
            }
            let (bytes, truncated) = read_up_to(&file, left, &rel)?;
            if truncated {
                // It grew after the size check.
                cut = true;
                continue;
            }
            total += bytes.len() as u64;
            out.push((rel, bytes));
        }
        // Symlinks, FIFOs, sockets and devices are skipped.
    }

    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((out, cut))
}

/// The sorted entries of a directory, with their types as read (symlinks are not followed).
fn list_dir(
    dir: &Dir,
    rel: &str,
    visited: &mut usize,
    cut: &mut bool,
) -> Result<std::vec::IntoIter<(OsString, FileType)>, SafeFsError> {
    let shown = if rel.is_empty() { "." } else { rel };
    let mut entries = Vec::new();
    for entry in dir.entries().map_err(|e| io_error(shown, e))? {
        if *visited >= MAX_WALK_ENTRIES {
            *cut = true;
            break;
        }
        *visited += 1;
        let entry = entry.map_err(|e| io_error(shown, e))?;
        let file_type = match entry.file_type() {
            Ok(file_type) => file_type,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error(shown, e)),
        };
        entries.push((entry.file_name(), file_type));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(entries.into_iter())
}

/// An entry seen by the walk that has gone, or became a symlink or something else, since.
fn vanished_or_swapped(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || matches!(
            e.raw_os_error(),
            Some(libc::ELOOP) | Some(libc::ENOTDIR) | Some(libc::ENXIO)
        )
}
