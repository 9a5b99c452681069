//! The run's budget in the engine: the warning once at 80%, the pause at 100% (the next job is
//! held in the state, not published), a refused raise, a raise that publishes what was held,
//! and notices only for a run with a webhook.

use super::*;
use crate::tracking::RunBudget;

const LOOP: &str = r#"
name: spend
start: a
nodes:
  a:
    kind: command
    commands: ["true"]
    max_visits: 10
    routes:
      - to: a
        when: visits.a < 4
      - to: done
  done: {kind: exit, status: a.ok}
"#;

fn costing(job: &JobId, usd: f64) -> Event {
    let mut e = result(job, 1, JobStatus::Ok, json!({}));
    if let Event::JobFinished { result, .. } = &mut e {
        result.usage.cost_usd = usd;
        result.usage.llm_calls = 1;
    }
    e
}

fn notices(t: &Transition) -> Vec<crate::tracking::EventType> {
    t.effects
        .iter()
        .filter_map(|e| match e {
            Effect::Notify(n) => Some(n.event.event_type),
            _ => None,
        })
        .collect()
}

#[test]
fn the_run_pauses_at_its_budget_and_a_raise_publishes_what_was_held() {
    use crate::tracking::EventType::*;
    let b = bundle(LOOP);
    let mut s = new_run(&b, 1);
    s.budget = Some(RunBudget::new(1.0).unwrap());
    s.webhook = Some("http://127.0.0.1:9/hook".into());
    let t = step(&b, &s, Event::Start { at: time(0) });
    let t = step(&b, &t.state, costing(&jobs_of(&t)[0].job_id.clone(), 0.5));
    assert!(notices(&t).is_empty());
    let t = step(&b, &t.state, costing(&jobs_of(&t)[0].job_id.clone(), 0.3));
    assert_eq!(notices(&t), [BudgetWarning], "0.8 of 1.0");
    let third = jobs_of(&t)[0].job_id.clone();
    let t = step(&b, &t.state, costing(&third, 0.3));
    assert_eq!(notices(&t), [BudgetExhausted]);
    assert!(
        jobs_of(&t).is_empty(),
        "the next job is held, not published"
    );
    assert_eq!(t.state.held.len(), 1);
    assert_eq!(t.state.status, RunStatus::Running);

    let raise = |usd: f64| Event::Budget {
        limit_usd: usd,
        by: "ana".into(),
        at: time(5),
    };
    let refused = step(&b, &t.state, raise(1.1));
    assert!(matches!(refused.applied, Applied::Refused(_)), "1.1 spent");
    assert_eq!(refused.state, t.state);
    let t = step(&b, &t.state, raise(5.0));
    assert_eq!(notices(&t), [Resumed]);
    assert_eq!(jobs_of(&t).len(), 1, "the held job is published");
    assert!(t.state.held.is_empty());
    let t = step(&b, &t.state, costing(&jobs_of(&t)[0].job_id.clone(), 0.1));
    assert_eq!(t.state.status, RunStatus::Succeeded);
    assert_eq!(notices(&t), [RunFinished]);
    let raised = step(&b, &t.state, raise(9.0));
    assert!(
        matches!(raised.applied, Applied::Refused(_)),
        "the run ended"
    );
}

#[test]
fn a_run_without_a_webhook_keeps_its_marks_without_notices() {
    let b = bundle(LOOP);
    let mut s = new_run(&b, 1);
    s.budget = Some(RunBudget::new(0.1).unwrap());
    let t = step(&b, &s, Event::Start { at: time(0) });
    let t = step(&b, &t.state, costing(&jobs_of(&t)[0].job_id.clone(), 0.2));
    assert!(notices(&t).is_empty());
    let marks = &t.state.budget.as_ref().unwrap().marks;
    assert_eq!(marks.len(), 2, "warning and exhausted in one jump");
    assert_eq!(t.state.held.len(), 1);
}
