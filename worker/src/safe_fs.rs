//! Host-side reads and writes of worktree content, which untrusted agents and repositories write.
//!
//! Every path is resolved one component at a time from a directory handle opened on the worktree
//! root (`cap-std`, `openat` with `O_NOFOLLOW`), so a symlink anywhere in the path is refused,
//! never followed, and a directory swapped for a symlink between a check and the open cannot
//! redirect us: there is no check-then-open on a path, only opens relative to handles already
//! held. Files are opened with `O_NONBLOCK | O_NOCTTY` (a FIFO opens at once instead of blocking),
//! checked on the open handle to be regular files, and read through a cap, so `/dev/zero`, a FIFO
//! or a 2 GB sparse file cannot stall or exhaust the worker. Relative paths are normalised with
//! `shared::paths::normalize_relative`; absolute paths and paths escaping with `..` are refused.

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, File, FileType, MetadataExt, OpenOptions, OpenOptionsExt};
use shared::paths::{normalize_relative, PathError};
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Flags added to every open of worktree content: never block on a FIFO, never take a terminal.
const OPEN_FLAGS: i32 = libc::O_NONBLOCK | libc::O_NOCTTY;

/// Directories deeper than this are not walked by [`regular_files`] (the walk is marked cut).
const MAX_WALK_DEPTH: usize = 256;

/// Directory entries of any kind that [`regular_files`] looks at before it gives up (cut).
const MAX_WALK_ENTRIES: usize = 1_000_000;

#[derive(Debug, thiserror::Error)]
pub enum SafeFsError {
    /// A component of the path (named: the prefix up to it) is a symlink.
    #[error("`{0}` is a symlink")]
    Symlink(String),
    #[error("`{0}` is not a regular file")]
    NotRegular(String),
    /// Absolute, with a drive letter, or leaving the worktree through `..`.
    #[error("`{0}` escapes the worktree")]
    Escapes(String),
    #[error("path is empty")]
    EmptyPath,
    /// Only from [`read_text_within`].
    #[error("`{path}` is larger than {limit} bytes")]
    TooLarge { path: String, limit: usize },
    #[error("`{path}`: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl SafeFsError {
    /// True when the path (or one of its parents) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, SafeFsError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Runs `f` on the blocking pool and waits for it: file-system walks and libgit2 must not hold
/// one of the runtime's threads. A panic in `f` continues in the caller (where a job's panic is
/// caught and reported), as if `f` had run there.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Only when the runtime shuts down before the task started.
        Err(e) => panic!("blocking work did not run: {e}"),
    }
}

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

/// The directory holding the final component of a validated relative path.
struct Target {
    parent: Dir,
    name: String,
    /// The normalised relative path, as shown in errors.
    rel: String,
}

fn open_root(root: &Path) -> Result<Dir, SafeFsError> {
    Dir::open_ambient_dir(root, ambient_authority())
        .map_err(|e| io_error(&root.display().to_string(), e))
}

/// Validates `rel` and opens its parent directory one component at a time, refusing symlinks;
/// with `create`, missing directories are made on the way.
fn resolve(root: &Path, rel: &str, create: bool) -> Result<Target, SafeFsError> {
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

fn open_for_reading(dir: &Dir, name: impl AsRef<Path>) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options
        .read(true)
        .follow(FollowSymlinks::No)
        .custom_flags(OPEN_FLAGS);
    dir.open_with(name, &options)
}

/// Reads at most `cap` bytes (and one more, to tell whether there was more).
fn read_up_to(file: &File, cap: u64, rel: &str) -> Result<(Vec<u8>, bool), SafeFsError> {
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

/// The error for a component that could not be opened: a symlink if it is one, else the cause.
fn component_error(dir: &Dir, name: &str, shown: &str, err: io::Error) -> SafeFsError {
    match dir.symlink_metadata(name) {
        Ok(meta) if meta.file_type().is_symlink() => SafeFsError::Symlink(shown.to_string()),
        _ => io_error(shown, err),
    }
}

/// The error for a final component that could not be opened for reading: a symlink, something
/// other than a regular file (a socket gives ENXIO), or the cause.
fn final_error(dir: &Dir, name: &str, rel: &str, err: io::Error) -> SafeFsError {
    match dir.symlink_metadata(name) {
        Ok(meta) if meta.file_type().is_symlink() => SafeFsError::Symlink(rel.to_string()),
        Ok(meta) if !meta.is_file() => SafeFsError::NotRegular(rel.to_string()),
        _ => io_error(rel, err),
    }
}

fn io_error(path: &str, source: io::Error) -> SafeFsError {
    SafeFsError::Io {
        path: path.to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cap_std::fs::FileTypeExt;
    use std::os::unix::fs::{symlink, PermissionsExt};
    use std::path::PathBuf;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    /// Runs `f` on a thread and fails the test if it takes more than 5 s (a blocked open).
    fn within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(5))
            .expect("the operation blocked for more than 5 s")
    }

    /// A worktree root and, beside it, an outside directory holding a secret.
    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("wt");
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"TOP-SECRET-BYTES").unwrap();
        (tmp, root, outside)
    }

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }

    #[test]
    fn reads_a_regular_file_and_caps_it() {
        let (_tmp, root, _) = setup();
        std::fs::create_dir(root.join("src")).unwrap();
        std::fs::write(root.join("src/a.py"), b"hello world").unwrap();
        let all = read_capped(&root, "src/./a.py", 100).unwrap();
        assert_eq!(
            all,
            Capped {
                bytes: b"hello world".to_vec(),
                truncated: false,
                size: 11
            }
        );
        let exact = read_capped(&root, "src/a.py", 11).unwrap();
        assert!(!exact.truncated);
        let cut = read_capped(&root, "src/a.py", 5).unwrap();
        assert_eq!(cut.bytes, b"hello");
        assert!(cut.truncated);
        assert_eq!(cut.size, 11);
        assert_eq!(
            read_text_within(&root, "src/a.py", 11).unwrap(),
            "hello world"
        );
        let err = read_text_within(&root, "src/a.py", 5).unwrap_err();
        assert!(matches!(err, SafeFsError::TooLarge { limit: 5, .. }));
        assert_eq!(err.to_string(), "`src/a.py` is larger than 5 bytes");
        let missing = read_capped(&root, "src/none.py", 5).unwrap_err();
        assert!(missing.is_not_found(), "{missing}");
        let missing_parent = read_capped(&root, "nodir/none.py", 5).unwrap_err();
        assert!(missing_parent.is_not_found(), "{missing_parent}");
    }

    #[test]
    fn refuses_a_symlink_to_a_file_outside_and_returns_none_of_its_bytes() {
        let (_tmp, root, outside) = setup();
        symlink(outside.join("secret"), root.join("ctx.md")).unwrap();
        let err = read_capped(&root, "ctx.md", 1 << 20).unwrap_err();
        assert!(
            matches!(&err, SafeFsError::Symlink(p) if p == "ctx.md"),
            "{err}"
        );
        assert_eq!(err.to_string(), "`ctx.md` is a symlink");
        let err = read_text_within(&root, "ctx.md", 1 << 20).unwrap_err();
        assert!(!format!("{err} {err:?}").contains("TOP-SECRET"));
        // A symlink that stays inside the worktree is refused as well.
        std::fs::write(root.join("real.md"), b"inside").unwrap();
        symlink("real.md", root.join("alias.md")).unwrap();
        assert!(matches!(
            read_capped(&root, "alias.md", 100),
            Err(SafeFsError::Symlink(_))
        ));
    }

    #[test]
    fn refuses_a_symlink_in_a_parent_component() {
        let (_tmp, root, outside) = setup();
        symlink(&outside, root.join("tests")).unwrap();
        let err = read_capped(&root, "tests/secret", 1 << 20).unwrap_err();
        assert!(
            matches!(&err, SafeFsError::Symlink(p) if p == "tests"),
            "{err}"
        );
        std::fs::create_dir_all(root.join("a/real")).unwrap();
        std::fs::write(root.join("a/real/f"), b"x").unwrap();
        symlink("real", root.join("a/link")).unwrap();
        let err = read_capped(&root, "a/link/f", 10).unwrap_err();
        assert!(
            matches!(&err, SafeFsError::Symlink(p) if p == "a/link"),
            "{err}"
        );
    }

    #[test]
    fn refuses_a_symlink_to_dev_zero_without_reading_it() {
        let (_tmp, root, _) = setup();
        symlink("/dev/zero", root.join("zero")).unwrap();
        let err = within_5s(move || read_capped(&root, "zero", 1 << 20)).unwrap_err();
        assert!(matches!(err, SafeFsError::Symlink(_)), "{err}");
    }

    #[test]
    fn refuses_a_fifo_without_blocking() {
        let (_tmp, root, _) = setup();
        mkfifo(&root.join("pipe"));
        let r = root.clone();
        let err = within_5s(move || read_capped(&r, "pipe", 1 << 20)).unwrap_err();
        assert!(
            matches!(&err, SafeFsError::NotRegular(p) if p == "pipe"),
            "{err}"
        );
        assert_eq!(err.to_string(), "`pipe` is not a regular file");
        let r = root.clone();
        let err = within_5s(move || read_text_within(&r, "pipe", 10)).unwrap_err();
        assert!(matches!(err, SafeFsError::NotRegular(_)));
        // Writing replaces the FIFO by a regular file, without blocking either.
        let r = root.clone();
        within_5s(move || write_beneath(&r, "pipe", b"now a file")).unwrap();
        let meta = std::fs::symlink_metadata(root.join("pipe")).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(std::fs::read(root.join("pipe")).unwrap(), b"now a file");
    }

    #[test]
    fn refuses_a_socket() {
        let (_tmp, root, _) = setup();
        let _listener = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
        let err = read_capped(&root, "sock", 10).unwrap_err();
        assert!(
            matches!(&err, SafeFsError::NotRegular(p) if p == "sock"),
            "{err}"
        );
        let (files, cut) = regular_files(&root, 10, 10).unwrap();
        assert!(files.is_empty() && !cut);
    }

    #[test]
    fn refuses_a_directory() {
        let (_tmp, root, _) = setup();
        std::fs::create_dir(root.join("d")).unwrap();
        assert!(matches!(
            read_capped(&root, "d", 10),
            Err(SafeFsError::NotRegular(_))
        ));
        assert!(matches!(
            write_beneath(&root, "d", b"x"),
            Err(SafeFsError::NotRegular(_))
        ));
        assert!(matches!(
            remove_beneath(&root, "d"),
            Err(SafeFsError::NotRegular(_))
        ));
        assert!(root.join("d").is_dir());
    }

    #[test]
    fn reads_a_2_gb_sparse_file_up_to_the_cap_quickly() {
        let (_tmp, root, _) = setup();
        let big = std::fs::File::create(root.join("big.bin")).unwrap();
        big.set_len(2 << 30).unwrap();
        drop(big);
        let r = root.clone();
        let started = Instant::now();
        let capped = within_5s(move || read_capped(&r, "big.bin", 1 << 20)).unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(capped.bytes.len(), 1 << 20);
        assert!(capped.truncated);
        assert_eq!(capped.size, 2 << 30);
        let err = within_5s(move || read_text_within(&root, "big.bin", 1 << 20)).unwrap_err();
        assert!(matches!(err, SafeFsError::TooLarge { .. }));
    }

    #[test]
    fn refuses_dotdot_and_absolute_paths_everywhere() {
        let (tmp, root, outside) = setup();
        std::fs::create_dir(root.join("a")).unwrap();
        for bad in [
            "../outside/secret",
            "a/../../outside/secret",
            "/etc/passwd",
            "C:\\x",
        ] {
            for err in [
                read_capped(&root, bad, 100).unwrap_err(),
                read_text_within(&root, bad, 100).unwrap_err(),
                write_beneath(&root, bad, b"pwned").unwrap_err(),
                remove_beneath(&root, bad).unwrap_err(),
            ] {
                assert!(
                    matches!(&err, SafeFsError::Escapes(p) if p == bad),
                    "{bad}: {err}"
                );
                assert_eq!(err.to_string(), format!("`{bad}` escapes the worktree"));
            }
        }
        assert_eq!(
            std::fs::read(outside.join("secret")).unwrap(),
            b"TOP-SECRET-BYTES"
        );
        assert!(!tmp.path().join("x").exists());
        assert!(matches!(
            read_capped(&root, "", 1),
            Err(SafeFsError::EmptyPath)
        ));
        assert!(matches!(
            write_beneath(&root, "a/..", b"x"),
            Err(SafeFsError::EmptyPath)
        ));
    }

    #[test]
    fn write_creates_parents_and_rewrites_files_in_place() {
        let (_tmp, root, _) = setup();
        write_beneath(&root, "new/deep/f.txt", b"one").unwrap();
        assert_eq!(std::fs::read(root.join("new/deep/f.txt")).unwrap(), b"one");
        std::fs::set_permissions(
            root.join("new/deep/f.txt"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        write_beneath(&root, "new/deep/f.txt", b"2").unwrap();
        assert_eq!(std::fs::read(root.join("new/deep/f.txt")).unwrap(), b"2");
        let mode = std::fs::metadata(root.join("new/deep/f.txt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(read_text_within(&root, "new/deep/f.txt", 10).unwrap(), "2");
    }

    #[test]
    fn write_replaces_a_symlink_and_leaves_its_target_untouched() {
        let (_tmp, root, outside) = setup();
        symlink(outside.join("secret"), root.join("out.txt")).unwrap();
        write_beneath(&root, "out.txt", b"new content").unwrap();
        let meta = std::fs::symlink_metadata(root.join("out.txt")).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(std::fs::read(root.join("out.txt")).unwrap(), b"new content");
        assert_eq!(
            std::fs::read(outside.join("secret")).unwrap(),
            b"TOP-SECRET-BYTES"
        );
        // A dangling symlink is replaced too, and nothing is created where it pointed.
        symlink(outside.join("created"), root.join("dangling")).unwrap();
        write_beneath(&root, "dangling", b"x").unwrap();
        assert!(!outside.join("created").exists());
        assert!(std::fs::symlink_metadata(root.join("dangling"))
            .unwrap()
            .file_type()
            .is_file());
        // No temporary file is left behind.
        let mut names: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["dangling", "out.txt"]);
    }

    #[test]
    fn write_replaces_a_hard_link_instead_of_writing_through_it() {
        let (_tmp, root, _) = setup();
        std::fs::write(root.join("a"), b"shared").unwrap();
        std::fs::hard_link(root.join("a"), root.join("b")).unwrap();
        write_beneath(&root, "b", b"mine").unwrap();
        assert_eq!(std::fs::read(root.join("a")).unwrap(), b"shared");
        assert_eq!(std::fs::read(root.join("b")).unwrap(), b"mine");
    }

    #[test]
    fn write_refuses_a_symlinked_parent() {
        let (_tmp, root, outside) = setup();
        symlink(&outside, root.join("dir")).unwrap();
        let err = write_beneath(&root, "dir/x", b"pwned").unwrap_err();
        assert!(
            matches!(&err, SafeFsError::Symlink(p) if p == "dir"),
            "{err}"
        );
        let err = write_beneath(&root, "dir/sub/x", b"pwned").unwrap_err();
        assert!(matches!(err, SafeFsError::Symlink(_)), "{err}");
        assert!(!outside.join("x").exists());
        assert!(!outside.join("sub").exists());
    }

    #[test]
    fn remove_unlinks_files_and_symlinks_and_ignores_absent_paths() {
        let (_tmp, root, outside) = setup();
        std::fs::write(root.join("f"), b"x").unwrap();
        symlink(outside.join("secret"), root.join("l")).unwrap();
        mkfifo(&root.join("p"));
        remove_beneath(&root, "f").unwrap();
        remove_beneath(&root, "l").unwrap();
        remove_beneath(&root, "p").unwrap();
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
        assert!(outside.join("secret").exists());
        remove_beneath(&root, "f").unwrap();
        remove_beneath(&root, "no/such/dir/f").unwrap();
        symlink(&outside, root.join("d")).unwrap();
        assert!(matches!(
            remove_beneath(&root, "d/secret"),
            Err(SafeFsError::Symlink(_))
        ));
        assert!(outside.join("secret").exists());
    }

    #[test]
    fn regular_files_skips_symlinks_and_fifos() {
        let (_tmp, root, outside) = setup();
        std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
        std::fs::write(root.join("b.txt"), b"bb").unwrap();
        std::fs::write(root.join("a.txt"), b"a").unwrap();
        std::fs::write(root.join("sub/c.txt"), b"ccc").unwrap();
        std::fs::write(root.join("sub/deeper/d.txt"), b"").unwrap();
        symlink(outside.join("secret"), root.join("link.txt")).unwrap();
        symlink(&outside, root.join("linkdir")).unwrap();
        symlink("/dev/zero", root.join("zero")).unwrap();
        mkfifo(&root.join("sub/pipe"));
        let r = root.clone();
        let (files, cut) = within_5s(move || regular_files(&r, 100, 1 << 20)).unwrap();
        assert!(!cut);
        assert_eq!(
            files,
            vec![
                ("a.txt".to_string(), b"a".to_vec()),
                ("b.txt".to_string(), b"bb".to_vec()),
                ("sub/c.txt".to_string(), b"ccc".to_vec()),
                ("sub/deeper/d.txt".to_string(), Vec::new()),
            ]
        );
    }

    #[test]
    fn regular_files_honours_its_limits() {
        let (_tmp, root, _) = setup();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("a.txt"), b"a").unwrap();
        std::fs::write(root.join("big.bin"), vec![7u8; 1000]).unwrap();
        std::fs::write(root.join("sub/c.txt"), b"ccc").unwrap();

        let (files, cut) = regular_files(&root, 2, 1 << 20).unwrap();
        assert!(cut);
        let names: Vec<_> = files.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["a.txt", "big.bin"]);

        // The big file does not fit in the bytes: skipped, the rest still comes.
        let (files, cut) = regular_files(&root, 100, 10).unwrap();
        assert!(cut);
        let names: Vec<_> = files.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["a.txt", "sub/c.txt"]);
        let total: usize = files.iter().map(|(_, b)| b.len()).sum();
        assert!(total <= 10);

        let (files, cut) = regular_files(&root, 0, 1 << 20).unwrap();
        assert!(cut);
        assert!(files.is_empty());

        let (files, cut) = regular_files(&root, 3, 1004).unwrap();
        assert!(!cut);
        assert_eq!(files.len(), 3);

        let r = root.clone();
        let sparse = std::fs::File::create(root.join("sparse")).unwrap();
        sparse.set_len(2 << 30).unwrap();
        let (files, cut) = within_5s(move || regular_files(&r, 100, 1 << 20)).unwrap();
        assert!(cut);
        assert!(files.iter().all(|(p, _)| p != "sparse"));
    }

    #[test]
    fn a_fifo_in_the_walk_does_not_block_it_even_if_it_swaps_in() {
        // A FIFO listed as a regular file (a swap between listing and opening) is opened with
        // O_NONBLOCK and then skipped; here we check the open itself cannot block.
        let (_tmp, root, _) = setup();
        mkfifo(&root.join("p"));
        let dir = open_root(&root).unwrap();
        let file = within_5s(move || open_for_reading(&dir, "p").map(|f| f.metadata())).unwrap();
        assert!(file.unwrap().file_type().is_fifo());
    }
}
