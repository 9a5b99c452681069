//! A run that stops moving without ending, on the cluster: its graph sends `a` to a join that
//! also waits for `b`, and nothing ever runs `b`. The watchdog ends it `run_stalled` with the
//! state it is stuck in once the stall grace passed, not before.

use super::cluster::{ok, start_run, Cluster};
use chrono::TimeDelta;
use serde_json::json;
use shared::engine::RunStatus;
use shared::messages::JobSpec;
use shared::time::{Clock, ManualClock, SystemClock};
use std::sync::Arc;
use std::time::Duration;

/// `a`'s first route always matches: `both` waits for `b`, which never runs.
const JOIN_NEVER_FULL: &str = r#"
name: join-never-full
start: a
nodes:
  a:
    kind: harness
    op: noop
    routes:
      - {to: both, when: "true"}
      - {to: b}
  b: {kind: harness, op: noop, routes: [{to: both}]}
  both: {kind: join, wait_for: [a, b], routes: [{to: done}]}
  done: {kind: exit, status: a.ok}
"#;

#[tokio::test]
async fn a_run_waiting_for_nothing_is_ended_stalled_after_the_grace_and_not_before() {
    let cluster = Cluster::new(|spec: &JobSpec| ok(spec));
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let c = cluster.coordinator_with("c1", |c| c.clock = clock.clone());
    let run = start_run(&c.coord, JOIN_NEVER_FULL, json!({})).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while cluster.load(&run).await.0.history.is_empty() {
        assert!(std::time::Instant::now() < deadline, "`a` never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Past `a`'s result the run waits for nothing; the watchdog (every second) leaves it
    // alone while the grace lasts.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (state, _) = cluster.load(&run).await;
    assert_eq!(state.status, RunStatus::Running, "{:?}", state.result);
    assert_eq!(state.history.len(), 1);

    let grace = TimeDelta::from_std(c.coord.stall_grace).expect("a small duration");
    clock.advance(grace + TimeDelta::seconds(1));
    let state = cluster.wait_finished(&run).await;
    assert_eq!(state.status, RunStatus::Failed);
    let result = state.result.clone().expect("an ended run has a result");
    assert_eq!(result["reason"], "run_stalled", "{result}");
    assert_eq!(
        result["stuck"]["joins_waiting"]["both"]["arrived"],
        json!(["a"])
    );
    assert_eq!(result["stuck"]["joins_waiting"]["both"]["expected"], 2);
    assert_eq!(c.finished("failed"), 1);
}
