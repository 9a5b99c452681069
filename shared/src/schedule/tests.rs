//! Tests of schedules: names, cron expressions and the tick due, the definition's checks,
//! firings and deliveries, the signature (RFC 4231 vectors), the morning report.

use super::cron::MAX_MISSED_COUNTED;
use super::def::{SCHEDULED_FOR_LABEL, SCHEDULE_LABEL};
use super::state::{run_now_batch_id, tick_batch_id, MAX_FIRINGS_KEPT};
use super::webhook::report_folder;
use super::*;
use crate::batch::{BatchSpec, BatchState};
use crate::graph::{load_bundle, GraphBundle};
use crate::hashing::sha256_hex;
use crate::ids::BatchId;
use chrono::{DateTime, TimeDelta, Utc};
use serde_json::json;
use std::time::Duration;

/// `secs` seconds (and `ms` milliseconds) after a fixed instant, 2026-11-22T10:00:00Z.
fn t(secs: i64) -> DateTime<Utc> {
    "2026-11-22T10:00:00Z".parse::<DateTime<Utc>>().unwrap() + TimeDelta::seconds(secs)
}

fn t_ms(ms: i64) -> DateTime<Utc> {
    t(0) + TimeDelta::milliseconds(ms)
}

fn cron(expr: &str) -> CronSchedule {
    CronSchedule::parse(expr, t(0)).unwrap_or_else(|e| panic!("{expr}: {e}"))
}

fn graph() -> GraphBundle {
    let yaml = "name: tiny\nstart: work\nnodes:\n  work:\n    kind: harness\n    op: noop\n    \
                routes: [{to: done}]\n  done:\n    kind: exit\n    status: work.ok\n";
    load_bundle("tiny.yaml", yaml, |p| Err(format!("unexpected {p}"))).expect("a valid graph")
}

/// A spec as the API reads it (fields added later take their defaults).
fn spec(labels: serde_json::Value) -> BatchSpec {
    serde_json::from_value(json!({"trials": 1, "max_running": 2, "labels": labels})).unwrap()
}

fn def(name: &str, expr: &str) -> ScheduleDef {
    let dataset = "{\"id\": \"a\", \"repo\": \"/r\"}\n".to_string();
    ScheduleDef {
        v: 1,
        name: name.into(),
        cron: expr.into(),
        graph: graph(),
        dataset_sha256: sha256_hex(dataset.as_bytes()),
        dataset,
        agent: Default::default(),
        options: json!({}),
        spec: spec(json!({"suite": "calc"})),
        webhook: Some(hook("https://hooks.example.com/x/TOKEN")),
        created_at: t(0),
        team: None,
        mirror_dir: None,
    }
}

#[test]
fn a_dataset_read_from_a_mirror_needs_an_absolute_mirror_directory() {
    let mut d = def("swe", "0 2 * * *");
    d.dataset = "{\"id\": \"m\", \"repo\": \"owner/name\", \"mirror\": true}\n".into();
    d.dataset_sha256 = sha256_hex(d.dataset.as_bytes());
    let err = d.check(t(0)).unwrap_err().to_string();
    assert!(err.contains("--mirror-dir"), "{err}");
    d.mirror_dir = Some("mirrors".into());
    let err = d.check(t(0)).unwrap_err().to_string();
    assert!(err.contains("not an absolute path"), "{err}");
    d.mirror_dir = Some("/srv/mirrors".into());
    assert!(d.check(t(0)).is_ok());
}

fn hook(url: &str) -> Webhook {
    Webhook {
        url: url.into(),
        secret: "0123456789abcdef-secret".into(),
    }
}

#[test]
fn names_are_short_plain_and_start_with_a_letter_or_digit() {
    for good in ["nightly", "a", "Night.ly_2-x", &"n".repeat(64), "9am"] {
        assert_eq!(check_name(good), Ok(()), "{good}");
    }
    for (bad, why) in [
        ("", "1 to 64"),
        (&"n".repeat(65), "1 to 64"),
        ("a/b", "[A-Za-z0-9_.-]"),
        ("a b", "[A-Za-z0-9_.-]"),
        ("nüchtern", "[A-Za-z0-9_.-]"),
        ("..", "starts with"),
        (".hidden", "starts with"),
        ("-rf", "starts with"),
    ] {
        let e = check_name(bad).expect_err(bad).to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
}

#[test]
fn five_and_six_field_expressions_give_their_next_tick_in_utc() {
    let daily = cron("0 2 * * *");
    assert_eq!(
        daily.next_after(t(0)),
        Some("2026-11-23T02:00:00Z".parse().unwrap())
    );
    let every_two = cron("*/2 * * * * *");
    assert_eq!(every_two.next_after(t_ms(500)), Some(t(2)));
    assert_eq!(every_two.next_after(t(2)), Some(t(4)), "strictly after");
    assert_eq!(every_two.latest_at_or_before(t_ms(3999)), Some(t(2)));
    assert_eq!(
        cron("@daily").next_after(t(0)),
        Some("2026-11-23T00:00:00Z".parse().unwrap())
    );
    // Names of days and months; day-of-month OR day-of-week when both are given.
    let mondays = cron("0 9 * * MON");
    assert_eq!(
        mondays.next_after(t(0)),
        Some("2026-11-23T09:00:00Z".parse().unwrap())
    );
    let either = cron("0 0 1 * SUN");
    assert_eq!(
        either.next_after(t(0)),
        Some("2026-11-29T00:00:00Z".parse().unwrap())
    );
}

#[test]
fn bad_expressions_are_refused_saying_why() {
    for (bad, why) in [
        ("", "empty"),
        ("   ", "empty"),
        ("* * *", "3 fields"),
        ("0 0 0 1 1 * 2030", "7 fields"),
        ("61 * * * *", "cron expression \"61 * * * *\""),
        ("0 25 * * *", "cron expression"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 * * *\u{7}", "printable"),
        ("0\t0 * * *", "printable"),
    ] {
        let e = CronSchedule::parse(bad, t(0)).expect_err(bad).to_string();
        assert!(e.contains(why), "{bad:?}: {e}");
    }
    let long = format!("0 0 * * {}", "1,".repeat(100));
    assert!(CronSchedule::parse(&long, t(0))
        .unwrap_err()
        .to_string()
        .contains("over 128"));
}

#[test]
fn one_tick_is_due_at_a_time_and_missed_ones_are_counted_not_fired() {
    let c = cron("*/2 * * * * *");
    assert_eq!(
        c.due(t(0), t_ms(1999)),
        None,
        "nothing due before the first tick"
    );
    assert_eq!(
        c.due(t(0), t(2)),
        Some(Due {
            at: t(2),
            missed: 0
        })
    );
    assert_eq!(
        c.due(t(2), t_ms(3500)),
        None,
        "the same tick is not due twice"
    );
    // Down from 2 s to 9.5 s: 4, 6 and 8 were due; 8 fires, 4 and 6 are missed.
    assert_eq!(
        c.due(t(2), t_ms(9500)),
        Some(Due {
            at: t(8),
            missed: 2
        })
    );
    // A long outage counts at most so many.
    let long = c.due(t(0), t(100_000)).unwrap();
    assert_eq!((long.at, long.missed), (t(100_000), MAX_MISSED_COUNTED));
    // A tick claimed in a fraction of its second is not due again.
    assert_eq!(c.due(t_ms(2400), t_ms(3900)), None);
}

#[test]
fn ticks_are_claimed_once_with_ids_fixed_by_name_and_time() {
    let c = cron("*/2 * * * * *");
    let mut s = ScheduleState::new(&def("nightly", "*/2 * * * * *"));
    assert_eq!(s.last_tick, t(0));
    assert_eq!(s.claim_tick(&c, t_ms(1500), "c1"), None);
    let first = s.claim_tick(&c, t_ms(2100), "c1").expect("due");
    assert_eq!(first.as_str(), "nightly-20261122T100002Z");
    assert_eq!(first, tick_batch_id("nightly", &t(2)));
    // Another coordinator reading the same state a moment later finds nothing due.
    assert_eq!(s.claim_tick(&c, t_ms(2300), "c2"), None);
    let second = s.claim_tick(&c, t(4), "c2").expect("the next tick");
    assert_eq!(second.as_str(), "nightly-20261122T100004Z");
    let late = s.claim_tick(&c, t_ms(11_000), "c1").expect("recovered");
    let f = s.firing(&late).unwrap();
    assert_eq!((f.scheduled_for, f.missed), (t(10), 2));
    assert_eq!(s.firings.len(), 3);
    assert!(s.firings.iter().all(|f| f.stage == FiringStage::Claimed));
}

#[test]
fn run_now_has_an_id_of_its_own_and_leaves_the_ticks_alone() {
    let mut s = ScheduleState::new(&def("n", "0 2 * * *"));
    let a = s.claim_run_now(t_ms(1234), "c1");
    let b = s.claim_run_now(t_ms(1234), "c1");
    assert_eq!(a, run_now_batch_id("n", &t_ms(1234)));
    assert_eq!(a.as_str(), "n-now-20261122T100001234Z");
    assert_eq!(b.as_str(), "n-now-20261122T100001234Z-2");
    assert_eq!(s.last_tick, t(0));
    assert_eq!(s.firing(&a).unwrap().kind, FiringKind::RunNow);
}

fn reported(s: &mut ScheduleState, at: i64, webhook: bool) -> BatchId {
    let id = s.claim_run_now(t(at), "c1");
    s.created(&id);
    s.finished(&id, t(at + 1), webhook);
    s.reported(&id);
    id
}

#[test]
fn a_firing_moves_claimed_running_finished_reported_and_is_compared_with_the_last_finished() {
    let mut s = ScheduleState::new(&def("n", "0 2 * * *"));
    let a = reported(&mut s, 1, false);
    let f = s.firing(&a).unwrap();
    assert_eq!(f.stage, FiringStage::Reported);
    assert_eq!(f.previous, None, "nothing earlier");
    assert!(f.delivery.is_none(), "no webhook, no delivery");
    assert!(f.is_settled());
    // A failed firing is never the one compared with; a running one neither.
    let failed = s.claim_run_now(t(2), "c1");
    s.failed(&failed, "boom");
    assert_eq!(s.firing(&failed).unwrap().error.as_deref(), Some("boom"));
    let running = s.claim_run_now(t(3), "c1");
    s.created(&running);
    let c = s.claim_run_now(t(4), "c1");
    s.created(&c);
    s.finished(&c, t(5), true);
    let f = s.firing(&c).unwrap();
    assert_eq!(f.stage, FiringStage::Finished);
    assert_eq!(f.previous.as_ref(), Some(&a));
    let d = f.delivery.as_ref().expect("a webhook: a delivery");
    assert_eq!((d.state, d.next_attempt_at), (DeliveryState::Pending, t(5)));
    assert_eq!(d.id, delivery_id(&c));
    // Out of order or repeated changes do nothing.
    let before = s.clone();
    s.created(&c);
    s.finished(&c, t(9), true);
    s.failed(&c, "late");
    s.finished(&BatchId::new("unknown"), t(9), true);
    s.reported(&running);
    s.attempt_done(&c, 1, Ok(200), t(9), &fast());
    assert_eq!(s, before);
    assert_eq!(s.firing(&running).unwrap().stage, FiringStage::Running);
}

fn fast() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        base: Duration::from_secs(1),
        cap: Duration::from_secs(60),
        lease: Duration::from_secs(30),
    }
}

#[test]
fn attempts_are_claimed_one_at_a_time_retried_with_backoff_and_bounded() {
    let p = fast();
    let mut s = ScheduleState::new(&def("n", "0 2 * * *"));
    let id = s.claim_run_now(t(0), "c1");
    s.created(&id);
    s.finished(&id, t(1), true);
    assert_eq!(
        s.claim_attempt(&id, t(1), "c1", &p),
        None,
        "not before the report is written"
    );
    s.reported(&id);
    assert_eq!(s.claim_attempt(&id, t(1), "c1", &p), Some(1));
    assert_eq!(
        s.claim_attempt(&id, t(2), "c2", &p),
        None,
        "held by its lease"
    );
    s.attempt_done(&id, 1, Ok(500), t(2), &p);
    let d = s.firing(&id).unwrap().delivery.clone().unwrap();
    assert_eq!(d.next_attempt_at, t(3), "1 s after the first failure");
    assert_eq!(d.attempts[0].status, Some(500));
    assert!(d.attempts[0].error.as_deref().unwrap().contains("500"));
    assert_eq!(s.claim_attempt(&id, t_ms(2999), "c2", &p), None);
    assert_eq!(s.claim_attempt(&id, t(3), "c2", &p), Some(2));
    // The coordinator making attempt 2 dies: after the lease another takes attempt 3.
    assert_eq!(s.claim_attempt(&id, t(33), "c1", &p), Some(3));
    let d = s.firing(&id).unwrap().delivery.clone().unwrap();
    assert!(d.attempts[1]
        .error
        .as_deref()
        .unwrap()
        .contains("no outcome"));
    // A late outcome of the lost attempt changes nothing.
    s.attempt_done(&id, 2, Ok(200), t(34), &p);
    assert_eq!(s.firing(&id).unwrap().delivery.clone().unwrap(), d);
    s.attempt_done(&id, 3, Err("connection refused".into()), t(34), &p);
    let d = s.firing(&id).unwrap().delivery.clone().unwrap();
    assert_eq!(d.state, DeliveryState::GaveUp, "3 attempts spent");
    assert_eq!(d.attempts.len(), 3);
    assert_eq!(s.claim_attempt(&id, t(999), "c1", &p), None);
    assert!(s.firing(&id).unwrap().is_settled());
}

#[test]
fn a_2xx_answer_delivers_once() {
    let p = fast();
    let mut s = ScheduleState::new(&def("n", "0 2 * * *"));
    let id = reported(&mut s, 0, true);
    assert_eq!(s.claim_attempt(&id, t(1), "c1", &p), Some(1));
    s.attempt_done(&id, 1, Ok(204), t(2), &p);
    let d = s.firing(&id).unwrap().delivery.clone().unwrap();
    assert_eq!(d.state, DeliveryState::Delivered);
    assert_eq!(d.attempts[0].error, None);
    assert_eq!(s.claim_attempt(&id, t(100), "c2", &p), None);
}

#[test]
fn an_attempt_under_way_that_outlives_every_attempt_gives_up() {
    let p = RetryPolicy {
        max_attempts: 1,
        ..fast()
    };
    let mut s = ScheduleState::new(&def("n", "0 2 * * *"));
    let id = reported(&mut s, 0, true);
    assert_eq!(s.claim_attempt(&id, t(1), "c1", &p), Some(1));
    assert_eq!(s.claim_attempt(&id, t(40), "c2", &p), None);
    let d = s.firing(&id).unwrap().delivery.clone().unwrap();
    assert_eq!(d.state, DeliveryState::GaveUp);
    assert!(d.attempts[0].finished_at.is_some());
}

#[test]
fn the_backoff_doubles_up_to_its_cap_without_overflow() {
    let p = RetryPolicy::default();
    let secs: Vec<u64> = (1..=9).map(|n| p.delay_after(n).as_secs()).collect();
    assert_eq!(secs, [10, 20, 40, 80, 160, 320, 640, 1280, 2560]);
    assert_eq!(p.delay_after(12), Duration::from_secs(3600));
    assert_eq!(p.delay_after(u32::MAX), Duration::from_secs(3600));
    assert_eq!(p.delay_after(0), Duration::from_secs(10));
}

#[test]
fn settled_firings_beyond_the_cap_are_forgotten_oldest_first() {
    let mut s = ScheduleState::new(&def("n", "0 2 * * *"));
    let running = s.claim_run_now(t(0), "c1");
    s.created(&running);
    for i in 1..=(MAX_FIRINGS_KEPT as i64 + 10) {
        reported(&mut s, i, false);
    }
    assert_eq!(s.firings.len(), MAX_FIRINGS_KEPT);
    assert_eq!(
        s.firings[0].batch_id, running,
        "an unsettled firing is kept"
    );
    assert_eq!(
        s.firings[1].scheduled_for,
        t(12),
        "the oldest settled ones went"
    );
}

#[test]
fn the_signature_is_rfc_4231_hmac_sha256_in_hex() {
    // RFC 4231, test cases 1 and 2.
    assert_eq!(
        sign(&[0x0b; 20], b"Hi There"),
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
    );
    let jefe = sign(b"Jefe", b"what do ya want for nothing?");
    assert_eq!(
        jefe,
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
    let body = b"what do ya want for nothing?";
    assert!(verify(b"Jefe", body, &format!("sha256={jefe}")));
    assert!(verify(b"Jefe", body, &jefe));
    assert!(!verify(b"Jeff", body, &jefe), "another key");
    assert!(
        !verify(b"Jefe", b"what do ya want for nothing!", &jefe),
        "another body"
    );
    assert!(!verify(b"Jefe", body, "sha256=zz"), "not hex");
    assert!(!verify(b"Jefe", body, &jefe[..62]), "cut short");
}

#[test]
fn webhooks_are_http_without_credentials_and_their_secret_is_never_shown() {
    assert_eq!(hook("https://hooks.example.com/x").check(), Ok(()));
    assert_eq!(hook("http://127.0.0.1:9999/hook?x=1").check(), Ok(()));
    for (url, why) in [
        ("ftp://example.com/x", "scheme is `ftp`"),
        ("example.com/x", "not `http://"),
        ("https:///x", "no host"),
        ("https://user:pw@example.com/x", "credentials"),
        ("https://example.com/x#frag", "fragment"),
        ("https://example.com/a b", "space"),
    ] {
        let e = hook(url).check().expect_err(url).to_string();
        assert!(e.contains(why), "{url}: {e}");
    }
    let long = format!("https://example.com/{}", "a".repeat(2048));
    assert!(hook(&long)
        .check()
        .unwrap_err()
        .to_string()
        .contains("over"));
    let short = Webhook {
        secret: "short".into(),
        ..hook("https://example.com")
    };
    assert!(short.check().unwrap_err().to_string().contains("5 bytes"));
    let shown = format!("{:?}", hook("https://hooks.example.com/x/TOKEN"));
    assert!(
        !shown.contains("secret\"") && !shown.contains("0123456789abcdef"),
        "{shown}"
    );
    assert!(!shown.contains("TOKEN"), "{shown}");
    assert_eq!(
        shown_url("https://hooks.example.com/x/TOKEN"),
        "https://hooks.example.com/…"
    );
    assert_eq!(shown_url("HTTP://h:80/"), "http://h:80");
    assert_eq!(shown_url("http://h:80?q=1"), "http://h:80/…");
}

#[test]
fn a_definition_is_checked_whole_before_it_is_stored() {
    let good = def("nightly", "0 2 * * *");
    assert_eq!(good.check(t(0)).unwrap().expr(), "0 2 * * *");
    let fired = good.fired_spec(&t(2));
    assert_eq!(fired.labels[SCHEDULE_LABEL], "nightly");
    assert_eq!(fired.labels[SCHEDULED_FOR_LABEL], "2026-11-22T10:00:02Z");
    assert_eq!(fired.labels["suite"], "calc");

    let refused = |d: ScheduleDef, why: &str| {
        let e = d.check(t(0)).expect_err(why).to_string();
        assert!(e.contains(why), "{why}: {e}");
    };
    refused(def("a/b", "0 2 * * *"), "schedule name");
    refused(def("n", "0 2 * *"), "4 fields");
    let mut d = def("n", "0 2 * * *");
    d.dataset.push_str("{\"id\": \"b\", \"repo\": \"/r\"}\n");
    refused(d.clone(), "sha256 does not match");
    d.dataset_sha256 = sha256_hex(d.dataset.as_bytes());
    assert!(d.check(t(0)).is_ok(), "two items, hash right");
    d.dataset = "{\"id\": \"a\"}\n".into();
    d.dataset_sha256 = sha256_hex(d.dataset.as_bytes());
    refused(d, "dataset:");
    let mut d = def("n", "0 2 * * *");
    d.dataset = "{\"id\": \"a\", \"repo\": \"/r\", \"script\": {\"se\": 3}}\n".into();
    d.dataset_sha256 = sha256_hex(d.dataset.as_bytes());
    refused(d, "script is malformed");
    let mut d = def("n", "0 2 * * *");
    d.spec = spec(json!({"schedule": "other"}));
    refused(d, "label `schedule`");
    let mut d = def("n", "0 2 * * *");
    d.spec.max_running = 0;
    refused(d, "max_running");
    let mut d = def("n", "0 2 * * *");
    d.options = json!([1]);
    refused(d, "`options` is an object");
    let mut d = def("n", "0 2 * * *");
    d.webhook = Some(hook("file:///etc/passwd"));
    refused(d, "webhook");
    let mut d = def("n", "0 2 * * *");
    d.graph.graph.start = crate::ids::NodeId::new("nowhere");
    assert!(matches!(d.check(t(0)), Err(ScheduleError::Graph(e)) if !e.is_empty()));
    // The uid changes with the definition, not with its secret.
    let mut other = good.clone();
    other.webhook = Some(Webhook {
        secret: "another secret, long enough".into(),
        ..hook("https://hooks.example.com/x/TOKEN")
    });
    assert_eq!(other.uid(), good.uid());
    other.created_at = t(1);
    assert_ne!(other.uid(), good.uid());
}

/// A batch of one item that finished with `passed` (its stored form, so fields the batch
/// model gains later take their defaults).
fn finished_batch(id: &BatchId, passed: bool) -> BatchState {
    let items = crate::batch::parse_dataset("{\"id\": \"a\", \"repo\": \"/r\"}\n").unwrap();
    let b = BatchState::new(
        id.clone(),
        "tiny",
        "graphs/x.json",
        spec(json!({})),
        &items,
        t(0),
    );
    let mut v = serde_json::to_value(&b).unwrap();
    let item = &mut v["items"][0];
    item["state"] = json!(if passed { "passed" } else { "failed" });
    item["verdict"] = json!(if passed { "PASS" } else { "FAIL" });
    item["run_id"] = json!(format!("{id}-r"));
    item["cost_usd"] = json!(0.5);
    item["finished_at"] = json!("2026-11-22T10:00:03Z");
    v["finished_at"] = json!("2026-11-22T10:00:03Z");
    let b: BatchState = serde_json::from_value(v).unwrap();
    assert!(b.is_finished());
    b
}

#[test]
fn the_morning_report_carries_the_report_and_the_comparison_and_is_the_same_every_time() {
    let mut s = ScheduleState::new(&def("nightly", "0 2 * * *"));
    let first = reported(&mut s, 1, true);
    let second = s.claim_run_now(t(10), "c1");
    s.created(&second);
    s.finished(&second, t(20), true);
    let firing = s.firing(&second).unwrap().clone();
    let (before, after) = (finished_batch(&first, false), finished_batch(&second, true));
    let m = morning_report("nightly", &firing, &after, Some(&before));
    assert_eq!(m, morning_report("nightly", &firing, &after, Some(&before)));
    let b = &m.body;
    assert_eq!(b["event"], "schedule.report");
    assert_eq!(b["delivery_id"], delivery_id(&second));
    assert_eq!(b["timestamp"], t(20).timestamp());
    assert_eq!(b["batch_id"], second.as_str());
    assert_eq!(b["kind"], "run_now");
    assert_eq!(b["previous_batch_id"], first.as_str());
    assert_eq!(b["report"], m.report);
    assert_eq!(b["report"]["batch_id"], second.as_str());
    assert_eq!(b["counts"]["passed"], 1);
    assert_eq!(b["comparison"]["improved"][0]["item_id"], "a");
    assert_eq!(
        m.comparison.as_ref().unwrap().flipped,
        vec!["a".to_string()]
    );
    let folder = report_folder("nightly", &second);
    assert_eq!(b["keys"]["comparison"], format!("{folder}comparison.json"));
    assert_eq!(folder, format!("schedules/nightly/{second}/"));
    let alone = morning_report("nightly", &firing, &after, None);
    assert!(alone.body["comparison"].is_null() && alone.body["keys"]["comparison"].is_null());
    assert!(alone.comparison.is_none());
}

#[test]
fn a_teams_schedules_are_stored_in_its_own_names() {
    use super::{shown_name, stored_name};
    assert_eq!(stored_name(Some("ml"), "nightly"), "ml~nightly");
    assert_eq!(stored_name(None, "nightly"), "nightly");
    assert_eq!(shown_name("ml~nightly"), "nightly");
    assert_eq!(shown_name("nightly"), "nightly");
    assert_ne!(stored_name(Some("a"), "x"), stored_name(Some("b"), "x"));
    assert!(
        super::check_name("a~x").is_err(),
        "no one names a schedule into a team"
    );
}
