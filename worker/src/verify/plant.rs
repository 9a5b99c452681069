//! What the harness plants among a Python run's tests before it starts, and takes away after:
//! must-fail twins (copies of real tests with an expected value changed, under fresh names, in
//! the same files) and the spec's own checks (`shared::speccheck`). Code under test cannot
//! tell them from the tests it is judged by, so anything that bends failing assertions into
//! passes bends the twins too, and anything that special-cases the tests' inputs meets the
//! spec's checks. The files are given back byte for byte after the run.

use crate::safe_fs;
use shared::speccheck::{self, Planted, SpecChecks};
use std::collections::BTreeSet;
use std::path::Path;
use tree_sitter::{Node, Parser};

/// At most this many twins per test file (each doubles one real test's cost).
const TWINS_PER_FILE: usize = 3;
/// Test files read for planting (the rest run untouched).
const MAX_FILES: usize = 20;
const FILE_CAP: usize = 1 << 20;
/// Literals harvested from the tests and examples for the properties' draws.
const MAX_LITERALS: usize = 200;

/// What was planted in one run.
#[derive(Clone, Debug, Default)]
pub struct Planting {
    /// Files changed, with their bytes before.
    originals: Vec<(String, Vec<u8>)>,
    /// Twin functions' names: every one must be reported failing.
    pub twins: BTreeSet<String>,
    /// The spec's checks as planted.
    pub spec: Vec<Planted>,
    /// The literals the properties mix in (a JSON list of ints and strings, which Python reads
    /// as the same list literal).
    pub literals: String,
}

impl Planting {
    /// Whether a report case is one of ours.
    pub fn owns(&self, case_id: &str) -> bool {
        let f = function_of(case_id);
        self.twins.contains(f) || self.spec.iter().any(|p| p.function == f)
    }
}

/// The function of a JUnit case id: `tests/test_x.py::test_y[1]` -> `test_y`.
pub fn function_of(case_id: &str) -> &str {
    let last = case_id.rsplit("::").next().unwrap_or(case_id);
    let last = last.rsplit('.').next().unwrap_or(last);
    last.split('[').next().unwrap_or(last)
}

fn parser() -> Result<Parser, String> {
    let mut p = Parser::new();
    p.set_language(&tree_sitter_python::LANGUAGE.into())
        .map_err(|e| e.to_string())?;
    Ok(p)
}

fn text<'a>(n: Node<'_>, src: &'a str) -> &'a str {
    &src[n.byte_range()]
}

/// Whether Python source parses (a check's code, as the body of a function).
pub fn parses(code: &str) -> bool {
    let body: String = code.lines().map(|l| format!("    {l}\n")).collect();
    parser()
        .ok()
        .and_then(|mut p| p.parse(format!("def f():\n{body}"), None))
        .is_some_and(|t| !t.root_node().has_error())
}

/// The top-level test function of `node` (bare or decorated), with its decorators' text.
fn test_function<'t>(node: Node<'t>, src: &str) -> Option<(Node<'t>, String)> {
    let (def, decorators) = match node.kind() {
        "function_definition" => (node, String::new()),
        "decorated_definition" => {
            let def = node.child_by_field_name("definition")?;
            (def, src[node.start_byte()..def.start_byte()].to_string())
        }
        _ => return None,
    };
    let name = text(def.child_by_field_name("name")?, src);
    (def.kind() == "function_definition" && name.starts_with("test")).then_some((def, decorators))
}

/// A twin of one test: its first top-level `assert x == y` with `y` changed so it cannot
/// hold. `None` when the test has no such assertion, or something before it may end the test
/// early (a return, a yield, a skip) or its decorators skip or expect failure.
fn twin_of(def: Node<'_>, decorators: &str, src: &str, name: &str) -> Option<String> {
    if ["skip", "xfail"].iter().any(|w| decorators.contains(w)) {
        return None;
    }
    let body = def.child_by_field_name("body")?;
    let mut c = body.walk();
    let mut target = None;
    for stmt in body.named_children(&mut c) {
        if stmt.kind() == "assert_statement" {
            let cmp = stmt.named_child(0)?;
            let eq = cmp.kind() == "comparison_operator"
                && cmp.named_child_count() == 2
                && text(cmp, src).contains("==")
                && !text(cmp, src).contains("!=");
            if eq {
                target = Some(cmp.named_child(1)?);
                break;
            }
        }
    }
    let right = target?;
    let before = &src[body.start_byte()..right.start_byte()];
    if ["return", "yield", "skip", "xfail", "exit"]
        .iter()
        .any(|w| before.contains(w))
    {
        return None;
    }
    let old_name = def.child_by_field_name("name")?;
    let mut out = String::from(decorators);
    out.push_str(&src[def.start_byte()..old_name.start_byte()]);
    out.push_str(name);
    out.push_str(&src[old_name.end_byte()..right.start_byte()]);
    out.push_str(&format!(
        "({}, {})",
        text(right, src),
        speccheck::py_str(name)
    ));
    out.push_str(&src[right.end_byte()..def.end_byte()]);
    Some(out)
}

/// Twins for a test file's source: the text to append and the twins' names. One twin with a
/// plain failing assertion is always added, so every file has a failure it must show.
pub fn twins(src: &str, nonce: &str, file_index: usize) -> Result<(String, Vec<String>), String> {
    let tree = parser()?
        .parse(src, None)
        .ok_or("the parser gave no tree")?;
    if tree.root_node().has_error() {
        return Err("the test file does not parse".into());
    }
    let mut out = String::from("\n\n");
    let mut names = Vec::new();
    let root = tree.root_node();
    let mut c = root.walk();
    for node in root.named_children(&mut c) {
        if names.len() >= TWINS_PER_FILE {
            break;
        }
        let Some((def, decorators)) = test_function(node, src) else {
            continue;
        };
        let orig = def
            .child_by_field_name("name")
            .map(|n| text(n, src))
            .unwrap_or("test");
        let name = speccheck::planted_name(orig, nonce, file_index * 1000 + names.len());
        if let Some(t) = twin_of(def, &decorators, src, &name) {
            out.push_str(&t);
            out.push_str("\n\n\n");
            names.push(name);
        }
    }
    let name = speccheck::planted_name("values_agree", nonce, file_index * 1000 + 999);
    let h = shared::hashing::sha256_hex(name.as_bytes());
    let n = u32::from_str_radix(&h[..6], 16).unwrap_or(7);
    out.push_str(&format!("def {name}():\n    assert {n} == {}\n", n + 1));
    names.push(name);
    Ok((out, names))
}

/// Integer and string literals of a Python source, for the properties' draws.
fn literals_of(src: &str, into: &mut BTreeSet<String>) {
    let Ok(Some(tree)) = parser().map(|mut p| p.parse(src, None)) else {
        return;
    };
    let mut stack = vec![tree.root_node()];
    while let Some(n) = stack.pop() {
        if into.len() >= MAX_LITERALS {
            return;
        }
        match n.kind() {
            "integer" => {
                if let Ok(v) = text(n, src).replace('_', "").parse::<i64>() {
                    into.insert(v.to_string());
                }
            }
            "string" if text(n, src).len() <= 80 => {
                let t = text(n, src);
                let plain = t
                    .strip_prefix('\'')
                    .and_then(|s| s.strip_suffix('\''))
                    .or_else(|| t.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
                    .filter(|s| !s.contains(['\\', '\'', '"', '{']));
                if let Some(s) = plain {
                    into.insert(speccheck::py_str(s));
                }
            }
            _ => {
                let mut c = n.walk();
                stack.extend(n.children(&mut c));
            }
        }
    }
}

/// The test files a run names: `.py` files as given, folders walked for `test_*.py` and
/// `*_test.py` (no link followed); globs are not planted in.
pub fn test_files(root: &Path, test_paths: &[String]) -> Vec<String> {
    let mut out = BTreeSet::new();
    for p in test_paths.iter().filter(|p| !p.contains(['*', '?', '['])) {
        let p = p.trim_end_matches('/');
        if p.ends_with(".py") {
            out.insert(p.to_string());
            continue;
        }
        let prefix = if p.is_empty() || p == "." {
            String::new()
        } else {
            format!("{p}/")
        };
        let keep = |rel: &str| {
            let file = rel.rsplit('/').next().unwrap_or(rel);
            rel.starts_with(&prefix)
                && file.ends_with(".py")
                && (file.starts_with("test_") || file.ends_with("_test.py"))
        };
        if let Ok((files, _)) = safe_fs::regular_files_where(root, keep, MAX_FILES, 20 << 20) {
            out.extend(files.into_iter().map(|(rel, _)| rel));
        }
    }
    out.into_iter().take(MAX_FILES).collect()
}

/// Plants twins in every test file and the spec's checks in the first; host side, before the
/// run. A file that cannot be read or parsed is left alone (its run shows why).
pub fn plant(
    root: &Path,
    files: &[String],
    checks: Option<&SpecChecks>,
    nonce: &str,
    seed: u64,
) -> Result<Planting, String> {
    let mut planting = Planting::default();
    let mut literals = BTreeSet::new();
    let mut sources = Vec::new();
    for f in files {
        if let Ok(src) = safe_fs::read_text_within(root, f, FILE_CAP) {
            literals_of(&src, &mut literals);
            sources.push((f.clone(), src));
        }
    }
    if let Some(c) = checks {
        literals_of(&c.setup, &mut literals);
        for (_, check) in c.each() {
            literals_of(&check.check, &mut literals);
        }
    }
    planting.literals = format!(
        "[{}]",
        literals.iter().cloned().collect::<Vec<_>>().join(", ")
    );
    for (i, (f, src)) in sources.iter().enumerate() {
        let Ok((mut extra, names)) = twins(src, nonce, i) else {
            continue;
        };
        if i == 0 {
            if let Some(c) = checks {
                let (spec_src, planted) =
                    speccheck::planted_source(c, nonce, seed, &planting.literals);
                extra.push_str(&spec_src);
                planting.spec = planted;
            }
        }
        let mut bytes = src.clone().into_bytes();
        if !src.ends_with('\n') {
            bytes.push(b'\n');
        }
        bytes.extend_from_slice(extra.as_bytes());
        planting
            .originals
            .push((f.clone(), src.clone().into_bytes()));
        safe_fs::write_beneath(root, f, &bytes).map_err(|e| format!("planting in {f}: {e}"))?;
        planting.twins.extend(names);
    }
    Ok(planting)
}

/// Gives the planted files back their bytes.
pub fn restore(root: &Path, planting: &Planting) -> Result<(), String> {
    for (f, bytes) in &planting.originals {
        safe_fs::write_beneath(root, f, bytes).map_err(|e| format!("restoring {f}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TESTS: &str = "from calc import multiply\n\n\ndef test_multiply():\n    x = multiply(3, 4)\n    assert x == 12\n\n\ndef test_early():\n    if True:\n        return\n    assert multiply(1, 1) == 1\n\n\n@pytest.mark.skip\ndef test_skipped():\n    assert 1 == 1\n";

    #[test]
    fn a_twin_changes_the_expected_value_of_the_first_equality() {
        let (extra, names) = twins(TESTS, "n", 0).unwrap();
        assert_eq!(
            names.len(),
            2,
            "one twin of test_multiply, one plain: {extra}"
        );
        assert!(names[0].starts_with("test_multiply_"));
        assert!(extra.contains(&format!(
            "def {}():\n    x = multiply(3, 4)\n    assert x == (12, \"{}\")",
            names[0], names[0]
        )));
        assert!(
            !extra.contains("test_early_"),
            "a test that may return early has no twin"
        );
        assert!(!extra.contains("test_skipped_"));
        let whole = format!("{TESTS}{extra}");
        assert!(parses(&whole), "the planted file parses");
    }

    #[test]
    fn literals_come_from_tests_and_checks() {
        let mut l = BTreeSet::new();
        literals_of("assert f(3, 'ab') == 13\n", &mut l);
        assert!(l.contains("3") && l.contains("13") && l.contains("\"ab\""));
    }

    #[test]
    fn case_ids_name_their_function() {
        assert_eq!(function_of("tests/test_x.py::test_y[1]"), "test_y");
        assert_eq!(function_of("tests.test_x.test_y"), "test_y");
        assert!(parses("assert 1 == 1\nx = 2"));
        assert!(!parses("assert (1 == \n"));
    }
}
