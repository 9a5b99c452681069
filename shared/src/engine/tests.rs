use super::*;
use crate::factory;
use crate::graph::load_bundle;
use crate::messages::JobStatus;

fn factory_bundle() -> GraphBundle {
    load_bundle(
        "graphs/factory/graph.yaml",
        include_str!("../../../graphs/factory/graph.yaml"),
        |p| match p {
            "templates/se.md.j2" => {
                Ok(include_str!("../../../graphs/factory/templates/se.md.j2").into())
            }
            "schemas/patch_proposal.json" => {
                Ok(include_str!("../../../graphs/factory/schemas/patch_proposal.json").into())
            }
            "schemas/factory_input.json" => {
                Ok(include_str!("../../../graphs/factory/schemas/factory_input.json").into())
            }
            other => Err(format!("unexpected {other}")),
        },
    )
    .expect("the shipped factory graph passes the checker")
}

fn assembler(name: &str) -> Option<Assembler> {
    (name == "factory_summary").then_some(factory::summarize as Assembler)
}

fn new_run(bundle: &GraphBundle, max_attempts: u32) -> RunState {
    let input = json!({"work_order": {}, "options": {"max_attempts": max_attempts}});
    RunState::new(
        RunId::new("r1"),
        bundle,
        "graph-ref".into(),
        input,
        json!({"repo_tree_hash_before": "t0"}),
        RepoSnapshot {
            url: "repo".into(),
            base_commit: "c0".into(),
            packs: vec!["p0".into()],
        },
        AgentConfig::default(),
        "t0",
    )
}

fn step(bundle: &GraphBundle, state: &RunState, event: Event) -> Transition {
    apply(bundle, state, &event, &assembler).expect("event applies")
}

fn result(job: &JobId, attempt: Attempt, status: JobStatus, output: Value) -> Event {
    Event::JobFinished {
        result: Box::new(JobResult {
            v: 1,
            job_id: job.clone(),
            run_id: RunId::new("r1"),
            attempt,
            status,
            output,
            error: (status != JobStatus::Ok).then(|| "boom".to_string()),
            commit: Some(format!("commit-of-{job}")),
            pack: Some(format!("pack-of-{job}")),
            artifacts: BTreeMap::new(),
            usage: Usage::default(),
            worker: "w".into(),
            started_at: "s".into(),
            finished_at: "f".into(),
            container_seconds: 0.0,
        }),
        at: "t".into(),
    }
}

fn published(t: &Transition) -> &JobSpec {
    match t.effects.as_slice() {
        [Effect::Publish(spec)] => spec,
        other => panic!("expected one publish, got {other:?}"),
    }
}

#[test]
fn the_factory_happy_path_runs_se_tr_po_and_passes() {
    let b = factory_bundle();
    let s0 = new_run(&b, 2);
    let t = step(&b, &s0, Event::Start { at: "t".into() });
    let se = published(&t).clone();
    assert_eq!(se.node.as_str(), "se");
    assert_eq!(se.worktree.as_ref().unwrap().commit, "c0");
    assert_eq!(se.artifact_prefix, "runs/r1/attempt_1/se/");
    assert_eq!(se.params["failure_brief"], Value::Null);

    let diff = json!({"unified_diff": "diff --git a/x b/x", "summary": "s"});
    let t = step(&b, &t.state, result(&se.job_id, 1, JobStatus::Ok, diff));
    let tr = published(&t).clone();
    assert_eq!(tr.node.as_str(), "tr");
    assert_eq!(tr.params["unified_diff"], "diff --git a/x b/x");

    let t = step(
        &b,
        &t.state,
        result(
            &tr.job_id,
            1,
            JobStatus::Ok,
            json!({"attempt_index": 1, "apply_ok": true}),
        ),
    );
    let po = published(&t).clone();
    assert_eq!(
        po.worktree.as_ref().unwrap().commit,
        format!("commit-of-{}", tr.job_id)
    );
    assert!(po
        .worktree
        .as_ref()
        .unwrap()
        .packs
        .contains(&format!("pack-of-{}", tr.job_id)));

    let t = step(
        &b,
        &t.state,
        result(
            &po.job_id,
            1,
            JobStatus::Ok,
            json!({"attempt_index": 1, "tree_hash_after": "t1"}),
        ),
    );
    assert_eq!(t.state.status, RunStatus::Succeeded);
    let summary = t.state.result.clone().unwrap();
    assert_eq!(summary["verdict"], "PASS");
    assert_eq!(summary["ended_stage"], "success");
    assert_eq!(summary["repo_tree_hash_after"], "t1");
    assert_eq!(summary["attempts"].as_array().unwrap().len(), 1);
}

#[test]
fn a_failed_attempt_carries_its_brief_into_the_next_prompt_and_ends_after_max_attempts() {
    let b = factory_bundle();
    let t = step(&b, &new_run(&b, 2), Event::Start { at: "t".into() });
    let se1 = published(&t).clone();
    let diff = json!({"unified_diff": "diff --git a/x b/x", "summary": "s"});
    let t = step(
        &b,
        &t.state,
        result(&se1.job_id, 1, JobStatus::Ok, diff.clone()),
    );
    let tr1 = published(&t).clone();
    let brief = json!({"stage": "patch_scope_violation", "command": null, "exit_code": null,
        "primary_error_excerpt": "x not allowed", "constraints_reminder": "r"});
    let t = step(
        &b,
        &t.state,
        result(
            &tr1.job_id,
            1,
            JobStatus::Failed,
            json!({"attempt_index": 1, "failure_brief": brief}),
        ),
    );
    let se2 = published(&t).clone();
    assert_eq!(se2.visit, 2);
    assert_eq!(
        se2.params["failure_brief"]["stage"],
        "patch_scope_violation"
    );

    // Attempt 2: the agent's output breaks the schema; attempts are exhausted.
    let t = step(
        &b,
        &t.state,
        result(&se2.job_id, 1, JobStatus::OutputInvalid, json!(null)),
    );
    assert_eq!(t.state.status, RunStatus::Failed);
    let summary = t.state.result.clone().unwrap();
    assert_eq!(summary["verdict"], "FAIL");
    assert_eq!(summary["ended_stage"], "llm_output_invalid");
    assert_eq!(
        summary["attempts"][0]["failure_brief"]["stage"],
        "patch_scope_violation"
    );
    assert_eq!(summary["repo_tree_hash_after"], "t0");
}

#[test]
fn duplicates_and_stale_attempts_change_nothing() {
    let b = factory_bundle();
    let t = step(&b, &new_run(&b, 2), Event::Start { at: "t".into() });
    let se = published(&t).clone();
    let ok = json!({"unified_diff": "diff --git a/x b/x", "summary": "s"});
    let t1 = step(
        &b,
        &t.state,
        result(&se.job_id, 1, JobStatus::Ok, ok.clone()),
    );
    let again = step(
        &b,
        &t1.state,
        result(&se.job_id, 1, JobStatus::Ok, ok.clone()),
    );
    assert_eq!(again.applied, Applied::Duplicate);
    assert!(again.effects.is_empty());
    assert_eq!(again.state, t1.state);

    let mut fenced = t.state.clone();
    fenced.jobs.get_mut(&se.job_id).unwrap().attempt = 2;
    let stale = step(&b, &fenced, result(&se.job_id, 1, JobStatus::Ok, ok));
    assert_eq!(stale.applied, Applied::Stale { current: 2 });
    assert!(stale.effects.is_empty());
}

#[test]
fn a_dead_job_fails_the_run_and_cancel_is_final() {
    let b = factory_bundle();
    let t = step(&b, &new_run(&b, 2), Event::Start { at: "t".into() });
    let se = published(&t).clone();
    let dead = step(
        &b,
        &t.state,
        Event::JobDead {
            job_id: se.job_id.clone(),
            attempt: 1,
            reason: "delivery limit".into(),
            at: "t".into(),
        },
    );
    assert_eq!(dead.state.status, RunStatus::Failed);
    assert_eq!(
        dead.state.result.as_ref().unwrap()["reason"],
        "job_dead_lettered"
    );

    let c = step(&b, &t.state, Event::Cancel { at: "t".into() });
    assert_eq!(c.state.status, RunStatus::Cancelled);
    let late = step(
        &b,
        &c.state,
        result(&se.job_id, 1, JobStatus::Ok, json!({})),
    );
    assert!(late.effects.is_empty());
    assert_eq!(late.state.status, RunStatus::Cancelled);
}

#[test]
fn a_visit_budget_ends_the_run_with_budget_exhausted() {
    let yaml = r#"
name: loop
start: a
nodes:
  a:
    kind: command
    commands: ["false"]
    max_visits: 2
    routes:
      - to: done
        when: a.ok
      - to: a
  done:
    kind: exit
    status: a.ok
"#;
    let b = load_bundle("loop.yaml", yaml, |_| Err("none".into())).unwrap();
    let mut t = step(&b, &new_run(&b, 1), Event::Start { at: "t".into() });
    for _ in 0..2 {
        let job = published(&t).job_id.clone();
        t = step(&b, &t.state, result(&job, 1, JobStatus::Failed, json!({})));
    }
    assert_eq!(t.state.status, RunStatus::Failed);
    assert_eq!(
        t.state.result.as_ref().unwrap()["reason"],
        "budget_exhausted"
    );
}

fn bundle(yaml: &str) -> GraphBundle {
    load_bundle("t.yaml", yaml, |p| match p {
        "t.md" => Ok("go".into()),
        "s.json" => Ok(r#"{"type":"object"}"#.into()),
        other => Err(format!("unexpected {other}")),
    })
    .unwrap_or_else(|e| panic!("{e:?}"))
}

fn jobs_of(t: &Transition) -> Vec<JobSpec> {
    t.effects
        .iter()
        .filter_map(|e| match e {
            Effect::Publish(s) => Some((**s).clone()),
            _ => None,
        })
        .collect()
}

fn ok(job: &JobId, output: Value) -> Event {
    result(job, 1, JobStatus::Ok, output)
}

const FORK_JOIN: &str = r#"
name: fj
start: skel
nodes:
  skel:
    kind: harness
    op: noop
    routes: [{to: [tests, impl]}]
  tests:
    kind: harness
    op: noop
    routes: [{to: meet}]
  impl:
    kind: harness
    op: noop
    routes: [{to: meet}]
  meet:
    kind: join
    wait_for: [tests, impl]
    routes: [{to: done}]
  done:
    kind: exit
    status: meet.ok
"#;

#[test]
fn a_fork_starts_both_branches_and_the_join_fires_exactly_once() {
    let b = bundle(FORK_JOIN);
    let t = step(&b, &new_run(&b, 1), Event::Start { at: "t".into() });
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
    let t = step(&b, &s, Event::Start { at: "t".into() });
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
    assert_eq!(gathered.output["arrivals"]["3"]["i"], 2);
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
    let t = step(&b, &new_run(&b, 1), Event::Start { at: "t".into() });
    assert!(t.effects.is_empty(), "nothing runs before the decision");
    assert_eq!(t.state.awaiting_approval(), vec![&NodeId::new("review")]);
    let decide = |approved| Event::Decide {
        node: NodeId::new("review"),
        approved,
        by: "ana".into(),
        comment: "fine".into(),
        at: "t".into(),
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
    let t = step(&b, &new_run(&b, 1), Event::Start { at: "t".into() });
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
    let mut t = step(&b, &new_run(&b, 1), Event::Start { at: "t".into() });
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

    let mut t = step(&b, &new_run(&b, 1), Event::Start { at: "t".into() });
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
    let mut t = step(&b, &new_run(&b, 1), Event::Start { at: "t".into() });
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
    let t = step(&b, &run, Event::Start { at: "t".into() });
    let scope = published(&t).write_scope.clone().unwrap();
    assert_eq!(scope.globs, vec!["stack.py", "tests/**", "a.py", "b.py"]);
    assert!(!scope.symlinks && !scope.submodules && !scope.mode_changes);
}

#[test]
fn a_started_job_past_its_deadline_is_reissued_and_the_old_attempt_is_fenced() {
    let b = factory_bundle();
    let t = step(&b, &new_run(&b, 2), Event::Start { at: "t".into() });
    let se = published(&t).clone();
    assert!(se.notify_start, "agent jobs announce their start");
    let started = step(
        &b,
        &t.state,
        Event::JobStarted {
            job_id: se.job_id.clone(),
            attempt: 1,
            worker: "w1".into(),
            at: "t1".into(),
        },
    );
    assert!(matches!(
        started.effects.as_slice(),
        [Effect::Watch {
            attempt: 1,
            timeout_seconds: 600,
            ..
        }]
    ));
    let again = step(
        &b,
        &started.state,
        Event::JobStarted {
            job_id: se.job_id.clone(),
            attempt: 1,
            worker: "w1".into(),
            at: "t1".into(),
        },
    );
    assert_eq!(again.applied, Applied::Duplicate);

    let stale_watch = step(
        &b,
        &started.state,
        Event::Reissue {
            job_id: se.job_id.clone(),
            attempt: 1,
            started_at: "t0".into(),
            at: "t2".into(),
        },
    );
    assert!(
        stale_watch.effects.is_empty(),
        "a deadline of an earlier start is ignored"
    );
    let re = step(
        &b,
        &started.state,
        Event::Reissue {
            job_id: se.job_id.clone(),
            attempt: 1,
            started_at: "t1".into(),
            at: "t2".into(),
        },
    );
    let spec2 = published(&re).clone();
    assert_eq!(spec2.attempt, 2);
    assert_eq!(spec2.job_id, se.job_id, "the same job, a new attempt");
    assert_eq!(re.state.jobs[&se.job_id].attempt, 2);

    let ok = json!({"unified_diff": "diff --git a/x b/x", "summary": "s"});
    let late = step(
        &b,
        &re.state,
        result(&se.job_id, 1, JobStatus::Ok, ok.clone()),
    );
    assert_eq!(late.applied, Applied::Stale { current: 2 });
    let fresh = step(&b, &re.state, result(&se.job_id, 2, JobStatus::Ok, ok));
    assert_eq!(fresh.applied, Applied::Changed);
    assert_eq!(published(&fresh).node.as_str(), "tr");
}

#[test]
fn a_job_that_never_finishes_fails_the_run_after_its_attempts() {
    let b = factory_bundle();
    let mut t = step(&b, &new_run(&b, 2), Event::Start { at: "t".into() });
    let job = published(&t).job_id.clone();
    let start = |t: &Transition, attempt, w: &str| {
        step(
            &b,
            &t.state,
            Event::JobStarted {
                job_id: job.clone(),
                attempt,
                worker: w.into(),
                at: format!("s{attempt}"),
            },
        )
    };
    for attempt in 1..MAX_ATTEMPTS {
        t = start(&t, attempt, "w");
        t = step(
            &b,
            &t.state,
            Event::Reissue {
                job_id: job.clone(),
                attempt,
                started_at: format!("s{attempt}"),
                at: "t".into(),
            },
        );
    }
    assert_eq!(t.state.jobs[&job].attempt, MAX_ATTEMPTS);
    let t = start(&t, MAX_ATTEMPTS, "w");
    let last = step(
        &b,
        &t.state,
        Event::Reissue {
            job_id: job,
            attempt: MAX_ATTEMPTS,
            started_at: format!("s{MAX_ATTEMPTS}"),
            at: "t".into(),
        },
    );
    assert_eq!(last.state.status, RunStatus::Failed);
    assert_eq!(last.state.result.unwrap()["reason"], "job_never_finished");
}

#[test]
fn a_queued_deadline_reissues_only_a_job_that_never_started() {
    let b = factory_bundle();
    let t = step(&b, &new_run(&b, 2), Event::Start { at: "t".into() });
    let job = published(&t).job_id.clone();
    let queued = |state: &RunState| {
        step(
            &b,
            state,
            Event::Reissue {
                job_id: job.clone(),
                attempt: 1,
                started_at: String::new(),
                at: "t9".into(),
            },
        )
    };
    let never_started = queued(&t.state);
    assert_eq!(published(&never_started).attempt, 2);
    let started = step(
        &b,
        &t.state,
        Event::JobStarted {
            job_id: job.clone(),
            attempt: 1,
            worker: "w1".into(),
            at: "t1".into(),
        },
    );
    let ignored = queued(&started.state);
    assert_eq!(
        ignored.applied,
        Applied::Ignored("the job started; its own deadline applies")
    );
    assert!(ignored.effects.is_empty());
}

#[test]
fn a_restored_run_reissues_every_job_it_waits_for_and_fences_the_old_attempts() {
    let b = factory_bundle();
    let t = step(&b, &new_run(&b, 2), Event::Start { at: "t".into() });
    let job = published(&t).job_id.clone();
    // Even a job at its last attempt is issued again: the loss was not its fault.
    let mut state = t.state.clone();
    state.jobs.get_mut(&job).unwrap().attempt = MAX_ATTEMPTS;
    let restored = step(&b, &state, Event::Restored { at: "t5".into() });
    assert_eq!(restored.applied, Applied::Changed);
    let again = published(&restored);
    assert_eq!(again.job_id, job);
    assert_eq!(again.attempt, MAX_ATTEMPTS + 1);
    assert_eq!(restored.state.status, RunStatus::Running);

    let ok = json!({"unified_diff": "diff --git a/x b/x", "summary": "s"});
    let old = step(
        &b,
        &restored.state,
        result(&job, MAX_ATTEMPTS, JobStatus::Ok, ok.clone()),
    );
    assert_eq!(
        old.applied,
        Applied::Stale {
            current: MAX_ATTEMPTS + 1
        }
    );
    let new = step(
        &b,
        &restored.state,
        result(&job, MAX_ATTEMPTS + 1, JobStatus::Ok, ok),
    );
    assert_eq!(new.applied, Applied::Changed);

    // A finished run has nothing to re-issue.
    let cancelled = step(&b, &t.state, Event::Cancel { at: "t2".into() });
    let nothing = step(&b, &cancelled.state, Event::Restored { at: "t3".into() });
    assert_eq!(nothing.applied, Applied::Ignored("no job to re-issue"));
}
