//! Parallel paths and node kinds: fork and join, fan-out, approvals, advisory and observer
//! nodes, stuck detection, write scopes.

use super::*;

#[test]
fn a_fork_starts_both_branches_and_the_join_fires_exactly_once() {
    let b = bundle(FORK_JOIN);
    let t = step(&b, &new_run(&b, 1), Event::Start { at: time(0) });
    let skel = jobs_of(&t)[0].clone();
    let t = step(&b, &t.state, ok(&skel.job_id, json!({})));
    let both = jobs_of(&t);
    assert_eq!(
        both.iter().map(|j| j.node.as_str()).collect::<Vec<_>>(),
        vec!["tests", "impl"]
    );
    let (tests, imp) = (both[0].job_id.clone(), both[1].job_id.clone());

    let t1 = step(&b, &t.state, ok(&tests, json!({"n": 1})));
    assert_eq!(
        t1.state.status,
        RunStatus::Running,
        "one arrival does not fire"
    );
    // A redelivered result of the same branch does not count twice.
    let dup = step(&b, &t1.state, ok(&tests, json!({"n": 1})));
    assert_eq!(dup.applied, Applied::Duplicate);
    assert_eq!(dup.state.joins[&NodeId::new("meet")].arrived.len(), 1);

    let t2 = step(&b, &t1.state, ok(&imp, json!({"n": 2})));
    assert_eq!(t2.state.status, RunStatus::Succeeded);
    assert_eq!(t2.state.joins[&NodeId::new("meet")].fired, 1);
    let joined = t2.state.last_outcome(&NodeId::new("meet")).unwrap();
    assert_eq!(joined.output["arrivals"]["impl"]["n"], 2);
    // Once more for good measure: nothing fires again.
    let again = step(&b, &t2.state, ok(&imp, json!({"n": 2})));
    assert!(again.effects.is_empty());
}

#[test]
fn a_fan_out_starts_one_branch_per_item_and_joins_on_the_count() {
    let b = bundle(
        r#"
name: fan
start: spread
nodes:
  spread:
    kind: fanout
    over: input.items
    body: each
    join: gather
  each:
    kind: harness
    op: noop
    with: {value: item}
    routes: [{to: gather}]
  gather:
    kind: join
    routes: [{to: done}]
  done:
    kind: exit
    status: gather.output.count == 3
"#,
    );
    let mut s = new_run(&b, 1);
    s.input = json!({"items": ["a", "b", "c"]});
    let t = step(&b, &s, Event::Start { at: time(0) });
    let jobs = jobs_of(&t);
    assert_eq!(jobs.len(), 3);
    assert_eq!(jobs[1].params["value"], "b");
    assert_eq!(jobs[1].branch, Some(2));
    assert_eq!(t.state.joins[&NodeId::new("gather")].expected, 3);
    let mut state = t.state;
    for (i, j) in jobs.iter().enumerate() {
        let t = step(&b, &state, ok(&j.job_id, json!({"i": i})));
        state = t.state;
        let done = state.status == RunStatus::Succeeded;
        assert_eq!(done, i == 2, "fires on the last arrival only");
    }
    let gathered = state.last_outcome(&NodeId::new("gather")).unwrap();
    for (branch, i) in [("1", 0), ("2", 1), ("3", 2)] {
        assert_eq!(gathered.output["arrivals"][branch]["i"], i, "{branch}");
    }
}

#[test]
fn an_approval_pauses_until_decided_and_a_second_decision_changes_nothing() {
    let b = bundle(
        r#"
name: gate
start: review
nodes:
  review:
    kind: approval
    show: "{'items': input.items | length}"
    routes:
      - to: work
        when: review.ok
      - to: done
  work:
    kind: harness
    op: noop
    routes: [{to: done}]
  done:
    kind: exit
    status: review.ok and work.ok
"#,
    );
    let mut s = new_run(&b, 1);
    s.input = json!({"items": ["a", "b"]});
    let t = step(&b, &s, Event::Start { at: time(0) });
    assert!(t.effects.is_empty(), "nothing runs before the decision");
    assert_eq!(t.state.awaiting_approval(), vec![&NodeId::new("review")]);
    let shown = &t.state.approvals[&NodeId::new("review")].shown;
    assert_eq!(
        shown,
        &Some(json!({"items": 2})),
        "what the person deciding sees"
    );
    let decide = |approved| Event::Decide {
        node: NodeId::new("review"),
        approved,
        by: "ana".into(),
        comment: "fine".into(),
        at: time(0),
        edits: None,
    };
    let t = step(&b, &t.state, decide(true));
    assert_eq!(jobs_of(&t).len(), 1);
    let twice = step(&b, &t.state, decide(false));
    assert_eq!(twice.applied, Applied::Duplicate);
    assert!(twice.effects.is_empty());
}

#[test]
fn advisory_nodes_report_after_the_exit_and_observers_see_outcomes() {
    let b = bundle(
        r#"
name: adv
start: work
nodes:
  work:
    kind: harness
    op: noop
    routes: [{to: [probe, done]}]
  probe:
    kind: harness
    op: noop
    advisory: true
    derive: {verdict: "'Weak' if output.survived > 1 else 'Robust'"}
  witness:
    kind: harness
    op: noop
    observes: [work]
  done:
    kind: exit
    status: work.ok
"#,
    );
    let t = step(&b, &new_run(&b, 1), Event::Start { at: time(0) });
    let work = jobs_of(&t)[0].clone();
    let t = step(&b, &t.state, ok(&work.job_id, json!({"did": "x"})));
    let started: Vec<String> = jobs_of(&t).iter().map(|j| j.node.to_string()).collect();
    assert_eq!(started, vec!["witness", "probe"]);
    let witness = jobs_of(&t)[0].clone();
    assert_eq!(witness.params["observed"]["output"]["did"], "x");
    assert_eq!(
        t.state.status,
        RunStatus::Succeeded,
        "the exit did not wait"
    );
    let probe = jobs_of(&t)[1].job_id.clone();
    let late = step(&b, &t.state, ok(&probe, json!({"survived": 3})));
    assert_eq!(late.applied, Applied::Changed);
    let res = late.state.result.clone().unwrap();
    assert_eq!(res["advisory"]["probe"]["derived"]["verdict"], "Weak");
    assert!(matches!(late.effects[0], Effect::ResultUpdated { .. }));
}

#[test]
fn a_repeated_failure_signature_routes_to_stuck_and_budgets_route_to_their_exit() {
    let b = bundle(
        r#"
name: loop
start: fix
nodes:
  fix:
    kind: harness
    op: noop
    max_visits: 5
    budget_exit: exhausted
    stuck: {signature: "fix.output.pattern if not fix.ok else none", times: 3, to: stuck}
    routes:
      - to: done
        when: fix.ok
      - to: fix
  stuck:
    kind: exit
    status: "false"
  exhausted:
    kind: exit
    status: "false"
  done:
    kind: exit
    status: fix.ok
"#,
    );
    let mut t = step(&b, &new_run(&b, 1), Event::Start { at: time(0) });
    for _ in 0..3 {
        let j = jobs_of(&t)[0].job_id.clone();
        t = step(
            &b,
            &t.state,
            result(&j, 1, JobStatus::Failed, json!({"pattern": "KeyError"})),
        );
    }
    assert_eq!(t.state.status, RunStatus::Failed);
    assert_eq!(t.state.result.as_ref().unwrap()["exit"], "stuck");

    let mut t = step(&b, &new_run(&b, 1), Event::Start { at: time(0) });
    for i in 0..5 {
        let j = jobs_of(&t)[0].job_id.clone();
        t = step(
            &b,
            &t.state,
            result(
                &j,
                1,
                JobStatus::Failed,
                json!({"pattern": format!("p{i}")}),
            ),
        );
    }
    assert_eq!(t.state.result.as_ref().unwrap()["exit"], "exhausted");
}

#[test]
fn one_test_failing_the_same_way_three_times_is_stuck_while_other_failures_change() {
    let b = bundle(
        r#"
name: loop
start: fix
nodes:
  fix:
    kind: harness
    op: noop
    max_visits: 10
    budget_exit: exhausted
    stuck: {signature: "fix.output.sigs if not fix.ok else none", times: 3, to: stuck}
    routes:
      - to: done
        when: fix.ok
      - to: fix
  stuck: {kind: exit, status: "false"}
  exhausted: {kind: exit, status: "false"}
  done: {kind: exit, status: fix.ok}
"#,
    );
    let mut t = step(&b, &new_run(&b, 1), Event::Start { at: time(0) });
    // `a` fails the same way every time; the other failure changes each round, and the whole
    // list never repeats. A joined signature would never be stuck; per test it is, at round 3.
    for i in 0..3 {
        assert!(!t.state.status.is_terminal(), "round {i}");
        let j = jobs_of(&t)[0].job_id.clone();
        t = step(
            &b,
            &t.state,
            result(
                &j,
                1,
                JobStatus::Failed,
                json!({"sigs": ["a:assertion", format!("b{i}:error"), "a:assertion"]}),
            ),
        );
    }
    assert_eq!(t.state.result.as_ref().unwrap()["exit"], "stuck");
}

#[test]
fn a_write_scope_is_evaluated_into_the_job() {
    let b = bundle(
        r#"
name: scoped
start: work
nodes:
  work:
    kind: command
    image: img
    commands: ["true"]
    worktree: {from: base, mode: rw, commit: true}
    writes: [input.impl, "input.tests ~ '/**'", "['a.py', 'b.py']"]
    routes: [{to: done}]
  done: {kind: exit, status: work.ok}
"#,
    );
    let mut run = new_run(&b, 1);
    run.input = json!({"impl": "stack.py", "tests": "tests"});
    let t = step(&b, &run, Event::Start { at: time(0) });
    let scope = published(&t).write_scope.clone().unwrap();
    assert_eq!(scope.globs, vec!["stack.py", "tests/**", "a.py", "b.py"]);
    assert!(!scope.symlinks && !scope.submodules && !scope.mode_changes);
}

#[test]
fn edits_come_only_with_an_approval_that_takes_them_and_fit_its_schema() {
    let b = bundle(
        r#"
name: gate
start: review
nodes:
  review:
    kind: approval
    edits: s.json
    max_visits: 3
    routes:
      - to: review
        when: review.ok and review.output.edits
      - to: other
        when: not review.ok
      - to: done
  other:
    kind: approval
    routes: [{to: done}]
  done:
    kind: exit
    status: review.ok
"#,
    );
    let t = step(&b, &new_run(&b, 1), Event::Start { at: time(0) });
    let decide = |node: &str, approved, edits: Option<Value>| Event::Decide {
        node: NodeId::new(node),
        approved,
        by: "ana".into(),
        comment: String::new(),
        at: time(1),
        edits,
    };
    // Not an object (the schema's type), with a rejection, on a node without edits: refused,
    // and the run still waits.
    for (node, approved, edits) in [
        ("review", true, json!(["a list"])),
        ("review", false, json!({"x": 1})),
        ("other", true, json!({"x": 1})),
    ] {
        let refused = step(&b, &t.state, decide(node, approved, Some(edits)));
        assert!(
            matches!(refused.applied, Applied::Refused(_)),
            "{node} {approved}: {:?}",
            refused.applied
        );
        assert!(refused.effects.is_empty());
        assert_eq!(
            refused.state.awaiting_approval(),
            vec![&NodeId::new("review")]
        );
    }
    // Edits that fit: kept in the decision, seen by the routes (the review is asked again).
    let edited = step(&b, &t.state, decide("review", true, Some(json!({"x": 1}))));
    assert_eq!(edited.applied, Applied::Changed);
    let last = edited.state.last_outcome(&NodeId::new("review")).unwrap();
    assert_eq!(last.output["edits"], json!({"x": 1}));
    assert_eq!(
        edited.state.awaiting_approval(),
        vec![&NodeId::new("review")]
    );
    let done = step(&b, &edited.state, decide("review", true, None));
    assert_eq!(done.state.status, RunStatus::Succeeded);
}
