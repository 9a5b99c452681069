//! The dashboard's view of a run's graph follows the run: idle, waiting for a person, running,
//! done or failed per node, its jobs counted, every route an edge.

use super::*;
use crate::http::{GraphView, NodeState};

fn states(v: &GraphView) -> Vec<(&str, NodeState)> {
    v.nodes.iter().map(|n| (n.id.as_str(), n.state)).collect()
}

#[test]
fn nodes_go_from_idle_to_waiting_running_and_done_or_failed() {
    let b = bundle(
        r#"
name: gate
start: review
nodes:
  review:
    kind: approval
    routes: [{to: work}]
  work:
    kind: harness
    op: noop
    routes: [{to: done, when: work.ok}, {to: failed}]
  done: {kind: exit, status: "true"}
  failed: {kind: exit, status: "false"}
"#,
    );
    let s = new_run(&b, 1);
    let v = GraphView::of(&b.graph, &s, 1);
    assert!(v.nodes.iter().all(|n| n.state == NodeState::Idle));
    assert_eq!(v.edges.len(), 3);
    assert_eq!(v.edges[1].when.as_deref(), Some("work.ok"));

    let t = step(&b, &s, Event::Start { at: time(0) });
    let v = GraphView::of(&b.graph, &t.state, 2);
    assert_eq!(states(&v)[2], ("review", NodeState::Waiting));
    assert_eq!(v.awaiting_approval, vec!["review".to_string()]);

    let t = step(
        &b,
        &t.state,
        Event::Decide {
            node: NodeId::new("review"),
            approved: true,
            by: "ana".into(),
            comment: String::new(),
            at: time(1),
            edits: None,
        },
    );
    let v = GraphView::of(&b.graph, &t.state, 3);
    let work = v.nodes.iter().find(|n| n.id == "work").unwrap();
    assert_eq!((work.state, work.running), (NodeState::Running, 1));
    assert_eq!(
        v.nodes.iter().find(|n| n.id == "review").unwrap().state,
        NodeState::Done
    );

    let job = jobs_of(&t)[0].job_id.clone();
    let t = step(&b, &t.state, result(&job, 1, JobStatus::Failed, json!({})));
    let v = GraphView::of(&b.graph, &t.state, 4);
    let work = v.nodes.iter().find(|n| n.id == "work").unwrap();
    assert_eq!(
        (work.state, work.running, work.failed),
        (NodeState::Failed, 0, 1)
    );
    assert_eq!(v.status, RunStatus::Failed);
    assert_eq!(v.version, 4);
    // The exit the run ended at, in the run's colour; the other exit never reached.
    let exit = |id: &str| v.nodes.iter().find(|n| n.id == id).unwrap().state;
    assert_eq!(
        (exit("failed"), exit("done")),
        (NodeState::Failed, NodeState::Idle)
    );
}
