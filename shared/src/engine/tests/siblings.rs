//! Events between sibling runs: a child's broadcast reaches the siblings still running (through
//! their parent), starts their handler once, and is never delivered to the sender, to an ended
//! sibling, or twice.

use super::children::Fleet;
use super::*;

const SIB: &str = r#"
name: sib
start: work
on_sibling: {merged: rebase}
defaults: {tree: {max_depth: 1, max_runs: 10}}
nodes:
  work:
    kind: harness
    op: noop
    routes:
      - {to: kids, when: "run.depth == 0"}
      - {to: merge}
  kids:
    kind: spawn
    over: "input.children or []"
    routes: [{to: done}]
  merge:
    kind: harness
    op: noop
    broadcast: merged
    routes: [{to: done}]
  rebase:
    kind: harness
    op: noop
    with: {onto: "event.payload.node"}
  done: {kind: exit, status: "true"}
"#;

#[test]
fn a_broadcast_reaches_the_running_siblings_once_and_starts_their_handler() {
    let b = bundle(SIB);
    let root = super::children::root_with(&b, json!({"children": [{}, {}]}));
    let mut fleet = Fleet::new(&b, root);
    let (first, second) = (RunId::new("root-kids-1-0"), RunId::new("root-kids-1-1"));
    // Hold back every job result of the second child: the first merges while it still runs.
    let mut held = Vec::new();
    while let Some((run, event)) = fleet.queue.pop_front() {
        if run == second && matches!(event, Event::JobFinished { .. }) {
            held.push((run, event));
        } else {
            fleet.deliver(&run, event);
        }
    }
    assert_eq!(fleet.runs[&first].status, RunStatus::Succeeded);
    let waiting = &fleet.runs[&second];
    assert_eq!(
        waiting.sibling_events.len(),
        1,
        "the first child's merge reached it"
    );
    assert_eq!(waiting.visits.get(&NodeId::new("rebase")), Some(&1));
    let ctx = waiting.context();
    assert_eq!(ctx["event"]["from"], first.as_str());
    assert_eq!(ctx["event"]["payload"]["node"], "merge");

    // A redelivered event changes nothing, at the parent or at the sibling.
    let event = waiting.sibling_events[0].clone();
    let again = Event::FromSibling {
        event: Box::new(event.clone()),
        at: time(9),
    };
    assert_eq!(
        apply(&b, waiting, &again, &assembler).unwrap().applied,
        Applied::Duplicate
    );
    let relay = Event::SiblingEvent {
        event: Box::new(event),
        at: time(9),
    };
    let parent = &fleet.runs[&RunId::new("root")];
    assert_eq!(
        apply(&b, parent, &relay, &assembler).unwrap().applied,
        Applied::Duplicate
    );

    // The second child merges after the first ended: nobody is left to hear it.
    fleet.queue.extend(held);
    fleet.drain(|_| 0);
    assert_eq!(fleet.runs[&RunId::new("root")].status, RunStatus::Succeeded);
    assert!(
        fleet.runs[&first].sibling_events.is_empty(),
        "an ended sibling hears nothing"
    );
    assert!(
        fleet.runs[&second]
            .sibling_events
            .iter()
            .all(|e| e.from != second),
        "the sender never hears itself"
    );
}

#[test]
fn a_handler_and_an_event_name_are_checked_with_the_graph() {
    let bad = SIB.replace(
        "on_sibling: {merged: rebase}",
        "on_sibling: {merged: nowhere, 'bad name': rebase}",
    );
    let errs = crate::graph::load_bundle("t.yaml", &bad, |_| Ok(String::new())).unwrap_err();
    let text = format!("{errs:?}");
    assert!(text.contains("starts unknown node `nowhere`"), "{text}");
    assert!(text.contains("event names are letters"), "{text}");
    // Without `on_sibling`, the routeless handler is an error again.
    let routeless = SIB.replace("on_sibling: {merged: rebase}\n", "");
    let errs = crate::graph::load_bundle("t.yaml", &routeless, |_| Ok(String::new())).unwrap_err();
    assert!(format!("{errs:?}").contains("rebase"), "{errs:?}");
}
