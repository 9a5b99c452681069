use super::super::html::{histogram, Histogram};
use super::report::mixed;
use super::*;
use crate::engine::RunStatus;
use crate::ids::RunId;
use crate::proptest_support::{arb_text, cases, timed, CASE_LIMIT};
use proptest::prelude::*;
use serde_json::Value;

const EVIL: &str = "<script>alert(\"&'\")</script>";
const EVIL_ESCAPED: &str = "&lt;script&gt;alert(&quot;&amp;&#39;&quot;)&lt;/script&gt;";

fn pct(v: &Value) -> String {
    format!("{:.1}%", v.as_f64().unwrap() * 100.0)
}

/// Every `href` of the page: each must stay on the coordinator's run artifacts.
fn hrefs(html: &str) -> Vec<&str> {
    html.split("href=\"")
        .skip(1)
        .map(|rest| &rest[..rest.find('"').unwrap()])
        .collect()
}

/// The page loads nothing from anywhere and links only to `/v1/runs/<run>/artifacts`.
fn assert_self_contained(html: &str) {
    for bad in [
        "http://",
        "https://",
        "src=",
        "href=\"//",
        "url(",
        "@import",
    ] {
        assert!(!html.contains(bad), "{bad} in the page");
    }
    for href in hrefs(html) {
        let run = href
            .strip_prefix("/v1/runs/")
            .and_then(|r| r.strip_suffix("/artifacts"))
            .unwrap_or_else(|| panic!("link elsewhere: {href}"));
        assert!(
            run.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            "{href}"
        );
    }
    assert_eq!(html.matches("<script").count(), 1, "one script, ours");
    assert_eq!(html.matches("<svg").count(), 2, "two charts");
    assert!(html.ends_with("</html>\n"));
}

/// Items settled at once, with no cost and no time.
fn all_zero(ids: &[&str]) -> BatchState {
    let mut b = batch(ids, spec(1, 10));
    let free = ItemOutcome {
        cost_usd: 0.0,
        tokens: 0,
        ..outcome(RunStatus::Succeeded, None)
    };
    for i in 0..ids.len() {
        b.started(i, b.run_id_for(i), t(5));
        b.finished(i, &free, t(5));
    }
    b
}

#[test]
fn the_page_shows_the_json_reports_figures() {
    let b = mixed();
    let r = json_report(&b);
    let html = html_report(&b);
    assert_self_contained(&html);
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("<h1>batch 0123456789abcdef</h1>"));
    assert!(html.contains("<dd>factory (bundles/g)</dd>"));
    assert!(html.contains("<dd>model=m&lt;1&gt;</dd>"));
    for (state, n) in r["counts"].as_object().unwrap() {
        let row = format!("<tr><th>{state}</th><td class=\"n\">{n}</td></tr>");
        assert!(html.contains(&row), "{row}");
    }
    let p = &r["pass_rate"];
    let rate = format!(
        "pass rate {} ({} / {} judged), 95% Wilson interval {} to {}; flaky, held, errored, \
         cancelled and unfinished items are no verdict and are left out",
        pct(&p["rate"]),
        p["passed"],
        p["judged"],
        pct(&p["ci95"]["low"]),
        pct(&p["ci95"]["high"]),
    );
    assert!(html.contains(&rate), "{rate}");
    assert!(html.contains("pass rate 33.3% (1 / 3 judged)"));
    let cost = format!("<dd>${:.4}</dd>", r["cost_usd"].as_f64().unwrap());
    assert!(html.contains(&cost), "{cost}");
    assert!(html.contains(&format!("<dd>{}</dd>", r["tokens"])));
    assert!(html.contains(&format!(
        "<dd>{:.1} s</dd>",
        r["wall_seconds"].as_f64().unwrap()
    )));
    let tr = &r["trials"];
    let at_k = format!(
        "pass@1 {}, pass@k {}, pass^k {}",
        pct(&tr["mean_pass_at_1"]),
        pct(&tr["mean_pass_at_k"]),
        pct(&tr["mean_pass_hat_k"])
    );
    assert!(html.contains(&at_k), "{at_k}");
    assert!(html.contains("<h2>trials (k = 2)</h2>"));

    // One row per item and trial, and every started run linked.
    assert_eq!(html.matches("<tr class=\"item\">").count(), 6);
    let runs: Vec<String> = r["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["run_id"].as_str())
        .map(|run| format!("/v1/runs/{run}/artifacts"))
        .collect();
    assert_eq!(runs.len(), 4);
    assert_eq!(hrefs(&html), runs);

    // Failures by stage, errors with their text.
    assert!(html.contains(
        "<tr><td>verify</td><td class=\"n\">2</td><td>a (trial 2), b (trial 1)</td></tr>"
    ));
    assert!(html.contains("<td><pre>still dead</pre></td><td><pre>lost\ndead again</pre></td>"));
    assert!(html.contains("<td class=\"st-errored\" data-v=\"errored\">errored</td>"));
}

#[test]
fn every_text_from_the_state_is_escaped() {
    let mut b = mixed();
    b.header_mut().graph = EVIL.into();
    b.header_mut().graph_ref = EVIL.into();
    b.header_mut().spec.labels = [("k".into(), EVIL.into())].into();
    b.items[1].ended_stage = Some(EVIL.into());
    b.items[1].verdict = Some(EVIL.into());
    b.items[3].error = Some(EVIL.into());
    b.items[3].infra_errors = vec![EVIL.into()];
    b.items[4].item_id = EVIL.into();
    // A run id that is not one of the fleet's is shown, never linked.
    b.items[0].run_id = Some(RunId::new("//evil.example/x\"><script>"));
    let html = html_report(&b);
    assert_self_contained(&html);
    assert!(!html.contains("alert(\""));
    assert!(html.contains(&format!("<dd>{EVIL_ESCAPED} ({EVIL_ESCAPED})</dd>")));
    assert!(html.contains(&format!("<dd>k={EVIL_ESCAPED}</dd>")));
    assert!(html.contains(&format!(
        "<tr><td>{EVIL_ESCAPED}</td><td class=\"n\">1</td>"
    )));
    assert!(html.contains(&format!("<td><pre>{EVIL_ESCAPED}</pre></td>")));
    assert!(html.contains(&format!("data-v=\"{EVIL_ESCAPED}\">{EVIL_ESCAPED}</td>")));
    assert!(html.contains("//evil.example/x&quot;&gt;&lt;script&gt;"));
    assert_eq!(hrefs(&html).len(), 3);
    assert_eq!(
        html_escape("a\u{0}b\tc\u{7f}"),
        "a\u{FFFD}b\tc\u{FFFD}",
        "controls"
    );
}

#[test]
fn empty_all_zero_and_single_item_batches_render() {
    let empty = html_report(&batch(&[], spec(1, 1)));
    assert_self_contained(&empty);
    assert_eq!(empty.matches("no data").count(), 2);
    assert!(empty.contains("pass rate: none yet (0 judged)"));
    assert_eq!(empty.matches("<tr class=\"item\">").count(), 0);
    assert!(empty.contains("no failed items") && empty.contains("no errored items"));

    let queued = html_report(&batch(&["a", "b"], spec(3, 1)));
    assert_self_contained(&queued);
    assert_eq!(queued.matches("no data").count(), 2);
    assert!(queued.contains("pass@1 n/a, pass@k n/a, pass^k n/a"));

    for ids in [&["a", "b", "c"][..], &["only"][..]] {
        let html = html_report(&all_zero(ids));
        assert_self_contained(&html);
        let page = &html[..html.find("<script>").unwrap()];
        assert!(!page.contains("NaN") && !page.contains("inf"), "{page}");
        assert_eq!(html.matches("<rect").count(), 2, "one bar per chart");
        assert!(html.contains("pass rate 100.0%"));
        assert_eq!(html.matches("<tr class=\"item\">").count(), ids.len());
    }
}

#[test]
fn histograms_bin_every_finite_value() {
    assert_eq!(histogram(&[]), None);
    assert_eq!(histogram(&[f64::NAN, f64::INFINITY]), None);
    let one = |low: f64, n| Histogram {
        low,
        high: low,
        counts: vec![n],
    };
    assert_eq!(histogram(&[0.0, 0.0, 0.0]), Some(one(0.0, 3)));
    assert_eq!(histogram(&[2.5]), Some(one(2.5, 1)));
    let h = histogram(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]).unwrap();
    assert_eq!((h.low, h.high, h.counts), (0.0, 7.0, vec![2, 2, 2, 2]));
    let h = histogram(&[1.0, 2.0]).unwrap();
    assert_eq!(h.counts, [1, 1]);
    let h = histogram(&[-f64::MAX, 0.0, f64::MAX, f64::MIN_POSITIVE]).unwrap();
    assert_eq!(h.counts.iter().sum::<usize>(), 4);
    let many: Vec<f64> = (0..10_000).map(f64::from).collect();
    let h = histogram(&many).unwrap();
    assert_eq!(h.counts.len(), 15);
    assert_eq!(h.counts.iter().sum::<usize>(), 10_000);
}

/// `b` with one failed item and one errored, their texts (and the graph's and a label's) set.
fn with_texts(graph: &str, label: &str, stage: &str, error: &str) -> BatchState {
    let mut b = batch(&["a", "b"], spec(1, 2));
    b.header_mut().graph = graph.into();
    b.header_mut().spec.labels = [(label.into(), label.into())].into();
    b.started(0, b.run_id_for(0), t(1));
    let fail = ItemOutcome {
        ended_stage: Some(stage.into()),
        verdict: Some(format!("F{stage}")),
        error: Some(error.into()),
        ..outcome(RunStatus::Failed, None)
    };
    b.finished(0, &fail, t(2));
    b.items[1].state = ItemState::Errored;
    b.items[1].error = Some(error.into());
    b
}

proptest! {
    #![proptest_config(cases(128))]

    /// Whatever the texts, they add no markup: the page has as many `<`, `>`, quotes and
    /// apostrophes as with plain texts.
    #[test]
    fn no_text_adds_markup(
        graph in arb_text(), label in arb_text(), stage in arb_text(), error in arb_text(),
    ) {
        let (html, took) = timed(|| html_report(&with_texts(&graph, &label, &stage, &error)));
        prop_assert!(took < CASE_LIMIT);
        let plain = html_report(&with_texts("g", "l", "s", "e"));
        for ch in ['<', '>', '"', '\''] {
            prop_assert_eq!(html.matches(ch).count(), plain.matches(ch).count(), "{}", ch);
        }
    }
}
