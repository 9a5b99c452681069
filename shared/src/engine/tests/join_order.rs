//! Property: joins fire once and the run ends once, whatever the order of the results.
//!
//! The graph forks into N nodes that meet at a join, which leads to a fan-out of N items whose
//! branches meet at a second join, then the exit. Every branch result is delivered through
//! `engine::apply` in any order, some of them several times (redeliveries), some jobs re-issued
//! first (a deadline passed before any result) with the result of their superseded attempt
//! delivered too, anywhere in the sequence (stale). Whatever the order:
//! - each join fires exactly once (`JoinState.fired == 1`, its arrivals complete);
//! - the run ends exactly once (one `Effect::Finished` over the whole sequence), succeeded;
//! - a redelivery is `Duplicate`, a superseded attempt `Stale`, and neither changes the state;
//! - the final state is the one the results give in their plain order, one copy each. The
//!   history and the run's pack list are kept in arrival order by design, so they are compared
//!   as sets.

use super::*;
use proptest::prelude::*;
use std::collections::{BTreeSet, VecDeque};

/// The fork into `n` nodes, their join, a fan-out over `input.items` and its join.
fn fork_and_fan_out(n: usize) -> String {
    let names: Vec<String> = (1..=n).map(|i| format!("b{i}")).collect();
    let mut yaml = format!(
        "name: joins\nstart: skel\nnodes:\n  skel:\n    kind: harness\n    op: noop\n    \
         routes: [{{to: [{list}]}}]\n",
        list = names.join(", ")
    );
    for name in &names {
        yaml +=
            &format!("  {name}:\n    kind: harness\n    op: noop\n    routes: [{{to: meet}}]\n");
    }
    yaml += &format!(
        "  meet:\n    kind: join\n    wait_for: [{list}]\n    routes: [{{to: spread}}]\n  \
         spread:\n    kind: fanout\n    over: input.items\n    body: each\n    join: gather\n  \
         each:\n    kind: harness\n    op: noop\n    with: {{value: item}}\n    \
         routes: [{{to: gather}}]\n  gather:\n    kind: join\n    routes: [{{to: done}}]\n  \
         done:\n    kind: exit\n    status: meet.output.count == {n} and gather.output.count == {n}\n",
        list = names.join(", ")
    );
    yaml
}

/// One delivery: the result of branch job `job` (0..n the fork's nodes, n..2n the fan-out's
/// branches), of its current attempt or of the attempt its re-issue superseded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Delivery {
    job: usize,
    stale: bool,
}

/// The branch job `job` stands for: its node and branch.
fn job_key(n: usize, job: usize) -> (NodeId, Option<u32>) {
    if job < n {
        (NodeId::new(format!("b{}", job + 1)), None)
    } else {
        (NodeId::new("each"), Some((job - n + 1) as u32))
    }
}

struct Ran {
    state: RunState,
    finished: usize,
}

/// Runs the graph, delivering `deliveries` in their order. A delivery whose job is not published
/// yet (a fan-out branch before the first join fired) waits at the back of the queue. A job in
/// `reissued` is re-issued as soon as it is published.
fn run(
    n: usize,
    reissued: &BTreeSet<usize>,
    deliveries: Vec<Delivery>,
) -> Result<Ran, TestCaseError> {
    let b = bundle(&fork_and_fan_out(n));
    let mut state = new_run(&b, 1);
    state.input = json!({"items": (0..n).map(|i| format!("item-{i}")).collect::<Vec<_>>()});
    let mut finished = 0;
    let mut published: BTreeMap<(NodeId, Option<u32>), JobId> = BTreeMap::new();
    let mut seen: BTreeSet<usize> = BTreeSet::new();

    let mut apply_event = |state: &mut RunState,
                           published: &mut BTreeMap<(NodeId, Option<u32>), JobId>,
                           event: Event|
     -> Result<Applied, TestCaseError> {
        let mut pending = vec![event];
        let mut first_applied = None;
        while let Some(event) = pending.pop() {
            let t = step(&b, state, event);
            first_applied.get_or_insert_with(|| t.applied.clone());
            for effect in &t.effects {
                match effect {
                    Effect::Finished { .. } => finished += 1,
                    Effect::Publish(spec) if spec.attempt == 1 => {
                        published.insert((spec.node.clone(), spec.branch), spec.job_id.clone());
                        let job =
                            (0..2 * n).find(|j| job_key(n, *j) == (spec.node.clone(), spec.branch));
                        if job.is_some_and(|j| reissued.contains(&j)) {
                            // Its deadline passed before any result: the next attempt runs.
                            pending.push(Event::Reissue {
                                job_id: spec.job_id.clone(),
                                attempt: 1,
                                started_at: None,
                                at: time(0),
                            });
                        }
                    }
                    _ => {}
                }
            }
            *state = t.state;
        }
        Ok(first_applied.expect("one event applied"))
    };

    let started = apply_event(&mut state, &mut published, Event::Start { at: time(0) })?;
    prop_assert_eq!(started, Applied::Changed);
    let skel = published[&(NodeId::new("skel"), None)].clone();
    apply_event(&mut state, &mut published, ok(&skel, json!({})))?;

    let mut queue: VecDeque<Delivery> = deliveries.into();
    let mut waited = 0;
    while let Some(d) = queue.pop_front() {
        let Some(job_id) = published.get(&job_key(n, d.job)).cloned() else {
            waited += 1;
            prop_assert!(
                waited < 10_000,
                "a delivery waits for a job never published"
            );
            queue.push_back(d);
            continue;
        };
        let current = if reissued.contains(&d.job) { 2 } else { 1 };
        let (attempt, output) = if d.stale {
            (current - 1, json!({"stale": true}))
        } else {
            (current, json!({"job": d.job}))
        };
        let before = state.clone();
        let applied = apply_event(
            &mut state,
            &mut published,
            result(&job_id, attempt, JobStatus::Ok, output),
        )?;
        if d.stale {
            prop_assert_eq!(applied, Applied::Stale { current });
            prop_assert_eq!(&state, &before);
        } else if !seen.insert(d.job) {
            prop_assert_eq!(applied, Applied::Duplicate);
            prop_assert_eq!(&state, &before);
        } else {
            prop_assert_eq!(applied, Applied::Changed);
        }
    }
    Ok(Ran { state, finished })
}

/// The state with the parts kept in arrival order (history, packs) put in a fixed order.
fn canonical(state: &RunState) -> RunState {
    let mut s = state.clone();
    s.history.sort_by(|a, b| a.job_id.cmp(&b.job_id));
    s.repo.packs.sort();
    s
}

/// N, the re-issued jobs, and the deliveries in any order: every job's result at least once,
/// redeliveries, and results of superseded attempts.
fn scenario() -> impl Strategy<Value = (usize, BTreeSet<usize>, Vec<Delivery>)> {
    (2usize..=5)
        .prop_flat_map(|n| {
            let jobs = 2 * n;
            (
                Just(n),
                prop::collection::vec(any::<bool>(), jobs),
                prop::collection::vec(1usize..=3, jobs),
                prop::collection::vec(0usize..=2, jobs),
            )
        })
        .prop_flat_map(|(n, reissue, copies, stale)| {
            let reissued: BTreeSet<usize> = (0..2 * n).filter(|j| reissue[*j]).collect();
            let mut deliveries = Vec::new();
            for job in 0..2 * n {
                for _ in 0..copies[job] {
                    deliveries.push(Delivery { job, stale: false });
                }
                if reissued.contains(&job) {
                    for _ in 0..stale[job] {
                        deliveries.push(Delivery { job, stale: true });
                    }
                }
            }
            (Just(n), Just(reissued), Just(deliveries).prop_shuffle())
        })
}

proptest! {
    #![proptest_config(crate::proptest_support::cases(128))]

    #[test]
    fn joins_fire_once_and_the_run_ends_once_whatever_the_order(
        (n, reissued, deliveries) in scenario()
    ) {
        let shuffled = run(n, &reissued, deliveries)?;
        let plain: Vec<Delivery> = (0..2 * n).map(|job| Delivery { job, stale: false }).collect();
        let reference = run(n, &reissued, plain)?;

        prop_assert_eq!(shuffled.finished, 1, "the run ends exactly once");
        prop_assert_eq!(reference.finished, 1);
        let s = &shuffled.state;
        prop_assert_eq!(s.status, RunStatus::Succeeded, "{:?}", s.result);
        for join in ["meet", "gather"] {
            let j = &s.joins[&NodeId::new(join)];
            prop_assert_eq!(j.fired, 1, "{} fires exactly once", join);
            prop_assert!(j.arrived.is_empty(), "{} was reset when it fired", join);
            let fired = s.last_outcome(&NodeId::new(join)).unwrap();
            prop_assert_eq!(&fired.output["count"], &json!(n));
        }
        prop_assert!(
            s.history.iter().all(|o| o.output.get("stale").is_none()),
            "a superseded attempt's output is never recorded"
        );
        prop_assert!(s.pending_jobs().next().is_none());
        prop_assert_eq!(canonical(s), canonical(&reference.state));
    }
}
