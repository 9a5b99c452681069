//! The JUnit XML parser: pytest's `--junitxml` (xunit1 and xunit2 families) and cargo-nextest's
//! JUnit, read with quick-xml as a flat stream of events (no recursion), bounded by
//! [`MAX_CASES`](super::MAX_CASES) and [`MAX_DEPTH`](super::MAX_DEPTH).

use super::{
    clip, push_capped, seconds_from, CaseOutcome, ReportError, TestCase, TestRunReport, MAX_CASES,
    MAX_DEPTH, MAX_RAW_TEXT_BYTES,
};
use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;
use std::collections::BTreeMap;

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
