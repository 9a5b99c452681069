//! The libtest parser (`cargo test`): the human `test name ... ok` lines with the panic
//! messages of the failures block, or libtest's JSON lines; bounded by
//! [`MAX_CASES`](super::MAX_CASES).

use super::{
    clip, push_capped, CaseOutcome, ReportError, TestCase, TestRunReport, MAX_CASES,
    MAX_RAW_TEXT_BYTES,
};
use std::collections::BTreeMap;

/// `running 1 test`, `running 12 tests`.
fn is_running_line(line: &str) -> bool {
    let Some(rest) = line.trim().strip_prefix("running ") else {
        return false;
    };
    let Some((n, word)) = rest.split_once(' ') else {
        return false;
    };
    !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (word == "test" || word == "tests")
}

/// `test path::to::name ... ok|FAILED|ignored|ignored, reason` (a `<0.001s>` may follow).
fn human_case(line: &str) -> Option<(String, CaseOutcome, String)> {
    let rest = line.strip_prefix("test ")?;
    let (name, result) = rest.split_once(" ... ")?;
    let name = name.trim();
    let name = name.strip_suffix(" - should panic").unwrap_or(name).trim();
    if name.is_empty() {
        return None;
    }
    let result = result.trim();
    let first = result.split_whitespace().next()?;
    let (outcome, message) = match first {
        "ok" => (CaseOutcome::Passed, String::new()),
        "FAILED" => (CaseOutcome::Failed, String::new()),
        "ignored" => (CaseOutcome::Skipped, String::new()),
        _ if first.starts_with("ignored,") => {
            let reason = result.strip_prefix("ignored,").unwrap_or("");
            (CaseOutcome::Skipped, clip(reason))
        }
        _ => return None,
    };
    Some((name.to_string(), outcome, message))
}

/// `---- path::to::name stdout ----`
fn failure_header(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("---- ")?;
    let name = rest
        .strip_suffix(" stdout ----")
        .or_else(|| rest.strip_suffix(" stderr ----"))?;
    Some(name.trim())
}

/// The panic (from `thread '…' panicked at` on, when present) without the backtrace.
fn panic_message(output: &str) -> String {
    let lines: Vec<&str> = output.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("thread '") && l.contains("panicked"))
        .unwrap_or(0);
    let mut kept = String::new();
    for line in &lines[start..] {
        if line.starts_with("stack backtrace:") {
            break;
        }
        if line.starts_with("note: run with `RUST_BACKTRACE")
            || line.starts_with("note: Some details are omitted")
        {
            continue;
        }
        push_capped(&mut kept, line, MAX_RAW_TEXT_BYTES);
        push_capped(&mut kept, "\n", MAX_RAW_TEXT_BYTES);
        if kept.len() >= MAX_RAW_TEXT_BYTES {
            break;
        }
    }
    clip(&kept)
}

fn json_case(value: &serde_json::Value) -> Option<TestCase> {
    let name = value.get("name")?.as_str()?.trim();
    if name.is_empty() {
        return None;
    }
    let text = |key: &str| value.get(key).and_then(|v| v.as_str()).unwrap_or("");
    let (outcome, message) = match value.get("event")?.as_str()? {
        "ok" => (CaseOutcome::Passed, String::new()),
        "failed" => {
            let message = if text("message").trim().is_empty() {
                panic_message(text("stdout"))
            } else {
                clip(text("message"))
            };
            (CaseOutcome::Failed, message)
        }
        "ignored" => (CaseOutcome::Skipped, clip(text("message"))),
        _ => return None,
    };
    let seconds = value
        .get("exec_time")
        .and_then(|v| v.as_f64())
        .filter(|v| v.is_finite() && *v >= 0.0)
        .unwrap_or(0.0);
    Some(TestCase {
        id: name.to_string(),
        outcome,
        message,
        seconds,
    })
}

fn push_case(cases: &mut Vec<TestCase>, case: TestCase) -> Result<(), ReportError> {
    if cases.len() >= MAX_CASES {
        return Err(ReportError::TooManyCases);
    }
    cases.push(case);
    Ok(())
}

/// libtest's closing line, the last one in `output`: `test result: FAILED. 3 passed; 2 failed;
/// 0 ignored; ...` gives the passed and failed counts.
pub fn libtest_summary(output: &str) -> Option<(usize, usize)> {
    let line = output
        .lines()
        .rev()
        .find_map(|l| l.trim_end_matches('\r').strip_prefix("test result: "))?;
    let (_, counts) = line.split_once(". ")?;
    let count = |what: &str| {
        counts.split(';').find_map(|part| {
            let (n, word) = part.trim().split_once(' ')?;
            (word == what).then(|| n.parse::<usize>().ok()).flatten()
        })
    };
    Some((count("passed")?, count("failed")?))
}

/// Parses libtest output: the human per-test lines of `cargo test` (messages from the
/// `failures:` section when present) and libtest's JSON lines (`--format json`). An output with
/// neither a test line nor a `running N tests` line is an error.
pub fn parse_libtest(output: &str) -> Result<TestRunReport, ReportError> {
    let mut saw_running = false;
    let mut cases: Vec<TestCase> = Vec::new();
    let mut blocks: BTreeMap<String, String> = BTreeMap::new();
    // The failure block being read: the test's name and its output so far.
    let mut block: Option<(String, String)> = None;

    for raw in output.lines() {
        let line = raw.trim_end_matches('\r');
        if let Some((_, text)) = block.as_mut() {
            if let Some(name) = failure_header(line) {
                if let Some((done, text)) = block.replace((name.to_string(), String::new())) {
                    blocks.entry(done).or_insert(text);
                }
            } else if line == "failures:" || line.starts_with("test result:") {
                if let Some((done, text)) = block.take() {
                    blocks.entry(done).or_insert(text);
                }
            } else {
                push_capped(text, line, MAX_RAW_TEXT_BYTES);
                push_capped(text, "\n", MAX_RAW_TEXT_BYTES);
            }
            continue;
        }
        let trimmed = line.trim();
        if trimmed.starts_with('{') {
            if let Ok(value) = serde_json::from_str::<serde_json::Value>(trimmed) {
                let field = |key: &str| value.get(key).and_then(|v| v.as_str());
                match (field("type"), field("event")) {
                    (Some("suite"), Some("started")) => saw_running = true,
                    (Some("test"), _) => {
                        if let Some(case) = json_case(&value) {
                            push_case(&mut cases, case)?;
                        }
                    }
                    _ => {}
                }
                continue;
            }
        }
        if is_running_line(line) {
            saw_running = true;
        } else if let Some(name) = failure_header(line) {
            block = Some((name.to_string(), String::new()));
        } else if let Some((id, outcome, message)) = human_case(line) {
            push_case(
                &mut cases,
                TestCase {
                    id,
                    outcome,
                    message,
                    seconds: 0.0,
                },
            )?;
        }
    }
    if let Some((done, text)) = block.take() {
        blocks.entry(done).or_insert(text);
    }
    if cases.is_empty() && !saw_running {
        return Err(ReportError::NoLibtestResults);
    }
    for case in &mut cases {
        if case.outcome == CaseOutcome::Failed && case.message.is_empty() {
            if let Some(text) = blocks.get(&case.id) {
                case.message = panic_message(text);
            }
        }
    }
    Ok(TestRunReport {
        format: "libtest".into(),
        cases,
    })
}
