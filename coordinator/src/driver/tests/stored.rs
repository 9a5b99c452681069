//! A run in the store as a snapshot and deltas: a reader that replays them gets exactly the
//! state the committing coordinator holds, and deltas that do not read or do not follow
//! the commit before them fail the load loudly instead of giving a wrong state.

use super::cluster::{ok, start_run, Cluster};
use crate::driver::Coordinator;
use serde_json::json;
use shared::engine::Applied;
use shared::ids::RunId;
use shared::ports::{CasOutcome, RunStore};
use std::sync::Arc;

const WAIT: &str = r#"
name: wait
start: a
nodes:
  a: {kind: harness, op: noop, routes: [{to: b}]}
  b: {kind: harness, op: noop, routes: [{to: review}]}
  review:
    kind: approval
    routes: [{to: done}]
  done: {kind: exit, status: review.ok}
"#;

/// Approvals in a row: a decision is a small delta, so of two decisions in a row at least
/// one is appended (a commit after a snapshot always is).
const REVIEWS: &str = r#"
name: reviews
start: a
nodes:
  a: {kind: harness, op: noop, routes: [{to: r1}]}
  r1: {kind: approval, routes: [{to: r2}]}
  r2: {kind: approval, routes: [{to: r3}]}
  r3: {kind: approval, routes: [{to: r4}]}
  r4: {kind: approval, routes: [{to: done}]}
  done: {kind: exit, status: r4.ok}
"#;

/// A run of `WAIT` waiting at its approval, its coordinator stopped (it still holds the state).
async fn stopped_at_the_approval() -> (Cluster, Arc<Coordinator>, RunId) {
    let cluster = Cluster::new(ok);
    let c = cluster.coordinator("c1");
    let run = start_run(&c.coord, WAIT, json!({})).await;
    cluster
        .wait_run(&run, "awaiting the approval", |s| {
            !s.awaiting_approval().is_empty()
        })
        .await;
    let coord = c.coord.clone();
    c.stop().await;
    (cluster, coord, run)
}

#[tokio::test]
async fn a_replayed_run_is_the_state_its_coordinator_committed() {
    let cluster = Cluster::new(ok);
    let c = cluster.coordinator("c1");
    let run = start_run(&c.coord, REVIEWS, json!({})).await;
    let mut stored = None;
    for node in ["r1", "r2", "r3"] {
        cluster
            .wait_run(&run, "awaiting the next approval", |s| {
                s.awaiting_approval().iter().any(|n| n.as_str() == node)
            })
            .await;
        let decided = c.coord.decide(&run, node, true, "ana", "ok", None).await;
        assert_eq!(decided.expect("decided"), Applied::Changed, "{node}");
        let now = cluster.store.load(&run).await.unwrap().unwrap();
        if !now.deltas.is_empty() {
            stored = Some(now);
            break;
        }
    }
    let stored = stored.expect("of two decisions in a row one was appended as a delta");
    let (replayed, version) = cluster.load(&run).await;
    let held = c.coord.load(&run).await.unwrap();
    assert_eq!(replayed, held, "the replay gives the committed state");
    assert_eq!(version, stored.version);
    assert_eq!(
        replayed.awaiting_approval().len(),
        1,
        "the next approval waits"
    );
    c.stop().await;
}

#[tokio::test]
async fn a_delta_that_does_not_follow_or_does_not_read_fails_the_load() {
    let (cluster, _, run) = stopped_at_the_approval().await;
    let version = cluster.store.head(&run).await.unwrap().unwrap().0;
    let forged = json!({"prev": "not-the-last-commit", "id": "x", "events": []}).to_string();
    let appended = cluster.store.append(&run, version, "x", &forged, &[]).await;
    assert_eq!(appended.unwrap(), CasOutcome::Committed);
    let reader = cluster.coordinator("reader");
    let err = reader.coord.load(&run).await.unwrap_err().to_string();
    assert!(
        err.contains("follows commit `not-the-last-commit`"),
        "{err}"
    );
    reader.stop().await;

    let (cluster, _, run) = stopped_at_the_approval().await;
    let version = cluster.store.head(&run).await.unwrap().unwrap().0;
    let appended = cluster.store.append(&run, version, "y", "{junk", &[]).await;
    assert_eq!(appended.unwrap(), CasOutcome::Committed);
    let reader = cluster.coordinator("reader");
    let err = reader.coord.load(&run).await.unwrap_err().to_string();
    assert!(err.contains("a stored delta does not read"), "{err}");
    reader.stop().await;
}

#[tokio::test]
async fn a_look_at_a_held_run_sees_it_only_while_the_store_still_names_it() {
    let (cluster, coord, run) = stopped_at_the_approval().await;
    let loaded = coord.load(&run).await.unwrap();
    let looked = coord.peek(&run, |s| s.clone()).await.unwrap();
    assert_eq!(looked, loaded, "the held state, as a load gives it");
    // Another writer moves the store on: the held state is stale and never shown; the look
    // goes to the store (whose forged delta fails the load).
    let version = cluster.store.head(&run).await.unwrap().unwrap().0;
    let forged = json!({"prev": "not-the-last-commit", "id": "x", "events": []}).to_string();
    let appended = cluster.store.append(&run, version, "x", &forged, &[]).await;
    assert_eq!(appended.unwrap(), CasOutcome::Committed);
    let err = coord.peek(&run, |s| s.status).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("follows commit `not-the-last-commit`"),
        "{err}"
    );
}
