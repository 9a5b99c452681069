use super::super::state::{BATCH_STATE_VERSION, MAX_INFRA_RETRIES, MAX_WEIGHT};
use super::*;
use crate::engine::RunStatus;
use crate::factory::valid_run_id;
use crate::ids::RunId;
use crate::proptest_support::cases;
use proptest::prelude::*;
use serde_json::json;
use std::collections::BTreeSet;

#[test]
fn a_new_batch_is_every_item_times_every_trial_queued() {
    let b = batch(&["x", "y"], spec(3, 2));
    assert_eq!(b.v, BATCH_STATE_VERSION);
    let order: Vec<(&str, u32)> = b
        .items
        .iter()
        .map(|i| (i.item_id.as_str(), i.trial))
        .collect();
    assert_eq!(
        order,
        [("x", 1), ("x", 2), ("x", 3), ("y", 1), ("y", 2), ("y", 3)]
    );
    assert!(b
        .items
        .iter()
        .all(|i| i.state == ItemState::Queued && i.attempt == 1 && i.run_id.is_none()));
    let c = b.counts();
    assert_eq!((c.total, c.queued, c.done()), (6, 6, 0));
    assert!(!b.is_finished() && b.finished_at.is_none() && !b.cancelled);
    assert_eq!(b.graph, "factory");
    assert_eq!(b.created_at, t(0));
}

#[test]
fn at_most_max_running_are_started_in_order() {
    let mut b = batch(&["a", "b", "c", "d"], spec(1, 2));
    assert_eq!(b.to_start(usize::MAX), [0, 1]);
    // The fleet's share may allow fewer starts than max_running, never more.
    assert_eq!(b.to_start(1), [0]);
    assert!(b.to_start(0).is_empty());
    for i in b.to_start(usize::MAX) {
        let run = b.run_id_for(i);
        assert!(changes(&mut b, |b| b.started(i, run, t(1))));
    }
    assert!(b.to_start(usize::MAX).is_empty());
    assert_eq!(b.counts().running, 2);
    assert!(changes(&mut b, |b| b.finished(
        0,
        &outcome(RunStatus::Succeeded, None),
        t(5)
    )));
    assert_eq!(b.to_start(usize::MAX), [2]);
    // Starting twice, or an item that is not queued, changes nothing.
    assert!(!changes(&mut b, |b| b.started(
        1,
        RunId::new("other"),
        t(2)
    )));
    assert!(!changes(&mut b, |b| b.started(
        0,
        RunId::new("other"),
        t(2)
    )));
    assert!(!changes(&mut b, |b| b.started(
        99,
        RunId::new("other"),
        t(2)
    )));
    assert_eq!(b.items[1].run_id, Some(b.run_id_for(1)));
}

#[test]
fn run_ids_are_deterministic_valid_and_unique() {
    let mut b = batch(&["a", "b.c", &"z".repeat(128)], spec(100, 5));
    let mut seen = BTreeSet::new();
    for i in 0..b.items.len() {
        let id = b.run_id_for(i);
        assert_eq!(id, b.clone().run_id_for(i));
        assert!(valid_run_id(id.as_str()), "{id}");
        assert!(id.as_str().starts_with("b0123456789abcdef-"), "{id}");
        assert!(seen.insert(id));
    }
    assert_eq!(
        b.run_id_for(1).as_str(),
        format!(
            "b0123456789abcdef-{}-t2-a1",
            &crate::hashing::sha256_hex(b"a")[..16]
        )
    );
    // The next attempt is another run, and so is another batch's.
    b.items[0].attempt = u32::MAX;
    let last = b.run_id_for(0);
    assert!(valid_run_id(last.as_str()) && seen.insert(last));
    b.header_mut().batch_id = BatchId::new("not a plain id, and long too");
    let other = b.run_id_for(1);
    assert!(valid_run_id(other.as_str()) && seen.insert(other));
}

#[test]
fn a_verdict_settles_the_item_and_the_last_one_the_batch() {
    let mut b = batch(&["a", "b", "c"], spec(1, 3));
    for i in 0..3 {
        b.started(i, b.run_id_for(i), t(1));
    }
    let factory_fail = ItemOutcome {
        ended_stage: Some("verify".into()),
        error: Some("tests failed".into()),
        ..outcome(RunStatus::Failed, Some("FAIL"))
    };
    assert!(changes(&mut b, |b| b.finished(
        0,
        &outcome(RunStatus::Succeeded, None),
        t(2)
    )));
    assert!(changes(&mut b, |b| b.finished(1, &factory_fail, t(3))));
    assert!(b.finished_at.is_none());
    // A succeeded run whose result says FAIL failed.
    assert!(changes(&mut b, |b| b.finished(
        2,
        &outcome(RunStatus::Succeeded, Some("FAIL")),
        t(4)
    )));
    let states: Vec<ItemState> = b.items.iter().map(|i| i.state).collect();
    assert_eq!(
        states,
        [ItemState::Passed, ItemState::Failed, ItemState::Failed]
    );
    assert_eq!(b.items[0].verdict.as_deref(), Some("PASS"));
    assert_eq!(b.items[1].ended_stage.as_deref(), Some("verify"));
    assert_eq!(b.items[1].error.as_deref(), Some("tests failed"));
    assert_eq!(b.items[1].finished_at, Some(t(3)));
    assert_eq!((b.items[2].cost_usd, b.items[2].tokens), (0.5, 100));
    assert!(b.is_finished());
    assert_eq!(b.finished_at, Some(t(4)));
    // A settled item takes nothing more.
    assert!(!changes(&mut b, |b| b.finished(
        0,
        &outcome(RunStatus::Failed, None),
        t(9)
    )));
    assert_eq!(b.items[0].state, ItemState::Passed);
}

#[test]
fn infrastructure_errors_are_retried_then_errored_never_a_verdict() {
    let mut b = batch(&["a"], spec(1, 1));
    for attempt in 1..=3 {
        assert_eq!(b.to_start(usize::MAX), [0]);
        let run = b.run_id_for(0);
        assert!(run.as_str().ends_with(&format!("-a{attempt}")));
        b.started(0, run, t(attempt.into()));
        assert!(changes(&mut b, |b| b.finished(
            0,
            &infra(&format!("docker down {attempt}")),
            t(10)
        )));
        assert_eq!(b.items[0].verdict, None);
    }
    let item = &b.items[0];
    assert_eq!(item.state, ItemState::Errored);
    assert_eq!(item.attempt, 3);
    assert_eq!(item.infra_errors, ["docker down 1", "docker down 2"]);
    assert_eq!(item.error.as_deref(), Some("docker down 3"));
    assert_eq!((item.cost_usd, item.tokens), (1.5, 300));
    let c = b.counts();
    assert_eq!((c.errored, c.passed, c.failed), (1, 0, 0));
    assert!(b.is_finished());

    let mut none = batch(
        &["a"],
        BatchSpec {
            max_infra_retries: 0,
            ..spec(1, 1)
        },
    );
    none.started(0, none.run_id_for(0), t(1));
    assert!(changes(&mut none, |none| none.finished(
        0,
        &infra("lost"),
        t(2)
    )));
    assert_eq!(none.items[0].state, ItemState::Errored);
    assert!(none.items[0].infra_errors.is_empty());
}

#[test]
fn an_item_whose_run_could_not_start_is_retried_then_errored_without_a_run() {
    let mut b = batch(&["a", "b"], spec(1, 1));
    for attempt in 1..=3 {
        assert_eq!(b.to_start(usize::MAX), [0]);
        assert!(changes(&mut b, |b| b.finished(
            0,
            &infra("no such repository"),
            t(attempt)
        )));
    }
    let item = &b.items[0];
    assert_eq!(
        (item.state, item.attempt, &item.run_id),
        (ItemState::Errored, 3, &None)
    );
    assert_eq!(item.started_at, None);
    assert_eq!(item.finished_at, Some(t(3)));
    // The next item's turn.
    assert_eq!(b.to_start(usize::MAX), [1]);
}

#[test]
fn unended_runs_and_unknown_items_change_nothing() {
    let mut b = batch(&["a"], spec(1, 1));
    b.started(0, b.run_id_for(0), t(1));
    let before = b.clone();
    for status in [RunStatus::Pending, RunStatus::Running] {
        assert!(!changes(&mut b, |b| b.finished(
            0,
            &outcome(status, None),
            t(2)
        )));
    }
    assert!(!changes(&mut b, |b| b.finished(
        7,
        &outcome(RunStatus::Succeeded, None),
        t(2)
    )));
    assert_eq!(b, before);
}

#[test]
fn cancel_stops_queued_items_and_lets_running_ones_end() {
    let mut b = batch(&["a", "b", "c", "d"], spec(1, 3));
    for i in b.to_start(usize::MAX) {
        b.started(i, b.run_id_for(i), t(1));
    }
    assert!(changes(&mut b, |b| b.cancel(t(2))));
    assert!(!changes(&mut b, |b| b.cancel(t(3))));
    assert!(b.to_start(usize::MAX).is_empty());
    assert_eq!(b.items[3].state, ItemState::Cancelled);
    assert_eq!(b.items[3].finished_at, Some(t(2)));
    assert_eq!(b.counts().running, 3);
    assert!(!b.is_finished());
    // A verdict still counts; an infrastructure error is not retried; a cancelled run is.
    b.finished(0, &outcome(RunStatus::Succeeded, Some("PASS")), t(4));
    b.finished(1, &infra("lost"), t(5));
    assert!(b.finished_at.is_none());
    b.finished(2, &outcome(RunStatus::Cancelled, None), t(6));
    let states: Vec<ItemState> = b.items.iter().map(|i| i.state).collect();
    assert_eq!(
        states,
        [
            ItemState::Passed,
            ItemState::Cancelled,
            ItemState::Cancelled,
            ItemState::Cancelled
        ]
    );
    assert!(b.items[1].infra_errors.is_empty());
    assert_eq!(b.finished_at, Some(t(6)));
    // A finished batch is not cancelled after the fact.
    let mut done = batch(&["a"], spec(1, 1));
    done.started(0, done.run_id_for(0), t(1));
    done.finished(0, &outcome(RunStatus::Succeeded, None), t(2));
    assert!(!changes(&mut done, |done| done.cancel(t(3))));
    assert!(!done.cancelled);
    // Cancelling a batch with nothing running finishes it at once.
    let mut idle = batch(&["a", "b"], spec(2, 1));
    assert!(changes(&mut idle, |idle| idle.cancel(t(7))));
    assert_eq!((idle.counts().cancelled, idle.finished_at), (4, Some(t(7))));
}

#[test]
fn the_spec_is_checked_and_has_defaults() {
    assert_eq!(spec(1, 1).validate(), Ok(()));
    assert_eq!(spec(100, 1).validate(), Ok(()));
    let long_key = "k".repeat(65);
    let many: BTreeMap<String, String> = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
    for (bad, why) in [
        (spec(0, 1), "trials"),
        (spec(101, 1), "trials"),
        (spec(1, 0), "max_running"),
        (
            BatchSpec {
                weight: 0,
                ..spec(1, 1)
            },
            "weight",
        ),
        (
            BatchSpec {
                weight: MAX_WEIGHT + 1,
                ..spec(1, 1)
            },
            "weight",
        ),
        (
            BatchSpec {
                max_infra_retries: MAX_INFRA_RETRIES + 1,
                ..spec(1, 1)
            },
            "max_infra_retries",
        ),
        (
            BatchSpec {
                labels: many,
                ..spec(1, 1)
            },
            "labels",
        ),
        (
            BatchSpec {
                labels: [(long_key, "v".into())].into(),
                ..spec(1, 1)
            },
            "label",
        ),
        (
            BatchSpec {
                labels: [("a b".into(), "v".into())].into(),
                ..spec(1, 1)
            },
            "label",
        ),
        (
            BatchSpec {
                labels: [("model".into(), "v".repeat(257))].into(),
                ..spec(1, 1)
            },
            "value",
        ),
    ] {
        let message = bad.validate().unwrap_err();
        assert!(message.contains(why), "{message}");
        assert!(message.starts_with(char::is_lowercase), "{message}");
    }
    let read: BatchSpec = serde_json::from_value(json!({"max_running": 4})).unwrap();
    assert_eq!(read, spec(1, 4));
}

#[test]
fn the_batch_id_is_deterministic_and_covers_graph_items_and_spec() {
    let items = [item("a"), item("b")];
    let id = batch_id("g1", &items, &spec(1, 2));
    assert_eq!(id, batch_id("g1", &items, &spec(1, 2)));
    assert_eq!(id.as_str().len(), 16);
    assert!(id.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
    let labelled = BatchSpec {
        labels: [("model".into(), "m".into())].into(),
        ..spec(1, 2)
    };
    let others = [
        batch_id("g2", &items, &spec(1, 2)),
        batch_id("g1", &items[..1], &spec(1, 2)),
        batch_id("g1", &[item("b"), item("a")], &spec(1, 2)),
        batch_id("g1", &items, &spec(2, 2)),
        batch_id("g1", &items, &labelled),
    ];
    assert!(others.iter().all(|o| *o != id));
}

#[test]
fn the_state_reads_back_as_written() {
    let mut b = batch(&["a", "b"], spec(2, 2));
    b.started(0, b.run_id_for(0), t(1));
    b.finished(0, &infra("lost"), t(2));
    b.started(1, b.run_id_for(1), t(3));
    b.finished(1, &outcome(RunStatus::Failed, Some("FAIL")), t(4));
    let text = serde_json::to_string(&b).unwrap();
    assert_eq!(serde_json::from_str::<BatchState>(&text).unwrap(), b);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["items"][1]["state"], "failed");
    assert_eq!(v["items"][1]["finished_at"], "2026-11-22T10:00:04Z");
}

#[derive(Clone, Debug)]
enum Op {
    StartAll,
    Finish(usize, u8),
    Cancel,
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::StartAll),
        6 => (0usize..12, any::<u8>()).prop_map(|(i, k)| Op::Finish(i, k)),
        1 => Just(Op::Cancel),
    ]
}

proptest! {
    #![proptest_config(cases(256))]

    /// Whatever the coordinator feeds it, a batch keeps its books: at most `max_running`
    /// running, one infra error recorded per extra attempt, verdicts only on judged items,
    /// `finished_at` exactly when every item settled.
    #[test]
    fn any_sequence_of_events_keeps_the_books(
        items in 1usize..4,
        trials in 1u32..4,
        max_running in 1u32..4,
        retries in 0u32..3,
        ops in prop::collection::vec(arb_op(), 0..40),
    ) {
        let ids: Vec<String> = (0..items).map(|i| format!("i{i}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let spec = BatchSpec { max_infra_retries: retries, ..spec(trials, max_running) };
        let mut b = batch(&refs, spec);
        for (n, op) in ops.into_iter().enumerate() {
            let at = t(n as i64);
            match op {
                Op::StartAll => {
                    for i in b.to_start(usize::MAX) {
                        prop_assert!(changes(&mut b, |b| b.started(i, b.run_id_for(i), at)));
                    }
                }
                Op::Finish(i, kind) => {
                    let i = i % b.items.len();
                    let o = arb_outcome(kind);
                    let changed = changes(&mut b, |b| b.finished(i, &o, at));
                    prop_assert!(!changed || o.status.is_terminal());
                }
                Op::Cancel => {
                    b.cancel(at);
                }
            }
            let c = b.counts();
            prop_assert_eq!(c.total, items * trials as usize);
            prop_assert_eq!(c.done() + c.queued + c.running, c.total);
            prop_assert!(c.running <= max_running as usize);
            prop_assert_eq!(b.finished_at.is_some(), b.is_finished());
            prop_assert!(!b.cancelled || c.queued == 0);
            for item in &b.items {
                prop_assert!(item.attempt >= 1 && item.attempt <= retries + 1);
                prop_assert_eq!(item.infra_errors.len() as u32, item.attempt - 1);
                let judged = matches!(item.state, ItemState::Passed | ItemState::Failed);
                prop_assert_eq!(item.verdict.is_some(), judged);
                if item.state == ItemState::Passed {
                    prop_assert_eq!(item.verdict.as_deref(), Some("PASS"));
                }
                let running = item.state == ItemState::Running;
                prop_assert_eq!(running, item.run_id.is_some() && !item.state.is_settled());
            }
        }
    }
}

#[test]
fn a_pass_with_suspected_special_cases_is_held_not_counted_as_a_pass() {
    let mut b = batch(&["a", "b"], spec(1, 2));
    for i in 0..2 {
        b.started(i, b.run_id_for(i), t(1));
    }
    let signal = crate::special_case::SuspectedSpecialCase {
        path: "calc.py".into(),
        line: 3,
        literal: "13".into(),
        why: "comparison".into(),
    };
    let suspect = ItemOutcome {
        suspected_special_case: vec![signal.clone()],
        ..outcome(RunStatus::Succeeded, Some("PASS"))
    };
    // A failed run with the same signal is a plain failure: nothing to hold.
    let failed = ItemOutcome {
        suspected_special_case: vec![signal],
        ..outcome(RunStatus::Failed, Some("FAIL"))
    };
    assert!(changes(&mut b, |b| b.finished(0, &suspect, t(2))));
    assert!(changes(&mut b, |b| b.finished(1, &failed, t(3))));
    assert_eq!(b.items[0].state, ItemState::Held);
    assert_eq!(b.items[0].verdict.as_deref(), Some("HELD"));
    let why = b.items[0].error.clone().unwrap_or_default();
    assert!(why.contains("calc.py:3 comparison on 13"), "{why}");
    assert_eq!(b.items[1].state, ItemState::Failed);
    let c = b.counts();
    assert_eq!((c.passed, c.held, c.failed), (0, 1, 1));
    assert!(b.is_finished());
}
