//! The contract of the run-store port (`shared::ports::RunStore`), written once and run against
//! every adapter: the memory store in this crate's unit tests (`store::memory`), Redis in
//! `tests/conformance.rs`. Each case gets a fresh, empty store (for Redis: a namespace of its
//! own) built with the [`Profile`]'s lease.
//!
//! What adapters may do differently is stated in the [`Profile`], and each case checks the
//! adapter against what its profile says, so no difference goes untested:
//!
//! - `lease`: how long an owner's lease lasts without a heartbeat (the cases sleep around it,
//!   so adapters are built with a short one);
//! - `list_limit`: `list` may return only the newest N runs (Redis: 1000), or all of them.
//!
//! Everything else is the same contract. The memory store used to differ (claimed outbox
//! messages were forgotten at once, leases ignored, `created_before` empty); it now keeps the
//! in-flight lists, the leases and the creation times like Redis does.
//!
//! Run the whole suite on an adapter with [`run_store_conformance!`](crate::run_store_conformance).

use shared::engine::RunState;
use shared::ids::{JobId, RunId};
use shared::messages::JobEnvelope;
use shared::ports::{CasOutcome, OutboxMessage, RunStore};
use std::time::Duration;

mod batches;
mod mirror_index;
mod schedules;
mod slots;
mod tokens;
pub use batches::*;
pub use mirror_index::*;
pub use schedules::*;
pub use slots::*;
pub use tokens::*;

/// What the adapter under test is allowed to do differently.
#[derive(Clone, Debug)]
pub struct Profile {
    /// The owner lease the store was built with.
    pub lease: Duration,
    /// `list` returns the newest this many runs at most; `None`: every run.
    pub list_limit: Option<usize>,
}

/// A run state good enough for a store (stores treat it as opaque but for its id). Built from
/// its stored JSON form, which changes less often than its constructor.
pub fn state(run: &str) -> RunState {
    let v = serde_json::json!({
        "run_id": run,
        "graph_name": "g",
        "graph_ref": "graphs/g.json",
        "status": "pending",
        "input": {},
        "meta": {},
        "repo": {"url": "/repo", "base_commit": "c0", "packs": []},
        "agent": serde_json::to_value(shared::messages::AgentConfig::default()).unwrap(),
        "visits": {},
        "jobs": {},
        "history": [],
        "result": null,
        "usage": serde_json::to_value(shared::messages::Usage::default()).unwrap(),
        "created_at": "2024-01-01T00:00:00Z",
        "updated_at": "2024-01-01T00:00:00Z",
        "finished_at": null,
    });
    serde_json::from_value(v).expect("a run state")
}

/// The `i`th outbox message of `run`.
pub fn message(run: &str, i: u32) -> OutboxMessage {
    OutboxMessage::Job(JobEnvelope {
        v: 1,
        job_id: JobId::new(format!("{run}.n.{i}")),
        run_id: RunId::new(run),
        attempt: 1,
        spec_ref: format!("blobs/{i:064}"),
        spec: None,
        team: None,
        image: None,
    })
}

pub(super) fn decode(raws: &[String]) -> Vec<OutboxMessage> {
    raws.iter()
        .map(|r| serde_json::from_str(r).expect("an outbox message as the store took it"))
        .collect()
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Pause long enough that two creations get different creation times (milliseconds).
pub(super) async fn tick() {
    tokio::time::sleep(Duration::from_millis(5)).await;
}

pub async fn create_is_idempotent(s: &dyn RunStore, _: &Profile) {
    let mut first = state("r1");
    first.graph_name = "first".into();
    assert!(s.create(&first, &[]).await.unwrap(), "a new run is created");
    let mut second = state("r1");
    second.graph_name = "second".into();
    assert!(
        !s.create(&second, &[message("r1", 9)]).await.unwrap(),
        "a run that exists is not created again"
    );
    let (loaded, version) = plain(s, &RunId::new("r1")).await.unwrap();
    assert_eq!(loaded.graph_name, "first", "the first state stays");
    assert_eq!(version, 1);
    assert!(
        s.outbox_claim("o", 10).await.unwrap().is_empty(),
        "a refused create adds nothing to the outbox"
    );
}

pub async fn load_returns_state_and_version(s: &dyn RunStore, _: &Profile) {
    assert!(s.load(&RunId::new("missing")).await.unwrap().is_none());
    let st = state("r1");
    s.create(&st, &[]).await.unwrap();
    assert_eq!(
        plain(s, &RunId::new("r1")).await,
        Some((st, 1)),
        "a created run is at version 1, as it was given"
    );
}

/// A run stored as a snapshot with no deltas after it: its state and version.
async fn plain(s: &dyn RunStore, run: &RunId) -> Option<(RunState, u64)> {
    let stored = s.load(run).await.unwrap()?;
    assert!(stored.deltas.is_empty(), "no deltas were appended");
    assert!(stored.snapshot_bytes > 0, "the snapshot's size is known");
    Some((stored.snapshot, stored.version))
}

pub async fn deltas_are_appended_by_version_and_dropped_by_a_snapshot(
    s: &dyn RunStore,
    _: &Profile,
) {
    let run = RunId::new("r1");
    let mut st = state("r1");
    assert_eq!(
        s.append(&run, 1, "c1", "d1", &[]).await.unwrap(),
        CasOutcome::Conflict,
        "a run that does not exist takes no delta"
    );
    st.commit = "c0".into();
    s.create(&st, &[]).await.unwrap();
    let sent = [message("r1", 1)];
    assert_eq!(
        s.append(&run, 1, "c1", "d1", &sent).await.unwrap(),
        CasOutcome::Committed
    );
    assert_eq!(
        s.append(&run, 2, "c2", "d2", &[]).await.unwrap(),
        CasOutcome::Committed
    );
    assert_eq!(
        s.append(&run, 2, "x", "stale", &[message("r1", 9)])
            .await
            .unwrap(),
        CasOutcome::Conflict,
        "a delta on a version that moved on is refused, with its outbox"
    );
    let stored = s.load(&run).await.unwrap().unwrap();
    assert_eq!(
        stored.snapshot, st,
        "the snapshot is not rewritten by a delta"
    );
    assert_eq!(
        stored.deltas,
        ["d1", "d2"],
        "deltas come back in commit order"
    );
    assert_eq!(stored.version, 3);
    assert_eq!(stored.delta_bytes(), 4);
    assert_eq!(s.head(&run).await.unwrap(), Some((3, "c2".into())));
    assert_eq!(
        decode(&s.outbox_claim("o", 10).await.unwrap()),
        sent,
        "an appended delta's outbox is written with it"
    );
    st.commit = "c3".into();
    st.graph_name = "snapshot".into();
    assert_eq!(s.commit(&st, 3, &[]).await.unwrap(), CasOutcome::Committed);
    assert_eq!(
        plain(s, &run).await,
        Some((st, 4)),
        "a snapshot drops the deltas"
    );
    s.remove(&run).await.unwrap();
    let mut again = state("r1");
    again.commit = "n0".into();
    s.create(&again, &[]).await.unwrap();
    assert_eq!(
        plain(s, &run).await,
        Some((again, 1)),
        "a new run starts with no deltas"
    );
}

pub async fn the_head_names_the_stored_version_and_commit(s: &dyn RunStore, _: &Profile) {
    let run = RunId::new("r1");
    assert_eq!(s.head(&run).await.unwrap(), None, "no run, no head");
    let mut st = state("r1");
    st.commit = "c1".into();
    s.create(&st, &[]).await.unwrap();
    assert_eq!(s.head(&run).await.unwrap(), Some((1, "c1".into())));
    st.commit = "c2".into();
    assert_eq!(s.commit(&st, 1, &[]).await.unwrap(), CasOutcome::Committed);
    assert_eq!(s.head(&run).await.unwrap(), Some((2, "c2".into())));
    st.commit = "c3".into();
    assert_eq!(s.commit(&st, 1, &[]).await.unwrap(), CasOutcome::Conflict);
    assert_eq!(
        s.head(&run).await.unwrap(),
        Some((2, "c2".into())),
        "a refused commit leaves the head"
    );
    s.remove(&run).await.unwrap();
    assert_eq!(
        s.head(&run).await.unwrap(),
        None,
        "a removed run has no head"
    );
}

pub async fn commit_is_compare_and_set(s: &dyn RunStore, _: &Profile) {
    let run = RunId::new("r1");
    let mut st = state("r1");
    assert_eq!(
        s.commit(&st, 1, &[]).await.unwrap(),
        CasOutcome::Conflict,
        "a run that does not exist cannot be committed"
    );
    s.create(&st, &[]).await.unwrap();
    st.graph_name = "v2".into();
    assert_eq!(s.commit(&st, 1, &[]).await.unwrap(), CasOutcome::Committed);
    assert_eq!(plain(s, &run).await, Some((st.clone(), 2)));
    let mut stale = st.clone();
    stale.graph_name = "stale".into();
    assert_eq!(
        s.commit(&stale, 1, &[message("r1", 1)]).await.unwrap(),
        CasOutcome::Conflict,
        "a commit on an older version conflicts"
    );
    assert_eq!(
        plain(s, &run).await,
        Some((st.clone(), 2)),
        "a conflict writes nothing"
    );
    assert!(
        s.outbox_claim("o", 10).await.unwrap().is_empty(),
        "a conflicting commit's messages are not queued"
    );
    st.graph_name = "v3".into();
    assert_eq!(s.commit(&st, 2, &[]).await.unwrap(), CasOutcome::Committed);
    assert_eq!(plain(s, &run).await.unwrap().1, 3);
}

pub async fn the_outbox_keeps_commit_order(s: &dyn RunStore, _: &Profile) {
    let st = state("r1");
    s.create(&st, &[message("r1", 1), message("r1", 2)])
        .await
        .unwrap();
    s.commit(&st, 1, &[message("r1", 3)]).await.unwrap();
    s.commit(&st, 2, &[message("r1", 4), message("r1", 5)])
        .await
        .unwrap();
    let first = s.outbox_claim("o", 2).await.unwrap();
    assert_eq!(decode(&first), vec![message("r1", 1), message("r1", 2)]);
    let rest = s.outbox_claim("o", 10).await.unwrap();
    assert_eq!(
        decode(&rest),
        vec![message("r1", 3), message("r1", 4), message("r1", 5)]
    );
    assert!(s.outbox_claim("o", 10).await.unwrap().is_empty());
}

/// Claimed messages stay in the owner's in-flight list until they are done: only what is done
/// is forgotten.
pub async fn claimed_messages_are_held_until_done(s: &dyn RunStore, _: &Profile) {
    let st = state("r1");
    let sent: Vec<_> = (1..=3).map(|i| message("r1", i)).collect();
    s.create(&st, &sent).await.unwrap();
    let claimed = s.outbox_claim("a", 10).await.unwrap();
    assert_eq!(decode(&claimed), sent);
    assert!(
        s.outbox_claim("b", 10).await.unwrap().is_empty(),
        "a claimed message is no one else's"
    );
    s.outbox_done("a", &claimed[..2]).await.unwrap();
    s.outbox_done("a", &[]).await.unwrap();
    s.outbox_done("a", &["not claimed".to_string()])
        .await
        .expect("forgetting what is not in flight is not an error");
    assert_eq!(
        s.outbox_reclaim_own("a").await.unwrap(),
        1,
        "only the message not done was still in flight"
    );
    assert_eq!(
        decode(&s.outbox_claim("b", 10).await.unwrap()),
        vec![sent[2].clone()]
    );
}

/// A process starting under an owner's id takes that owner's in-flight messages back, to the
/// end of the outbox, whatever the lease says.
pub async fn reclaim_own_returns_in_flight_messages_to_the_outbox(s: &dyn RunStore, _: &Profile) {
    assert_eq!(s.outbox_reclaim_own("a").await.unwrap(), 0);
    let st = state("r1");
    s.create(&st, &[message("r1", 1), message("r1", 2)])
        .await
        .unwrap();
    s.outbox_claim("a", 1).await.unwrap();
    s.heartbeat("a").await.unwrap();
    assert_eq!(s.outbox_reclaim_own("a").await.unwrap(), 1);
    assert_eq!(s.outbox_reclaim_own("a").await.unwrap(), 0);
    assert_eq!(
        decode(&s.outbox_claim("b", 10).await.unwrap()),
        vec![message("r1", 2), message("r1", 1)],
        "taken back to the end of the outbox"
    );
}

/// Another owner's in-flight messages go back to the outbox only once its lease lapsed (a
/// claim takes the lease, a heartbeat keeps it); recovery never takes the caller's own.
pub async fn recover_takes_only_lapsed_leases(s: &dyn RunStore, p: &Profile) {
    let st = state("r1");
    s.create(&st, &[message("r1", 1), message("r1", 2)])
        .await
        .unwrap();
    assert_eq!(s.outbox_claim("a", 1).await.unwrap().len(), 1);
    assert_eq!(
        s.outbox_recover("b").await.unwrap(),
        0,
        "a fresh claim holds the lease"
    );
    // Renewed before the claim's lease ends, watched after it ended (half a lease of margin
    // for the heartbeat: a recovery scans the whole store, which takes time on a busy one).
    tokio::time::sleep(p.lease * 6 / 10).await;
    s.heartbeat("a").await.unwrap();
    tokio::time::sleep(p.lease / 2).await;
    assert_eq!(
        s.outbox_recover("b").await.unwrap(),
        0,
        "a heartbeat keeps the lease past the claim's"
    );
    tokio::time::sleep(p.lease * 3 / 2).await;
    assert_eq!(
        s.outbox_recover("b").await.unwrap(),
        1,
        "a lapsed lease gives the in-flight message back"
    );
    assert_eq!(s.outbox_recover("b").await.unwrap(), 0, "once");
    let claimed = s.outbox_claim("b", 10).await.unwrap();
    assert_eq!(decode(&claimed), vec![message("r1", 2), message("r1", 1)]);
    // b's own list is never recovered by b, whatever its lease.
    tokio::time::sleep(p.lease * 3 / 2).await;
    assert_eq!(s.outbox_recover("b").await.unwrap(), 0);
    assert_eq!(s.outbox_recover("c").await.unwrap(), 2);
}

pub async fn watches_are_leased_when_due(s: &dyn RunStore, _: &Profile) {
    s.watch(&[]).await.unwrap();
    s.watch(&[
        ("w1".to_string(), 100),
        ("w2".to_string(), 200),
        ("w3".to_string(), 300),
    ])
    .await
    .unwrap();
    assert!(s.due(99, 10, 30).await.unwrap().is_empty(), "none due yet");
    assert_eq!(
        s.due(250, 10, 30).await.unwrap(),
        vec!["w1", "w2"],
        "due ones, earliest first"
    );
    assert!(
        s.due(250, 10, 30).await.unwrap().is_empty(),
        "handed out once while leased"
    );
    assert_eq!(
        s.due(280, 10, 30).await.unwrap(),
        vec!["w1", "w2"],
        "handed out again once the lease ended"
    );
    s.unwatch("w1").await.unwrap();
    s.unwatch("never watched").await.unwrap();
    // w2's lease (to 310) ends after w3's deadline (300).
    assert_eq!(
        s.due(400, 1, 30).await.unwrap(),
        vec!["w3"],
        "at most max, earliest first"
    );
    assert_eq!(s.due(400, 10, 30).await.unwrap(), vec!["w2"]);
    // Watching again moves the deadline.
    s.unwatch("w2").await.unwrap();
    s.watch(&[("w3".to_string(), 1000)]).await.unwrap();
    assert!(s.due(999, 10, 30).await.unwrap().is_empty());
    assert_eq!(s.due(1000, 10, 30).await.unwrap(), vec!["w3"]);
}

pub async fn exists_and_remove(s: &dyn RunStore, _: &Profile) {
    let run = RunId::new("r1");
    assert!(!s.exists(&run).await.unwrap());
    s.create(&state("r1"), &[]).await.unwrap();
    s.create(&state("r2"), &[]).await.unwrap();
    assert!(s.exists(&run).await.unwrap());
    s.remove(&run).await.unwrap();
    assert!(!s.exists(&run).await.unwrap());
    assert!(s.load(&run).await.unwrap().is_none());
    assert_eq!(s.list().await.unwrap(), vec![RunId::new("r2")]);
    s.remove(&run)
        .await
        .expect("removing twice is not an error");
    assert!(
        s.create(&state("r1"), &[]).await.unwrap(),
        "a removed run can be created again"
    );
    assert_eq!(plain(s, &run).await.unwrap().1, 1);
}

pub async fn created_before_lists_the_oldest_first(s: &dyn RunStore, _: &Profile) {
    let t0 = now_ms();
    tick().await;
    for r in ["a", "b", "c"] {
        s.create(&state(r), &[]).await.unwrap();
        tick().await;
    }
    let cut = now_ms();
    tick().await;
    s.create(&state("d"), &[]).await.unwrap();
    assert!(s.created_before(t0, 10).await.unwrap().is_empty());
    assert_eq!(
        s.created_before(cut, 10).await.unwrap(),
        vec![RunId::new("a"), RunId::new("b"), RunId::new("c")]
    );
    assert_eq!(
        s.created_before(cut, 2).await.unwrap(),
        vec![RunId::new("a"), RunId::new("b")],
        "at most max, oldest first"
    );
    s.remove(&RunId::new("a")).await.unwrap();
    assert_eq!(
        s.created_before(now_ms() + 1000, 10).await.unwrap(),
        vec![RunId::new("b"), RunId::new("c"), RunId::new("d")]
    );
}

pub async fn list_is_newest_first(s: &dyn RunStore, p: &Profile) {
    assert!(s.list().await.unwrap().is_empty());
    for r in ["a", "b", "c"] {
        s.create(&state(r), &[]).await.unwrap();
        tick().await;
    }
    assert_eq!(
        s.list().await.unwrap(),
        vec![RunId::new("c"), RunId::new("b"), RunId::new("a")]
    );
    // Past the limit (or, with none, past Redis's): the newest are kept.
    let n = p.list_limit.unwrap_or(1000);
    for i in 0..n {
        s.create(&state(&format!("m{i:05}")), &[]).await.unwrap();
    }
    let listed = s.list().await.unwrap();
    match p.list_limit {
        Some(limit) => {
            assert_eq!(listed.len(), limit, "the newest {limit}");
            assert!(!listed.contains(&RunId::new("a")), "the oldest fell off");
        }
        None => {
            assert_eq!(listed.len(), n + 3, "every run");
            assert_eq!(listed.last(), Some(&RunId::new("a")));
        }
    }
}

pub async fn the_epoch_is_set_once(s: &dyn RunStore, _: &Profile) {
    assert_eq!(s.epoch("first").await.unwrap(), "first");
    assert_eq!(
        s.epoch("second").await.unwrap(),
        "first",
        "the first candidate stays"
    );
}

/// One `#[tokio::test]` per case of the run-store contract. `$fresh` is an expression that
/// gives a fresh, empty store (it may `.await`), `$profile` the adapter's [`Profile`].
#[macro_export]
macro_rules! run_store_conformance {
    ($fresh:expr, $profile:expr) => {
        $crate::run_store_conformance!(@cases $fresh, $profile;
            create_is_idempotent,
            load_returns_state_and_version,
            commit_is_compare_and_set,
            the_head_names_the_stored_version_and_commit,
            deltas_are_appended_by_version_and_dropped_by_a_snapshot,
            the_outbox_keeps_commit_order,
            claimed_messages_are_held_until_done,
            reclaim_own_returns_in_flight_messages_to_the_outbox,
            recover_takes_only_lapsed_leases,
            watches_are_leased_when_due,
            exists_and_remove,
            created_before_lists_the_oldest_first,
            list_is_newest_first,
            the_epoch_is_set_once,
            the_mirror_index_vouches_only_once_reconciled,
            batches_are_created_once_and_written_by_version,
            large_batches_keep_their_items_in_order,
            finished_batches_leave_the_active_set,
            schedules_are_added_once_and_listed_by_name,
            schedule_states_are_written_by_version_and_uid,
            tokens_are_found_by_hash_and_revoked_in_place,
            a_full_team_waits_in_line_and_a_freed_slot_moves_the_line,
            lapsed_slots_free_room_and_an_ended_run_leaves_nothing,
            without_a_limit_the_whole_line_moves,
        );
    };
    (@cases $fresh:expr, $profile:expr; $($case:ident,)+) => {
        $(
            #[tokio::test]
            async fn $case() {
                let store = $fresh;
                $crate::store::conformance::$case(&store, &$profile).await;
            }
        )+
    };
}
