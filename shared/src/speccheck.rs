//! The spec's own checks, run by the harness (pure rules; the worker runs them).
//!
//! A spec (the factory's work order, the hybrid graph's input or its types step) may name
//! examples (code with assertions, as given) and properties (a function `prop` whose annotated
//! parameters the harness draws, over inputs the agents never saw). The harness plants them
//! as tests among the real tests (random names, the same file), so code under test cannot tell
//! them apart from the tests it is judged by, and runs them once more outside the test runner.
//! A run whose tests pass over an implementation that fails a spec check does not check what the
//! spec names; a check that passes in one process and fails in the other shows code that
//! behaves one way under the runner and another outside it.
//!
//! Must-fail twins and the runner guard's record are read here too: `GuardRecord::parse`.

use serde::{Deserialize, Serialize};

pub mod declared;

/// At most this many checks of each kind are planted.
pub const MAX_CHECKS: usize = 50;
/// Cases drawn per property.
pub const PROPERTY_CASES: u32 = 100;
/// The largest check's code, in bytes.
pub const MAX_CHECK_BYTES: usize = 4096;

/// One executable check of the spec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// A short name (letters, digits, `_`).
    pub name: String,
    /// Python statements (an example) or a function `prop` (a property).
    pub check: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

/// The spec's checks, as a work order or a spec gives them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecChecks {
    /// Statements run before each check (imports of the product).
    #[serde(default)]
    pub setup: String,
    #[serde(default)]
    pub examples: Vec<Check>,
    #[serde(default)]
    pub properties: Vec<Check>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckKind {
    Example,
    Property,
}

/// A check as planted: its test function's name in this run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Planted {
    pub kind: CheckKind,
    pub name: String,
    /// The planted test function's name (unique per run).
    pub function: String,
}

impl SpecChecks {
    pub fn is_empty(&self) -> bool {
        self.examples.is_empty() && self.properties.is_empty()
    }

    /// The checks merged with `other`'s (setup lines joined, names kept apart).
    pub fn merged(mut self, other: SpecChecks) -> SpecChecks {
        if !other.setup.trim().is_empty() {
            if !self.setup.trim().is_empty() {
                self.setup.push('\n');
            }
            self.setup.push_str(&other.setup);
        }
        self.examples.extend(other.examples);
        self.properties.extend(other.properties);
        self
    }

    /// Each check with its kind, bounded by `MAX_CHECKS` per kind.
    pub fn each(&self) -> impl Iterator<Item = (CheckKind, &Check)> {
        self.examples
            .iter()
            .take(MAX_CHECKS)
            .map(|c| (CheckKind::Example, c))
            .chain(
                self.properties
                    .iter()
                    .take(MAX_CHECKS)
                    .map(|c| (CheckKind::Property, c)),
            )
    }

    /// Names and sizes checked (the syntax is the worker's to check).
    pub fn validate(&self) -> Result<(), String> {
        for (kind, c) in self.each() {
            let plain = !c.name.is_empty()
                && c.name.len() <= 64
                && c.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !plain {
                return Err(format!(
                    "the spec check name `{}` is not a plain name (letters, digits, `_`, at most 64)",
                    c.name
                ));
            }
            if c.check.len() > MAX_CHECK_BYTES || c.check.trim().is_empty() {
                return Err(format!(
                    "the spec check `{}` is empty or longer than {MAX_CHECK_BYTES} bytes",
                    c.name
                ));
            }
            if kind == CheckKind::Property && !c.check.contains("def prop(") {
                return Err(format!(
                    "the property `{}` must define a function `prop(...)` with annotated parameters",
                    c.name
                ));
            }
        }
        Ok(())
    }
}

/// A name for a planted test that reads like the tests beside it: `test_<word>_<hex>`.
pub fn planted_name(word: &str, nonce: &str, index: usize) -> String {
    let h = crate::hashing::sha256_hex(format!("{nonce}:{word}:{index}").as_bytes());
    let word: String = word
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(40)
        .collect();
    let word = word.trim_start_matches("test_").trim_matches('_');
    format!("test_{word}_{}", &h[..8])
}

fn indent(code: &str, by: &str) -> String {
    code.lines()
        .map(|l| {
            if l.trim().is_empty() {
                String::new()
            } else {
                format!("{by}{l}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A Python literal for `s`.
pub fn py_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The Python source planting `checks` as test functions (appended to a test file), and what
/// was planted. `seed` draws the properties' inputs; `literals` (a Python list literal) are
/// the visible inputs the draws mix in.
pub fn planted_source(
    checks: &SpecChecks,
    nonce: &str,
    seed: u64,
    literals: &str,
) -> (String, Vec<Planted>) {
    let mut src = String::from("\n\n");
    let mut planted = Vec::new();
    for (i, (kind, c)) in checks.each().enumerate() {
        let function = planted_name(&c.name, nonce, i);
        src.push_str(&format!("def {function}():\n"));
        if !checks.setup.trim().is_empty() {
            src.push_str(&indent(&checks.setup, "    "));
            src.push('\n');
        }
        src.push_str(&indent(&c.check, "    "));
        src.push('\n');
        if kind == CheckKind::Property {
            src.push_str(&format!(
                "    import fleet_gen\n    fleet_gen.check(prop, {seed}, {PROPERTY_CASES}, {literals})\n"
            ));
        }
        src.push_str("\n\n");
        planted.push(Planted {
            kind,
            name: c.name.clone(),
            function,
        });
    }
    (src, planted)
}

/// What the runner guard wrote: its start and end, and every sign of tampering it saw.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GuardRecord {
    pub started: bool,
    pub ended: bool,
    pub tampered: Vec<String>,
}

impl GuardRecord {
    /// Reads the record of the run with `nonce`. A line that is not the guard's (no nonce, or
    /// another) is itself a sign of tampering: only the guard and the code it watches can
    /// write there, and the guard writes only its own lines.
    pub fn parse(text: &str, nonce: &str) -> GuardRecord {
        let mut r = GuardRecord::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let mut parts = line.splitn(3, ' ');
            let (kind, n, rest) = (parts.next(), parts.next(), parts.next());
            match (kind, n == Some(nonce)) {
                (Some("start"), true) if rest.is_none() => r.started = true,
                (Some("end"), true) if rest.is_none() && r.started => r.ended = true,
                (Some("tamper"), true) => {
                    let seen = rest.unwrap_or_default().to_string();
                    // The same refusal, once (a check's setup runs per check).
                    if !r.tampered.contains(&seen) {
                        r.tampered.push(seen);
                    }
                }
                _ => r.tampered.push(format!(
                    "a line the guard did not write: {}",
                    crate::text::head(line, 200)
                )),
            }
        }
        r
    }

    /// Why the run cannot be trusted, if it cannot: tampering seen, or a guard that did not
    /// start or finish (`needs_end`: a pytest run must reach its end).
    pub fn verdict(&self, needs_end: bool) -> Option<String> {
        if !self.tampered.is_empty() {
            let shown: Vec<&str> = self.tampered.iter().take(5).map(String::as_str).collect();
            return Some(shown.join("; "));
        }
        if !self.started {
            return Some("the runner guard never started: the runner was not the harness's".into());
        }
        if needs_end && !self.ended {
            return Some(
                "the runner guard did not reach the end of the run: the process was cut short or its hooks were removed"
                    .into(),
            );
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checks() -> SpecChecks {
        SpecChecks {
            setup: "import calc".into(),
            examples: vec![Check {
                name: "three_by_four".into(),
                check: "assert calc.multiply(3, 4) == 12".into(),
                description: String::new(),
            }],
            properties: vec![Check {
                name: "commutes".into(),
                check: "def prop(a: int, b: int):\n    assert calc.multiply(a, b) == calc.multiply(b, a)".into(),
                description: String::new(),
            }],
        }
    }

    #[test]
    fn planted_checks_are_test_functions_with_fresh_names() {
        let (src, planted) = planted_source(&checks(), "n1", 42, "[3, 4]");
        assert_eq!(planted.len(), 2);
        assert!(planted[0].function.starts_with("test_three_by_four_"));
        assert!(src.contains(&format!(
            "def {}():\n    import calc\n    assert calc.multiply(3, 4) == 12\n",
            planted[0].function
        )));
        assert!(src.contains("fleet_gen.check(prop, 42, 100, [3, 4])"));
        let (_, again) = planted_source(&checks(), "n2", 42, "[]");
        assert_ne!(
            planted[0].function, again[0].function,
            "a new run, new names"
        );
    }

    #[test]
    fn bad_checks_are_refused_with_their_name() {
        let mut c = checks();
        c.properties[0].check = "assert True".into();
        assert!(c.validate().unwrap_err().contains("commutes"));
        let mut c = checks();
        c.examples[0].name = "a b".into();
        assert!(c.validate().is_err());
        assert!(checks().validate().is_ok());
    }

    #[test]
    fn the_guard_record_must_start_end_and_hold_only_its_own_lines() {
        let ok = GuardRecord::parse("start n\nend n\n", "n");
        assert_eq!(ok.verdict(true), None);
        let cut = GuardRecord::parse("start n\n", "n");
        assert!(cut.verdict(true).unwrap().contains("did not reach the end"));
        assert_eq!(cut.verdict(false), None);
        let t = GuardRecord::parse("start n\ntamper n runner changed: x\nend n\n", "n");
        assert!(t.verdict(true).unwrap().contains("runner changed: x"));
        let forged = GuardRecord::parse("start n\nend m\nend n\n", "n");
        assert!(forged.verdict(true).unwrap().contains("did not write"));
        assert!(GuardRecord::parse("", "n")
            .verdict(false)
            .unwrap()
            .contains("never started"));
    }
}
