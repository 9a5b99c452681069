//! Deadlines: a started job past its deadline, a job that never finishes, a queued deadline,
//! and a restored run re-issuing what it waits for (older attempts fenced).

use super::*;

#[test]
fn a_started_job_past_its_deadline_is_reissued_and_the_old_attempt_is_fenced() {
    let b = factory_bundle();
    let t = step(&b, &new_run(&b, 2), Event::Start { at: time(0) });
    let se = published(&t).clone();
    assert!(se.notify_start, "agent jobs announce their start");
    let started = step(
        &b,
        &t.state,
        Event::JobStarted {
            job_id: se.job_id.clone(),
            attempt: 1,
            worker: "w1".into(),
            at: time(1),
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
            at: time(1),
        },
    );
    assert_eq!(again.applied, Applied::Duplicate);

    let stale_watch = step(
        &b,
        &started.state,
        Event::Reissue {
            job_id: se.job_id.clone(),
            attempt: 1,
            started_at: Some(time(0)),
            at: time(2),
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
            started_at: Some(time(1)),
            at: time(2),
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
    let mut t = step(&b, &new_run(&b, 2), Event::Start { at: time(0) });
    let job = published(&t).job_id.clone();
    let start = |t: &Transition, attempt, w: &str| {
        step(
            &b,
            &t.state,
            Event::JobStarted {
                job_id: job.clone(),
                attempt,
                worker: w.into(),
                at: time(10 + i64::from(attempt)),
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
                started_at: Some(time(10 + i64::from(attempt))),
                at: time(0),
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
            started_at: Some(time(10 + i64::from(MAX_ATTEMPTS))),
            at: time(0),
        },
    );
    assert_eq!(last.state.status, RunStatus::Failed);
    assert_eq!(last.state.result.unwrap()["reason"], "job_never_finished");
}

#[test]
fn a_queued_deadline_reissues_only_a_job_that_never_started() {
    let b = factory_bundle();
    let t = step(&b, &new_run(&b, 2), Event::Start { at: time(0) });
    let job = published(&t).job_id.clone();
    let queued = |state: &RunState| {
        step(
            &b,
            state,
            Event::Reissue {
                job_id: job.clone(),
                attempt: 1,
                started_at: None,
                at: time(9),
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
            at: time(1),
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
    let t = step(&b, &new_run(&b, 2), Event::Start { at: time(0) });
    let job = published(&t).job_id.clone();
    // Even a job at its last attempt is issued again: the loss was not its fault.
    let mut state = t.state.clone();
    state.jobs.get_mut(&job).unwrap().attempt = MAX_ATTEMPTS;
    let restored = step(&b, &state, Event::Restored { at: time(5) });
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
    let cancelled = step(&b, &t.state, Event::Cancel { at: time(2) });
    let nothing = step(&b, &cancelled.state, Event::Restored { at: time(3) });
    assert_eq!(nothing.applied, Applied::Ignored("no job to re-issue"));
}
