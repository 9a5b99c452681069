//! Links in every position, FIFOs, devices, sparse and huge files, races with a swapped
//! directory, caps and cuts.

use super::resolve::{open_for_reading, open_root};
use super::*;
use cap_std::fs::FileTypeExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
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
