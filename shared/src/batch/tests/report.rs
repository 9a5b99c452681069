use super::super::report::{wilson_interval, xml_escape};
use super::*;
use crate::engine::RunStatus;
use crate::proptest_support::{arb_text, cases, timed, CASE_LIMIT};
use crate::testreport::{parse_junit, CaseOutcome};
use proptest::prelude::*;
use quick_xml::events::Event;
use quick_xml::Reader;
use serde_json::{json, Value};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-4
}

#[test]
fn the_wilson_interval_matches_known_values() {
    assert_eq!(wilson_interval(0, 0), None);
    let (low, high) = wilson_interval(5, 10).unwrap();
    assert!(close(low, 0.2366) && close(high, 0.7634), "{low} {high}");
    let (low, high) = wilson_interval(0, 10).unwrap();
    assert!(close(low, 0.0) && close(high, 0.2775), "{low} {high}");
    let (low, high) = wilson_interval(10, 10).unwrap();
    assert!(close(low, 0.7225) && close(high, 1.0), "{low} {high}");
    let (low, high) = wilson_interval(81, 100).unwrap();
    assert!(close(low, 0.7222) && close(high, 0.8749), "{low} {high}");
}

/// Two items, two trials: a passes then fails, b fails then errors (after one infra retry);
/// c (one trial each too) stays queued.
pub(super) fn mixed() -> BatchState {
    let mut b = batch(&["a", "b", "c"], spec(2, 4));
    for i in b.to_start(usize::MAX) {
        b.started(i, b.run_id_for(i), t(10));
    }
    b.finished(0, &outcome(RunStatus::Succeeded, None), t(20));
    let fail = ItemOutcome {
        ended_stage: Some("verify".into()),
        ..outcome(RunStatus::Failed, Some("FAIL"))
    };
    b.finished(1, &fail, t(30));
    b.finished(2, &fail, t(40));
    b.finished(3, &infra("lost"), t(41));
    b.started(3, b.run_id_for(3), t(42));
    b.finished(3, &infra("dead again"), t(50));
    b.started(3, b.run_id_for(3), t(51));
    b.finished(3, &infra("still dead"), t(60));
    b.header_mut().spec.labels = [("model".into(), "m<1>".into())].into();
    b
}

#[test]
fn the_json_report_counts_rates_costs_and_lists_every_item() {
    let r = json_report(&mixed());
    assert_eq!(r["batch_id"], "0123456789abcdef");
    assert_eq!(r["graph"], "factory");
    assert_eq!(r["labels"], json!({"model": "m<1>"}));
    assert_eq!(r["finished"], false);
    assert_eq!(
        r["counts"],
        json!({"total": 6, "queued": 2, "running": 0, "passed": 1, "failed": 2,
               "errored": 1, "cancelled": 0, "flaky": 0, "held": 0})
    );
    // Errored items are no verdict: 1 of 3 judged.
    assert_eq!(r["pass_rate"]["judged"], 3);
    assert!(close(r["pass_rate"]["rate"].as_f64().unwrap(), 1.0 / 3.0));
    let (low, high) = wilson_interval(1, 3).unwrap();
    assert_eq!(r["pass_rate"]["ci95"], json!({"low": low, "high": high}));
    // Five runs at 0.5 each (item 3 ran three times).
    assert!(close(r["cost_usd"].as_f64().unwrap(), 3.0));
    assert_eq!(r["tokens"], 600);
    assert_eq!(r["wall_seconds"], 60.0);
    let items = r["items"].as_array().unwrap();
    assert_eq!(items.len(), 6);
    let errored = &items[3];
    assert_eq!(errored["item_id"], "b");
    assert_eq!(errored["trial"], 2);
    assert_eq!(errored["attempt"], 3);
    assert_eq!(errored["state"], "errored");
    assert_eq!(errored["verdict"], Value::Null);
    assert_eq!(errored["error"], "still dead");
    assert_eq!(errored["infra_errors"], json!(["lost", "dead again"]));
    assert_eq!(errored["seconds"], 9.0);
    assert_eq!(items[1]["ended_stage"], "verify");
    assert_eq!(items[1]["seconds"], 20.0);
    assert_eq!(items[4]["seconds"], Value::Null);
    assert!(items[0]["run_id"].as_str().unwrap().ends_with("-t1-a1"));
}

#[test]
fn with_trials_the_report_has_pass_at_k() {
    let r = json_report(&mixed());
    let trials = &r["trials"];
    assert_eq!(trials["k"], 2);
    let per: Vec<&Value> = trials["items"].as_array().unwrap().iter().collect();
    assert_eq!(
        *per[0],
        json!({"item_id": "a", "judged": 2, "passed": 1, "pass_at_1": 0.5,
               "pass_at_k": 1.0, "pass_hat_k": 0.0})
    );
    assert_eq!(
        *per[1],
        json!({"item_id": "b", "judged": 1, "passed": 0, "pass_at_1": 0.0,
               "pass_at_k": 0.0, "pass_hat_k": 0.0})
    );
    assert_eq!(per[2]["pass_at_1"], Value::Null);
    assert_eq!(trials["mean_pass_at_1"], 0.25);
    assert_eq!(trials["mean_pass_at_k"], 0.5);
    assert_eq!(trials["mean_pass_hat_k"], 0.0);

    let mut one = batch(&["a"], spec(1, 1));
    one.started(0, one.run_id_for(0), t(1));
    one.finished(0, &outcome(RunStatus::Succeeded, None), t(3));
    let r = json_report(&one);
    assert_eq!(r.get("trials"), None);
    assert_eq!(r["pass_rate"]["rate"], 1.0);
    assert_eq!(r["finished_at"], "2026-11-22T10:00:03Z");
    assert_eq!(r["wall_seconds"], 3.0);
}

/// An element's name and its attributes, unescaped.
type Element = (String, BTreeMap<String, String>);

/// Every event of `xml`, failing on the first error; (element, attributes unescaped) of each
/// start or empty element and the unescaped texts.
fn read_xml(xml: &str) -> (Vec<Element>, Vec<String>) {
    let mut reader = Reader::from_str(xml);
    reader.config_mut().check_end_names = true;
    let (mut elements, mut texts) = (Vec::new(), Vec::new());
    loop {
        match reader.read_event().expect("well-formed xml") {
            Event::Start(e) | Event::Empty(e) => {
                let name = String::from_utf8(e.name().as_ref().to_vec()).unwrap();
                let attrs = e
                    .attributes()
                    .map(|a| {
                        let a = a.expect("an attribute");
                        let key = String::from_utf8(a.key.as_ref().to_vec()).unwrap();
                        (key, a.unescape_value().expect("escaped").into_owned())
                    })
                    .collect();
                elements.push((name, attrs));
            }
            Event::Text(t) => texts.push(t.unescape().expect("escaped").into_owned()),
            Event::Eof => break,
            _ => {}
        }
    }
    (elements, texts)
}

#[test]
fn junit_has_one_case_per_item_and_trial_and_escapes_everything() {
    let mut b = mixed();
    b.header_mut().graph = "g<&\"'>".into();
    b.items[1].error = Some("assert 1 < 2 && \"x\" != 'y'\n\tnext\u{1}".into());
    b.items[1].ended_stage = Some("<stage>".into());
    b.items[3].error = Some("lost & \"found\"".into());
    b.cancel(t(70));
    let xml = junit_xml(&b);
    let (elements, texts) = read_xml(&xml);
    let suite = &elements[0];
    assert_eq!(suite.0, "testsuite");
    assert_eq!(suite.1["name"], "batch 0123456789abcdef");
    let counts: Vec<&str> = ["tests", "failures", "errors", "skipped"]
        .iter()
        .map(|k| suite.1[*k].as_str())
        .collect();
    assert_eq!(counts, ["6", "2", "1", "2"]);
    assert_eq!(elements[2].1["value"], "m<1>");
    let cases: Vec<&BTreeMap<String, String>> = elements
        .iter()
        .filter(|(n, _)| n == "testcase")
        .map(|(_, a)| a)
        .collect();
    assert_eq!(cases.len(), 6);
    assert_eq!(cases[0]["classname"], "g<&\"'>");
    assert_eq!(cases[0]["name"], "a trial 1");
    assert_eq!(cases[3]["name"], "b trial 2");
    assert_eq!(cases[1]["time"], "20.000");
    let failure = elements.iter().find(|(n, _)| n == "failure").unwrap();
    assert_eq!(failure.1["message"], "FAIL <stage>");
    assert!(texts.contains(&"assert 1 < 2 && \"x\" != 'y'\n\tnext\u{FFFD}".to_string()));
    let error = elements.iter().find(|(n, _)| n == "error").unwrap();
    assert_eq!(error.1["message"], "lost & \"found\"");
    assert!(texts.contains(&"lost\ndead again".to_string()));
    let skipped: Vec<&str> = elements
        .iter()
        .filter(|(n, _)| n == "skipped")
        .map(|(_, a)| a["message"].as_str())
        .collect();
    assert_eq!(skipped, ["cancelled", "cancelled"]);

    // The fleet's own JUnit reader agrees.
    let read = parse_junit(&xml).unwrap();
    let outcomes: Vec<CaseOutcome> = read.cases.iter().map(|c| c.outcome).collect();
    use CaseOutcome::*;
    assert_eq!(
        outcomes,
        [Passed, Failed, Failed, Errored, Skipped, Skipped]
    );
}

#[test]
fn one_trial_cases_are_named_by_the_item_alone() {
    let b = batch(&["x.1"], spec(1, 1));
    let (elements, _) = read_xml(&junit_xml(&b));
    let case = elements.iter().find(|(n, _)| n == "testcase").unwrap();
    assert_eq!(case.1["name"], "x.1");
    assert!(elements
        .iter()
        .any(|(n, a)| n == "skipped" && a["message"] == "queued"));
}

#[test]
fn xml_escape_keeps_what_xml_can_carry() {
    assert_eq!(
        xml_escape("<a & 'b'>\"c\""),
        "&lt;a &amp; &apos;b&apos;&gt;&quot;c&quot;"
    );
    assert_eq!(
        xml_escape("a\r\n\tb\u{0}\u{1f}\u{FFFF}é"),
        "a&#13;&#10;&#9;b\u{FFFD}\u{FFFD}\u{FFFD}é"
    );
}

proptest! {
    #![proptest_config(cases(128))]

    /// Whatever text errors, stages, graphs and labels carry, the JUnit report is well-formed
    /// and says it exactly (characters XML cannot carry aside).
    #[test]
    fn junit_is_well_formed_for_any_text(
        graph in arb_text(), error in arb_text(), stage in arb_text(), label in arb_text(),
    ) {
        let mut b = batch(&["a", "b"], spec(1, 2));
        b.header_mut().graph = graph.clone();
        b.header_mut().spec.labels = [("k".into(), label.clone())].into();
        b.started(0, b.run_id_for(0), t(1));
        let fail = ItemOutcome {
            ended_stage: Some(stage.clone()),
            error: Some(error.clone()),
            ..outcome(RunStatus::Failed, Some("FAIL"))
        };
        b.finished(0, &fail, t(2));
        let (xml, took) = timed(|| junit_xml(&b));
        prop_assert!(took < CASE_LIMIT);
        let (elements, texts) = read_xml(&xml);
        let clean = |s: &str| -> String {
            s.chars()
                .map(|c| {
                    let control = (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r');
                    if control || matches!(c, '\u{FFFE}' | '\u{FFFF}') { '\u{FFFD}' } else { c }
                })
                .collect()
        };
        let case = elements.iter().find(|(n, _)| n == "testcase").unwrap();
        prop_assert_eq!(&case.1["classname"], &clean(&graph));
        let failure = elements.iter().find(|(n, _)| n == "failure").unwrap();
        prop_assert_eq!(&failure.1["message"], &format!("FAIL {}", clean(&stage)));
        let property = elements.iter().find(|(n, _)| n == "property").unwrap();
        prop_assert_eq!(&property.1["value"], &clean(&label));
        if !error.is_empty() {
            prop_assert!(texts.contains(&clean(&error)));
        }
        let json = json_report(&b);
        prop_assert_eq!(&json["items"][0]["error"], &json!(error));
    }
}
