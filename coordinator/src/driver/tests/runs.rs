//! Runs to their end on the cluster: a chain, a fan-out meeting at its join, a failure routed
//! by the graph, and approvals approved and rejected.

use super::cluster::{history, ok, result, result_file, start_run, Answer, Cluster, CHAIN, WORKER};
use serde_json::json;
use shared::engine::{Applied, JobState, RunStatus};
use shared::ids::NodeId;
use shared::messages::{JobSpec, JobStatus, INLINE_LIMIT};
use std::collections::BTreeSet;

#[tokio::test]
async fn a_chain_of_noop_nodes_runs_to_succeeded_with_one_outcome_per_node() {
    // `b`'s result is too large to ride inline: the coordinator reads it from object storage.
    let big = "x".repeat(INLINE_LIMIT + 1);
    let cluster = Cluster::new(move |spec: &JobSpec| match spec.node.as_str() {
        "b" => Answer::Report(result(spec, JobStatus::Ok, json!({"big": big}))),
        _ => ok(spec),
    });
    let c = cluster.coordinator("c1");
    let run = start_run(&c.coord, CHAIN, json!({})).await;
    let state = cluster.wait_finished(&run).await;

    assert_eq!(state.status, RunStatus::Succeeded, "{:?}", state.result);
    assert_eq!(history(&state), ["a", "b", "c"], "one outcome per node");
    assert!(state.history.iter().all(|o| o.ok && o.worker == WORKER));
    assert_eq!(
        state.history[0].output,
        json!({"node": "a", "attempt": 1, "value": null})
    );
    assert_eq!(
        state.history[1].output["big"].as_str().map(str::len),
        Some(INLINE_LIMIT + 1),
        "a stored result is read back whole"
    );
    assert_eq!(state.jobs.len(), 3);
    assert!(state
        .jobs
        .values()
        .all(|j| j.state == JobState::Done && j.attempt == 1));
    let taken: Vec<(String, u32)> = cluster
        .worker
        .jobs()
        .iter()
        .map(|j| (j.node.to_string(), j.attempt))
        .collect();
    assert_eq!(
        taken,
        [("a".into(), 1), ("b".into(), 1), ("c".into(), 1)],
        "each node's job was published once, in order"
    );
    let res = state.result.clone().expect("a finished run has a result");
    assert_eq!(
        (res["exit"].as_str(), res["success"].as_bool()),
        (Some("done"), Some(true))
    );
    assert_eq!(result_file(&cluster.blobs, &run).await, res);
    assert_eq!(c.finished("succeeded"), 1);
}

const FAN: &str = r#"
name: fan
start: spread
nodes:
  spread: {kind: fanout, over: input.items, body: each, join: gather}
  each: {kind: harness, op: noop, with: {value: item}, routes: [{to: gather}]}
  gather: {kind: join, routes: [{to: done}]}
  done: {kind: exit, status: gather.ok and gather.output.count == (input.items | length)}
"#;

#[tokio::test]
async fn a_fan_out_meets_at_its_join_which_fires_once_with_every_arrival() {
    let items = ["a", "b", "c", "d", "e"];
    let cluster = Cluster::new(ok);
    let c = cluster.coordinator("c1");
    let run = start_run(&c.coord, FAN, json!({"items": items})).await;
    let state = cluster.wait_finished(&run).await;

    assert_eq!(state.status, RunStatus::Succeeded, "{:?}", state.result);
    let jobs = cluster.worker.jobs();
    let branches: BTreeSet<Option<u32>> = jobs.iter().map(|j| j.branch).collect();
    assert_eq!(jobs.len(), items.len(), "one job per item");
    assert_eq!(branches.len(), items.len(), "each in a branch of its own");
    let wanted: BTreeSet<&str> = items.into_iter().collect();
    let given: BTreeSet<&str> = jobs
        .iter()
        .filter_map(|j| j.params["value"].as_str())
        .collect();
    assert_eq!(given, wanted, "each item went to a branch");

    let gather = NodeId::new("gather");
    assert_eq!(state.joins[&gather].fired, 1, "the join fired exactly once");
    let fired: Vec<_> = state.history.iter().filter(|o| o.node == gather).collect();
    assert_eq!(fired.len(), 1, "one outcome of the join");
    assert_eq!(fired[0].output["count"], items.len());
    let arrived: BTreeSet<&str> = fired[0].output["arrivals"]
        .as_object()
        .expect("arrivals by branch")
        .values()
        .filter_map(|o| o["value"].as_str())
        .collect();
    assert_eq!(arrived, wanted, "every branch's output arrived");
    assert_eq!(history(&state).last(), Some(&"gather"));
}

const FAILING: &str = r#"
name: failing
start: work
nodes:
  work:
    kind: harness
    op: noop
    routes:
      - {to: done, when: work.ok}
      - {to: cleanup}
  cleanup: {kind: harness, op: noop, routes: [{to: failed}]}
  done: {kind: exit, status: work.ok}
  failed: {kind: exit, status: "false"}
"#;

#[tokio::test]
async fn a_failed_or_errored_result_routes_as_the_graph_says() {
    for status in [JobStatus::Failed, JobStatus::Error] {
        let cluster = Cluster::new(move |spec: &JobSpec| match spec.node.as_str() {
            "work" => Answer::Report(result(spec, status, json!({"reason": "tests fail"}))),
            _ => ok(spec),
        });
        let c = cluster.coordinator("c1");
        let run = start_run(&c.coord, FAILING, json!({})).await;
        let state = cluster.wait_finished(&run).await;

        assert_eq!(
            state.status,
            RunStatus::Failed,
            "{status:?}: {:?}",
            state.result
        );
        assert_eq!(
            history(&state),
            ["work", "cleanup"],
            "{status:?}: the failure route"
        );
        let work = &state.history[0];
        assert_eq!((work.ok, work.status), (false, status));
        assert_eq!(work.error.as_deref(), Some("work went wrong"));
        let res = state.result.clone().expect("a result");
        assert_eq!(res["exit"], "failed", "{status:?}");
        assert_eq!(res["outputs"]["work"]["ok"], false);
        assert_eq!(res["outputs"]["work"]["output"]["reason"], "tests fail");
        assert_eq!(result_file(&cluster.blobs, &run).await, res);
        assert_eq!((c.finished("failed"), c.finished("succeeded")), (1, 0));
    }
}

const GATE: &str = r#"
name: gate
start: prep
nodes:
  prep: {kind: harness, op: noop, routes: [{to: review}]}
  review:
    kind: approval
    routes:
      - {to: ship, when: review.ok}
      - {to: rejected}
  ship: {kind: harness, op: noop, routes: [{to: done}]}
  done: {kind: exit, status: review.ok and ship.ok}
  rejected: {kind: exit, status: "false"}
"#;

#[tokio::test]
async fn an_approval_pauses_the_run_until_decided_and_an_approval_goes_on() {
    let cluster = Cluster::new(ok);
    let c = cluster.coordinator("c1");
    let run = start_run(&c.coord, GATE, json!({})).await;
    let paused = cluster
        .wait_run(&run, "awaiting the approval", |s| {
            !s.awaiting_approval().is_empty()
        })
        .await;
    assert_eq!(paused.status, RunStatus::Running);
    assert_eq!(paused.awaiting_approval(), [&NodeId::new("review")]);
    assert_eq!(
        paused.pending_jobs().count(),
        0,
        "nothing runs while it waits"
    );
    assert_eq!(cluster.worker.jobs().len(), 1, "only `prep` ran");

    let applied = c
        .coord
        .decide(&run, "review", true, "ana", "ship it", None)
        .await;
    assert_eq!(applied.expect("decided"), Applied::Changed);
    let state = cluster.wait_finished(&run).await;
    assert_eq!(state.status, RunStatus::Succeeded, "{:?}", state.result);
    assert_eq!(history(&state), ["prep", "review", "ship"]);
    assert_eq!(state.history[1].output["by"], "ana");
    assert_eq!(
        state.result.as_ref().map(|r| &r["exit"]),
        Some(&json!("done"))
    );
    let nodes: Vec<String> = cluster
        .worker
        .jobs()
        .iter()
        .map(|j| j.node.to_string())
        .collect();
    assert_eq!(nodes, ["prep", "ship"]);
}

#[tokio::test]
async fn a_rejection_routes_to_the_graphs_rejection_exit() {
    let cluster = Cluster::new(ok);
    let c = cluster.coordinator("c1");
    let run = start_run(&c.coord, GATE, json!({})).await;
    cluster
        .wait_run(&run, "awaiting the approval", |s| {
            !s.awaiting_approval().is_empty()
        })
        .await;

    let applied = c
        .coord
        .decide(&run, "review", false, "ana", "not now", None)
        .await;
    assert_eq!(applied.expect("decided"), Applied::Changed);
    let (state, version) = cluster.load(&run).await;
    assert_eq!(state.status, RunStatus::Failed, "{:?}", state.result);
    assert_eq!(history(&state), ["prep", "review"]);
    let review = &state.history[1];
    assert!(!review.ok);
    assert_eq!(review.error.as_deref(), Some("rejected by ana: not now"));
    let res = state.result.clone().expect("a result");
    assert_eq!(res["exit"], "rejected");
    assert_eq!(result_file(&cluster.blobs, &run).await, res);

    let again = c
        .coord
        .decide(&run, "review", true, "bo", "changed my mind", None)
        .await;
    assert_eq!(
        again.expect("decided"),
        Applied::Duplicate,
        "a decision is final"
    );
    assert_eq!(cluster.load(&run).await.1, version, "nothing was committed");
    let nodes: Vec<String> = cluster
        .worker
        .jobs()
        .iter()
        .map(|j| j.node.to_string())
        .collect();
    assert_eq!(nodes, ["prep"], "`ship` never ran");
}
