//! A batch's reports: JSON ([`json_report`]: counts, the pass rate with its 95% Wilson
//! interval, pass@k over trials, flaky items and tests, every item) and JUnit XML
//! ([`junit_xml`]: one testcase per item and trial, for CI dashboards).

use super::state::{BatchItem, BatchState, ItemState};
use crate::time::rfc3339;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write;

/// The version of [`json_report`]'s form.
pub const REPORT_VERSION: u32 = 1;
/// z for a two-sided 95% interval.
const Z95: f64 = 1.959_963_984_540_054;

/// The 95% Wilson score interval of `successes` out of `n` (none when `n` is 0), as
/// `(low, high)` within `[0, 1]`.
pub fn wilson_interval(successes: usize, n: usize) -> Option<(f64, f64)> {
    if n == 0 {
        return None;
    }
    let n_f = n as f64;
    let p = successes.min(n) as f64 / n_f;
    let z2 = Z95 * Z95;
    let denominator = 1.0 + z2 / n_f;
    let centre = (p + z2 / (2.0 * n_f)) / denominator;
    let half = Z95 / denominator * (p * (1.0 - p) / n_f + z2 / (4.0 * n_f * n_f)).sqrt();
    Some(((centre - half).max(0.0), (centre + half).min(1.0)))
}

fn seconds_between(from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Option<f64> {
    let (from, to) = (from?, to?);
    Some((to - from).num_milliseconds().max(0) as f64 / 1000.0)
}

/// Seconds from the batch's creation to its end, or (while it runs) to the latest time an item
/// recorded.
fn wall_seconds(state: &BatchState) -> f64 {
    let end = state.finished_at.or_else(|| {
        state
            .items
            .iter()
            .flat_map(|i| [i.started_at, i.finished_at])
            .flatten()
            .max()
    });
    seconds_between(Some(state.created_at), end).unwrap_or(0.0)
}

fn item_json(item: &BatchItem) -> Value {
    json!({
        "item_id": item.item_id,
        "trial": item.trial,
        "attempt": item.attempt,
        "run_id": item.run_id,
        "state": item.state,
        "verdict": item.verdict,
        "ended_stage": item.ended_stage,
        "error": item.error,
        "infra_errors": item.infra_errors,
        "flaky_tests": item.flaky_tests,
        "cost_usd": item.cost_usd,
        "tokens": item.tokens,
        "steps": item.steps,
        "cache_hits": item.cache_hits,
        "started_at": item.started_at.as_ref().map(rfc3339),
        "finished_at": item.finished_at.as_ref().map(rfc3339),
        "seconds": seconds_between(item.started_at, item.finished_at),
    })
}

fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Per item over its trials, with `k` the batch's trials. Only judged trials (passed or
/// failed) count, as in the pass rate; `judged` says how many there were. pass@1: the share
/// that passed; pass@k: any passed; pass^k (`pass_hat_k`): all passed. Items with no judged
/// trial have none of the three and are left out of the means.
fn trials_json(state: &BatchState) -> Value {
    let mut order: Vec<&str> = Vec::new();
    let mut tally: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for item in &state.items {
        let entry = tally.entry(&item.item_id).or_insert_with(|| {
            order.push(&item.item_id);
            (0, 0)
        });
        match item.state {
            ItemState::Passed => {
                entry.0 += 1;
                entry.1 += 1;
            }
            ItemState::Failed => entry.1 += 1,
            _ => {}
        }
    }
    let (mut at_1, mut at_k, mut hat_k) = (Vec::new(), Vec::new(), Vec::new());
    let items: Vec<Value> = order
        .iter()
        .map(|id| {
            let (passed, judged) = tally[id];
            let stats = (judged > 0).then(|| {
                let s = (
                    passed as f64 / judged as f64,
                    if passed > 0 { 1.0 } else { 0.0 },
                    if passed == judged { 1.0 } else { 0.0 },
                );
                at_1.push(s.0);
                at_k.push(s.1);
                hat_k.push(s.2);
                s
            });
            json!({
                "item_id": id,
                "judged": judged,
                "passed": passed,
                "pass_at_1": stats.map(|s| s.0),
                "pass_at_k": stats.map(|s| s.1),
                "pass_hat_k": stats.map(|s| s.2),
            })
        })
        .collect();
    json!({
        "k": state.spec.trials,
        "items": items,
        "mean_pass_at_1": mean(&at_1),
        "mean_pass_at_k": mean(&at_k),
        "mean_pass_hat_k": mean(&hat_k),
    })
}

/// The batch as JSON: id, graph, labels, counts, the pass rate (passed / (passed + failed);
/// flaky, held, errored, cancelled and unfinished items left out: no verdict) with its 95% Wilson
/// interval, `flaky` (items settled flaky, and the flaky tests they list), total cost and
/// tokens, wall time, every item (a flaky one with its `flaky_tests`); with more than one trial,
/// `trials`: pass@1, pass@k and pass^k per item and their means over items.
pub fn json_report(state: &BatchState) -> Value {
    let counts = state.counts();
    let judged = counts.passed + counts.failed;
    let rate = (judged > 0).then(|| counts.passed as f64 / judged as f64);
    let interval = wilson_interval(counts.passed, judged);
    let cost_usd: f64 = state.items.iter().map(|i| i.cost_usd).sum();
    let tokens = state
        .items
        .iter()
        .fold(0u64, |sum, i| sum.saturating_add(i.tokens));
    let mut report = json!({
        "v": REPORT_VERSION,
        "batch_id": state.batch_id,
        "graph": state.graph,
        "graph_ref": state.graph_ref,
        "labels": state.spec.labels,
        "spec": state.spec,
        "created_at": rfc3339(&state.created_at),
        "finished_at": state.finished_at.as_ref().map(rfc3339),
        "finished": state.is_finished(),
        "cancelled": state.cancelled,
        "counts": counts,
        "pass_rate": {
            "passed": counts.passed,
            "judged": judged,
            "rate": rate,
            "ci95": interval.map(|(low, high)| json!({"low": low, "high": high})),
        },
        "held": {
            "items": counts.held,
            "why": "passed with suspected special cases (lines branching on the tests' literals): held for a person, not counted as passes",
        },
        "flaky": {
            "items": counts.flaky,
            "tests": state.items.iter().map(|i| i.flaky_tests.len()).sum::<usize>(),
        },
        "cost_usd": cost_usd,
        "tokens": tokens,
        "step_cache": {
            "steps": state.items.iter().map(|i| u64::from(i.steps)).sum::<u64>(),
            "hits": state.items.iter().map(|i| u64::from(i.cache_hits)).sum::<u64>(),
        },
        "wall_seconds": wall_seconds(state),
        "items": state.items.iter().map(item_json).collect::<Vec<_>>(),
    });
    if state.spec.trials > 1 {
        report["trials"] = trials_json(state);
    }
    report
}

/// `text` for XML, in an attribute or as character data: `&<>"'` as entities, tabs, newlines
/// and carriage returns as character references (so attributes keep them), and the characters
/// XML 1.0 cannot carry (the other C0 controls, U+FFFE, U+FFFF) as U+FFFD.
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' => out.push_str("&#9;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

fn case_name(state: &BatchState, item: &BatchItem) -> String {
    if state.spec.trials > 1 {
        format!("{} trial {}", item.item_id, item.trial)
    } else {
        item.item_id.clone()
    }
}

/// The batch as JUnit XML: one `<testsuite name="batch <id>">` (its counts in its attributes,
/// labels as properties) with one `<testcase classname="<graph>" name="<item>[ trial <n>]">`
/// per item and trial: nothing inside when passed, `<failure message="<verdict>
/// <ended_stage>">` (the error as text) when failed, `<error message="<error>">` (earlier
/// infrastructure errors as text) when errored, `<skipped type="flaky" message="FLAKY ...">`
/// (its flaky tests as text, one a line: no verdict) when flaky, `<skipped message="<state>"/>`
/// when cancelled, queued or running. Every attribute and text is escaped ([`xml_escape`]).
pub fn junit_xml(state: &BatchState) -> String {
    let c = state.counts();
    let skipped = c.cancelled + c.queued + c.running + c.flaky + c.held;
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" \
         time=\"{:.3}\" timestamp=\"{}\">",
        xml_escape(&format!("batch {}", state.batch_id)),
        c.total,
        c.failed,
        c.errored,
        skipped,
        wall_seconds(state),
        rfc3339(&state.created_at),
    );
    if !state.spec.labels.is_empty() {
        out.push_str("  <properties>\n");
        for (key, value) in &state.spec.labels {
            let _ = writeln!(
                out,
                "    <property name=\"{}\" value=\"{}\"/>",
                xml_escape(key),
                xml_escape(value)
            );
        }
        out.push_str("  </properties>\n");
    }
    for item in &state.items {
        let seconds = seconds_between(item.started_at, item.finished_at).unwrap_or(0.0);
        let _ = write!(
            out,
            "  <testcase classname=\"{}\" name=\"{}\" time=\"{seconds:.3}\"",
            xml_escape(&state.graph),
            xml_escape(&case_name(state, item)),
        );
        let (element, message, text) = match item.state {
            ItemState::Passed => {
                out.push_str("/>\n");
                continue;
            }
            ItemState::Flaky => {
                let _ = writeln!(
                    out,
                    ">\n    <skipped type=\"flaky\" message=\"{}\">{}</skipped>\n  </testcase>",
                    xml_escape(&format!(
                        "FLAKY: {} flaky tests, no verdict",
                        item.flaky_tests.len()
                    )),
                    xml_escape(&item.flaky_tests.join("\n")),
                );
                continue;
            }
            ItemState::Held => {
                let _ = writeln!(
                    out,
                    ">\n    <skipped type=\"held\" message=\"{}\">{}</skipped>\n  </testcase>",
                    xml_escape("HELD: passed with suspected special cases, for a person to review"),
                    xml_escape(item.error.as_deref().unwrap_or_default()),
                );
                continue;
            }
            ItemState::Failed => {
                let verdict = item.verdict.as_deref().unwrap_or("FAIL");
                let message = match &item.ended_stage {
                    Some(stage) => format!("{verdict} {stage}"),
                    None => verdict.to_string(),
                };
                ("failure", message, item.error.clone().unwrap_or_default())
            }
            ItemState::Errored => (
                "error",
                item.error
                    .clone()
                    .unwrap_or_else(|| "infrastructure error".into()),
                item.infra_errors.join("\n"),
            ),
            ItemState::Queued | ItemState::Running | ItemState::Cancelled => {
                let state_name = match item.state {
                    ItemState::Queued => "queued",
                    ItemState::Running => "running",
                    _ => "cancelled",
                };
                let _ = writeln!(
                    out,
                    ">\n    <skipped message=\"{state_name}\"/>\n  </testcase>"
                );
                continue;
            }
        };
        let _ = writeln!(
            out,
            ">\n    <{element} message=\"{}\">{}</{element}>\n  </testcase>",
            xml_escape(&message),
            xml_escape(&text),
        );
    }
    out.push_str("</testsuite>\n");
    out
}
