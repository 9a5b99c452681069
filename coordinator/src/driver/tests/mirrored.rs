//! A finished run's mirror: the deltas its commits wrote are removed once the final snapshot
//! is written. The coordinator that made every write of the mirror removes the keys it wrote
//! without listing the folder; one that cannot tell (another coordinator, a restart, a
//! restore) lists it and removes whatever is there.

use super::cluster::{echo, ok, result, start_run, Answer, Cluster, CHAIN};
use serde_json::json;
use shared::ids::RunId;
use shared::messages::{JobSpec, JobStatus};
use std::time::Duration;
use worker::blobs::Blobs;

/// A cluster whose worker holds `c`'s job, and the run started on coordinator `c1`, its
/// deltas listed once `c` is held, and a stray key put among them: a delta this coordinator
/// never wrote, which only a listing finds.
async fn held_at_c(cluster: &Cluster, coord: &super::cluster::Running) -> (RunId, JobSpec) {
    let run = start_run(&coord.coord, CHAIN, json!({})).await;
    let c = cluster.held("c").await;
    let written = deltas(&cluster.blobs, &run).await;
    assert!(!written.is_empty(), "`a`'s and `b`'s commits wrote deltas");
    let stray = format!("runs/{run}/deltas/stray");
    cluster
        .blobs
        .put(&stray, b"{}".to_vec())
        .await
        .expect("stored");
    (run, c)
}

async fn deltas(blobs: &Blobs, run: &RunId) -> Vec<String> {
    let mut keys = blobs
        .list(&format!("runs/{run}/deltas/"))
        .await
        .expect("listed");
    keys.sort();
    keys
}

/// The run's deltas once the finished run's housekeeping (a task of its own) has settled.
async fn deltas_left(blobs: &Blobs, run: &RunId, expected: &[String]) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = deltas(blobs, run).await;
        if left == expected || tokio::time::Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn holding_c(spec: &JobSpec) -> Answer {
    match spec.node.as_str() {
        "c" => Answer::Silent,
        _ => ok(spec),
    }
}

#[tokio::test]
async fn the_coordinator_that_wrote_every_delta_removes_them_by_key_without_a_listing() {
    let cluster = Cluster::new(holding_c);
    let c1 = cluster.coordinator("c1");
    let (run, c) = held_at_c(&cluster, &c1).await;
    cluster
        .worker
        .report(&result(&c, JobStatus::Ok, echo(&c)))
        .await;
    cluster.wait_finished(&run).await;
    let stray = vec![format!("runs/{run}/deltas/stray")];
    assert_eq!(
        deltas_left(&cluster.blobs, &run, &stray).await,
        stray,
        "the deltas it wrote are gone and the folder was not listed (the stray stays)"
    );
    c1.stop().await;
}

#[tokio::test]
async fn a_coordinator_that_did_not_write_every_delta_lists_them_and_removes_all() {
    let cluster = Cluster::new(holding_c);
    let c1 = cluster.coordinator("c1");
    let (run, c) = held_at_c(&cluster, &c1).await;
    c1.stop().await;
    // `c`'s result is committed by a coordinator that knows nothing of the mirror's writes.
    let c2 = cluster.coordinator("c2");
    cluster
        .worker
        .report(&result(&c, JobStatus::Ok, echo(&c)))
        .await;
    cluster.wait_finished(&run).await;
    assert_eq!(
        deltas_left(&cluster.blobs, &run, &[]).await,
        Vec::<String>::new(),
        "every delta is removed, the stray with them"
    );
    c2.stop().await;
}
