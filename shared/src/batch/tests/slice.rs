//! A batch driven a slice at a time ends exactly where the same events leave the whole batch,
//! and its books always agree with its items.

use super::*;
use crate::engine::RunStatus;
use crate::ids::RunId;
use crate::proptest_support::cases;
use proptest::prelude::*;

/// One pass of a driver: read a slice (every running item, the first `queued` queued), act,
/// and write back the header and the changed items.
fn pass(b: &mut BatchState, queued: usize, act: impl FnOnce(&mut BatchSlice)) -> Vec<usize> {
    let mut slice = BatchSlice::of(b, queued);
    act(&mut slice);
    let written: Vec<usize> = slice.changed().iter().map(|(n, _)| *n).collect();
    if slice.is_changed() {
        slice.apply_to(b);
    }
    written
}

#[test]
fn a_slice_holds_the_running_items_and_the_first_queued_ones() {
    let mut b = batch(&["a", "b", "c", "d", "e"], spec(1, 2));
    pass(&mut b, 2, |s| {
        for n in s.to_start(usize::MAX) {
            let run = s.run_id_for(n).unwrap();
            assert!(s.started(n, run, t(1)));
        }
    });
    let s = BatchSlice::of(&b, 1);
    let held: Vec<(usize, ItemState)> = [0, 1, 2, 3, 4]
        .into_iter()
        .filter_map(|n| s.item(n).map(|i| (n, i.state)))
        .collect();
    assert_eq!(
        held,
        [
            (0, ItemState::Running),
            (1, ItemState::Running),
            (2, ItemState::Queued)
        ]
    );
    // Room is what max_running leaves, whatever the slice holds.
    assert!(s.to_start(usize::MAX).is_empty());
    assert_eq!(s.header().counts.running, 2);
    assert!(!s.is_changed());
}

#[test]
fn only_the_items_a_pass_moved_are_written() {
    let mut b = batch(&["a", "b", "c", "d"], spec(1, 4));
    let written = pass(&mut b, 4, |s| {
        let run = s.run_id_for(2).unwrap();
        s.started(2, run, t(1));
        // An item the slice does not hold, or a second start, changes nothing.
        assert!(!s.started(9, RunId::new("x"), t(1)));
        assert!(!s.started(2, RunId::new("x"), t(1)));
    });
    assert_eq!(written, [2]);
    assert_eq!(b.items[2].state, ItemState::Running);
    assert_eq!(b.counts().running, 1);
    let written = pass(&mut b, 0, |s| {
        assert!(!s.finished(2, &outcome(RunStatus::Running, None), t(2)));
    });
    assert!(written.is_empty());
}

#[test]
fn a_cancelled_batch_cancels_its_queued_items_a_slice_at_a_time() {
    let mut b = batch(&["a", "b", "c", "d", "e"], spec(1, 1));
    pass(&mut b, 1, |s| {
        let run = s.run_id_for(0).unwrap();
        s.started(0, run, t(1));
    });
    // The API cancels through a slice without queued items: only the header changes.
    let written = pass(&mut b, 0, |s| assert!(s.cancel(t(2))));
    assert!(written.is_empty() && b.cancelled);
    assert_eq!(b.counts().queued, 4);
    // The driver then cancels two queued items per pass; nothing starts.
    for left in [2, 0] {
        pass(&mut b, 2, |s| {
            assert!(s.to_start(usize::MAX).is_empty());
            s.cancel(t(3));
        });
        assert_eq!(b.counts().queued, left);
    }
    assert!(!b.is_finished(), "the running item is still running");
    pass(&mut b, 0, |s| {
        s.finished(0, &outcome(RunStatus::Cancelled, None), t(4));
    });
    assert!(b.is_finished() && b.finished_at == Some(t(4)));
    assert_eq!(b.counts().cancelled, 5);
}

#[derive(Clone, Debug)]
enum Op {
    Start(usize),
    Finish(usize, u8),
    Cancel,
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..6).prop_map(Op::Start),
        6 => (0usize..12, any::<u8>()).prop_map(|(i, k)| Op::Finish(i, k)),
        1 => Just(Op::Cancel),
    ]
}

proptest! {
    #![proptest_config(cases(256))]

    /// The same events, fed to slices and to the whole batch, end in the same batch; the
    /// slices' books are what counting the items gives.
    #[test]
    fn slices_and_the_whole_batch_agree(
        items in 1usize..4,
        trials in 1u32..4,
        max_running in 1u32..4,
        chunk in 1usize..4,
        ops in prop::collection::vec(arb_op(), 0..40),
    ) {
        let ids: Vec<String> = (0..items).map(|i| format!("i{i}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let mut whole = batch(&refs, spec(trials, max_running));
        let mut sliced = whole.clone();
        for (n, op) in ops.into_iter().enumerate() {
            let at = t(n as i64);
            match op {
                Op::Start(max_new) => {
                    let chosen = whole.to_start(max_new);
                    for &i in &chosen {
                        whole.started(i, whole.run_id_for(i), at);
                    }
                    pass(&mut sliced, max_new, |s| {
                        let picked = s.to_start(max_new);
                        assert_eq!(picked, chosen);
                        for i in picked {
                            let run = s.run_id_for(i).unwrap();
                            s.started(i, run, at);
                        }
                    });
                }
                Op::Finish(i, kind) => {
                    let i = i % whole.items.len();
                    let o = arb_outcome(kind);
                    // A driver finishes the running items it read.
                    if whole.items[i].state == ItemState::Running {
                        whole.finished(i, &o, at);
                        pass(&mut sliced, 0, |s| { s.finished(i, &o, at); });
                    }
                }
                Op::Cancel => {
                    whole.cancel(at);
                    pass(&mut sliced, 0, |s| { s.cancel(at); });
                    // The driver cancels what is queued, `chunk` at a time.
                    while sliced.cancelled && sliced.counts().queued > 0 {
                        pass(&mut sliced, chunk, |s| { s.cancel(at); });
                    }
                }
            }
            let recount = BatchState::from_parts(sliced.header().clone(), sliced.items.clone());
            prop_assert_eq!(recount.header(), sliced.header());
            prop_assert_eq!(&whole, &sliced);
        }
    }
}
