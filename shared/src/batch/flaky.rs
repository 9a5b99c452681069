//! What a run's flaky tests mean for its batch item: the tests its test runs found flaky, and
//! whether the run ended at a test run whose verdict would have depended on the run (then the
//! item settles `Flaky`, no verdict: see [`super::state`]); and the HTML report's section
//! listing them.

use super::html::html_escape;
use crate::engine::{RunState, RunStatus};
use crate::text::head;
use serde_json::Value;
use std::collections::BTreeSet;
use std::fmt::Write;

/// An item lists at most this many flaky tests, each cut to `MAX_FLAKY_ID_CHARS` characters.
pub const MAX_FLAKY_LISTED: usize = 100;
pub const MAX_FLAKY_ID_CHARS: usize = 300;
/// The verdict of a run whose verdict would have depended on a flaky test.
pub const FLAKY_VERDICT: &str = "FLAKY";

/// The tests a run's test runs found flaky (the result's `flaky_tests` when it lists them,
/// else every job's `output.flaky_tests`), sorted, at most [`MAX_FLAKY_LISTED`] of at most
/// [`MAX_FLAKY_ID_CHARS`] characters; and whether the run failed at a job that said
/// `flaky: true` (the last failed job's output).
pub fn flaky_of(run: &RunState) -> (Vec<String>, bool) {
    let from = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|s| head(s, MAX_FLAKY_ID_CHARS))
            .collect()
    };
    let listed = run.result.as_ref().map(|r| &r["flaky_tests"]);
    let ids: BTreeSet<String> = match listed {
        Some(v @ Value::Array(_)) => from(v).into_iter().collect(),
        _ => run
            .history
            .iter()
            .flat_map(|o| from(&o.output["flaky_tests"]))
            .collect(),
    };
    let last_failed = run
        .history
        .iter()
        .rev()
        .find(|o| !o.ok && !o.worker.is_empty());
    let ended_flaky = run.status == RunStatus::Failed
        && last_failed.is_some_and(|o| o.output["flaky"] == Value::Bool(true));
    (
        ids.into_iter().take(MAX_FLAKY_LISTED).collect(),
        ended_flaky,
    )
}

/// A JSON value as HTML text: a string as it is, null as nothing, others as JSON; escaped.
fn esc(v: &Value) -> String {
    match v {
        Value::String(s) => html_escape(s),
        Value::Null => String::new(),
        other => html_escape(&other.to_string()),
    }
}

/// The HTML report's section on flaky tests, from the JSON report `r` and its `items`: how many
/// items settled flaky (no verdict) and how many flaky tests they list, then each with its tests.
pub(super) fn html_section(out: &mut String, r: &Value, items: &[Value]) {
    let listed: Vec<&Value> = items
        .iter()
        .filter(|i| i["flaky_tests"].as_array().is_some_and(|a| !a.is_empty()))
        .collect();
    let _ = writeln!(
        out,
        "<h2>flaky tests</h2>\n<p class=\"note\" id=\"flaky-count\">{} flaky items (no \
         verdict), {} flaky tests listed</p>",
        esc(&r["flaky"]["items"]),
        esc(&r["flaky"]["tests"])
    );
    if listed.is_empty() {
        return;
    }
    out.push_str(
        "<table id=\"flaky\"><thead><tr><th>item</th><th>trial</th><th>state</th>\
         <th>flaky tests</th></tr></thead><tbody>\n",
    );
    for item in listed {
        let tests: Vec<String> = item["flaky_tests"]
            .as_array()
            .into_iter()
            .flatten()
            .map(esc)
            .collect();
        let state = esc(&item["state"]);
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"st-{state}\">{state}</td>\
             <td><pre>{}</pre></td></tr>",
            esc(&item["item_id"]),
            esc(&item["trial"]),
            tests.join("\n"),
        );
    }
    out.push_str("</tbody></table>\n");
}

/// How a `Flaky` item's error starts; a JSON array of its flaky tests follows.
pub const FLAKY_ERROR_PREFIX: &str = "flaky tests, no verdict: ";

/// A flaky run's error for its batch item: [`FLAKY_ERROR_PREFIX`] and the ids as a JSON array,
/// as many as fit in [`super::state::MAX_ERROR_CHARS`] (an item's error is cut there): what a
/// person reads; the item keeps the list itself in `flaky_tests` (from the run's outcome).
pub fn flaky_error(ids: &[String]) -> String {
    let room = super::state::MAX_ERROR_CHARS - FLAKY_ERROR_PREFIX.len();
    let mut kept: Vec<&str> = Vec::new();
    let mut used = 2;
    for id in ids {
        let len = serde_json::to_string(id).map_or(usize::MAX, |s| s.chars().count()) + 1;
        if used + len > room {
            break;
        }
        used += len;
        kept.push(id);
    }
    let list = serde_json::to_string(&kept).unwrap_or_else(|_| "[]".into());
    format!("{FLAKY_ERROR_PREFIX}{list}")
}

/// The ids [`flaky_error`] wrote (for readers of errors); none from any other error.
pub fn ids_from_error(error: &str) -> Vec<String> {
    error
        .strip_prefix(FLAKY_ERROR_PREFIX)
        .and_then(|list| serde_json::from_str::<Vec<String>>(list).ok())
        .unwrap_or_default()
}
