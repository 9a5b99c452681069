//! Items put on hold for people: a decision is taken only on an item that waits, recorded in
//! order, visible to expressions, and releases the hold node when the run waits there.

use super::*;

const HOLD: &str = r#"
name: hold
start: settle
quarantine:
  pending: "settle.output.pending if visits.settle else []"
  hold: wait
nodes:
  settle:
    kind: harness
    op: collect
    max_visits: 5
    routes:
      - to: done
        when: not settle.output.pending
      - to: wait
  wait:
    kind: approval
    max_visits: 5
    routes: [{to: settle}]
  done:
    kind: exit
    status: "true"
"#;

fn decision(item: &str, approved: bool) -> Event {
    Event::Quarantine {
        item: item.into(),
        approved,
        by: "ana".into(),
        comment: "looked at it".into(),
        at: time(0),
    }
}

#[test]
fn a_decision_on_a_waiting_item_is_recorded_and_releases_the_hold() {
    let b = bundle(HOLD);
    let t = step(&b, &new_run(&b, 1), Event::Start { at: time(0) });
    // Nothing waits yet: a decision is refused.
    let early = step(&b, &t.state, decision("4", true));
    assert_eq!(
        early.applied,
        Applied::Ignored("the item is not in quarantine")
    );
    let settle = jobs_of(&t)[0].clone();
    let t = step(&b, &t.state, ok(&settle.job_id, json!({"pending": [4]})));
    assert_eq!(t.state.awaiting_approval(), vec![&NodeId::new("wait")]);
    assert_eq!(crate::engine::quarantine::pending(&b, &t.state), vec!["4"]);
    let other = step(&b, &t.state, decision("5", true));
    assert_eq!(
        other.applied,
        Applied::Ignored("the item is not in quarantine")
    );

    let t = step(&b, &t.state, decision("4", false));
    assert_eq!(t.applied, Applied::Changed);
    assert_eq!(t.state.quarantine["4"].len(), 1);
    assert!(!t.state.quarantine["4"][0].approved);
    // The hold was released: settle runs again and sees the decision.
    let again = jobs_of(&t);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].node, NodeId::new("settle"));
    let ctx = t.state.context_in(None);
    assert_eq!(ctx["quarantine"]["4"][0]["by"], "ana");
    let t = step(&b, &t.state, ok(&again[0].job_id, json!({"pending": []})));
    assert_eq!(t.state.status, RunStatus::Succeeded);
    let late = step(&b, &t.state, decision("4", true));
    assert_eq!(late.applied, Applied::Ignored("run is not running"));
}
