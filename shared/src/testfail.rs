//! Structured failures parsed from test-runner output: pytest (with `-rA` or `-rf`, Hypothesis
//! counterexamples included) and `cargo test` (proptest counterexamples included).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TestFailure {
    pub name: String,
    /// `assertion`, `error`, `panic`, `collection` or `timeout`.
    pub kind: String,
    pub message: String,
    pub counterexample: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TestReport {
    pub runner: String,
    pub passed: Vec<String>,
    pub failures: Vec<TestFailure>,
}

/// Picks the parser from the output's shape.
pub fn parse(output: &str) -> TestReport {
    if output.contains("test result:")
        || output
            .lines()
            .any(|l| l.starts_with("running ") && l.ends_with(" tests"))
    {
        parse_cargo(output)
    } else {
        parse_pytest(output)
    }
}

fn kind_of(message: &str) -> &'static str {
    if message.starts_with("AssertionError") || message.starts_with("assert ") {
        "assertion"
    } else if message.contains("Timeout") {
        "timeout"
    } else {
        "error"
    }
}

/// pytest prefixes error lines with `E   `.
fn strip_e(line: &str) -> &str {
    let t = line.trim_start();
    match t.strip_prefix('E') {
        Some(rest) if rest.starts_with(' ') => rest.trim_start(),
        _ => t,
    }
}

pub fn parse_pytest(output: &str) -> TestReport {
    let mut report = TestReport {
        runner: "pytest".into(),
        ..Default::default()
    };
    // Counterexamples by test name, from the failure sections (`____ test_x ____`).
    let mut current: Option<String> = None;
    let mut examples: Vec<(String, String)> = Vec::new();
    let lines: Vec<&str> = output.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_end();
        let trimmed = line.trim_matches('_').trim();
        if line.starts_with("___") && line.ends_with("___") && !trimmed.is_empty() {
            current = Some(
                trimmed
                    .split('[')
                    .next()
                    .unwrap_or(trimmed)
                    .trim()
                    .to_string(),
            );
        }
        if let Some(rest) = strip_e(line).strip_prefix("Falsifying example: ") {
            let mut example = rest.to_string();
            let mut j = i + 1;
            while j < lines.len() && !example.trim_end().ends_with(')') {
                example.push('\n');
                example.push_str(strip_e(lines[j]).trim_end());
                j += 1;
            }
            if let Some(name) = &current {
                examples.push((name.clone(), example));
            }
            i = j;
            continue;
        }
        i += 1;
    }
    for line in &lines {
        let line = line.trim_end();
        let (status, rest) = if let Some(r) = line.strip_prefix("FAILED ") {
            ("FAILED", r)
        } else if let Some(r) = line.strip_prefix("ERROR ") {
            ("ERROR", r)
        } else if let Some(r) = line.strip_prefix("PASSED ") {
            ("PASSED", r)
        } else {
            continue;
        };
        let (id, message) = match rest.split_once(" - ") {
            Some((id, m)) => (id.trim(), m.trim().to_string()),
            None => (rest.trim(), String::new()),
        };
        let name = id
            .rsplit("::")
            .next()
            .unwrap_or(id)
            .split('[')
            .next()
            .unwrap_or(id)
            .to_string();
        match status {
            "PASSED" => report.passed.push(name),
            _ => {
                let kind = if status == "ERROR" && !id.contains("::") {
                    "collection"
                } else {
                    kind_of(&message)
                };
                let counterexample = examples
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, e)| e.clone());
                report.failures.push(TestFailure {
                    name,
                    kind: kind.into(),
                    message,
                    counterexample,
                });
            }
        }
    }
    report
}

pub fn parse_cargo(output: &str) -> TestReport {
    let mut report = TestReport {
        runner: "cargo".into(),
        ..Default::default()
    };
    let lines: Vec<&str> = output.lines().collect();
    let mut failed = Vec::new();
    for line in &lines {
        if let Some(rest) = line.strip_prefix("test ") {
            if let Some(name) = rest.strip_suffix(" ... ok") {
                report.passed.push(name.to_string());
            } else if let Some(name) = rest.strip_suffix(" ... FAILED") {
                failed.push(name.to_string());
            }
        }
    }
    for name in failed {
        let header = format!("---- {name} stdout ----");
        let mut message = String::new();
        let mut counterexample = None;
        if let Some(start) = lines.iter().position(|l| l.trim() == header) {
            let body: Vec<&str> = lines[start + 1..]
                .iter()
                .take_while(|l| !l.starts_with("---- ") && !l.starts_with("failures:"))
                .copied()
                .collect();
            if let Some(p) = body.iter().position(|l| l.contains("panicked at")) {
                let after: Vec<&str> = body[p + 1..]
                    .iter()
                    .take_while(|l| !l.starts_with("note:") && !l.trim().is_empty())
                    .copied()
                    .collect();
                message = after.join("\n");
                if message.is_empty() {
                    message = body[p].to_string();
                }
            }
            counterexample = body.iter().find_map(|l| {
                l.split_once("minimal failing input: ")
                    .map(|(_, e)| e.trim().to_string())
            });
        }
        let kind = if message.contains("assertion") {
            "assertion"
        } else {
            "panic"
        };
        report.failures.push(TestFailure {
            name,
            kind: kind.into(),
            message,
            counterexample,
        });
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::tests::{arb_text, cases, timed, CASE_LIMIT};
    use proptest::prelude::*;

    /// Lines of pytest and cargo-test output, with a test name or text spliced in.
    const LINES: &[&str] = &[
        "running 3 tests",
        "test {} ... ok",
        "test {} ... FAILED",
        "---- {} stdout ----",
        "thread '{}' panicked at src/lib.rs:1:1:",
        "assertion `left == right` failed",
        "minimal failing input: {}",
        "note: run with `RUST_BACKTRACE=1`",
        "failures:",
        "test result: FAILED. 1 passed; 2 failed",
        "____ {} ____",
        "______________________________",
        "E   AssertionError: {}",
        "E   Falsifying example: {}(",
        "Falsifying example: {}",
        "E       x={},",
        "E   )",
        "PASSED tests/t.py::{}",
        "FAILED tests/t.py::{} - {}",
        "ERROR tests/t.py::{}[x] - Timeout",
        "ERROR {}",
        "",
    ];

    fn arb_output() -> impl Strategy<Value = String> {
        let line =
            (prop::sample::select(LINES), arb_text()).prop_map(|(l, name)| l.replace("{}", &name));
        let line = prop_oneof![5 => line, 1 => arb_text()];
        prop::collection::vec(line, 0..40).prop_map(|ls| ls.join("\n"))
    }

    proptest! {
        #![proptest_config(cases(256))]

        /// Runner output is whatever the code under test prints: any of it is scraped, quickly.
        #[test]
        fn any_runner_output_is_scraped(output in arb_output()) {
            let (report, took) = timed(|| parse(&output));
            prop_assert!(took < CASE_LIMIT);
            for f in &report.failures {
                prop_assert!(
                    ["assertion", "error", "panic", "collection", "timeout"].contains(&f.kind.as_str())
                );
            }
        }
    }

    const PYTEST: &str = r#"
.F.E
=================================== FAILURES ===================================
______________________________ test_push_pop ______________________________

    @given(st.integers())
>   def test_push_pop(x):
E   AssertionError: assert None == 0
E   Falsifying example: test_push_pop(
E       x=0,
E   )
=========================== short test summary info ============================
PASSED tests/test_stack.py::test_empty
FAILED tests/test_stack.py::test_push_pop - AssertionError: assert None == 0
ERROR tests/test_stack.py::test_size - NameError: name 'Stack' is not defined
ERROR tests/test_broken.py
1 failed, 1 passed, 2 errors in 0.12s
"#;

    #[test]
    fn pytest_failures_are_structured_with_counterexamples() {
        let r = parse(PYTEST);
        assert_eq!(r.runner, "pytest");
        assert_eq!(r.passed, vec!["test_empty"]);
        assert_eq!(r.failures.len(), 3);
        let pp = &r.failures[0];
        assert_eq!(pp.name, "test_push_pop");
        assert_eq!(pp.kind, "assertion");
        assert_eq!(pp.message, "AssertionError: assert None == 0");
        assert!(pp.counterexample.as_deref().unwrap().contains("x=0"));
        assert_eq!(r.failures[1].kind, "error");
        assert_eq!(r.failures[2].kind, "collection");
    }

    const CARGO: &str = r#"
running 3 tests
test tests::empty ... ok
test tests::push_pop ... FAILED
test tests::size ... FAILED

failures:

---- tests::push_pop stdout ----
thread 'tests::push_pop' panicked at src/lib.rs:40:9:
assertion `left == right` failed
  left: 1
 right: 0
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace

---- tests::size stdout ----
thread 'tests::size' panicked at src/lib.rs:50:5:
Test failed: boom; minimal failing input: x = 7
note: run with `RUST_BACKTRACE=1`

failures:
    tests::push_pop
    tests::size

test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out
"#;

    #[test]
    fn cargo_test_failures_are_structured_with_counterexamples() {
        let r = parse(CARGO);
        assert_eq!(r.runner, "cargo");
        assert_eq!(r.passed, vec!["tests::empty"]);
        assert_eq!(r.failures[0].name, "tests::push_pop");
        assert_eq!(r.failures[0].kind, "assertion");
        assert!(r.failures[0].message.contains("left: 1"));
        assert_eq!(r.failures[1].counterexample.as_deref(), Some("x = 7"));
    }
}
