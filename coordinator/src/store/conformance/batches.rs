//! The batch cases of the run-store contract: created once, written by version a slice at a
//! time, large batches kept whole and in order, finished ones out of the active set.

use super::{tick, Profile};
use shared::batch::ItemState;
use shared::ports::{CasOutcome, RunStore};

/// A batch of `n` items (`i0`, `i1`, ...) of which two run at once, created now.
pub fn batch_of(id: &str, n: usize) -> shared::batch::BatchState {
    let lines: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"id": "i{i}", "repo": "/r"}}"#))
        .collect();
    let items = shared::batch::parse_dataset(&lines.join("\n")).expect("items");
    let spec = shared::batch::BatchSpec {
        trials: 1,
        max_running: 2,
        max_infra_retries: 0,
        labels: Default::default(),
        weight: 1,
    };
    shared::batch::BatchState::new(
        shared::ids::BatchId::new(id),
        "g",
        "graphs/g.json",
        spec,
        &items,
        chrono::Utc::now(),
    )
}

/// A batch of one item.
pub fn batch(id: &str) -> shared::batch::BatchState {
    batch_of(id, 1)
}

/// Item indexes of a slice's items in `state`, in order.
fn held(slice: &shared::batch::BatchSlice, n: usize, state: ItemState) -> Vec<usize> {
    (0..n)
        .filter(|i| slice.item(*i).is_some_and(|item| item.state == state))
        .collect()
}

pub async fn batches_are_created_once_and_written_by_version(s: &dyn RunStore, _: &Profile) {
    let b = batch_of("b1", 5);
    let id = b.batch_id.clone();
    assert!(s.create_batch(&b).await.unwrap());
    let (got, v) = s.load_batch(&id).await.unwrap().expect("stored");
    assert_eq!(got, b);
    let (header, hv) = s.batch_header(&id).await.unwrap().expect("stored");
    assert_eq!((&header, hv), (b.header(), v));
    // A pass starts the two first items through a slice.
    let (mut slice, sv) = s.batch_slice(&id, 2).await.unwrap().expect("stored");
    assert_eq!(sv, v);
    assert_eq!(held(&slice, 5, ItemState::Queued), [0, 1]);
    for i in slice.to_start(usize::MAX) {
        let run = slice.run_id_for(i).expect("held");
        assert!(slice.started(i, run, chrono::Utc::now()));
    }
    assert_eq!(
        s.commit_batch(&slice, v).await.unwrap(),
        CasOutcome::Committed
    );
    assert_eq!(
        s.commit_batch(&slice, v).await.unwrap(),
        CasOutcome::Conflict,
        "a stale version is refused"
    );
    // Submitted again, the batch is not created again and its items stay as they are.
    assert!(!s.create_batch(&b).await.unwrap(), "created once");
    let (got, v2) = s.load_batch(&id).await.unwrap().expect("stored");
    assert_eq!(v2, v + 1);
    let states: Vec<ItemState> = got.items.iter().map(|i| i.state).collect();
    use ItemState::{Queued, Running};
    assert_eq!(states, [Running, Running, Queued, Queued, Queued]);
    assert_eq!(got.header(), slice.header(), "the header is the slice's");
    assert_eq!(got.counts().running, 2);
    // A slice holds every running item and the first queued ones.
    let (slice, _) = s.batch_slice(&id, 10).await.unwrap().expect("stored");
    assert_eq!(held(&slice, 5, Running), [0, 1]);
    assert_eq!(held(&slice, 5, Queued), [2, 3, 4]);
    let unknown = shared::ids::BatchId::new("nope");
    assert!(s.load_batch(&unknown).await.unwrap().is_none());
    assert!(s.batch_header(&unknown).await.unwrap().is_none());
    assert!(s.batch_slice(&unknown, 1).await.unwrap().is_none());
    let ghost = shared::batch::BatchSlice::of(&batch("nope"), 1);
    assert_eq!(
        s.commit_batch(&ghost, 1).await.unwrap(),
        CasOutcome::Conflict,
        "no write to a batch that does not exist"
    );
    assert!(s.load_batch(&unknown).await.unwrap().is_none());
}

/// A batch larger than a store writes at once keeps every item, in order, and hands out its
/// queued items in item order (10 after 9, not after 1).
pub async fn large_batches_keep_their_items_in_order(s: &dyn RunStore, _: &Profile) {
    let n = 2500;
    let b = batch_of("big", n);
    assert!(s.create_batch(&b).await.unwrap());
    let (got, _) = s.load_batch(&b.batch_id).await.unwrap().expect("stored");
    assert_eq!(got, b);
    // Settle the first 11 items one pass at a time, as a driver would.
    for _ in 0..11 {
        let (mut slice, v) = s
            .batch_slice(&b.batch_id, 1)
            .await
            .unwrap()
            .expect("stored");
        let [i] = held(&slice, n, ItemState::Queued)[..] else {
            panic!("one queued item in the slice");
        };
        let run = slice.run_id_for(i).expect("held");
        let now = chrono::Utc::now();
        slice.started(i, run, now);
        let outcome = shared::batch::ItemOutcome {
            status: shared::engine::RunStatus::Succeeded,
            verdict: None,
            ended_stage: None,
            error: None,
            infra_error: false,
            cost_usd: 0.25,
            tokens: 10,
            flaky_tests: Vec::new(),
            suspected_special_case: Vec::new(),
            steps: 1,
            cache_hits: 0,
        };
        slice.finished(i, &outcome, now);
        assert_eq!(
            s.commit_batch(&slice, v).await.unwrap(),
            CasOutcome::Committed
        );
    }
    let (slice, _) = s
        .batch_slice(&b.batch_id, 3)
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(held(&slice, n, ItemState::Queued), [11, 12, 13]);
    let (header, _) = s.batch_header(&b.batch_id).await.unwrap().expect("stored");
    assert_eq!((header.counts.passed, header.counts.queued), (11, n - 11));
    assert_eq!((header.cost_usd, header.tokens), (2.75, 110));
    let (got, _) = s.load_batch(&b.batch_id).await.unwrap().expect("stored");
    assert_eq!(got.header(), &header, "the books agree with the items");
    assert!(got.items[..11].iter().all(|i| i.state == ItemState::Passed));
}

pub async fn finished_batches_leave_the_active_set(s: &dyn RunStore, _: &Profile) {
    let (b1, b2) = (batch_of("b1", 3), batch("b2"));
    s.create_batch(&b1).await.unwrap();
    tick().await;
    let b2 = shared::batch::BatchState::from_parts(
        shared::batch::BatchHeader {
            created_at: chrono::Utc::now(),
            ..b2.header().clone()
        },
        b2.items.clone(),
    );
    s.create_batch(&b2).await.unwrap();
    let ids =
        |v: Vec<shared::ids::BatchId>| -> Vec<String> { v.iter().map(|i| i.to_string()).collect() };
    assert_eq!(ids(s.list_batches().await.unwrap()), vec!["b2", "b1"]);
    let mut active = ids(s.active_batches().await.unwrap());
    active.sort();
    assert_eq!(active, vec!["b1", "b2"]);
    // Cancelled, a batch with nothing running is finished once its queued items are.
    let (mut slice, v) = s
        .batch_slice(&b1.batch_id, 0)
        .await
        .unwrap()
        .expect("stored");
    assert!(slice.cancel(chrono::Utc::now()));
    s.commit_batch(&slice, v).await.unwrap();
    let mut active = ids(s.active_batches().await.unwrap());
    active.sort();
    assert_eq!(active, vec!["b1", "b2"], "three items still queued");
    let (mut slice, v) = s
        .batch_slice(&b1.batch_id, 3)
        .await
        .unwrap()
        .expect("stored");
    assert!(slice.cancel(chrono::Utc::now()));
    assert!(slice.header().is_finished());
    s.commit_batch(&slice, v).await.unwrap();
    assert_eq!(ids(s.active_batches().await.unwrap()), vec!["b2"]);
    assert_eq!(
        ids(s.list_batches().await.unwrap()),
        vec!["b2", "b1"],
        "still listed"
    );
    let (got, _) = s.load_batch(&b1.batch_id).await.unwrap().expect("stored");
    assert!(got.cancelled && got.is_finished() && got.counts().cancelled == 3);
}
