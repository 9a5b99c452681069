//! Claims checked against disk: names an agent's output says it wrote must be defined in the
//! files it changed, and a test that claims to exercise a function must call it. Parsing is
//! per language behind `LanguageIndex` (tree-sitter: `python.rs`, `haskell.rs`).

pub mod haskell;
pub mod policy;
mod python;

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// What a parser found in a file: definitions and, per definition, the names it calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileIndex {
    pub definitions: BTreeMap<String, BTreeSet<String>>,
    /// Declared types by name, where the language writes them apart (Haskell's `f :: T`).
    pub signatures: BTreeMap<String, String>,
}

pub trait LanguageIndex {
    /// Does this language own the file?
    fn handles(&self, path: &str) -> bool;
    fn index(&self, source: &str) -> Result<FileIndex, String>;
    /// Functions whose body is not the language's stub (Python: `raise NotImplementedError`;
    /// Haskell: `error "..."`, `error $ ...`, `undefined`); special methods (Python) and
    /// instance methods (Haskell) are part of the type's representation and exempt.
    fn not_stubbed(&self, source: &str) -> Result<Vec<String>, String>;
}

pub fn language(name: &str) -> Option<Box<dyn LanguageIndex>> {
    match name.trim().to_ascii_lowercase().as_str() {
        "python" | "py" => Some(Box::new(python::Python)),
        "haskell" | "hs" => Some(Box::new(haskell::Haskell)),
        _ => None,
    }
}

/// The adapter owning a file, by its extension (`.py`, `.hs`).
pub fn for_path(path: &str) -> Option<Box<dyn LanguageIndex>> {
    [language("python"), language("haskell")]
        .into_iter()
        .flatten()
        .find(|l| l.handles(path))
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ClaimError {
    /// `missing_definition`, `test_missing` or `test_does_not_call`.
    pub kind: String,
    pub name: String,
    pub detail: String,
}

/// A test's claim to exercise some functions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exercise {
    pub test: String,
    pub calls: Vec<String>,
}

/// Checks the claims against the changed files (path → source). Pure: no I/O.
pub fn check(
    lang: &dyn LanguageIndex,
    files: &BTreeMap<String, String>,
    defines: &[String],
    exercises: &[Exercise],
) -> Vec<ClaimError> {
    let mut all = FileIndex::default();
    let mut errors = Vec::new();
    for (path, src) in files.iter().filter(|(p, _)| lang.handles(p)) {
        match lang.index(src) {
            Ok(ix) => {
                for (name, calls) in ix.definitions {
                    all.definitions.entry(name).or_default().extend(calls);
                }
            }
            Err(e) => errors.push(ClaimError {
                kind: "unparsable_file".into(),
                name: path.clone(),
                detail: e,
            }),
        }
    }
    for name in defines {
        if !all.definitions.contains_key(name) {
            errors.push(ClaimError {
                kind: "missing_definition".into(),
                name: name.clone(),
                detail: format!("`{name}` is claimed but not defined in the changed files"),
            });
        }
    }
    for ex in exercises {
        match all.definitions.get(&ex.test) {
            None => errors.push(ClaimError {
                kind: "test_missing".into(),
                name: ex.test.clone(),
                detail: format!(
                    "test `{}` is claimed but not defined in the changed files",
                    ex.test
                ),
            }),
            Some(calls) => {
                for f in &ex.calls {
                    if !calls.contains(f) {
                        errors.push(ClaimError {
                            kind: "test_does_not_call".into(),
                            name: ex.test.clone(),
                            detail: format!(
                                "test `{}` claims to exercise `{f}` but never calls it",
                                ex.test
                            ),
                        });
                    }
                }
            }
        }
    }
    errors
}

/// The other direction: functions defined in the changed files that no claim declares (special
/// methods aside). Reported, not failed: an agent may write helpers, but the result says so.
pub fn undeclared(
    lang: &dyn LanguageIndex,
    files: &BTreeMap<String, String>,
    declared: &[String],
) -> Vec<String> {
    let mut found = BTreeSet::new();
    for (_, src) in files.iter().filter(|(p, _)| lang.handles(p)) {
        if let Ok(ix) = lang.index(src) {
            found.extend(ix.definitions.into_keys());
        }
    }
    found
        .into_iter()
        .filter(|n| !(n.starts_with("__") && n.ends_with("__")))
        .filter(|n| !declared.contains(n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(src: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("stack.py".to_string(), src.to_string()),
            ("notes.txt".into(), "def x".into()),
        ])
    }

    const SRC: &str = r#"
class Stack:
    def push(self, x):
        self.items.append(x)

def pop(stack):
    return stack.items.pop()

def test_push_pop():
    s = Stack()
    s.push(1)
    assert pop(s) == 1

def test_lazy():
    assert True
"#;

    #[test]
    fn the_adapter_is_chosen_by_language_or_by_extension() {
        assert!(language("Haskell").is_some() && language("cobol").is_none());
        assert!(for_path("src/Data/Stack.hs").is_some_and(|l| l.handles("x.hs")));
        assert!(for_path("stack.py").is_some_and(|l| l.handles("y.py")));
        assert!(for_path("notes.txt").is_none());
    }

    #[test]
    fn definitions_nobody_declared_are_reported() {
        let py = language("python").unwrap();
        let found = undeclared(
            py.as_ref(),
            &files(SRC),
            &["push".to_string(), "test_push_pop".to_string()],
        );
        assert_eq!(found, vec!["Stack", "pop", "test_lazy"]);
    }

    #[test]
    fn stubs_are_told_apart_from_bodies() {
        let py = language("python").unwrap();
        let src = r#"
class Stack:
    def __init__(self):
        self.items = []

    def push(self, x):
        """Push x."""
        raise NotImplementedError

    def pop(self):
        raise NotImplementedError()

    def size(self):
        return len(self.items)
"#;
        assert_eq!(py.not_stubbed(src).unwrap(), vec!["size"]);
    }

    #[test]
    fn claimed_names_must_be_defined() {
        let py = language("python").unwrap();
        let errs = check(
            py.as_ref(),
            &files(SRC),
            &["Stack".into(), "push".into(), "peek".into()],
            &[],
        );
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].kind, "missing_definition");
        assert_eq!(errs[0].name, "peek");
    }

    #[test]
    fn a_test_must_call_what_it_claims_to_exercise() {
        let py = language("python").unwrap();
        let ex = vec![
            Exercise {
                test: "test_push_pop".into(),
                calls: vec!["push".into(), "pop".into()],
            },
            Exercise {
                test: "test_lazy".into(),
                calls: vec!["pop".into()],
            },
            Exercise {
                test: "test_ghost".into(),
                calls: vec![],
            },
        ];
        let errs = check(py.as_ref(), &files(SRC), &[], &ex);
        let kinds: Vec<(&str, &str)> = errs
            .iter()
            .map(|e| (e.kind.as_str(), e.name.as_str()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("test_does_not_call", "test_lazy"),
                ("test_missing", "test_ghost")
            ]
        );
    }
}
