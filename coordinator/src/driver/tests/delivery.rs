//! What at-least-once delivery and restarts bring, on the cluster: a result delivered twice, a
//! result of a superseded attempt, the watchdog's re-issue, cancel with a late result, and a
//! second coordinator finishing a run the first left mid-way.

use super::cluster::{echo, history, ok, result, start_run, Answer, Cluster, CHAIN};
use chrono::TimeDelta;
use serde_json::json;
use shared::engine::{Applied, Event, JobState, RunStatus};
use shared::ids::NodeId;
use shared::messages::{JobSpec, JobStatus};
use shared::time::{Clock, ManualClock, SystemClock};
use std::sync::Arc;
use std::time::Duration;

const TWO: &str = r#"
name: two
start: a
nodes:
  a: {kind: harness, op: noop, routes: [{to: b}]}
  b: {kind: harness, op: noop, routes: [{to: done}]}
  done: {kind: exit, status: a.ok and b.ok}
"#;

/// The nodes of the jobs the worker took, in order.
fn taken(cluster: &Cluster) -> Vec<(String, u32)> {
    cluster
        .worker
        .jobs()
        .iter()
        .map(|j| (j.node.to_string(), j.attempt))
        .collect()
}

fn pairs(nodes: &[(&str, u32)]) -> Vec<(String, u32)> {
    nodes.iter().map(|(n, a)| (n.to_string(), *a)).collect()
}

#[tokio::test]
async fn a_result_delivered_twice_is_applied_once() {
    let cluster = Cluster::new(|spec: &JobSpec| match spec.node.as_str() {
        "a" => Answer::Twice(result(spec, JobStatus::Ok, echo(spec))),
        _ => Answer::Silent,
    });
    let c = cluster.coordinator("c1");
    let run = start_run(&c.coord, TWO, json!({})).await;
    let b = cluster.held("b").await;
    cluster
        .eventually("the copy seen", || c.events("duplicate") >= 1)
        .await;
    let (state, version) = cluster.load(&run).await;
    assert_eq!(history(&state), ["a"], "`a` has one outcome");
    assert_eq!(
        version, 2,
        "the creation and `a`'s result: the copy committed nothing"
    );

    // Once more, alone in its batch, after the run moved on.
    let a_result = cluster.worker.reported()[0].clone();
    assert_eq!(a_result.job_id.as_str(), "two-run.a.1");
    cluster.worker.report(&a_result).await;
    cluster
        .eventually("the late copy seen", || c.events("duplicate") >= 2)
        .await;
    assert_eq!(
        cluster.load(&run).await.1,
        version,
        "the late copy committed nothing"
    );

    cluster
        .worker
        .report(&result(&b, JobStatus::Ok, echo(&b)))
        .await;
    let state = cluster.wait_finished(&run).await;
    assert_eq!(state.status, RunStatus::Succeeded, "{:?}", state.result);
    assert_eq!(history(&state), ["a", "b"]);
    assert_eq!(state.visits[&NodeId::new("b")], 1, "`b` was entered once");
    assert_eq!(
        taken(&cluster),
        pairs(&[("a", 1), ("b", 1)]),
        "the copies published nothing"
    );
    assert_eq!((c.events("changed"), c.events("duplicate")), (2, 2));
}

const ONE: &str = r#"
name: one
start: a
nodes:
  a: {kind: harness, op: noop, routes: [{to: done}]}
  done: {kind: exit, status: a.ok}
"#;

#[tokio::test]
async fn a_result_of_an_older_attempt_after_a_reissue_is_dropped() {
    let cluster = Cluster::new(|_: &JobSpec| Answer::Silent);
    let c = cluster.coordinator("c1");
    let run = start_run(&c.coord, ONE, json!({})).await;
    let first = cluster.held("a").await;
    assert_eq!(first.attempt, 1);

    // What the watchdog applies when the job's deadline passed.
    let reissue = Event::Reissue {
        job_id: first.job_id.clone(),
        attempt: 1,
        started_at: None,
        at: c.coord.clock.now(),
    };
    assert_eq!(
        c.coord.apply(&run, &reissue).await.expect("applied"),
        Applied::Changed
    );
    cluster
        .eventually("attempt 2 published", || {
            cluster.worker.held().iter().any(|j| j.attempt == 2)
        })
        .await;
    let second = cluster.worker.held().pop().expect("attempt 2");
    assert_eq!((&second.job_id, second.attempt), (&first.job_id, 2));

    let (_, version) = cluster.load(&run).await;
    cluster
        .worker
        .report(&result(&first, JobStatus::Ok, echo(&first)))
        .await;
    cluster
        .eventually("the old attempt's result seen", || c.events("stale") >= 1)
        .await;
    let (state, after) = cluster.load(&run).await;
    assert_eq!(after, version, "the stale result committed nothing");
    assert_eq!(state.status, RunStatus::Running);
    assert!(state.history.is_empty());
    let job = &state.jobs[&first.job_id];
    assert_eq!((job.attempt, job.state), (2, JobState::Pending));

    cluster
        .worker
        .report(&result(&second, JobStatus::Ok, echo(&second)))
        .await;
    let state = cluster.wait_finished(&run).await;
    assert_eq!(state.status, RunStatus::Succeeded, "{:?}", state.result);
    assert_eq!(state.history.len(), 1);
    assert_eq!(
        state.history[0].output["attempt"], 2,
        "the new attempt's result"
    );
    assert_eq!(c.events("stale"), 1);
}

#[tokio::test]
async fn the_watchdog_reissues_a_job_nobody_answered_and_the_run_finishes_on_the_new_attempt() {
    let cluster = Cluster::new(|spec: &JobSpec| match spec.attempt {
        1 => Answer::Silent,
        _ => ok(spec),
    });
    // The coordinator's clock stands still until the test moves it past the deadline of the
    // queued job (its timeout plus the queue grace): nothing is re-issued early, and attempt 2
    // is answered long before its own deadline.
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let c = cluster.coordinator_with("c1", |c| c.clock = clock.clone());
    let run = start_run(&c.coord, ONE, json!({})).await;
    cluster.held("a").await;
    let (state, _) = cluster.load(&run).await;
    let job = state.jobs.values().next().expect("the job of `a`");
    let due = c.coord.queue_grace + Duration::from_secs(job.timeout_seconds);
    assert_eq!(c.coord.metrics.reissued.get(), 0, "not before its deadline");
    clock.advance(TimeDelta::from_std(due).expect("a small duration") + TimeDelta::seconds(1));
    let state = cluster.wait_finished(&run).await;

    assert_eq!(state.status, RunStatus::Succeeded, "{:?}", state.result);
    assert_eq!(taken(&cluster), pairs(&[("a", 1), ("a", 2)]));
    assert_eq!(state.history.len(), 1);
    assert_eq!(state.history[0].output["attempt"], 2);
    assert_eq!(c.coord.metrics.reissued.get(), 1);
}

#[tokio::test]
async fn cancel_stops_a_running_run_and_a_later_result_changes_nothing() {
    let cluster = Cluster::new(|_: &JobSpec| Answer::Silent);
    let c = cluster.coordinator("c1");
    let run = start_run(&c.coord, TWO, json!({})).await;
    let a = cluster.held("a").await;

    assert_eq!(
        c.coord.cancel(&run).await.expect("cancelled"),
        Applied::Changed
    );
    let (state, version) = cluster.load(&run).await;
    assert_eq!(state.status, RunStatus::Cancelled);
    assert_eq!(state.result, Some(json!({"reason": "cancelled"})));
    assert_eq!(state.jobs[&a.job_id].state, JobState::Cancelled);
    cluster
        .eventually("the worker asked to stop `a`", || {
            cluster.worker.stops().contains(&a.job_id)
        })
        .await;

    cluster
        .worker
        .report(&result(&a, JobStatus::Ok, echo(&a)))
        .await;
    cluster
        .eventually("the late result seen", || c.events("duplicate") >= 1)
        .await;
    let (after, v) = cluster.load(&run).await;
    assert_eq!(v, version, "the late result committed nothing");
    assert_eq!(after.status, RunStatus::Cancelled);
    assert!(
        after.history.is_empty(),
        "the late result is not an outcome"
    );
    assert_eq!(
        c.coord.cancel(&run).await.expect("applied"),
        Applied::Duplicate
    );
    assert_eq!(taken(&cluster), pairs(&[("a", 1)]), "`b` never started");
    assert_eq!(c.finished("cancelled"), 1);
}

#[tokio::test]
async fn a_second_coordinator_finishes_a_run_the_first_left_mid_way() {
    let cluster = Cluster::new(|spec: &JobSpec| match spec.node.as_str() {
        "b" => Answer::Silent,
        _ => ok(spec),
    });
    let first = cluster.coordinator("coord-1");
    let run = start_run(&first.coord, CHAIN, json!({})).await;
    let b = cluster.held("b").await;
    let first_coord = first.coord.clone();
    first.stop().await;
    let (left, _) = cluster.load(&run).await;
    assert_eq!(left.status, RunStatus::Running);
    assert_eq!(history(&left), ["a"]);

    // `b`'s result arrives while no coordinator runs; a new one (empty caches, no locks, no
    // inbox) picks it up from the queue and carries on from the store.
    cluster
        .worker
        .report(&result(&b, JobStatus::Ok, echo(&b)))
        .await;
    let second = cluster.coordinator("coord-2");
    let state = cluster.wait_finished(&run).await;

    assert_eq!(state.status, RunStatus::Succeeded, "{:?}", state.result);
    assert_eq!(history(&state), ["a", "b", "c"]);
    assert_eq!(
        taken(&cluster),
        pairs(&[("a", 1), ("b", 1), ("c", 1)]),
        "nothing was re-issued: the store kept the run"
    );
    assert_eq!(first_coord.metrics.jobs_published.get(), 2, "`a` and `b`");
    assert_eq!(second.coord.metrics.jobs_published.get(), 1, "`c`");
    let finished_by_first = first_coord
        .metrics
        .runs_finished
        .with_label_values(&["succeeded"])
        .get();
    assert_eq!((finished_by_first, second.finished("succeeded")), (0, 1));
    assert_eq!(second.events("changed"), 2, "the results of `b` and `c`");
}
