//! House rules checked on the source itself (plain file reads, no servers):
//!
//! - each I/O crate is named by its adapter only (non-test code; `#[cfg(test)]` items, files
//!   named `tests.rs` and files under a `tests/` folder are test code): `lapin` by
//!   `worker/src/rabbitmq.rs`, `bollard` by `worker/src/sandbox/docker.rs`, `redis` by
//!   `coordinator/src/store/redis*.rs` (`redis.rs` and the files beside it, `redis_batches.rs`
//!   and the like), `worker/src/quota/redis_ledger.rs` and the connection both use,
//!   `worker/src/redis_link.rs`, `object_store` by `worker/src/blobs.rs`, `git2` by
//!   `worker/src/git*`;
//! - `shared` (no I/O) depends on none of the I/O crates;
//! - no `clippy::type_complexity` or `clippy::too_many_arguments` allowance in the crates'
//!   sources (name the type, or pass a struct).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

const SOURCE_DIRS: [&str; 3] = ["shared/src", "worker/src", "coordinator/src"];

/// Every `.rs` file under the crates' sources, as (path relative to the root, text).
fn sources() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = root();
    let mut files = Vec::new();
    for d in SOURCE_DIRS {
        walk(&root.join(d), &mut files);
    }
    files
        .into_iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let rel = p
                .strip_prefix(&root)
                .expect("under the root")
                .to_string_lossy()
                .replace('\\', "/");
            (rel, text)
        })
        .collect()
}

/// The text with comments and the contents of string and char literals blanked (newlines
/// kept, so line numbers hold).
fn code_only(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        if c[i] == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if (c[i] == 'r' || (c[i] == 'b' && at(i + 1) == 'r'))
            && !is_ident(at(i.wrapping_sub(1)))
            && {
                let s = if c[i] == 'b' { i + 2 } else { i + 1 };
                let mut k = s;
                while at(k) == '#' {
                    k += 1;
                }
                at(k) == '"'
            }
        {
            // A raw string: r#"..."# with as many hashes at the end.
            let s = if c[i] == 'b' { i + 2 } else { i + 1 };
            let mut k = s;
            while at(k) == '#' {
                k += 1;
            }
            let hashes = k - s;
            out.extend(std::iter::repeat_n(' ', k + 1 - i));
            i = k + 1;
            while i < c.len() {
                if c[i] == '"' && (0..hashes).all(|h| at(i + 1 + h) == '#') {
                    out.extend(std::iter::repeat_n(' ', 1 + hashes));
                    i += 1 + hashes;
                    break;
                }
                out.push(blank(c[i]));
                i += 1;
            }
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A char literal ('x', '\n', '\u{..}'); a lifetime ('a) is left as it is.
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '\'' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                out.push(' ');
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn is_ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

/// The code with every `#[cfg(test)]` item blanked (newlines kept).
fn without_test_items(code: &str) -> String {
    let c: Vec<char> = code.chars().collect();
    let text: String = c.iter().collect();
    let mut out: Vec<char> = c.clone();
    let mut search = 0;
    while let Some(found) = text[search..].find("#[cfg(test)]") {
        let start_byte = search + found;
        let start = text[..start_byte].chars().count();
        // The item: up to a `;` before any brace, or to the brace that closes its first one.
        let mut i = start + "#[cfg(test)]".chars().count();
        let mut depth = 0usize;
        let mut opened = false;
        while i < c.len() {
            match c[i] {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => {
                    depth = depth.saturating_sub(1);
                    if opened && depth == 0 {
                        i += 1;
                        break;
                    }
                }
                ';' if !opened => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        for ch in out.iter_mut().take(i).skip(start) {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
        search = text
            .char_indices()
            .nth(i)
            .map(|(b, _)| b)
            .unwrap_or(text.len());
    }
    out.into_iter().collect()
}

fn is_test_file(path: &str) -> bool {
    path.ends_with("/tests.rs") || path.split('/').any(|part| part == "tests")
}

/// Lines (1-based) where the code names `krate` as a crate: `krate::…` not behind `::`, or
/// `use krate` / `extern crate krate`.
fn names_crate(code: &str, krate: &str) -> Vec<usize> {
    let mut lines = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let mut hit = false;
        for (at, _) in line.match_indices(krate) {
            let before = line[..at].trim_end();
            let after = &line[at + krate.len()..];
            let prev = line[..at].chars().next_back().unwrap_or(' ');
            let next = after.chars().next().unwrap_or(' ');
            if is_ident(prev) || is_ident(next) || before.ends_with("::") {
                continue;
            }
            if after.trim_start().starts_with("::")
                || before.ends_with("use")
                || before.ends_with("extern crate")
            {
                hit = true;
            }
        }
        if hit {
            lines.push(n + 1);
        }
    }
    lines
}

#[test]
fn io_crates_are_named_by_their_adapter_only() {
    type Owns = fn(&str) -> bool;
    let owners: [(&str, Owns); 5] = [
        ("lapin", |p| p.starts_with("worker/src/rabbitmq/")),
        ("bollard", |p| p == "worker/src/sandbox/docker.rs"),
        ("redis", |p| {
            p.starts_with("coordinator/src/store/redis")
                || p == "worker/src/quota/redis_ledger.rs"
                || p == "worker/src/redis_link.rs"
        }),
        ("object_store", |p| p == "worker/src/blobs.rs"),
        ("git2", |p| p.starts_with("worker/src/git")),
    ];
    let mut bad = Vec::new();
    for (path, text) in sources() {
        if is_test_file(&path) {
            continue;
        }
        let code = without_test_items(&code_only(&text));
        for (krate, owns) in owners {
            if owns(&path) {
                continue;
            }
            for line in names_crate(&code, krate) {
                bad.push(format!("{path}:{line}: names `{krate}`"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "only an adapter names its crate (callers use the port's own error kinds):\n{}",
        bad.join("\n")
    );
}

#[test]
fn shared_depends_on_no_io_crate() {
    const IO: [&str; 7] = [
        "tokio",
        "lapin",
        "redis",
        "object_store",
        "git2",
        "reqwest",
        "bollard",
    ];
    let manifest = std::fs::read_to_string(root().join("shared/Cargo.toml")).unwrap();
    let mut section = String::new();
    let mut bad = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        let key = line
            .split(['=', '.'])
            .next()
            .unwrap_or("")
            .trim()
            .trim_matches('"');
        let dep_section = section.contains("dependencies");
        // `[dependencies.tokio]` names it in the header.
        let header_dep = IO
            .iter()
            .find(|d| section.trim_end_matches(']').ends_with(&format!(".{d}")));
        if dep_section && IO.contains(&key) {
            bad.push(format!("{section} {key}"));
        } else if let Some(d) = header_dep.filter(|_| dep_section && line.is_empty()) {
            bad.push(format!("{section} {d}"));
        }
    }
    assert!(
        bad.is_empty(),
        "shared does no I/O, so it depends on no I/O crate: {bad:?}"
    );
}

#[test]
fn no_complexity_allowances() {
    let mut bad = Vec::new();
    for (path, text) in sources() {
        let code = code_only(&text);
        for (n, line) in code.lines().enumerate() {
            for lint in ["clippy::type_complexity", "clippy::too_many_arguments"] {
                if line.contains(lint) {
                    bad.push(format!("{path}:{}: allows {lint}", n + 1));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "name the type or pass a struct instead of allowing the lint:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_scanner_reads_code_not_comments_strings_or_tests() {
    let src = r##"
// redis::Client in a comment
/* lapin::x /* nested */ still */
let s = "object_store::Error";
let r = r#"git2::Repo "quoted" "#;
let c = '{';
use crate::store::redis::RedisRunStore;
fn f<'a>(x: &'a str) -> git2::Oid { todo() }
use bollard;
#[cfg(test)]
mod tests {
    fn g() { let _ = lapin::options::X; }
}
#[cfg(test)]
use redis::AsyncCommands;
let e = redis ::cmd("GET");
"##;
    let code = without_test_items(&code_only(src));
    assert!(names_crate(&code, "lapin").is_empty(), "{code}");
    assert!(names_crate(&code, "object_store").is_empty());
    assert_eq!(names_crate(&code, "git2"), vec![8]);
    assert_eq!(names_crate(&code, "bollard"), vec![9]);
    assert_eq!(names_crate(&code, "redis"), vec![16]);
    assert!(is_test_file("worker/src/engine/tests.rs"));
    assert!(is_test_file("worker/src/tests/x.rs"));
    assert!(!is_test_file("worker/src/testreport.rs"));
}

/// Rooms stay small enough to read: no source file of shared, coordinator or worker is over
/// `MAX_LINES` (ARCHITECTURE.md's code map names the rooms).
#[test]
fn no_source_file_is_over_six_hundred_lines() {
    const MAX_LINES: usize = 600;
    let big: Vec<String> = sources()
        .into_iter()
        .filter_map(|(path, text)| {
            let n = text.lines().count();
            (n > MAX_LINES).then(|| format!("{path}: {n} lines"))
        })
        .collect();
    assert!(
        big.is_empty(),
        "files over {MAX_LINES} lines:\n{}",
        big.join("\n")
    );
}

/// ARCHITECTURE.md's code map names every module of the three crates (a file or a folder
/// directly under `src/`, and every folder below), so the map cannot fall behind the tree.
#[test]
fn the_code_map_names_every_module() {
    let map = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let mut missing = Vec::new();
    for krate in ["shared", "coordinator", "worker"] {
        let src = root().join(krate).join("src");
        let mut dirs = vec![src.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("src folder").flatten() {
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().to_string();
                let key = if path.is_dir() {
                    if name == "tests" {
                        continue;
                    }
                    dirs.push(path.clone());
                    format!("{name}/")
                } else if dir == src && name != "lib.rs" && name != "main.rs" {
                    name.clone()
                } else {
                    continue;
                };
                // A folder of tests only (`raw/tests.rs`) is not a module of its own.
                let only_tests = path.is_dir()
                    && std::fs::read_dir(&path)
                        .map(|d| d.flatten().all(|e| e.file_name() == "tests.rs"))
                        .unwrap_or(false);
                if !only_tests && !map.contains(&key) {
                    missing.push(format!("{krate}/src/…/{key}"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not in ARCHITECTURE.md's code map:\n{}",
        missing.join("\n")
    );
}
