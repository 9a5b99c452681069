//! Runs of the shipped factory graph: the happy path, attempts carrying their brief, duplicates
//! and stale attempts, dead jobs and cancel, visit budgets.

use super::*;

#[test]
fn the_factory_happy_path_runs_se_tr_po_and_passes() {
    let b = factory_bundle();
    let s0 = new_run(&b, 2);
    let t = step(&b, &s0, Event::Start { at: time(0) });
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
    let t = step(&b, &new_run(&b, 2), Event::Start { at: time(0) });
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
    let t = step(&b, &new_run(&b, 2), Event::Start { at: time(0) });
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
    let t = step(&b, &new_run(&b, 2), Event::Start { at: time(0) });
    let se = published(&t).clone();
    let dead = step(
        &b,
        &t.state,
        Event::JobDead {
            job_id: se.job_id.clone(),
            attempt: 1,
            reason: "delivery limit".into(),
            at: time(0),
        },
    );
    assert_eq!(dead.state.status, RunStatus::Failed);
    assert_eq!(
        dead.state.result.as_ref().unwrap()["reason"],
        "job_dead_lettered"
    );

    let c = step(&b, &t.state, Event::Cancel { at: time(0) });
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
    let mut t = step(&b, &new_run(&b, 1), Event::Start { at: time(0) });
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
