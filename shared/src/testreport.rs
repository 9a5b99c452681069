//! Machine-readable test reports turned into structured results, and the judges of a test run.
//!
//! Two inputs: a JUnit XML document (pytest's `--junitxml`, cargo-nextest's JUnit) and the output
//! of libtest (`cargo test`: the human `test name ... ok` lines, or its JSON lines). Both parsers
//! read hostile input: they never panic, never recurse, and reject documents with more than
//! [`MAX_CASES`] test cases or deeper than [`MAX_DEPTH`] nesting levels.
//!
//! How pytest (7.2) writes xfail and xpass in JUnit: an xfailed test has
//! `<skipped type="pytest.xfail" message="REASON"/>`; a strict xpass is a
//! `<failure message="[XPASS(strict)] REASON">`, read here as [`CaseOutcome::Xpassed`]; a
//! non-strict xpass is written as a plain passing `<testcase/>`, so it reads as
//! [`CaseOutcome::Passed`] (JUnit cannot tell it apart).
//!
//! The judges are pure: [`judge_pass`] for a run that must pass, [`judge_fail`] for tests run
//! against stubs, which must all fail.

use std::collections::{BTreeMap, BTreeSet};

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// More test cases than this in one report is an error.
pub const MAX_CASES: usize = 100_000;
/// More nested XML elements than this is an error.
pub const MAX_DEPTH: usize = 64;
/// A case's message keeps at most this many characters.
pub const MAX_MESSAGE_CHARS: usize = 500;
/// Reasons name at most this many ids.
const MAX_LISTED_IDS: usize = 10;
/// Raw text kept per failure element before the message is clipped.
const MAX_RAW_TEXT_BYTES: usize = 8 * MAX_MESSAGE_CHARS;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReportError {
    #[error("malformed xml at byte {position}: {message}")]
    Xml { position: u64, message: String },
    #[error("not a junit report: {0}")]
    NotJunit(String),
    #[error("truncated report: {0} elements left open")]
    Truncated(usize),
    #[error("a testcase has no name")]
    MissingName,
    #[error("too many test cases (more than {MAX_CASES})")]
    TooManyCases,
    #[error("xml nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("no test results and no `running N tests` line in the libtest output")]
    NoLibtestResults,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaseOutcome {
    Passed,
    Failed,
    Errored,
    Skipped,
    Xfailed,
    Xpassed,
}

impl CaseOutcome {
    /// When one test is reported twice (pytest writes a second `<testcase>` for a teardown error
    /// after a failed call), the higher rank wins.
    fn rank(self) -> u8 {
        match self {
            CaseOutcome::Passed => 0,
            CaseOutcome::Xfailed => 1,
            CaseOutcome::Skipped => 2,
            CaseOutcome::Xpassed => 3,
            CaseOutcome::Errored => 4,
            CaseOutcome::Failed => 5,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestCase {
    /// `classname::name` (JUnit, when classname is non-empty), else `name`; exact, so it can be
    /// compared across runs.
    pub id: String,
    pub outcome: CaseOutcome,
    /// At most [`MAX_MESSAGE_CHARS`] characters of the failure, error or skip message.
    pub message: String,
    pub seconds: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Every case that is not skipped.
    pub executed: usize,
    pub passed: usize,
    pub failed: usize,
    pub errored: usize,
    pub skipped: usize,
    pub xfailed: usize,
    pub xpassed: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestRunReport {
    /// `junit` or `libtest`.
    pub format: String,
    /// JUnit: one case per id (repeats merged). libtest: one case per result line, so the same
    /// name in two test binaries gives two cases with one id.
    pub cases: Vec<TestCase>,
}

impl TestRunReport {
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for case in &self.cases {
            match case.outcome {
                CaseOutcome::Passed => c.passed += 1,
                CaseOutcome::Failed => c.failed += 1,
                CaseOutcome::Errored => c.errored += 1,
                CaseOutcome::Skipped => c.skipped += 1,
                CaseOutcome::Xfailed => c.xfailed += 1,
                CaseOutcome::Xpassed => c.xpassed += 1,
            }
        }
        c.executed = self.cases.len() - c.skipped;
        c
    }

    pub fn ids(&self) -> BTreeSet<String> {
        self.cases.iter().map(|c| c.id.clone()).collect()
    }

    fn ids_with(&self, pred: impl Fn(&TestCase) -> bool) -> BTreeSet<String> {
        self.cases
            .iter()
            .filter(|c| pred(c))
            .map(|c| c.id.clone())
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Shared helpers

/// Trimmed, at most [`MAX_MESSAGE_CHARS`] characters.
fn clip(s: &str) -> String {
    let t = s.trim();
    match t.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((i, _)) => t[..i].trim_end().to_string(),
        None => t.to_string(),
    }
}

/// Appends as much of `s` as fits in `cap` bytes, on a character boundary.
fn push_capped(buf: &mut String, s: &str, cap: usize) {
    let room = cap.saturating_sub(buf.len());
    if s.len() <= room {
        buf.push_str(s);
        return;
    }
    let mut end = 0;
    for (i, ch) in s.char_indices() {
        if i + ch.len_utf8() > room {
            break;
        }
        end = i + ch.len_utf8();
    }
    buf.push_str(&s[..end]);
}

fn seconds_from(s: &str) -> f64 {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => v,
        _ => 0.0,
    }
}

// ---------------------------------------------------------------------------------------------
// JUnit

struct OpenCase {
    level: usize,
    id: String,
    seconds: f64,
    outcome: CaseOutcome,
    message: String,
}

struct OpenResult {
    level: usize,
    outcome: CaseOutcome,
    message: String,
    text: String,
}

#[derive(Default)]
struct Attrs {
    name: Option<String>,
    classname: Option<String>,
    time: Option<String>,
    kind: Option<String>,
    message: Option<String>,
}

fn xml_error(position: u64, e: impl std::fmt::Display) -> ReportError {
    ReportError::Xml {
        position,
        message: e.to_string(),
    }
}

fn read_attrs(e: &BytesStart<'_>, position: u64) -> Result<Attrs, ReportError> {
    let mut out = Attrs::default();
    for attr in e.attributes() {
        let attr = attr.map_err(|err| xml_error(position, err))?;
        let slot = match attr.key.local_name().as_ref() {
            b"name" => &mut out.name,
            b"classname" => &mut out.classname,
            b"time" => &mut out.time,
            b"type" => &mut out.kind,
            b"message" => &mut out.message,
            _ => continue,
        };
        let value = attr
            .unescape_value()
            .map_err(|err| xml_error(position, err))?;
        *slot = Some(value.into_owned());
    }
    Ok(out)
}

fn result_outcome(element: &[u8], attrs: &Attrs) -> Option<CaseOutcome> {
    let message = attrs.message.as_deref().unwrap_or("");
    match element {
        b"failure" if message.starts_with("[XPASS(strict)]") => Some(CaseOutcome::Xpassed),
        b"failure" => Some(CaseOutcome::Failed),
        b"error" => Some(CaseOutcome::Errored),
        b"skipped" if attrs.kind.as_deref() == Some("pytest.xfail") => Some(CaseOutcome::Xfailed),
        // What pytest's junitxml writes for an xpass reported as a failure.
        b"skipped" if message == "xfail-marked test passes unexpectedly" => {
            Some(CaseOutcome::Xpassed)
        }
        b"skipped" => Some(CaseOutcome::Skipped),
        _ => None,
    }
}

/// Cases in first-seen order, one per id.
#[derive(Default)]
struct CaseList {
    cases: Vec<TestCase>,
    index: BTreeMap<String, usize>,
}

impl CaseList {
    fn add(&mut self, case: TestCase) {
        match self.index.get(&case.id) {
            Some(&i) => {
                let old = &mut self.cases[i];
                old.seconds += case.seconds;
                if case.outcome.rank() > old.outcome.rank() {
                    old.outcome = case.outcome;
                    old.message = case.message;
                }
            }
            None => {
                self.index.insert(case.id.clone(), self.cases.len());
                self.cases.push(case);
            }
        }
    }
}

/// Parses a JUnit XML report (pytest `--junitxml`, xunit1 or xunit2; cargo-nextest). The root
/// must be `<testsuites>` or `<testsuite>` and at least one `<testsuite>` must appear; a
/// malformed or truncated document is an error, never an empty pass.
pub fn parse_junit(xml: &str) -> Result<TestRunReport, ReportError> {
    let mut reader = Reader::from_str(xml);
    {
        let config = reader.config_mut();
        config.check_end_names = true;
        config.allow_unmatched_ends = false;
        config.expand_empty_elements = false;
    }
    let mut depth = 0usize;
    let mut root_seen = false;
    let mut suites = 0usize;
    let mut seen_cases = 0usize;
    let mut case: Option<OpenCase> = None;
    let mut result: Option<OpenResult> = None;
    let mut list = CaseList::default();

    loop {
        let event = reader
            .read_event()
            .map_err(|e| xml_error(reader.error_position(), e))?;
        let position = reader.buffer_position();
        let (start, empty) = match event {
            Event::Start(e) => (e, false),
            Event::Empty(e) => (e, true),
            Event::End(_) => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| xml_error(position, "unmatched end tag"))?;
                close_element(depth, &mut case, &mut result, &mut list);
                continue;
            }
            Event::Text(t) => {
                if let Some(r) = result.as_mut().filter(|r| depth == r.level + 1) {
                    let text = t.unescape().map_err(|e| xml_error(position, e))?;
                    push_capped(&mut r.text, &text, MAX_RAW_TEXT_BYTES);
                }
                continue;
            }
            Event::CData(c) => {
                if let Some(r) = result.as_mut().filter(|r| depth == r.level + 1) {
                    let text = c.decode().map_err(|e| xml_error(position, e))?;
                    push_capped(&mut r.text, &text, MAX_RAW_TEXT_BYTES);
                }
                continue;
            }
            Event::Eof => break,
            Event::Comment(_) | Event::Decl(_) | Event::PI(_) | Event::DocType(_) => continue,
        };

        let level = depth;
        if level >= MAX_DEPTH {
            return Err(ReportError::TooDeep);
        }
        let local = start.local_name();
        let name = local.as_ref();
        if level == 0 {
            if root_seen {
                return Err(ReportError::NotJunit("more than one root element".into()));
            }
            root_seen = true;
            if name != b"testsuites" && name != b"testsuite" {
                return Err(ReportError::NotJunit(format!(
                    "the root element is <{}>, not <testsuites> or <testsuite>",
                    clip(&String::from_utf8_lossy(name))
                )));
            }
        }
        match name {
            b"testsuite" => suites += 1,
            b"testcase" => {
                if case.is_some() {
                    return Err(ReportError::NotJunit("a testcase inside a testcase".into()));
                }
                seen_cases += 1;
                if seen_cases > MAX_CASES {
                    return Err(ReportError::TooManyCases);
                }
                let attrs = read_attrs(&start, position)?;
                let test_name = attrs.name.unwrap_or_default();
                if test_name.is_empty() {
                    return Err(ReportError::MissingName);
                }
                let id = match attrs.classname.as_deref() {
                    Some(class) if !class.is_empty() => format!("{class}::{test_name}"),
                    _ => test_name,
                };
                case = Some(OpenCase {
                    level,
                    id,
                    seconds: attrs.time.as_deref().map(seconds_from).unwrap_or(0.0),
                    outcome: CaseOutcome::Passed,
                    message: String::new(),
                });
            }
            _ => {
                if case.as_ref().is_some_and(|c| level == c.level + 1) {
                    let attrs = read_attrs(&start, position)?;
                    if let Some(outcome) = result_outcome(name, &attrs) {
                        result = Some(OpenResult {
                            level,
                            outcome,
                            message: attrs.message.unwrap_or_default(),
                            text: String::new(),
                        });
                    }
                }
            }
        }
        if empty {
            close_element(level, &mut case, &mut result, &mut list);
        } else {
            depth += 1;
        }
    }

    if depth != 0 {
        return Err(ReportError::Truncated(depth));
    }
    if !root_seen {
        return Err(ReportError::NotJunit("no root element".into()));
    }
    if suites == 0 {
        return Err(ReportError::NotJunit("no testsuite element".into()));
    }
    Ok(TestRunReport {
        format: "junit".into(),
        cases: list.cases,
    })
}

/// The element at `level` closed.
fn close_element(
    level: usize,
    case: &mut Option<OpenCase>,
    result: &mut Option<OpenResult>,
    list: &mut CaseList,
) {
    if result.as_ref().is_some_and(|r| r.level == level) {
        if let (Some(r), Some(c)) = (result.take(), case.as_mut()) {
            if r.outcome.rank() > c.outcome.rank() {
                let message = if r.message.trim().is_empty() {
                    &r.text
                } else {
                    &r.message
                };
                c.outcome = r.outcome;
                c.message = clip(message);
            }
        }
    }
    if case.as_ref().is_some_and(|c| c.level == level) {
        if let Some(c) = case.take() {
            list.add(TestCase {
                id: c.id,
                outcome: c.outcome,
                message: c.message,
                seconds: c.seconds,
            });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// libtest

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

// ---------------------------------------------------------------------------------------------
// Judging

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassJudgement {
    pub ok: bool,
    pub reasons: Vec<String>,
    /// Frozen tests that did not run.
    pub missing: Vec<String>,
    /// Tests that ran but are not frozen.
    pub unexpected: Vec<String>,
    /// Tests whose outcome is not a pass (allowed skips excepted).
    pub not_passed: Vec<String>,
    pub counts: Counts,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailJudgement {
    pub ok: bool,
    pub reasons: Vec<String>,
    /// Tests that passed (or xpassed) although they must fail.
    pub trivial: Vec<String>,
    pub counts: Counts,
}

/// `1 test`, `3 tests`.
fn tests(n: usize) -> String {
    if n == 1 {
        "1 test".to_string()
    } else {
        format!("{n} tests")
    }
}

/// Up to [`MAX_LISTED_IDS`] ids, then how many more.
fn id_list(ids: &BTreeSet<String>) -> String {
    let mut s = ids
        .iter()
        .take(MAX_LISTED_IDS)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if ids.len() > MAX_LISTED_IDS {
        s.push_str(&format!(" and {} more", ids.len() - MAX_LISTED_IDS));
    }
    s
}

/// Pushes `"N tests <what>: ids"` when `ids` is not empty.
fn reason_for(reasons: &mut Vec<String>, ids: &BTreeSet<String>, what: &str) {
    if !ids.is_empty() {
        reasons.push(format!("{} {what}: {}", tests(ids.len()), id_list(ids)));
    }
}

/// A run that must pass: the report parsed, every frozen test ran and nothing else appeared
/// (when `frozen` is Some), nothing failed, errored, was skipped (except ids listed in
/// `allowed_skips`), xfailed or xpassed, at least one test executed, and the exit code is 0.
/// Reasons are short lowercase sentences naming counts and up to 10 ids.
pub fn judge_pass(
    report: &TestRunReport,
    exit_code: i64,
    frozen: Option<&BTreeSet<String>>,
    allowed_skips: &BTreeSet<String>,
) -> PassJudgement {
    let counts = report.counts();
    let mut reasons = Vec::new();
    if counts.executed == 0 {
        reasons.push("no test executed".to_string());
    }
    let of = |outcome: CaseOutcome| report.ids_with(|c| c.outcome == outcome);
    let failed = of(CaseOutcome::Failed);
    let errored = of(CaseOutcome::Errored);
    let skipped: BTreeSet<String> = of(CaseOutcome::Skipped)
        .into_iter()
        .filter(|id| !allowed_skips.contains(id))
        .collect();
    let xfailed = of(CaseOutcome::Xfailed);
    let xpassed = of(CaseOutcome::Xpassed);
    reason_for(&mut reasons, &failed, "failed");
    reason_for(&mut reasons, &errored, "errored");
    reason_for(&mut reasons, &skipped, "skipped");
    reason_for(&mut reasons, &xfailed, "xfailed");
    reason_for(&mut reasons, &xpassed, "xpassed");

    let mut missing = BTreeSet::new();
    let mut unexpected = BTreeSet::new();
    if let Some(frozen) = frozen {
        let ran = report.ids();
        missing = frozen.difference(&ran).cloned().collect();
        unexpected = ran.difference(frozen).cloned().collect();
        if !missing.is_empty() {
            reasons.push(format!(
                "{} of the frozen tests did not run: {}",
                missing.len(),
                id_list(&missing)
            ));
        }
        reason_for(&mut reasons, &unexpected, "ran outside the frozen set");
    }
    if exit_code != 0 {
        reasons.push(format!("the test command exited with code {exit_code}"));
    }

    let not_passed: BTreeSet<String> = report.ids_with(|c| match c.outcome {
        CaseOutcome::Passed => false,
        CaseOutcome::Skipped => !allowed_skips.contains(&c.id),
        _ => true,
    });
    PassJudgement {
        ok: reasons.is_empty(),
        reasons,
        missing: missing.into_iter().collect(),
        unexpected: unexpected.into_iter().collect(),
        not_passed: not_passed.into_iter().collect(),
        counts,
    }
}

/// pytest's closing line, e.g. `2 failed, 5 passed, 1 skipped in 0.31s` (also framed with
/// `=`): its counts by word (`passed`, `failed`, `error`/`errors`, `skipped`, `xfailed`,
/// `xpassed`, `deselected`, `warnings`...). `None` when the output has no such line. Only the
/// last one counts.
pub fn pytest_summary(output: &str) -> Option<std::collections::BTreeMap<String, usize>> {
    for line in output.lines().rev() {
        let l = line.trim().trim_matches('=').trim();
        let Some((counts, time)) = l.rsplit_once(" in ") else {
            continue;
        };
        let time = time.split_whitespace().next().unwrap_or_default();
        if !time.ends_with('s') || time.trim_end_matches('s').parse::<f64>().is_err() {
            continue;
        }
        let mut found = std::collections::BTreeMap::new();
        let mut ok = !counts.trim().is_empty();
        for item in counts.split(", ") {
            match item.trim().split_once(' ') {
                Some((n, word)) if n.parse::<usize>().is_ok() && !word.contains(' ') => {
                    *found.entry(word.to_string()).or_insert(0) += n.parse::<usize>().unwrap_or(0);
                }
                _ => ok = false,
            }
        }
        if ok {
            return Some(found);
        }
    }
    None
}

/// Tests run against stubs (the skeleton) must all fail: ok when at least one test executed,
/// none passed, none skipped/xfailed, no collection error (errored cases whose id has no `::`)
/// and the exit code is non-zero.
pub fn judge_fail(report: &TestRunReport, exit_code: i64) -> FailJudgement {
    let counts = report.counts();
    let mut reasons = Vec::new();
    if counts.executed == 0 {
        reasons.push("no test executed".to_string());
    }
    let trivial =
        report.ids_with(|c| matches!(c.outcome, CaseOutcome::Passed | CaseOutcome::Xpassed));
    let skipped = report.ids_with(|c| c.outcome == CaseOutcome::Skipped);
    let xfailed = report.ids_with(|c| c.outcome == CaseOutcome::Xfailed);
    let collection = report.ids_with(|c| c.outcome == CaseOutcome::Errored && !c.id.contains("::"));
    reason_for(&mut reasons, &trivial, "passed but must fail");
    reason_for(&mut reasons, &skipped, "skipped");
    reason_for(&mut reasons, &xfailed, "xfailed");
    if !collection.is_empty() {
        reasons.push(format!(
            "{} collection {}: {}",
            collection.len(),
            if collection.len() == 1 {
                "error"
            } else {
                "errors"
            },
            id_list(&collection)
        ));
    }
    if exit_code == 0 {
        reasons.push("the test command exited with code 0 although the tests must fail".into());
    }
    FailJudgement {
        ok: reasons.is_empty(),
        reasons,
        trivial: trivial.into_iter().collect(),
        counts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real pytest 7.2.1 output (Debian bookworm's python3-pytest, default xunit2 family):
    // passed, failed, fixture setup and teardown errors, skip, skipif, xfail, xpass (non-strict
    // and strict), parametrized, class-based and a unicode/escaped message.
    const PYTEST_STACK: &str = r##"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="2" failures="4" skipped="3" tests="15" time="0.092" timestamp="2026-11-22T05:38:12.185789" hostname="vm"><testcase classname="tests.test_stack" name="test_pass" time="0.001" /><testcase classname="tests.test_stack" name="test_fail" time="0.001"><failure message="assert [1, 2] == [1, 3]&#10;  At index 1 diff: 2 != 3&#10;  Use -v to get more diff">def test_fail():
&gt;       assert [1, 2] == [1, 3]
E       assert [1, 2] == [1, 3]
E         At index 1 diff: 2 != 3
E         Use -v to get more diff

tests/test_stack.py:8: AssertionError</failure></testcase><testcase classname="tests.test_stack" name="test_fixture_error" time="0.001"><error message="failed on setup with &quot;RuntimeError: fixture exploded&quot;">@pytest.fixture
    def broken():
&gt;       raise RuntimeError("fixture exploded")
E       RuntimeError: fixture exploded

tests/test_stack.py:12: RuntimeError</error></testcase><testcase classname="tests.test_stack" name="test_teardown_error" time="0.001"><error message="failed on teardown with &quot;ValueError: teardown boom&quot;">@pytest.fixture
    def bad_teardown():
        yield 1
&gt;       raise ValueError("teardown boom")
E       ValueError: teardown boom

tests/test_stack.py:20: ValueError</error></testcase><testcase classname="tests.test_stack" name="test_skip" time="0.001"><skipped type="pytest.skip" message="not today">/tmp/pt/tests/test_stack.py:26: not today</skipped></testcase><testcase classname="tests.test_stack" name="test_skipif" time="0.000"><skipped type="pytest.skip" message="py3 only skip">/tmp/pt/tests/test_stack.py:28: py3 only skip</skipped></testcase><testcase classname="tests.test_stack" name="test_xfail" time="0.001"><skipped type="pytest.xfail" message="known bug" /></testcase><testcase classname="tests.test_stack" name="test_xpass" time="0.000" /><testcase classname="tests.test_stack" name="test_xpass_strict" time="0.000"><failure message="[XPASS(strict)] must fail">[XPASS(strict)] must fail</failure></testcase><testcase classname="tests.test_stack" name="test_push[1]" time="0.001" /><testcase classname="tests.test_stack" name="test_push[2]" time="0.001"><failure message="assert 2 != 2">n = 2

    @pytest.mark.parametrize("n", [1, 2, "a b"])
    def test_push(n):
&gt;       assert n != 2
E       assert 2 != 2

tests/test_stack.py:46: AssertionError</failure></testcase><testcase classname="tests.test_stack" name="test_push[a b]" time="0.001" /><testcase classname="tests.test_stack.TestStack" name="test_in_class" time="0.001" /><testcase classname="tests.test_stack.TestStack" name="test_unicode" time="0.001"><failure message="assert 'héllo &lt;ünï&gt; &amp; &quot;q&quot;' == '✓ ☃ &lt;tag&gt;'&#10;  - ✓ ☃ &lt;tag&gt;&#10;  + héllo &lt;ünï&gt; &amp; &quot;q&quot;">self = &lt;tests.test_stack.TestStack object at 0x7feb2089f610&gt;

    def test_unicode(self):
&gt;       assert "héllo &lt;ünï&gt; &amp; \"q\"" == "✓ ☃ &lt;tag&gt;"
E       assert 'héllo &lt;ünï&gt; &amp; "q"' == '✓ ☃ &lt;tag&gt;'
E         - ✓ ☃ &lt;tag&gt;
E         + héllo &lt;ünï&gt; &amp; "q"

tests/test_stack.py:52: AssertionError</failure></testcase></testsuite></testsuites>"##;

    // pytest 7.2.1, a test file with a syntax error: a collection error.
    const PYTEST_COLLECTION_ERROR: &str = r##"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="0" skipped="0" tests="1" time="0.151" timestamp="2026-11-22T05:38:09.589664" hostname="vm"><testcase classname="" name="tests.test_broken" time="0.000"><error message="collection failure">/usr/lib/python3/dist-packages/_pytest/python.py:618: in _importtestmodule
    mod = import_path(self.path, mode=importmode, root=self.config.rootpath)
/usr/lib/python3/dist-packages/_pytest/pathlib.py:533: in import_path
    importlib.import_module(module_name)
/usr/lib/python3.11/importlib/__init__.py:126: in import_module
    return _bootstrap._gcd_import(name[level:], package, level)
&lt;frozen importlib._bootstrap&gt;:1206: in _gcd_import
    ???
&lt;frozen importlib._bootstrap&gt;:1178: in _find_and_load
    ???
&lt;frozen importlib._bootstrap&gt;:1149: in _find_and_load_unlocked
    ???
&lt;frozen importlib._bootstrap&gt;:690: in _load_unlocked
    ???
/usr/lib/python3/dist-packages/_pytest/assertion/rewrite.py:159: in exec_module
    source_stat, co = _rewrite_test(fn, self.config)
/usr/lib/python3/dist-packages/_pytest/assertion/rewrite.py:342: in _rewrite_test
    tree = ast.parse(source, filename=strfn)
/usr/lib/python3.11/ast.py:50: in parse
    return compile(source, filename, mode, flags,
E     File "/tmp/pt/tests/test_broken.py", line 1
E       def test_x(:
E                  ^
E   SyntaxError: invalid syntax</error></testcase></testsuite></testsuites>"##;

    // pytest 7.2.1 with `-o junit_logging=all`: a failed call plus a teardown error (two
    // `<testcase>` with one id), a module-level skip, xfail(run=False), imperative xfail.
    const PYTEST_MORE: &str = r##"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1" skipped="3" tests="4" time="0.099" timestamp="2026-11-22T05:38:25.971103" hostname="vm"><testcase classname="" name="tests.test_modskip" time="0.000"><skipped message="collection skipped">('/tmp/pt2/tests/test_modskip.py', 2, 'Skipped: whole module')</skipped></testcase><testcase classname="tests.test_more" name="test_fail_and_teardown" time="0.001"><failure message="assert 1 == 2">bad_teardown = 1

    def test_fail_and_teardown(bad_teardown):
        print("captured out")
&gt;       assert bad_teardown == 2
E       assert 1 == 2

tests/test_more.py:10: AssertionError</failure></testcase><testcase classname="tests.test_more" name="test_fail_and_teardown" time="0.000"><error message="failed on teardown with &quot;ValueError: teardown boom&quot;">@pytest.fixture
    def bad_teardown():
        yield 1
&gt;       raise ValueError("teardown boom")
E       ValueError: teardown boom

tests/test_more.py:6: ValueError</error><system-out>--------------------------------- Captured Log ---------------------------------

--------------------------------- Captured Out ---------------------------------
captured out

</system-out><system-err>--------------------------------- Captured Err ---------------------------------

</system-err></testcase><testcase classname="tests.test_more" name="test_xfail_norun" time="0.001"><skipped type="pytest.xfail" message="[NOTRUN] known bug" /><system-out>--------------------------------- Captured Log ---------------------------------

--------------------------------- Captured Out ---------------------------------

</system-out><system-err>--------------------------------- Captured Err ---------------------------------

</system-err></testcase><testcase classname="tests.test_more" name="test_imperative_xfail" time="0.001"><skipped type="pytest.xfail" message="imperative" /><system-out>--------------------------------- Captured Log ---------------------------------

--------------------------------- Captured Out ---------------------------------

</system-out><system-err>--------------------------------- Captured Err ---------------------------------

</system-err></testcase></testsuite></testsuites>"##;

    // pytest 7.2.1 with `-o junit_family=xunit1`.
    const PYTEST_XUNIT1: &str = r##"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="3" time="0.042" timestamp="2026-11-22T05:49:48.435090" hostname="vm"><testcase classname="tests.test_small" name="test_ok" file="tests/test_small.py" line="1" time="0.001" /><testcase classname="tests.test_small" name="test_bad" file="tests/test_small.py" line="3" time="0.001"><failure message="assert 1 == 2">def test_bad():
&gt;       assert 1 == 2
E       assert 1 == 2

tests/test_small.py:5: AssertionError</failure></testcase><testcase classname="tests.test_small" name="test_later" file="tests/test_small.py" line="5" time="0.001"><skipped type="pytest.xfail" message="later" /></testcase></testsuite></testsuites>"##;

    // cargo-nextest's JUnit shape (Jenkins flavour): a testsuite per binary, classname = binary
    // id, reruns and flaky runs as extra children.
    const NEXTEST: &str = r##"<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="nextest-run" tests="4" failures="1" errors="0" uuid="45c50042-482e-477e-88a2-60cfcc3eaf95" timestamp="2024-01-09T07:50:12.664+00:00" time="0.023">
    <testsuite name="nextest-tests::basic" tests="4" disabled="1" errors="0" failures="1">
        <testcase name="test_cwd" classname="nextest-tests::basic" timestamp="2024-01-09T07:50:12.665+00:00" time="0.004">
        </testcase>
        <testcase name="test_failure_assert" classname="nextest-tests::basic" timestamp="2024-01-09T07:50:12.665+00:00" time="0.004">
            <failure type="test failure">thread &apos;test_failure_assert&apos; panicked at tests/basic.rs:19:5:
assertion `left == right` failed: this is an assertion</failure>
            <rerunFailure timestamp="2024-01-09T07:50:12.670+00:00" time="0.004" type="test failure">thread &apos;test_failure_assert&apos; panicked
                <system-out>
running 1 test
test test_failure_assert ... FAILED
</system-out>
            </rerunFailure>
            <system-out><![CDATA[captured <out>]]></system-out>
        </testcase>
        <testcase name="test_flaky" classname="nextest-tests::basic" time="0.010">
            <flakyFailure type="test failure" time="0.002">first try failed</flakyFailure>
        </testcase>
        <testcase name="test_ignored" classname="nextest-tests::basic" time="0.000">
            <skipped/>
        </testcase>
    </testsuite>
</testsuites>
"##;

    // Real `cargo test` output (RUST_BACKTRACE=1 was set), stdout only.
    const LIBTEST_HUMAN: &str = r##"
running 6 tests
test tests::ignored_plain ... ignored
test tests::ignored_reason ... ignored, needs a database
test tests::panics - should panic ... ok
test tests::fails ... FAILED
test tests::passes ... ok
test tests::unicode_fail ... FAILED

failures:

---- tests::fails stdout ----

thread 'tests::fails' (18065) panicked at src/lib.rs:8:26:
assertion `left == right` failed: two is not three
  left: 2
 right: 3
stack backtrace:
   0: __rustc::rust_begin_unwind
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/panicking.rs:689:5
   1: core::panicking::panic_fmt
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/panicking.rs:80:14
   2: core::panicking::assert_failed_inner
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/panicking.rs:434:23
   3: core::panicking::assert_failed::<i32, i32>
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/panicking.rs:394:5
   4: lt::tests::fails
             at ./src/lib.rs:8:26
   5: lt::tests::fails::{{closure}}
             at ./src/lib.rs:8:23
   6: core::ops::function::FnOnce::call_once
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/ops/function.rs:250:5
   7: <fn() -> core::result::Result<(), alloc::string::String> as core::ops::function::FnOnce<()>>::call_once
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/ops/function.rs:250:5
note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.

---- tests::unicode_fail stdout ----
héllo ✓

thread 'tests::unicode_fail' (18068) panicked at src/lib.rs:12:54:
ünïcode ☃
stack backtrace:
   0: __rustc::rust_begin_unwind
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/panicking.rs:689:5
   1: core::panicking::panic_fmt
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/panicking.rs:80:14
   2: lt::tests::unicode_fail
             at ./src/lib.rs:12:57
   3: lt::tests::unicode_fail::{{closure}}
             at ./src/lib.rs:12:30
   4: core::ops::function::FnOnce::call_once
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/ops/function.rs:250:5
   5: <fn() -> core::result::Result<(), alloc::string::String> as core::ops::function::FnOnce<()>>::call_once
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/ops/function.rs:250:5
note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.


failures:
    tests::fails
    tests::unicode_fail

test result: FAILED. 2 passed; 2 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.16s

"##;

    // Real libtest JSON (`-Z unstable-options --format json --report-time`), same tests.
    const LIBTEST_JSON: &str = r##"{ "type": "suite", "event": "started", "test_count": 6 }
{ "type": "test", "event": "started", "name": "tests::fails" }
{ "type": "test", "event": "started", "name": "tests::ignored_plain" }
{ "type": "test", "name": "tests::ignored_plain", "event": "ignored" }
{ "type": "test", "event": "started", "name": "tests::ignored_reason" }
{ "type": "test", "name": "tests::ignored_reason", "event": "ignored", "message": "needs a database" }
{ "type": "test", "event": "started", "name": "tests::panics" }
{ "type": "test", "name": "tests::fails", "event": "failed", "exec_time": 0.000105567, "stdout": "\nthread 'tests::fails' (31319) panicked at src/lib.rs:8:26:\nassertion `left == right` failed: two is not three\n  left: 2\n right: 3\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n" }
{ "type": "test", "event": "started", "name": "tests::passes" }
{ "type": "test", "name": "tests::passes", "event": "ok", "exec_time": 0.000000391 }
{ "type": "test", "event": "started", "name": "tests::unicode_fail" }
{ "type": "test", "name": "tests::unicode_fail", "event": "failed", "exec_time": 0.000013295, "stdout": "héllo ✓\n\nthread 'tests::unicode_fail' (31322) panicked at src/lib.rs:12:54:\nünïcode ☃\n" }
{ "type": "test", "name": "tests::panics", "event": "ok", "exec_time": 0.000048881 }
{ "type": "suite", "event": "failed", "passed": 2, "failed": 2, "ignored": 2, "measured": 0, "filtered_out": 0, "exec_time": 0.003126387 }
"##;

    // Real `cargo test --doc` output.
    const LIBTEST_DOC: &str = r##"
running 1 test
test src/lib.rs - two (line 1) ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.12s

"##;

    fn case<'a>(report: &'a TestRunReport, id: &str) -> &'a TestCase {
        report
            .cases
            .iter()
            .find(|c| c.id == id)
            .unwrap_or_else(|| panic!("no case {id} in {:?}", report.ids()))
    }

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn report(cases: &[(&str, CaseOutcome)]) -> TestRunReport {
        TestRunReport {
            format: "junit".into(),
            cases: cases
                .iter()
                .map(|(id, outcome)| TestCase {
                    id: id.to_string(),
                    outcome: *outcome,
                    message: String::new(),
                    seconds: 0.0,
                })
                .collect(),
        }
    }

    use CaseOutcome::*;

    // ----- JUnit: pytest ------------------------------------------------------------------

    #[test]
    fn pytest_outcomes_from_real_output() {
        let r = parse_junit(PYTEST_STACK).unwrap();
        assert_eq!(r.format, "junit");
        let expect = [
            ("tests.test_stack::test_pass", Passed),
            ("tests.test_stack::test_fail", Failed),
            ("tests.test_stack::test_fixture_error", Errored),
            ("tests.test_stack::test_teardown_error", Errored),
            ("tests.test_stack::test_skip", Skipped),
            ("tests.test_stack::test_skipif", Skipped),
            ("tests.test_stack::test_xfail", Xfailed),
            ("tests.test_stack::test_xpass", Passed),
            ("tests.test_stack::test_xpass_strict", Xpassed),
            ("tests.test_stack::test_push[1]", Passed),
            ("tests.test_stack::test_push[2]", Failed),
            ("tests.test_stack::test_push[a b]", Passed),
            ("tests.test_stack.TestStack::test_in_class", Passed),
            ("tests.test_stack.TestStack::test_unicode", Failed),
        ];
        let got: Vec<(&str, CaseOutcome)> =
            r.cases.iter().map(|c| (c.id.as_str(), c.outcome)).collect();
        assert_eq!(got, expect);
        assert_eq!(
            r.counts(),
            Counts {
                executed: 12,
                passed: 5,
                failed: 3,
                errored: 2,
                skipped: 2,
                xfailed: 1,
                xpassed: 1,
            }
        );
        assert_eq!(case(&r, "tests.test_stack::test_pass").seconds, 0.001);
    }

    #[test]
    fn pytest_messages_from_real_output() {
        let r = parse_junit(PYTEST_STACK).unwrap();
        let msg = |id: &str| case(&r, id).message.clone();
        assert!(msg("tests.test_stack::test_fail").starts_with("assert [1, 2] == [1, 3]\n"));
        assert_eq!(
            msg("tests.test_stack::test_fixture_error"),
            r#"failed on setup with "RuntimeError: fixture exploded""#
        );
        assert_eq!(
            msg("tests.test_stack::test_teardown_error"),
            r#"failed on teardown with "ValueError: teardown boom""#
        );
        assert_eq!(msg("tests.test_stack::test_skip"), "not today");
        assert_eq!(msg("tests.test_stack::test_skipif"), "py3 only skip");
        assert_eq!(msg("tests.test_stack::test_xfail"), "known bug");
        assert_eq!(
            msg("tests.test_stack::test_xpass_strict"),
            "[XPASS(strict)] must fail"
        );
        assert_eq!(msg("tests.test_stack::test_pass"), "");
        assert_eq!(
            msg("tests.test_stack.TestStack::test_unicode"),
            "assert 'héllo <ünï> & \"q\"' == '✓ ☃ <tag>'\n  - ✓ ☃ <tag>\n  + héllo <ünï> & \"q\""
        );
    }

    #[test]
    fn pytest_collection_error_has_an_id_without_separator() {
        let r = parse_junit(PYTEST_COLLECTION_ERROR).unwrap();
        assert_eq!(r.cases.len(), 1);
        assert_eq!(r.cases[0].id, "tests.test_broken");
        assert_eq!(r.cases[0].outcome, Errored);
        assert_eq!(r.cases[0].message, "collection failure");
        let j = judge_fail(&r, 2);
        assert!(!j.ok);
        assert!(
            j.reasons
                .contains(&"1 collection error: tests.test_broken".to_string()),
            "{:?}",
            j.reasons
        );
        assert!(!judge_pass(&r, 2, None, &BTreeSet::new()).ok);
    }

    #[test]
    fn pytest_repeated_testcase_is_merged_and_module_skip_read() {
        let r = parse_junit(PYTEST_MORE).unwrap();
        let got: Vec<(&str, CaseOutcome)> =
            r.cases.iter().map(|c| (c.id.as_str(), c.outcome)).collect();
        assert_eq!(
            got,
            [
                ("tests.test_modskip", Skipped),
                ("tests.test_more::test_fail_and_teardown", Failed),
                ("tests.test_more::test_xfail_norun", Xfailed),
                ("tests.test_more::test_imperative_xfail", Xfailed),
            ]
        );
        assert_eq!(case(&r, "tests.test_modskip").message, "collection skipped");
        assert_eq!(
            case(&r, "tests.test_more::test_fail_and_teardown").message,
            "assert 1 == 2"
        );
        assert_eq!(
            case(&r, "tests.test_more::test_xfail_norun").message,
            "[NOTRUN] known bug"
        );
        assert_eq!(
            case(&r, "tests.test_more::test_imperative_xfail").message,
            "imperative"
        );
    }

    #[test]
    fn pytest_xunit1_family() {
        let r = parse_junit(PYTEST_XUNIT1).unwrap();
        let got: Vec<(&str, CaseOutcome)> =
            r.cases.iter().map(|c| (c.id.as_str(), c.outcome)).collect();
        assert_eq!(
            got,
            [
                ("tests.test_small::test_ok", Passed),
                ("tests.test_small::test_bad", Failed),
                ("tests.test_small::test_later", Xfailed),
            ]
        );
    }

    #[test]
    fn bare_testsuite_root() {
        let start = PYTEST_XUNIT1.find("<testsuite ").unwrap();
        let end = PYTEST_XUNIT1.find("</testsuites>").unwrap();
        let bare = &PYTEST_XUNIT1[start..end];
        assert!(bare.starts_with("<testsuite ") && bare.ends_with("</testsuite>"));
        let r = parse_junit(bare).unwrap();
        assert_eq!(r.cases.len(), 3);
        assert_eq!(r.counts().failed, 1);
    }

    #[test]
    fn legacy_xpass_skip_is_an_xpass() {
        let xml = r#"<testsuite><testcase classname="t" name="x"><skipped message="xfail-marked test passes unexpectedly"/></testcase></testsuite>"#;
        assert_eq!(parse_junit(xml).unwrap().cases[0].outcome, Xpassed);
    }

    #[test]
    fn worst_result_in_one_testcase_wins() {
        let xml = r#"<testsuite><testcase name="x"><skipped message="s"/><error message="e"/><system-out>o</system-out></testcase></testsuite>"#;
        let r = parse_junit(xml).unwrap();
        assert_eq!(r.cases[0].id, "x");
        assert_eq!(r.cases[0].outcome, Errored);
        assert_eq!(r.cases[0].message, "e");
    }

    #[test]
    fn message_falls_back_to_text_and_is_clipped() {
        let long = "é".repeat(2 * MAX_MESSAGE_CHARS);
        let xml = format!(
            r#"<testsuite><testcase name="a"><failure>  first line
second</failure></testcase><testcase name="b"><failure message="{long}"/></testcase><testcase name="c"><error><![CDATA[cdata <raw>]]></error></testcase></testsuite>"#
        );
        let r = parse_junit(&xml).unwrap();
        assert_eq!(case(&r, "a").message, "first line\nsecond");
        assert_eq!(case(&r, "b").message.chars().count(), MAX_MESSAGE_CHARS);
        assert_eq!(case(&r, "c").message, "cdata <raw>");
    }

    #[test]
    fn odd_times_become_zero() {
        let xml = r#"<testsuite><testcase name="a" time="NaN"/><testcase name="b" time="-1"/><testcase name="c" time="x"/><testcase name="d" time=" 2.5 "/></testsuite>"#;
        let r = parse_junit(xml).unwrap();
        let secs: Vec<f64> = r.cases.iter().map(|c| c.seconds).collect();
        assert_eq!(secs, [0.0, 0.0, 0.0, 2.5]);
        serde_json::to_string(&r).unwrap();
    }

    // ----- JUnit: nextest ------------------------------------------------------------------

    #[test]
    fn nextest_junit() {
        let r = parse_junit(NEXTEST).unwrap();
        let got: Vec<(&str, CaseOutcome)> =
            r.cases.iter().map(|c| (c.id.as_str(), c.outcome)).collect();
        assert_eq!(
            got,
            [
                ("nextest-tests::basic::test_cwd", Passed),
                ("nextest-tests::basic::test_failure_assert", Failed),
                ("nextest-tests::basic::test_flaky", Passed),
                ("nextest-tests::basic::test_ignored", Skipped),
            ]
        );
        assert_eq!(
            case(&r, "nextest-tests::basic::test_failure_assert").message,
            "thread 'test_failure_assert' panicked at tests/basic.rs:19:5:\nassertion `left == right` failed: this is an assertion"
        );
    }

    // ----- JUnit: rejected documents -------------------------------------------------------

    #[test]
    fn not_a_report_is_an_error() {
        for doc in [
            "",
            "   ",
            "hello world",
            "<?xml version=\"1.0\"?>",
            "<html><body>502 bad gateway</body></html>",
            "<testsuites/>",
            "<testsuites></testsuites>",
            "<testsuites><testcase name=\"a\"/></testsuites>",
            "<testsuite/><testsuite/>",
            "<testsuite><testcase name=\"a\"><testcase name=\"b\"/></testcase></testsuite>",
        ] {
            assert!(
                matches!(parse_junit(doc), Err(ReportError::NotJunit(_))),
                "{doc:?}: {:?}",
                parse_junit(doc)
            );
        }
    }

    #[test]
    fn malformed_xml_is_an_error() {
        for doc in [
            "<testsuite><testcase name=\"a\"></testsuite>",
            "<testsuite></testcase></testsuite>",
            "<testsuite><testcase name=\"a\" name=\"b\"/></testsuite>",
            "<testsuite><testcase name=\"a&bogus;\"/></testsuite>",
            "<testsuite><testcase name=\"a\"><failure>&bogus;</failure></testcase></testsuite>",
            "<testsuite><testcase name=a/></testsuite>",
            "</testsuite>",
        ] {
            assert!(
                matches!(parse_junit(doc), Err(ReportError::Xml { .. })),
                "{doc:?}: {:?}",
                parse_junit(doc)
            );
        }
    }

    #[test]
    fn every_truncation_of_a_real_report_is_an_error() {
        for sample in [PYTEST_STACK, PYTEST_MORE, NEXTEST.trim_end()] {
            for (i, _) in sample.char_indices() {
                assert!(
                    parse_junit(&sample[..i]).is_err(),
                    "prefix of {i} bytes parsed"
                );
            }
            assert!(parse_junit(sample).is_ok());
        }
        assert_eq!(
            parse_junit("<testsuites><testsuite><testcase name=\"a\"/>"),
            Err(ReportError::Truncated(2))
        );
    }

    #[test]
    fn testcase_without_name_is_an_error() {
        for doc in [
            r#"<testsuite><testcase classname="c"/></testsuite>"#,
            r#"<testsuite><testcase classname="c" name=""></testcase></testsuite>"#,
        ] {
            assert_eq!(parse_junit(doc), Err(ReportError::MissingName));
        }
    }

    #[test]
    fn too_deep_is_an_error() {
        let ok = format!(
            "<testsuites><testsuite>{}{}</testsuite></testsuites>",
            "<p>".repeat(MAX_DEPTH - 2),
            "</p>".repeat(MAX_DEPTH - 2)
        );
        assert!(parse_junit(&ok).is_ok());
        let deep = format!(
            "<testsuites><testsuite>{}{}</testsuite></testsuites>",
            "<p>".repeat(MAX_DEPTH - 1),
            "</p>".repeat(MAX_DEPTH - 1)
        );
        assert_eq!(parse_junit(&deep), Err(ReportError::TooDeep));
        let very_deep = format!("<testsuites>{}", "<p>".repeat(1_000_000));
        assert_eq!(parse_junit(&very_deep), Err(ReportError::TooDeep));
    }

    #[test]
    fn too_many_cases_is_an_error() {
        let many = |n: usize| {
            let mut s = String::from("<testsuite>");
            for i in 0..n {
                s.push_str(&format!("<testcase name=\"t{i}\"/>"));
            }
            s.push_str("</testsuite>");
            s
        };
        assert_eq!(
            parse_junit(&many(MAX_CASES)).unwrap().cases.len(),
            MAX_CASES
        );
        assert_eq!(
            parse_junit(&many(MAX_CASES + 1)),
            Err(ReportError::TooManyCases)
        );
    }

    #[test]
    fn error_messages_are_lowercase() {
        for e in [
            ReportError::Xml {
                position: 3,
                message: "x".into(),
            },
            ReportError::NotJunit("no testsuite element".into()),
            ReportError::Truncated(2),
            ReportError::MissingName,
            ReportError::TooManyCases,
            ReportError::TooDeep,
            ReportError::NoLibtestResults,
        ] {
            let s = e.to_string();
            assert!(s.starts_with(|c: char| c.is_lowercase()), "{s}");
        }
    }

    // ----- libtest -------------------------------------------------------------------------

    #[test]
    fn libtest_human_output() {
        let r = parse_libtest(LIBTEST_HUMAN).unwrap();
        assert_eq!(r.format, "libtest");
        let got: Vec<(&str, CaseOutcome)> =
            r.cases.iter().map(|c| (c.id.as_str(), c.outcome)).collect();
        assert_eq!(
            got,
            [
                ("tests::ignored_plain", Skipped),
                ("tests::ignored_reason", Skipped),
                ("tests::panics", Passed),
                ("tests::fails", Failed),
                ("tests::passes", Passed),
                ("tests::unicode_fail", Failed),
            ]
        );
        assert_eq!(
            case(&r, "tests::ignored_reason").message,
            "needs a database"
        );
        let fails = &case(&r, "tests::fails").message;
        assert!(fails.starts_with("thread 'tests::fails'"), "{fails}");
        assert!(fails.ends_with("left: 2\n right: 3"), "{fails}");
        let unicode = &case(&r, "tests::unicode_fail").message;
        assert!(unicode.ends_with("\nünïcode ☃"), "{unicode}");
        assert_eq!(r.counts().executed, 4);
    }

    #[test]
    fn libtest_json_output() {
        let r = parse_libtest(LIBTEST_JSON).unwrap();
        let human = parse_libtest(LIBTEST_HUMAN).unwrap();
        assert_eq!(r.ids(), human.ids());
        assert_eq!(r.counts(), human.counts());
        for c in &r.cases {
            let h = case(&human, &c.id);
            assert_eq!(c.outcome, h.outcome, "{}", c.id);
            // The thread id in the panic line differs between the two runs.
            let tail = |m: &str| m.lines().skip(1).map(String::from).collect::<Vec<_>>();
            assert_eq!(tail(&c.message), tail(&h.message), "{}", c.id);
            assert_eq!(c.message.is_empty(), h.message.is_empty(), "{}", c.id);
        }
        assert!(case(&r, "tests::panics").seconds > 0.0);
    }

    #[test]
    fn libtest_doc_tests_and_timings() {
        let r = parse_libtest(LIBTEST_DOC).unwrap();
        assert_eq!(r.cases.len(), 1);
        assert_eq!(r.cases[0].id, "src/lib.rs - two (line 1)");
        assert_eq!(r.cases[0].outcome, Passed);
        let timed =
            parse_libtest("test a::b ... ok <0.001s>\ntest a::c ... FAILED <0.002s>\n").unwrap();
        assert_eq!(timed.cases[0].outcome, Passed);
        assert_eq!(timed.cases[1].outcome, Failed);
    }

    #[test]
    fn libtest_zero_tests_and_no_tests() {
        let r =
            parse_libtest("\nrunning 0 tests\n\ntest result: ok. 0 passed; 0 failed\n").unwrap();
        assert!(r.cases.is_empty());
        assert_eq!(
            parse_libtest("error[E0425]: cannot find value `x`\n"),
            Err(ReportError::NoLibtestResults)
        );
        assert_eq!(parse_libtest(""), Err(ReportError::NoLibtestResults));
        // Bench lines are not test results.
        assert_eq!(
            parse_libtest("test bench_x ... bench:         123 ns/iter (+/- 4)\n"),
            Err(ReportError::NoLibtestResults)
        );
    }

    #[test]
    fn libtest_output_inside_a_failure_block_is_not_a_result() {
        let out = "running 1 test\ntest a ... FAILED\n\nfailures:\n\n---- a stdout ----\ntest inner ... ok\nthread 'a' panicked at x.rs:1:1:\nboom\n\nfailures:\n    a\n\ntest result: FAILED. 0 passed; 1 failed\n";
        let r = parse_libtest(out).unwrap();
        assert_eq!(r.ids(), set(&["a"]));
        assert_eq!(r.cases[0].message, "thread 'a' panicked at x.rs:1:1:\nboom");
    }

    #[test]
    fn libtest_too_many_cases() {
        let many: String = (0..=MAX_CASES)
            .map(|i| format!("test t{i} ... ok\n"))
            .collect();
        assert_eq!(parse_libtest(&many), Err(ReportError::TooManyCases));
    }

    // ----- judge_pass ----------------------------------------------------------------------

    #[test]
    fn pass_all_green() {
        let r = report(&[("a::x", Passed), ("a::y", Passed)]);
        let j = judge_pass(&r, 0, Some(&set(&["a::x", "a::y"])), &BTreeSet::new());
        assert!(j.ok, "{:?}", j.reasons);
        assert!(j.reasons.is_empty() && j.missing.is_empty() && j.unexpected.is_empty());
        assert!(j.not_passed.is_empty());
        assert_eq!(j.counts.passed, 2);
        // Without a frozen set too.
        assert!(judge_pass(&r, 0, None, &BTreeSet::new()).ok);
    }

    #[test]
    fn pass_missing_frozen_test() {
        let r = report(&[("a::x", Passed)]);
        let j = judge_pass(&r, 0, Some(&set(&["a::x", "a::y"])), &BTreeSet::new());
        assert!(!j.ok);
        assert_eq!(j.missing, ["a::y"]);
        assert_eq!(j.reasons, ["1 of the frozen tests did not run: a::y"]);
    }

    #[test]
    fn pass_extra_test() {
        let r = report(&[("a::x", Passed), ("a::z", Passed)]);
        let j = judge_pass(&r, 0, Some(&set(&["a::x"])), &BTreeSet::new());
        assert!(!j.ok);
        assert_eq!(j.unexpected, ["a::z"]);
        assert_eq!(j.reasons, ["1 test ran outside the frozen set: a::z"]);
    }

    #[test]
    fn pass_zero_tests() {
        let r = report(&[]);
        let j = judge_pass(&r, 0, None, &BTreeSet::new());
        assert!(!j.ok);
        assert_eq!(j.reasons, ["no test executed"]);
        // libtest's `running 0 tests`.
        let r = parse_libtest("running 0 tests\n").unwrap();
        assert!(!judge_pass(&r, 0, None, &BTreeSet::new()).ok);
    }

    #[test]
    fn pass_all_skipped() {
        let r = report(&[("a::x", Skipped), ("a::y", Skipped)]);
        let j = judge_pass(&r, 0, None, &BTreeSet::new());
        assert!(!j.ok);
        assert_eq!(
            j.reasons,
            ["no test executed", "2 tests skipped: a::x, a::y"]
        );
        assert_eq!(j.not_passed, ["a::x", "a::y"]);
        // Even when every skip is allowed, nothing executed.
        let j = judge_pass(&r, 0, None, &set(&["a::x", "a::y"]));
        assert_eq!(j.reasons, ["no test executed"]);
    }

    #[test]
    fn pass_exit_zero_with_a_failed_case() {
        let r = report(&[("a::x", Passed), ("a::y", Failed)]);
        let j = judge_pass(&r, 0, None, &BTreeSet::new());
        assert!(!j.ok);
        assert_eq!(j.reasons, ["1 test failed: a::y"]);
        assert_eq!(j.not_passed, ["a::y"]);
    }

    #[test]
    fn pass_exit_one_with_all_passed() {
        let r = report(&[("a::x", Passed)]);
        let j = judge_pass(&r, 1, None, &BTreeSet::new());
        assert!(!j.ok);
        assert_eq!(j.reasons, ["the test command exited with code 1"]);
        assert!(j.not_passed.is_empty());
    }

    #[test]
    fn pass_allowed_skip() {
        let r = report(&[("a::x", Passed), ("a::slow", Skipped)]);
        let frozen = set(&["a::x", "a::slow"]);
        let j = judge_pass(&r, 0, Some(&frozen), &set(&["a::slow"]));
        assert!(j.ok, "{:?}", j.reasons);
        assert_eq!(j.counts.skipped, 1);
        let j = judge_pass(&r, 0, Some(&frozen), &set(&["a::other"]));
        assert_eq!(j.reasons, ["1 test skipped: a::slow"]);
    }

    #[test]
    fn pass_errored_xfailed_xpassed() {
        let r = report(&[
            ("a::x", Passed),
            ("a::e", Errored),
            ("a::f", Xfailed),
            ("a::p", Xpassed),
        ]);
        let j = judge_pass(&r, 1, None, &set(&["a::f", "a::e"]));
        assert!(!j.ok);
        assert_eq!(
            j.reasons,
            [
                "1 test errored: a::e",
                "1 test xfailed: a::f",
                "1 test xpassed: a::p",
                "the test command exited with code 1",
            ]
        );
        assert_eq!(j.not_passed, ["a::e", "a::f", "a::p"]);
    }

    #[test]
    fn pass_reasons_name_at_most_ten_ids() {
        let ids: Vec<String> = (0..12).map(|i| format!("t::{i:02}")).collect();
        let cases: Vec<(&str, CaseOutcome)> = ids.iter().map(|i| (i.as_str(), Failed)).collect();
        let j = judge_pass(&report(&cases), 1, None, &BTreeSet::new());
        assert_eq!(
            j.reasons[0],
            "12 tests failed: t::00, t::01, t::02, t::03, t::04, t::05, t::06, t::07, t::08, t::09 and 2 more"
        );
        assert_eq!(j.not_passed.len(), 12);
    }

    #[test]
    fn pass_on_real_pytest_output() {
        let r = parse_junit(PYTEST_STACK).unwrap();
        let j = judge_pass(&r, 1, Some(&r.ids()), &BTreeSet::new());
        assert!(!j.ok);
        assert_eq!(j.not_passed.len(), 9);
        assert!(j.missing.is_empty() && j.unexpected.is_empty());
    }

    // ----- judge_fail ----------------------------------------------------------------------

    #[test]
    fn fail_all_failing() {
        let r = report(&[("a::x", Failed), ("a::y", Failed), ("a::z", Errored)]);
        let j = judge_fail(&r, 1);
        assert!(j.ok, "{:?}", j.reasons);
        assert!(j.trivial.is_empty());
        assert_eq!(j.counts.executed, 3);
    }

    #[test]
    fn fail_trivial_pass_and_xpass() {
        let r = report(&[("a::x", Failed), ("a::y", Passed), ("a::z", Xpassed)]);
        let j = judge_fail(&r, 1);
        assert!(!j.ok);
        assert_eq!(j.trivial, ["a::y", "a::z"]);
        assert_eq!(j.reasons, ["2 tests passed but must fail: a::y, a::z"]);
    }

    #[test]
    fn fail_zero_tests() {
        let j = judge_fail(&report(&[]), 5);
        assert!(!j.ok);
        assert_eq!(j.reasons, ["no test executed"]);
    }

    #[test]
    fn fail_skipped_and_xfailed() {
        let r = report(&[("a::x", Failed), ("a::s", Skipped), ("a::f", Xfailed)]);
        let j = judge_fail(&r, 1);
        assert!(!j.ok);
        assert_eq!(j.reasons, ["1 test skipped: a::s", "1 test xfailed: a::f"]);
        let j = judge_fail(&report(&[("a::s", Skipped)]), 1);
        assert_eq!(j.reasons, ["no test executed", "1 test skipped: a::s"]);
    }

    #[test]
    fn fail_collection_error() {
        let r = report(&[("a::x", Failed), ("tests.test_x", Errored)]);
        let j = judge_fail(&r, 2);
        assert!(!j.ok);
        assert_eq!(j.reasons, ["1 collection error: tests.test_x"]);
    }

    #[test]
    fn fail_exit_zero() {
        let j = judge_fail(&report(&[("a::x", Failed)]), 0);
        assert!(!j.ok);
        assert_eq!(
            j.reasons,
            ["the test command exited with code 0 although the tests must fail"]
        );
    }

    #[test]
    fn fail_on_real_outputs() {
        // The pytest sample has passing tests, skips and an xfail.
        let r = parse_junit(PYTEST_STACK).unwrap();
        let j = judge_fail(&r, 1);
        assert!(!j.ok);
        assert_eq!(
            j.trivial,
            [
                "tests.test_stack.TestStack::test_in_class",
                "tests.test_stack::test_pass",
                "tests.test_stack::test_push[1]",
                "tests.test_stack::test_push[a b]",
                "tests.test_stack::test_xpass",
                "tests.test_stack::test_xpass_strict",
            ]
        );
        let r = parse_libtest(LIBTEST_HUMAN).unwrap();
        let j = judge_fail(&r, 101);
        assert_eq!(j.trivial, ["tests::panics", "tests::passes"]);
    }

    #[test]
    fn judgements_serialize_snake_case() {
        let r = parse_junit(PYTEST_STACK).unwrap();
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["cases"][6]["outcome"], "xfailed");
        let back: TestRunReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, r);
        let j = serde_json::to_value(judge_fail(&r, 1)).unwrap();
        assert!(j["counts"]["xpassed"].is_number());
        let p = serde_json::to_value(judge_pass(&r, 1, None, &BTreeSet::new())).unwrap();
        assert!(p["not_passed"].is_array());
    }

    // ----- hostile input -------------------------------------------------------------------

    mod fuzz {
        use super::super::{parse_junit, parse_libtest};
        use proptest::prelude::*;

        const XML_TOKENS: &[&str] = &[
            "<?xml version=\"1.0\" encoding=\"utf-8\"?>",
            "<testsuites>",
            "</testsuites>",
            "<testsuites/>",
            "<testsuite name=\"pytest\" tests=\"3\">",
            "<testsuite>",
            "</testsuite>",
            "<testcase classname=\"tests.t\" name=\"test_a[1]\" time=\"0.001\">",
            "<testcase name=\"b\" time=\"1e400\"/>",
            "<testcase classname=\"\" name=\"tests.t\">",
            "<testcase>",
            "</testcase>",
            "<failure message=\"assert 1 == 2&#10;x\">",
            "<failure message=\"[XPASS(strict)] r\"/>",
            "</failure>",
            "<error message=\"collection failure\">",
            "</error>",
            "<skipped type=\"pytest.xfail\" message=\"m\"/>",
            "<skipped type=\"pytest.skip\">",
            "</skipped>",
            "<system-out>",
            "</system-out>",
            "<rerunFailure>",
            "</rerunFailure>",
            "<![CDATA[ <x> ]]>",
            "<!-- c -->",
            "<!DOCTYPE x [<!ENTITY a \"aaaa\">]>",
            "&a;",
            "&amp;",
            "&#x0;",
            "&#1114112;",
            "&lt;",
            "é☃",
            "\"",
            "'",
            "<",
            ">",
            "/>",
            "=",
            " ",
            "\n",
            "&",
            "test a::b ... ok\n",
            "test c ... FAILED\n",
            "running 2 tests\n",
            "failures:\n",
            "---- c stdout ----\n",
            "{\"type\":\"test\",\"event\":\"failed\",\"name\":\"c\",\"stdout\":\"thread 'c' panicked\"}\n",
            "{\"type\":\"suite\",\"event\":\"started\"}\n",
            "{\"type\":\"test\",\"event\":\"ok\",\"name\":\"d\",\"exec_time\":-1}\n",
            "[[[[[[[[[[[[[[[[",
        ];

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn arbitrary_strings_never_panic(s in ".*") {
                let _ = parse_junit(&s);
                let _ = parse_libtest(&s);
            }

            #[test]
            fn xml_ish_strings_never_panic(
                parts in prop::collection::vec(prop::sample::select(XML_TOKENS), 0..60)
            ) {
                let s = parts.concat();
                let _ = parse_junit(&s);
                let _ = parse_libtest(&s);
            }

            #[test]
            fn mutated_real_reports_never_panic(
                cut in 0usize..4000, insert in ".{0,8}", which in 0usize..3
            ) {
                let sample = [super::PYTEST_STACK, super::NEXTEST, super::LIBTEST_HUMAN][which];
                let mut at = cut.min(sample.len());
                while !sample.is_char_boundary(at) {
                    at -= 1;
                }
                let s = format!("{}{}{}", &sample[..at], insert, &sample[at..]);
                let _ = parse_junit(&s);
                let _ = parse_libtest(&s);
            }
        }
    }

    #[test]
    fn pytest_closing_lines_are_read() {
        let s = pytest_summary("....\n1 failed, 3 passed in 0.29s\n").unwrap();
        assert_eq!((s["failed"], s["passed"]), (1, 3));
        let s = pytest_summary("===== 2 passed, 1 skipped, 1 xfailed in 1.02s =====\n").unwrap();
        assert_eq!((s["passed"], s["skipped"], s["xfailed"]), (2, 1, 1));
        assert!(pytest_summary("nothing in here\n").is_none());
        assert!(pytest_summary("").is_none());
        // The last closing line wins.
        let s = pytest_summary("5 passed in 1.0s\n1 failed in 0.1s\n").unwrap();
        assert_eq!(s.get("passed"), None);
    }
}
