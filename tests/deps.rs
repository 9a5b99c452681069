//! What `cargo deny` would check of our dependencies that needs no network: every package comes
//! from crates.io (or is one of ours), and every license is one we accept. (Advisories need the
//! RustSec database, which this network cannot reach; see README's CI notes.)

use serde_json::Value;
use std::process::Command;

/// Licenses a dependency may carry (SPDX ids).
const ALLOWED: &[&str] = &[
    "MIT",
    "MIT-0",
    "Apache-2.0",
    "Apache-2.0 WITH LLVM-exception",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "ISC",
    "Zlib",
    "Unicode-3.0",
    "Unlicense",
    "BSL-1.0",
    "CDLA-Permissive-2.0",
];

/// Whether an SPDX expression (`A OR B`, `A AND (B OR C)`, the old `A/B`) can be satisfied
/// with allowed licenses only.
fn acceptable(expr: &str) -> bool {
    let tokens: Vec<String> = expr
        .replace('/', " OR ")
        .replace('(', " ( ")
        .replace(')', " ) ")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let mut pos = 0;
    let ok = or_expr(&tokens, &mut pos);
    ok && pos == tokens.len()
}

fn or_expr(t: &[String], pos: &mut usize) -> bool {
    let mut ok = and_expr(t, pos);
    while t.get(*pos).map(String::as_str) == Some("OR") {
        *pos += 1;
        ok |= and_expr(t, pos);
    }
    ok
}

fn and_expr(t: &[String], pos: &mut usize) -> bool {
    let mut ok = license(t, pos);
    while t.get(*pos).map(String::as_str) == Some("AND") {
        *pos += 1;
        ok &= license(t, pos);
    }
    ok
}

fn license(t: &[String], pos: &mut usize) -> bool {
    match t.get(*pos).map(String::as_str) {
        Some("(") => {
            *pos += 1;
            let ok = or_expr(t, pos);
            if t.get(*pos).map(String::as_str) == Some(")") {
                *pos += 1;
                ok
            } else {
                false
            }
        }
        Some(id) => {
            *pos += 1;
            let mut id = id.to_string();
            if t.get(*pos).map(String::as_str) == Some("WITH") {
                id = format!("{id} WITH {}", t.get(*pos + 1).cloned().unwrap_or_default());
                *pos += 2;
            }
            ALLOWED.contains(&id.as_str())
        }
        None => false,
    }
}

#[test]
fn the_license_expressions_are_read_as_spdx() {
    assert!(acceptable("MIT OR Apache-2.0"));
    assert!(acceptable("MIT/Apache-2.0"));
    assert!(acceptable("(MIT OR Apache-2.0) AND Unicode-3.0"));
    assert!(acceptable(
        "Apache-2.0 WITH LLVM-exception OR Apache-2.0 OR MIT"
    ));
    assert!(acceptable("MIT OR Apache-2.0 OR LGPL-2.1-or-later"));
    assert!(!acceptable("GPL-3.0-only"));
    assert!(!acceptable("MIT AND GPL-3.0-only"));
    assert!(!acceptable("(MIT"));
    assert!(!acceptable(""));
}

#[test]
fn dependencies_come_from_crates_io_under_accepted_licenses() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(fleet_tests::stack::workspace_root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("metadata is json");
    let mut problems = Vec::new();
    for p in meta["packages"].as_array().expect("packages") {
        let name = format!("{} {}", p["name"], p["version"]);
        match p["source"].as_str() {
            None => continue, // a crate of this workspace
            Some(s) if s.starts_with("registry+https://github.com/rust-lang/crates.io-index") => {}
            Some(s) => problems.push(format!("{name}: from {s}, not crates.io")),
        }
        match p["license"].as_str() {
            Some(l) if acceptable(l) => {}
            Some(l) => problems.push(format!("{name}: license `{l}`")),
            None => problems.push(format!("{name}: no license expression")),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
