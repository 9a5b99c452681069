//! Child runs: a whole tree played through the pure engine by a tiny driver (every effect
//! carried out in memory, in any order), the tree's bounds, the cascade of cancels, the first
//! failure, and reports that must not count (duplicates, forged indexes, other runs).

use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, VecDeque};

const TREE: &str = r#"
name: tree
start: work
input_schema: s.json
defaults: {tree: {max_depth: 2, max_runs: 10}}
nodes:
  work:
    kind: harness
    op: noop
    routes:
      - {to: failed, when: "input.plan.fail"}
      - {to: kids}
  kids:
    kind: spawn
    over: "input.plan.children or []"
    input: "{'plan': item, 'n': index}"
    wait: WAIT
    routes:
      - {to: done, when: "kids.ok"}
      - {to: failed}
  done: {kind: exit, status: "true"}
  failed: {kind: exit, status: "false"}
"#;

fn tree_bundle(wait: &str) -> GraphBundle {
    bundle(&TREE.replace("WAIT", wait))
}

/// A root run of the tree graph over `plan` (each node of the plan: `children`, `fail`).
fn root(bundle: &GraphBundle, plan: Value) -> RunState {
    root_with(bundle, json!({ "plan": plan }))
}

/// A root run named `root` of any graph, with `input`.
pub(super) fn root_with(bundle: &GraphBundle, input: Value) -> RunState {
    RunState::new(
        super::NewRun {
            run_id: RunId::new("root"),
            graph_ref: "graph-ref".into(),
            input,
            meta: json!({}),
            repo: RepoSnapshot {
                url: "repo".into(),
                base_commit: "c0".into(),
                packs: vec!["p0".into()],
            },
            agent: AgentConfig::default(),
        },
        bundle,
        time(0),
    )
}

/// Every run of a tree, and the events not yet delivered; `pick` chooses the next one.
pub(super) struct Fleet<'a> {
    bundle: &'a GraphBundle,
    pub(super) runs: BTreeMap<RunId, RunState>,
    pub(super) queue: VecDeque<(RunId, Event)>,
    created: usize,
    finished: BTreeMap<RunId, usize>,
}

impl<'a> Fleet<'a> {
    pub(super) fn new(bundle: &'a GraphBundle, root: RunState) -> Self {
        let id = root.run_id.clone();
        let mut fleet = Fleet {
            bundle,
            runs: BTreeMap::new(),
            queue: VecDeque::new(),
            created: 1,
            finished: BTreeMap::new(),
        };
        fleet.runs.insert(id.clone(), root);
        fleet.queue.push_back((id, Event::Start { at: time(1) }));
        fleet
    }

    /// Delivers queued events in order until `done` holds.
    pub(super) fn grow_until(&mut self, done: impl Fn(&Self) -> bool) {
        while !done(self) {
            let (run, event) = self.queue.pop_front().expect("the tree grows");
            self.deliver(&run, event);
        }
    }

    /// Delivers queued events (the `pick`-th each time) until none is left.
    pub(super) fn drain(&mut self, mut pick: impl FnMut(usize) -> usize) {
        let mut steps = 0;
        while !self.queue.is_empty() {
            steps += 1;
            assert!(steps < 10_000, "the tree never settles");
            let i = pick(self.queue.len()) % self.queue.len();
            let (run, event) = self.queue.remove(i).expect("an event");
            self.deliver(&run, event);
        }
    }

    pub(super) fn deliver(&mut self, run: &RunId, event: Event) {
        let state = self
            .runs
            .get(run)
            .expect("events only reach runs that exist");
        let t = step(self.bundle, state, event);
        self.runs.insert(run.clone(), t.state);
        for fx in t.effects {
            match fx {
                Effect::Publish(spec) => self
                    .queue
                    .push_back((run.clone(), ok(&spec.job_id, json!({})))),
                Effect::StartChildren(children) => {
                    for child in children {
                        let id = child.run.run_id.clone();
                        assert!(!self.runs.contains_key(&id), "`{id}` started twice");
                        let state = RunState::new_child(child, self.bundle, time(2));
                        self.runs.insert(id.clone(), state);
                        self.created += 1;
                        self.queue.push_back((id, Event::Start { at: time(2) }));
                    }
                }
                Effect::NotifyParent(report) => {
                    *self.finished.entry(run.clone()).or_default() += 1;
                    let parent = report.parent.clone();
                    self.queue.push_back((
                        parent,
                        Event::ChildFinished {
                            report,
                            at: time(3),
                        },
                    ));
                }
                Effect::Finished { .. } if self.runs[run].tree.is_none() => {
                    *self.finished.entry(run.clone()).or_default() += 1;
                }
                Effect::CancelRuns(ids) => {
                    for id in ids {
                        self.queue.push_back((id, Event::Cancel { at: time(4) }));
                    }
                }
                Effect::RelayToSiblings(event) => {
                    let parent = event.parent.clone();
                    self.queue
                        .push_back((parent, Event::SiblingEvent { event, at: time(5) }));
                }
                Effect::DeliverToRuns(ids, event) => {
                    for id in ids {
                        let event = event.clone();
                        self.queue
                            .push_back((id, Event::FromSibling { event, at: time(6) }));
                    }
                }
                _ => {}
            }
        }
    }

    fn status(&self, id: &str) -> RunStatus {
        self.runs[&RunId::new(id)].status
    }
}

/// 1 + 2 + 1: the root's first child has a child of its own.
fn small_tree() -> Value {
    json!({"children": [{"children": [{}]}, {}]})
}

#[test]
fn a_tree_of_child_runs_settles_bottom_up_and_the_parent_routes_on_their_results() {
    let b = tree_bundle("all");
    let mut fleet = Fleet::new(&b, root(&b, small_tree()));
    fleet.drain(|_| 0);
    assert_eq!(fleet.created, 4);
    for id in [
        "root",
        "root-kids-1-0",
        "root-kids-1-1",
        "root-kids-1-0-kids-1-0",
    ] {
        assert_eq!(fleet.status(id), RunStatus::Succeeded, "{id}");
        assert_eq!(fleet.finished[&RunId::new(id)], 1, "{id} ended once");
    }
    let grandchild = &fleet.runs[&RunId::new("root-kids-1-0-kids-1-0")];
    let link = grandchild.tree.as_ref().expect("a child knows its place");
    assert_eq!((link.root.as_str(), link.depth), ("root", 2));
    assert_eq!(link.parent.as_str(), "root-kids-1-0");
    assert_eq!(grandchild.input["n"], 0);
    let root = &fleet.runs[&RunId::new("root")];
    let kids = &root
        .last_outcome(&NodeId::new("kids"))
        .expect("spawned")
        .output;
    assert_eq!(
        (kids["count"].as_u64(), kids["succeeded"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(kids["children"][1]["run_id"], "root-kids-1-1");
    assert_eq!(kids["children"][0]["status"], "succeeded");
    // Each child's context knows its depth and parent.
    let ctx = root.context();
    assert_eq!(
        (ctx["run"]["depth"].as_u64(), ctx["run"]["parent"].is_null()),
        (Some(0), true)
    );
}

#[test]
fn a_child_that_fails_fails_the_spawn_once_every_child_has_ended() {
    let b = tree_bundle("all");
    let plan = json!({"children": [{"fail": true}, {"children": [{}]}]});
    let mut fleet = Fleet::new(&b, root(&b, plan));
    fleet.drain(|_| 0);
    assert_eq!(fleet.status("root-kids-1-0"), RunStatus::Failed);
    assert_eq!(
        fleet.status("root-kids-1-1"),
        RunStatus::Succeeded,
        "`all` waits for it"
    );
    assert_eq!(fleet.status("root"), RunStatus::Failed);
    let kids = &fleet.runs[&RunId::new("root")]
        .last_outcome(&NodeId::new("kids"))
        .unwrap()
        .output;
    assert_eq!(
        (kids["failed"].as_u64(), kids["succeeded"].as_u64()),
        (Some(1), Some(1))
    );
}

#[test]
fn with_first_failure_the_first_failed_child_settles_the_spawn_and_its_siblings_are_cancelled() {
    let b = tree_bundle("first_failure");
    let plan = json!({"children": [{"fail": true}, {"children": [{}]}]});
    let mut fleet = Fleet::new(&b, root(&b, plan));
    // Deliver the root's start and its first job, then the children's starts, then the failed
    // child's events before its sibling's.
    fleet.drain(|n| n - 1);
    assert_eq!(fleet.status("root"), RunStatus::Failed);
    let kids = &fleet.runs[&RunId::new("root")]
        .last_outcome(&NodeId::new("kids"))
        .unwrap()
        .output;
    assert_eq!(kids["failed"], 1, "{kids}");
    assert!(
        matches!(
            fleet.status("root-kids-1-1"),
            RunStatus::Cancelled | RunStatus::Succeeded
        ),
        "the sibling was cancelled unless it had already ended"
    );
    for (id, state) in &fleet.runs {
        assert!(state.status.is_terminal(), "{id} still {:?}", state.status);
    }
}

#[test]
fn cancelling_the_root_cascades_down_the_whole_tree() {
    let b = tree_bundle("all");
    let mut fleet = Fleet::new(&b, root(&b, small_tree()));
    // Run until the grandchild exists, holding back every job result.
    let grandchild = RunId::new("root-kids-1-0-kids-1-0");
    fleet.grow_until(|f| f.runs.contains_key(&grandchild));
    fleet
        .queue
        .push_back((RunId::new("root"), Event::Cancel { at: time(9) }));
    // No job finishes from here on: only the cancels can end the runs.
    while let Some((run, event)) = fleet.queue.pop_front() {
        if !matches!(event, Event::JobFinished { .. }) {
            fleet.deliver(&run, event);
        }
    }
    for id in [
        "root",
        "root-kids-1-0",
        "root-kids-1-1",
        "root-kids-1-0-kids-1-0",
    ] {
        assert_eq!(fleet.status(id), RunStatus::Cancelled, "{id}");
    }
}

#[test]
fn a_spawn_deeper_than_the_tree_allows_is_refused_and_routes_as_a_failure() {
    let b = tree_bundle("all");
    // Depth 3 is asked for; the graph allows 2.
    let plan = json!({"children": [{"children": [{"children": [{}]}]}]});
    let mut fleet = Fleet::new(&b, root(&b, plan));
    fleet.drain(|_| 0);
    let deepest = &fleet.runs[&RunId::new("root-kids-1-0-kids-1-0")];
    let kids = &deepest.last_outcome(&NodeId::new("kids")).unwrap();
    assert!(!kids.ok);
    assert_eq!(kids.output["refused"], "tree_depth_limit");
    assert_eq!(fleet.created, 3, "no run at depth 3");
    assert_eq!(
        fleet.status("root"),
        RunStatus::Failed,
        "the refusal routed to `failed`"
    );
}

#[test]
fn a_spawn_wider_than_the_runs_left_is_refused() {
    let b = tree_bundle("all");
    // Ten children would make eleven runs; the tree allows ten.
    let plan = json!({"children": vec![json!({}); 10]});
    let mut fleet = Fleet::new(&b, root(&b, plan));
    fleet.drain(|_| 0);
    let kids = fleet.runs[&RunId::new("root")]
        .last_outcome(&NodeId::new("kids"))
        .cloned();
    assert_eq!(kids.expect("settled").output["refused"], "tree_run_limit");
    assert_eq!(fleet.created, 1);
}

#[test]
fn a_child_input_the_graph_refuses_is_caught_before_any_child_starts() {
    let mut b = tree_bundle("all");
    b.files.insert(
        "s.json".into(),
        r#"{"type":"object","required":["plan"],"properties":{"n":{"type":"integer","maximum":0}}}"#
            .into(),
    );
    // The second child's `n` is 1, above the schema's maximum.
    let mut fleet = Fleet::new(&b, root(&b, json!({"children": [{}, {}]})));
    fleet.drain(|_| 0);
    let kids = fleet.runs[&RunId::new("root")]
        .last_outcome(&NodeId::new("kids"))
        .cloned();
    let out = kids.expect("settled").output;
    assert_eq!(
        (out["refused"].as_str(), out["detail"]["index"].as_u64()),
        (Some("child_input_invalid"), Some(1))
    );
    assert_eq!(fleet.created, 1);
}

#[test]
fn reports_that_are_duplicates_forged_or_for_another_run_change_nothing() {
    let b = tree_bundle("all");
    let mut fleet = Fleet::new(&b, root(&b, json!({"children": [{}, {}]})));
    fleet.grow_until(|f| f.runs.len() == 3);
    fleet.drain(|n| n - 1);
    let root_state = fleet.runs[&RunId::new("root")].clone();
    assert_eq!(root_state.status, RunStatus::Succeeded);
    let real = fleet.runs[&RunId::new("root-kids-1-0")]
        .child_report()
        .expect("a child");
    let mut forged = real.clone();
    forged.index = 1; // child 0's report claiming child 1's place
    let mut other = real.clone();
    other.child = RunId::new("stranger");
    for report in [real, forged, other] {
        let event = Event::ChildFinished {
            report: Box::new(report),
            at: time(5),
        };
        let t = apply(&b, &root_state, &event, &assembler).unwrap();
        assert_ne!(t.applied, Applied::Changed);
        assert_eq!(t.state, root_state);
    }
    // While the root still waits, a forged index is refused too.
    let mut fleet = Fleet::new(&b, root(&b, json!({"children": [{}, {}]})));
    fleet.grow_until(|f| f.runs.len() == 3);
    let waiting = fleet.runs[&RunId::new("root")].clone();
    let mut child = fleet.runs[&RunId::new("root-kids-1-0")].clone();
    child.status = RunStatus::Failed;
    let mut forged = child.child_report().unwrap();
    forged.index = 1;
    let t = apply(
        &b,
        &waiting,
        &Event::ChildFinished {
            report: Box::new(forged),
            at: time(5),
        },
        &assembler,
    )
    .unwrap();
    assert_eq!(t.applied, Applied::Duplicate);
}

#[test]
fn a_long_child_id_is_cut_to_a_valid_run_id_and_stays_unique() {
    let parent = RunId::new("p".repeat(60));
    let a = child_run_id(&parent, &NodeId::new("kids"), 1, 0);
    let b = child_run_id(&parent, &NodeId::new("kids"), 1, 1);
    assert_ne!(a, b);
    for id in [&a, &b] {
        assert!(crate::factory::valid_run_id(id.as_str()), "{id}");
    }
}

/// A random plan: up to `depth` levels, up to four children each, some failing.
fn plan(depth: u32) -> BoxedStrategy<Value> {
    let leaf = any::<u8>()
        .prop_map(|f| json!({"fail": f % 5 == 0}))
        .boxed();
    if depth == 0 {
        return leaf;
    }
    prop_oneof![
        leaf,
        (prop::collection::vec(plan(depth - 1), 0..4), any::<u8>())
            .prop_map(|(children, f)| json!({"children": children, "fail": f % 7 == 0})),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(crate::proptest_support::cases(128))]

    /// Whatever the plan and whatever order events arrive in: the tree never holds more runs
    /// than it allows or goes deeper, every run ends, and each ends exactly once.
    #[test]
    fn a_tree_stays_within_its_bounds_and_every_run_ends_once(
        plan in plan(4),
        order in prop::collection::vec(any::<usize>(), 1..64),
        first_failure in any::<bool>(),
    ) {
        let b = tree_bundle(if first_failure { "first_failure" } else { "all" });
        let mut fleet = Fleet::new(&b, root(&b, plan));
        let mut i = 0;
        fleet.drain(|_| { i += 1; order[i % order.len()] });
        prop_assert!(fleet.created <= 10);
        for (id, state) in &fleet.runs {
            prop_assert!(state.status.is_terminal(), "{} still {:?}", id, state.status);
            prop_assert!(state.depth() <= 2);
            prop_assert_eq!(fleet.finished.get(id).copied(), Some(1), "{} ended once", id);
        }
    }
}

#[test]
fn a_restored_parent_asks_again_for_every_child_it_still_waits_for_as_first_decided() {
    let b = tree_bundle("all");
    let mut fleet = Fleet::new(&b, root(&b, small_tree()));
    fleet.grow_until(|f| f.runs.len() == 3);
    let parent = fleet.runs[&RunId::new("root")].clone();
    let t = step(&b, &parent, Event::Restored { at: time(7) });
    let asked: Vec<ChildRun> = t
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::StartChildren(c) => Some(c.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(asked.len(), 2);
    for child in asked {
        let first = &fleet.runs[&child.run.run_id];
        assert_eq!(first.input, child.run.input);
        assert_eq!(first.tree.as_ref(), Some(&child.tree));
        assert_eq!(first.spawn_budget, Some(child.budget));
        assert_eq!(first.repo.base_commit, child.run.repo.base_commit);
    }
    // Once both children reported, a restore asks for none.
    fleet.drain(|_| 0);
    let done = fleet.runs[&RunId::new("root")].clone();
    let t = apply(&b, &done, &Event::Restored { at: time(8) }, &assembler).unwrap();
    assert!(!t
        .effects
        .iter()
        .any(|e| matches!(e, Effect::StartChildren(_))));
}

#[test]
fn a_base_the_run_never_saw_is_refused_however_well_formed() {
    let yaml = TREE.replace("WAIT", "all").replace(
        "    input: \"{'plan': item, 'n': index}\"",
        "    input: \"{'plan': item}\"\n    base: input.plan.base",
    );
    let b = bundle(&yaml);
    // A well-formed hash out of thin air (another run's commit, say).
    let stranger = "0123456789abcdef0123456789abcdef01234567";
    let mut fleet = Fleet::new(&b, root(&b, json!({"base": stranger, "children": [{}]})));
    fleet.drain(|_| 0);
    let kids = fleet.runs[&RunId::new("root")]
        .last_outcome(&NodeId::new("kids"))
        .cloned();
    assert_eq!(kids.expect("settled").output["refused"], "bad_base");
    assert_eq!(fleet.created, 1);
    // The run's own commit (here its noop step's) is taken.
    let mut fleet = Fleet::new(
        &b,
        root(
            &b,
            json!({"base": "commit-of-root.work.1", "children": [{}]}),
        ),
    );
    fleet.drain(|_| 0);
    let child = &fleet.runs[&RunId::new("root-kids-1-0")];
    assert_eq!(child.repo.base_commit, "commit-of-root.work.1");
}
