//! A batch's report for people ([`html_report`]): one self-contained HTML page (inline CSS,
//! inline SVG charts, a few lines of inline JS that sort the item table; no external URL of any
//! kind), built from [`json_report`]'s figures so the two never disagree. Every text from the
//! state is escaped ([`html_escape`]); the only links are to `/v1/runs/<run>/artifacts` on the
//! coordinator that serves the page.

use super::report::json_report;
use super::state::BatchState;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Histograms have at most this many bins.
const MAX_BINS: usize = 20;
/// The charts' plot area inside their `viewBox` (`0 0 400 215`): left, top, width, height.
const PLOT: (f64, f64, f64, f64) = (56.0, 14.0, 326.0, 150.0);
/// A stage group lists at most this many of its items.
const MAX_LISTED: usize = 20;
/// The item table's columns: header and whether it sorts as numbers.
const COLUMNS: [(&str, bool); 10] = [
    ("item", false),
    ("trial", true),
    ("attempt", true),
    ("state", false),
    ("verdict", false),
    ("stage", false),
    ("cost (USD)", true),
    ("tokens", true),
    ("seconds", true),
    ("run", false),
];
/// Nothing is fetched: the page is complete as it is.
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'";

const STYLE: &str = r#"
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d232a;background:#fff}
h1{font-size:20px;margin:0 0 12px}h2{font-size:16px;margin:24px 0 8px}
table{border-collapse:collapse;margin:4px 0}
th,td{border:1px solid #d5dae0;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f2f4f7;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}
table.sortable th{cursor:pointer;user-select:none}
table.sortable th[aria-sort=ascending]::after{content:" \25B2"}
table.sortable th[aria-sort=descending]::after{content:" \25BC"}
.st-passed{color:#137333}.st-failed{color:#b3261e}.st-errored{color:#a15c00}.st-flaky{color:#8e24aa}.st-held{color:#8e24aa}
.st-queued,.st-running,.st-cancelled{color:#5f6368}
dl.summary{display:grid;grid-template-columns:max-content auto;gap:2px 16px;margin:0 0 8px}
dt{color:#5f6368}dd{margin:0}
.rate{font-weight:600}.note{color:#5f6368}
.charts{display:flex;flex-wrap:wrap;gap:24px}
figure{margin:0}figcaption{color:#5f6368;font-size:12px}
svg.chart{width:400px;height:215px}
svg.chart rect{fill:#4a78c2}svg.chart line{stroke:#333}
svg.chart text{font-size:11px;fill:#333}
pre{margin:0;white-space:pre-wrap;word-break:break-word;max-width:80ch}
"#;

/// Sorts a `table.sortable` by the clicked column (`data-v` of each cell; as numbers when the
/// header has `data-num`), ascending then descending. A link may name a sort: `#sort=cost`
/// (a column's first word), `#sort=-cost` descending.
const SCRIPT: &str = r#"
(function () {
  function key(cell, num) {
    var v = cell.getAttribute('data-v') || '';
    if (!num) { return v; }
    var n = parseFloat(v);
    return isNaN(n) ? -Infinity : n;
  }
  document.querySelectorAll('table.sortable th').forEach(function (th) {
    th.addEventListener('click', function () {
      var body = th.closest('table').tBodies[0], col = th.cellIndex;
      var num = th.hasAttribute('data-num');
      var asc = th.getAttribute('aria-sort') !== 'ascending';
      th.parentNode.querySelectorAll('th').forEach(function (h) { h.removeAttribute('aria-sort'); });
      th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
      Array.prototype.slice.call(body.rows).sort(function (a, b) {
        var x = key(a.cells[col], num), y = key(b.cells[col], num);
        var c = num ? (x < y ? -1 : x > y ? 1 : 0)
                    : x.localeCompare(y, undefined, { numeric: true });
        return asc ? c : -c;
      }).forEach(function (row) { body.appendChild(row); });
    });
  });
  var m = /^#sort=(-?)([a-z@^]+)$/.exec(location.hash);
  if (m) {
    document.querySelectorAll('table.sortable th').forEach(function (th) {
      if (th.textContent.split(' ')[0] !== m[2]) { return; }
      th.click();
      if (m[1]) { th.click(); }
    });
  }
})();
"#;

/// `text` for HTML, as character data or in a quoted attribute: `&<>"'` as entities, control
/// characters other than tab, newline and carriage return as U+FFFD.
pub fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// A JSON value as text, escaped: a string as it is, null as nothing, others as JSON.
fn esc(v: &Value) -> String {
    match v {
        Value::String(s) => html_escape(s),
        Value::Null => String::new(),
        other => html_escape(&other.to_string()),
    }
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// A share as a percentage with one decimal, `n/a` when absent.
fn percent(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "n/a".to_string(), |x| format!("{:.1}%", x * 100.0))
}

/// How many values fall in each of `counts.len()` equal bins from `low` to `high`.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Histogram {
    pub low: f64,
    pub high: f64,
    pub counts: Vec<usize>,
}

/// The finite values binned (Sturges' rule, at most [`MAX_BINS`]); one bin when they are all
/// equal (one value, all zero, ...); none when there are no finite values.
pub(super) fn histogram(values: &[f64]) -> Option<Histogram> {
    let values: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    let low = values.iter().copied().reduce(f64::min)?;
    let high = values.iter().copied().fold(low, f64::max);
    let bins = if high > low {
        ((values.len() as f64).log2().ceil() as usize + 1).clamp(2, MAX_BINS)
    } else {
        1
    };
    let width = (high - low) / bins as f64;
    let mut counts = vec![0; bins];
    for v in values {
        let index = if width > 0.0 {
            ((v - low) / width) as usize
        } else {
            0
        };
        counts[index.min(bins - 1)] += 1;
    }
    Some(Histogram { low, high, counts })
}

/// The whole batch as one HTML page: a summary (id, graph, labels, counts per state, the pass
/// rate with its 95% Wilson interval, cost, tokens, wall time), pass@1 / pass@k / pass^k with
/// more than one trial, histograms of item cost and time, failed items grouped by the stage
/// they ended in, errored items with their errors, items with flaky tests, and a sortable table
/// of every item whose run ids link to the run's artifacts. Every figure is [`json_report`]'s.
pub fn html_report(state: &BatchState) -> String {
    let r = json_report(state);
    let items: &[Value] = r["items"].as_array().map_or(&[], Vec::as_slice);
    let mut out = String::with_capacity(4096 + items.len() * 512);
    head(&mut out, &r);
    summary(&mut out, &r);
    trials(&mut out, &r);
    charts(&mut out, items);
    failures(&mut out, &r, items);
    errors(&mut out, items);
    super::flaky::html_section(&mut out, &r, items);
    table(&mut out, items);
    let _ = write!(
        out,
        "<p class=\"note\">Figures of the batch's JSON report (version {}).</p>\n\
         <script>{SCRIPT}</script>\n</body>\n</html>\n",
        esc(&r["v"])
    );
    out
}

fn head(out: &mut String, r: &Value) {
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>batch {}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        esc(&r["batch_id"])
    );
}

/// The pass rate in words: passed / judged, its interval, and what is left out.
fn pass_rate(r: &Value) -> String {
    let p = &r["pass_rate"];
    let left_out =
        "flaky, held, errored, cancelled and unfinished items are no verdict and are left out";
    if p["rate"].is_null() {
        return format!("pass rate: none yet (0 judged); {left_out}");
    }
    let interval = match &p["ci95"] {
        Value::Null => String::new(),
        ci => format!(
            ", 95% Wilson interval {} to {}",
            percent(&ci["low"]),
            percent(&ci["high"])
        ),
    };
    format!(
        "pass rate {} ({} / {} judged){interval}; {left_out}",
        percent(&p["rate"]),
        esc(&p["passed"]),
        esc(&p["judged"])
    )
}

fn summary(out: &mut String, r: &Value) {
    let status = if r["cancelled"] == true {
        "cancelled"
    } else if r["finished"] == true {
        "finished"
    } else {
        "running"
    };
    let labels: Vec<String> = r["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{}={}", html_escape(k), esc(v)))
        .collect();
    let labels = if labels.is_empty() {
        "none".to_string()
    } else {
        labels.join(", ")
    };
    let finished_at = match &r["finished_at"] {
        Value::Null => String::new(),
        at => format!(", finished {}", esc(at)),
    };
    let _ = write!(
        out,
        "<h1>batch {}</h1>\n<dl class=\"summary\">\n\
         <dt>graph</dt><dd>{} ({})</dd>\n<dt>labels</dt><dd>{labels}</dd>\n\
         <dt>status</dt><dd>{status}: created {}{finished_at}</dd>\n\
         <dt>wall time</dt><dd>{:.1} s</dd>\n<dt>cost</dt><dd>${:.4}</dd>\n\
         <dt>tokens</dt><dd>{}</dd>\n\
         <dt>step cache</dt><dd id=\"step-cache\">{} of {} steps reused</dd>\n</dl>\n",
        esc(&r["batch_id"]),
        esc(&r["graph"]),
        esc(&r["graph_ref"]),
        esc(&r["created_at"]),
        num(&r["wall_seconds"]),
        num(&r["cost_usd"]),
        esc(&r["tokens"]),
        esc(&r["step_cache"]["hits"]),
        esc(&r["step_cache"]["steps"]),
    );
    out.push_str("<table class=\"counts\">\n");
    for name in [
        "total",
        "queued",
        "running",
        "passed",
        "failed",
        "flaky",
        "held",
        "errored",
        "cancelled",
    ] {
        let _ = writeln!(
            out,
            "<tr><th>{name}</th><td class=\"n\">{}</td></tr>",
            esc(&r["counts"][name])
        );
    }
    let _ = writeln!(
        out,
        "</table>\n<p class=\"rate\" id=\"pass-rate\">{}</p>",
        pass_rate(r)
    );
}

/// pass@1, pass@k and pass^k: their means over items, then per item.
fn trials(out: &mut String, r: &Value) {
    let t = &r["trials"];
    if t.is_null() {
        return;
    }
    let _ = write!(
        out,
        "<h2>trials (k = {})</h2>\n<p id=\"pass-at-k\">mean over items: pass@1 {}, pass@k {}, \
         pass^k {} (only judged trials count; items without one are left out)</p>\n\
         <table><thead><tr><th>item</th><th>judged</th><th>passed</th><th>pass@1</th>\
         <th>pass@k</th><th>pass^k</th></tr></thead><tbody>\n",
        esc(&t["k"]),
        percent(&t["mean_pass_at_1"]),
        percent(&t["mean_pass_at_k"]),
        percent(&t["mean_pass_hat_k"]),
    );
    for item in t["items"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(&item["item_id"]),
            esc(&item["judged"]),
            esc(&item["passed"]),
            percent(&item["pass_at_1"]),
            percent(&item["pass_at_k"]),
            percent(&item["pass_hat_k"]),
        );
    }
    out.push_str("</tbody></table>\n");
}

/// The histograms: cost over settled items, time over items with a start and an end.
fn charts(out: &mut String, items: &[Value]) {
    let costs: Vec<f64> = items
        .iter()
        .filter(|i| !matches!(i["state"].as_str(), Some("queued" | "running")))
        .map(|i| num(&i["cost_usd"]))
        .collect();
    let seconds: Vec<f64> = items.iter().filter_map(|i| i["seconds"].as_f64()).collect();
    out.push_str("<h2>distributions</h2>\n<div class=\"charts\">\n");
    chart(out, "cost", "item cost (USD)", "settled items", &costs, 4);
    chart(
        out,
        "time",
        "item time (s)",
        "items with a start and an end",
        &seconds,
        1,
    );
    out.push_str("</div>\n");
}

/// One histogram as inline SVG: bars, both axes with their labels, the counts' and the
/// values' bounds as ticks; "no data" when there are no values.
fn chart(out: &mut String, id: &str, axis: &str, over: &str, values: &[f64], decimals: usize) {
    let (left, top, width, height) = PLOT;
    let (right, bottom, middle) = (left + width, top + height, left + width / 2.0);
    let _ = write!(
        out,
        "<figure><svg id=\"chart-{id}\" class=\"chart\" viewBox=\"0 0 400 215\" role=\"img\" \
         aria-label=\"histogram of {axis}\">\n\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{bottom}\"/>\
         <line x1=\"{left}\" y1=\"{bottom}\" x2=\"{right}\" y2=\"{bottom}\"/>\n\
         <text x=\"{middle}\" y=\"208\" text-anchor=\"middle\">{axis}</text>\
         <text transform=\"translate(16 {}) rotate(-90)\" text-anchor=\"middle\">items</text>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\n",
        top + height / 2.0,
        left - 6.0,
        bottom + 4.0,
    );
    match histogram(values) {
        None => {
            let _ = writeln!(
                out,
                "<text x=\"{middle}\" y=\"{}\" text-anchor=\"middle\">no data</text>",
                top + height / 2.0
            );
        }
        Some(h) => bars(out, &h, decimals),
    }
    let _ = writeln!(
        out,
        "</svg><figcaption>{axis} over {} {over}</figcaption></figure>",
        values.len()
    );
}

fn bars(out: &mut String, h: &Histogram, decimals: usize) {
    let (left, top, width, height) = PLOT;
    let bottom = top + height;
    let highest = h.counts.iter().copied().max().unwrap_or(0).max(1);
    let bins = h.counts.len().max(1);
    let bar = width / bins as f64;
    let step = (h.high - h.low) / bins as f64;
    for (i, &count) in h.counts.iter().enumerate() {
        let tall = count as f64 / highest as f64 * height;
        let (from, to) = (h.low + step * i as f64, h.low + step * (i + 1) as f64);
        let _ = writeln!(
            out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{tall:.1}\">\
             <title>{from:.decimals$} to {to:.decimals$}: {count}</title></rect>",
            left + bar * i as f64 + 1.0,
            bottom - tall,
            (bar - 2.0).max(1.0),
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{highest}</text>",
        left - 6.0,
        top + 4.0
    );
    let below = bottom + 16.0;
    if bins == 1 {
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{below}\" text-anchor=\"middle\">{:.decimals$}</text>",
            left + width / 2.0,
            h.low
        );
    } else {
        let _ = writeln!(
            out,
            "<text x=\"{left}\" y=\"{below}\" text-anchor=\"start\">{:.decimals$}</text>\
             <text x=\"{}\" y=\"{below}\" text-anchor=\"end\">{:.decimals$}</text>",
            h.low,
            left + width,
            h.high
        );
    }
}

/// How an item is named in lists: its id, and its trial when there are several.
fn item_name(item: &Value, trials: u64) -> String {
    if trials > 1 {
        format!("{} (trial {})", esc(&item["item_id"]), esc(&item["trial"]))
    } else {
        esc(&item["item_id"])
    }
}

/// Failed items grouped by the stage they ended in, largest group first.
fn failures(out: &mut String, r: &Value, items: &[Value]) {
    let trials = r["spec"]["trials"].as_u64().unwrap_or(1);
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for item in items.iter().filter(|i| i["state"] == "failed") {
        let stage = match &item["ended_stage"] {
            Value::Null => "(no stage)".to_string(),
            s => esc(s),
        };
        groups
            .entry(stage)
            .or_default()
            .push(item_name(item, trials));
    }
    let mut groups: Vec<(String, Vec<String>)> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| a.0.cmp(&b.0)));
    out.push_str("<h2>failures by stage</h2>\n");
    if groups.is_empty() {
        out.push_str("<p class=\"note\">no failed items</p>\n");
        return;
    }
    out.push_str(
        "<table id=\"stages\"><thead><tr><th>ended stage</th><th>failed</th><th>items</th>\
         </tr></thead><tbody>\n",
    );
    for (stage, names) in &groups {
        let mut listed = names
            .iter()
            .take(MAX_LISTED)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if names.len() > MAX_LISTED {
            let _ = write!(listed, " and {} more", names.len() - MAX_LISTED);
        }
        let _ = writeln!(
            out,
            "<tr><td>{stage}</td><td class=\"n\">{}</td><td>{listed}</td></tr>",
            names.len()
        );
    }
    out.push_str("</tbody></table>\n");
}

/// Errored items (infrastructure errors, no verdict) with their errors.
fn errors(out: &mut String, items: &[Value]) {
    let errored: Vec<&Value> = items.iter().filter(|i| i["state"] == "errored").collect();
    out.push_str("<h2>errors (no verdict)</h2>\n");
    if errored.is_empty() {
        out.push_str("<p class=\"note\">no errored items</p>\n");
        return;
    }
    out.push_str(
        "<table id=\"errors\"><thead><tr><th>item</th><th>trial</th><th>attempts</th>\
         <th>error</th><th>earlier attempts</th></tr></thead><tbody>\n",
    );
    for item in errored {
        let earlier: Vec<String> = item["infra_errors"]
            .as_array()
            .into_iter()
            .flatten()
            .map(esc)
            .collect();
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td><pre>{}</pre></td>\
             <td><pre>{}</pre></td></tr>",
            esc(&item["item_id"]),
            esc(&item["trial"]),
            esc(&item["attempt"]),
            esc(&item["error"]),
            earlier.join("\n"),
        );
    }
    out.push_str("</tbody></table>\n");
}

/// A run id as the fleet makes them (`[A-Za-z0-9_-]`), so a link to it stays on the
/// coordinator's `/v1/runs/` whatever the state holds.
fn linkable(run: &str) -> bool {
    !run.is_empty()
        && run
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

/// A cell: its sort key and what it shows (both escaped already), numbers right-aligned.
fn cell(out: &mut String, key: &str, shown: &str, class: &str) {
    if class.is_empty() {
        let _ = write!(out, "<td data-v=\"{key}\">{shown}</td>");
    } else {
        let _ = write!(out, "<td class=\"{class}\" data-v=\"{key}\">{shown}</td>");
    }
}

/// Every item, one row each, sortable by any column; run ids link to the run's artifacts.
fn table(out: &mut String, items: &[Value]) {
    out.push_str(
        "<h2>items</h2>\n<p class=\"note\">Click a column to sort.</p>\n\
         <table id=\"items\" class=\"sortable\"><thead><tr>",
    );
    for (name, numeric) in COLUMNS {
        let _ = write!(
            out,
            "<th{}>{name}</th>",
            if numeric { " data-num" } else { "" }
        );
    }
    out.push_str("</tr></thead><tbody>\n");
    for item in items {
        out.push_str("<tr class=\"item\">");
        for key in ["item_id", "trial", "attempt"] {
            let v = esc(&item[key]);
            cell(out, &v, &v, if key == "item_id" { "" } else { "n" });
        }
        let state = esc(&item["state"]);
        cell(out, &state, &state, &format!("st-{state}"));
        for key in ["verdict", "ended_stage"] {
            let v = esc(&item[key]);
            cell(out, &v, &v, "");
        }
        let cost = num(&item["cost_usd"]);
        cell(out, &cost.to_string(), &format!("{cost:.4}"), "n");
        let tokens = esc(&item["tokens"]);
        cell(out, &tokens, &tokens, "n");
        let (key, shown) = match item["seconds"].as_f64() {
            Some(s) => (s.to_string(), format!("{s:.1}")),
            None => (String::new(), String::new()),
        };
        cell(out, &key, &shown, "n");
        let run = item["run_id"].as_str().unwrap_or_default();
        let shown = if linkable(run) {
            format!("<a href=\"/v1/runs/{run}/artifacts\">{run}</a>")
        } else {
            html_escape(run)
        };
        cell(out, &html_escape(run), &shown, "");
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table>\n");
}
