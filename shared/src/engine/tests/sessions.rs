//! Messages between agent sessions: an incremental job's progress puts its crosstalk into the
//! running target's session once (fenced by job, attempt and invocation), sends again what the
//! target has not received, and a job published later starts with what is still unread.

use super::*;
use crate::session::{Delivery, ProgressNotice};

const TALK: &str = r#"
name: talk
start: skel
nodes:
  skel:
    kind: harness
    op: noop
    routes: [{to: [tests, impl]}]
  tests:
    kind: agent
    template: t.md
    output_schema: s.json
    incremental: {max_invocations: 5}
    crosstalk:
      - {to: impl, message: "FYI: the test agent added {{ progress.completed | join(', ') }}"}
    routes: [{to: meet}]
  impl:
    kind: agent
    template: t.md
    output_schema: s.json
    incremental:
      max_invocations: 5
      checkpoints: [{name: build, command: "python -m compileall {{ input.dir }}"}]
    routes: [{to: meet}]
  meet:
    kind: join
    wait_for: [tests, impl]
    routes: [{to: done}]
  done: {kind: exit, status: meet.ok}
"#;

fn progress(job: &JobId, attempt: Attempt, invocation: u32, committed: bool, read: u64) -> Event {
    Event::Progress {
        notice: Box::new(ProgressNotice {
            v: 1,
            job_id: job.clone(),
            run_id: RunId::new("r1"),
            attempt,
            invocation,
            output: json!({"status": "more_work", "completed": [format!("prop_{invocation}")]}),
            committed,
            commit: format!("c{invocation}"),
            delivered: read,
        }),
        at: time(5),
    }
}

fn deliveries(t: &Transition) -> Vec<Delivery> {
    t.effects
        .iter()
        .flat_map(|e| match e {
            Effect::Deliver(d) => d.clone(),
            _ => Vec::new(),
        })
        .collect()
}

#[test]
fn crosstalk_reaches_the_running_session_once_and_again_until_it_is_read() {
    let b = bundle(TALK);
    let mut run = new_run(&b, 1);
    run.input = json!({"dir": "src"});
    let t = step(&b, &run, Event::Start { at: time(0) });
    let skel = jobs_of(&t)[0].clone();
    let t = step(&b, &t.state, ok(&skel.job_id, json!({})));
    let jobs = jobs_of(&t);
    let (tests, imp) = (jobs[0].clone(), jobs[1].clone());
    assert_eq!(tests.incremental.as_ref().unwrap().max_invocations, 5);
    assert_eq!(
        imp.incremental.as_ref().unwrap().checkpoints,
        vec![("build".to_string(), "python -m compileall src".to_string())],
        "checkpoint commands are rendered at publish"
    );

    let t1 = step(&b, &t.state, progress(&tests.job_id, 1, 1, true, 0));
    let sent = deliveries(&t1);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].job_id, imp.job_id);
    assert_eq!(sent[0].messages[0].seq, 1);
    assert_eq!(sent[0].messages[0].text, "FYI: the test agent added prop_1");
    // The same invocation again (a redelivered notice) sends nothing twice.
    let dup = step(&b, &t1.state, progress(&tests.job_id, 1, 1, true, 0));
    assert_eq!(dup.applied, Applied::Duplicate);
    // An invocation that committed nothing has nothing to tell.
    let quiet = step(&b, &t1.state, progress(&tests.job_id, 1, 2, false, 0));
    assert!(deliveries(&quiet).is_empty());

    // The impl session's progress shows it has not read message 1: sent again, to it.
    let again = step(&b, &quiet.state, progress(&imp.job_id, 1, 1, true, 0));
    let resent = deliveries(&again);
    assert_eq!(resent.len(), 1);
    assert_eq!(resent[0].job_id, imp.job_id);
    assert_eq!(resent[0].messages.len(), 1);
    // Once it has, nothing more goes out.
    let read = step(&b, &again.state, progress(&imp.job_id, 1, 2, true, 1));
    assert!(deliveries(&read).is_empty());
    assert_eq!(read.state.mailboxes[&NodeId::new("impl")].delivered, 1);
    // A progress of an attempt the run has moved past is stale.
    let mut moved = read.state.clone();
    moved.jobs.get_mut(&imp.job_id).unwrap().attempt = 2;
    let stale = step(&b, &moved, progress(&imp.job_id, 1, 3, true, 1));
    assert!(matches!(stale.applied, Applied::Stale { .. }));
}

#[test]
fn a_message_for_a_session_that_is_not_running_waits_in_its_next_job() {
    let b = bundle(
        r#"
name: later
start: tests
nodes:
  tests:
    kind: agent
    template: t.md
    output_schema: s.json
    incremental: {max_invocations: 3}
    crosstalk: [{to: impl, message: "tests at {{ commit }}"}]
    routes: [{to: impl}]
  impl:
    kind: agent
    template: t.md
    output_schema: s.json
    incremental: {max_invocations: 3}
    routes: [{to: done}]
  done: {kind: exit, status: impl.ok}
"#,
    );
    let t = step(&b, &new_run(&b, 1), Event::Start { at: time(0) });
    let tests = jobs_of(&t)[0].clone();
    let t = step(&b, &t.state, progress(&tests.job_id, 1, 1, true, 0));
    assert!(deliveries(&t).is_empty(), "nobody runs to hear it yet");
    let t = step(&b, &t.state, ok(&tests.job_id, json!({"status": "done"})));
    let imp = published(&t);
    assert_eq!(imp.inbox.len(), 1);
    assert_eq!(imp.inbox[0].text, "tests at c1");
    // Its result says it read the message: a later job would not get it again.
    let t = step(
        &b,
        &t.state,
        ok(&imp.job_id, json!({"status": "done", "delivered": 1})),
    );
    assert_eq!(t.state.mailboxes[&NodeId::new("impl")].delivered, 1);
    assert!(t.state.mailboxes[&NodeId::new("impl")]
        .undelivered()
        .is_empty());
}

#[test]
fn crosstalk_must_name_an_incremental_agent_other_than_itself() {
    for (to, why) in [
        ("skel", "is not an incremental agent node"),
        ("tests", "cannot message itself"),
        ("nobody", "unknown node"),
    ] {
        let yaml = TALK.replace("{to: impl, message", &format!("{{to: {to}, message"));
        let e = load_bundle("t.yaml", &yaml, |p| match p {
            "t.md" => Ok("go".into()),
            "s.json" => Ok(r#"{"type":"object"}"#.into()),
            other => Err(format!("unexpected {other}")),
        })
        .map(|_| ())
        .unwrap_err();
        assert!(format!("{e:?}").contains(why), "{to}: {e:?}");
    }
    let yaml = TALK.replace("max_invocations: 5}", "max_invocations: 0}");
    let e = load_bundle("t.yaml", &yaml, |p| match p {
        "t.md" => Ok("go".into()),
        "s.json" => Ok(r#"{"type":"object"}"#.into()),
        other => Err(format!("unexpected {other}")),
    })
    .map(|_| ())
    .unwrap_err();
    assert!(format!("{e:?}").contains("max_invocations"), "{e:?}");
}

#[test]
fn a_reissued_attempt_does_not_take_an_invocation_twice() {
    let b = bundle(TALK);
    let t = step(&b, &new_run(&b, 1), Event::Start { at: time(0) });
    let skel = jobs_of(&t)[0].clone();
    let t = step(&b, &t.state, ok(&skel.job_id, json!({})));
    let (tests, imp) = (jobs_of(&t)[0].clone(), jobs_of(&t)[1].clone());
    let t = step(&b, &t.state, progress(&tests.job_id, 1, 1, true, 0));
    assert_eq!(deliveries(&t).len(), 1);
    // The worker went silent: attempt 2, which resumes from the checkpoint of invocation 1
    // and announces it again.
    let t = step(
        &b,
        &t.state,
        Event::Reissue {
            job_id: tests.job_id.clone(),
            attempt: 1,
            started_at: None,
            at: time(9),
        },
    );
    assert_eq!(t.state.jobs[&tests.job_id].attempt, 2);
    let again = step(&b, &t.state, progress(&tests.job_id, 2, 1, true, 0));
    assert_eq!(again.applied, Applied::Duplicate);
    assert_eq!(again.state.mailboxes[&imp.node].messages.len(), 1);
    let next = step(&b, &t.state, progress(&tests.job_id, 2, 2, true, 0));
    assert_eq!(next.state.mailboxes[&imp.node].messages.len(), 2);
}
