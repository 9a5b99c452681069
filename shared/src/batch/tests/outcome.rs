use super::super::outcome::INFRA_REASONS;
use super::super::state::MAX_ERROR_CHARS;
use super::*;
use crate::engine::{Outcome, RunState, RunStatus};
use crate::ids::{JobId, NodeId, RunId};
use crate::messages::{AgentConfig, JobStatus, RepoSnapshot, Usage};
use serde_json::{json, Value};

pub(super) fn job(
    node: &str,
    status: JobStatus,
    error: Option<&str>,
    cost: f64,
    tokens: u64,
) -> Outcome {
    Outcome {
        job_id: JobId::new(format!("r1.{node}.1")),
        node: NodeId::new(node),
        visit: 1,
        ok: status == JobStatus::Ok,
        status,
        output: json!({}),
        derived: json!({}),
        error: error.map(String::from),
        commit: None,
        artifacts: BTreeMap::new(),
        usage: Usage {
            llm_calls: 1,
            input_tokens: tokens,
            output_tokens: 1,
            cost_usd: cost,
        },
        worker: "w".into(),
        execution: String::new(),
        started_at: t(0),
        finished_at: t(1),
        container_seconds: 0.0,
        branch: None,
        cached_from: None,
        events: Vec::new(),
    }
}

pub(super) fn run(status: RunStatus, result: Option<Value>, history: Vec<Outcome>) -> RunState {
    RunState {
        run_id: RunId::new("r1"),
        graph_name: "factory".into(),
        graph_ref: "bundles/g".into(),
        status,
        input: json!({}),
        meta: json!({}),
        repo: RepoSnapshot::default(),
        agent: AgentConfig::default(),
        visits: BTreeMap::new(),
        jobs: BTreeMap::new(),
        history,
        result,
        usage: Usage::default(),
        created_at: t(0),
        updated_at: t(1),
        finished_at: Some(t(1)),
        joins: BTreeMap::new(),
        branches: BTreeMap::new(),
        approvals: BTreeMap::new(),
        quarantine: BTreeMap::new(),
        signatures: BTreeMap::new(),
        tree: None,
        spawn_budget: None,
        children: BTreeMap::new(),
        sibling_events: Vec::new(),
        mailboxes: BTreeMap::new(),
        budget: None,
        webhook: None,
        held: Vec::new(),
        team: None,
        commit: String::new(),
    }
}

#[test]
fn the_factory_verdict_and_stage_come_from_the_result() {
    let r = run(
        RunStatus::Failed,
        Some(json!({"verdict": "FAIL", "ended_stage": "verify_failed"})),
        vec![
            job("se", JobStatus::Ok, None, 0.25, 10),
            job("verify", JobStatus::Failed, Some("2 tests failed"), 0.5, 20),
        ],
    );
    let o = outcome_of(&r);
    assert_eq!(o.status, RunStatus::Failed);
    assert_eq!(o.verdict.as_deref(), Some("FAIL"));
    assert_eq!(o.ended_stage.as_deref(), Some("verify_failed"));
    assert_eq!(
        o.error.as_deref(),
        Some("node verify failed: 2 tests failed")
    );
    assert!(!o.infra_error);
    assert_eq!((o.cost_usd, o.tokens), (0.75, 32));
}

#[test]
fn without_a_verdict_the_status_decides() {
    let pass = outcome_of(&run(
        RunStatus::Succeeded,
        Some(json!({"exit": "done"})),
        vec![],
    ));
    assert_eq!(
        (pass.verdict.as_deref(), pass.infra_error),
        (Some("PASS"), false)
    );
    assert_eq!(pass.error, None);
    let fail = outcome_of(&run(RunStatus::Failed, None, vec![]));
    assert_eq!(fail.verdict.as_deref(), Some("FAIL"));
    // A non-string verdict is not one.
    let odd = outcome_of(&run(
        RunStatus::Succeeded,
        Some(json!({"verdict": 1})),
        vec![],
    ));
    assert_eq!(odd.verdict.as_deref(), Some("PASS"));
    let cancelled = outcome_of(&run(
        RunStatus::Cancelled,
        Some(json!({"reason": "cancelled"})),
        vec![],
    ));
    assert_eq!((cancelled.verdict, cancelled.infra_error), (None, false));
    let running = outcome_of(&run(RunStatus::Running, None, vec![]));
    assert_eq!(running.verdict, None);
}

#[test]
fn engine_reasons_of_the_infrastructure_are_infra_errors_and_the_agents_are_not() {
    for reason in INFRA_REASONS {
        let r = run(
            RunStatus::Failed,
            Some(json!({"reason": reason, "node": "se", "detail": "delivery limit"})),
            vec![],
        );
        let o = outcome_of(&r);
        assert!(o.infra_error, "{reason}");
        assert_eq!(o.verdict, None);
        assert_eq!(
            o.error.unwrap(),
            format!("{reason} at node se: delivery limit")
        );
    }
    for reason in ["budget_exhausted", "fanout_too_wide"] {
        let o = outcome_of(&run(
            RunStatus::Failed,
            Some(json!({"reason": reason, "node": "se", "max_visits": 3})),
            vec![],
        ));
        assert!(!o.infra_error, "{reason}");
        assert_eq!(o.verdict.as_deref(), Some("FAIL"));
        assert_eq!(o.error.unwrap(), format!("{reason} at node se"));
    }
}

#[test]
fn a_failed_run_with_an_errored_or_dead_job_is_an_infra_error() {
    for status in [JobStatus::Error, JobStatus::Dead] {
        let history = vec![
            job("se", JobStatus::Ok, None, 0.1, 1),
            job("verify", status, Some("docker: no such image"), 0.0, 0),
        ];
        let o = outcome_of(&run(
            RunStatus::Failed,
            Some(json!({"verdict": "FAIL", "ended_stage": "exception"})),
            history.clone(),
        ));
        assert!(o.infra_error);
        assert_eq!(o.verdict, None);
        let error = o.error.unwrap();
        assert!(error.starts_with("node verify "), "{error}");
        assert!(error.ends_with(": docker: no such image"), "{error}");
        // The same job in a run that succeeded anyway is no error of the run.
        let ok = outcome_of(&run(RunStatus::Succeeded, None, history));
        assert!(!ok.infra_error);
        assert_eq!(ok.verdict.as_deref(), Some("PASS"));
    }
    // The agent's failures are verdicts.
    for status in [
        JobStatus::TimedOut,
        JobStatus::OutputInvalid,
        JobStatus::Failed,
    ] {
        let o = outcome_of(&run(
            RunStatus::Failed,
            None,
            vec![job("se", status, None, 0.0, 0)],
        ));
        assert!(!o.infra_error, "{status:?}");
        assert_eq!(o.verdict.as_deref(), Some("FAIL"));
    }
}

#[test]
fn an_outcome_drives_the_batch_and_its_error_is_bounded() {
    let long = "x".repeat(MAX_ERROR_CHARS * 2);
    let r = run(
        RunStatus::Failed,
        Some(json!({"reason": "job_dead_lettered", "detail": long})),
        vec![],
    );
    let o = outcome_of(&r);
    assert!(o.error.as_ref().unwrap().chars().count() <= MAX_ERROR_CHARS + 20);
    let mut b = batch(&["a"], spec(1, 1));
    b.started(0, RunId::new("r1"), t(1));
    assert!(changes(&mut b, |b| b.finished(0, &o, t(2))));
    assert_eq!(
        (b.items[0].state, b.items[0].attempt, &b.items[0].run_id),
        (ItemState::Queued, 2, &None)
    );
}
