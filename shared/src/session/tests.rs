use super::*;
use serde_json::json;

fn spec(max: u32, stuck_after: u32) -> LoopSpec {
    LoopSpec {
        max_invocations: max,
        stuck_after,
        checkpoints: vec![("build".into(), "python -m compileall -q .".into())],
    }
}

fn progress(status: WorkStatus, completed: &[&str], remaining: &[&str]) -> IncrementalProgress {
    IncrementalProgress {
        status,
        completed: completed.iter().map(|s| s.to_string()).collect(),
        remaining: remaining.iter().map(|s| s.to_string()).collect(),
        notes: None,
    }
}

fn run(name: &str, exit_code: i64) -> CheckpointRun {
    CheckpointRun {
        name: name.into(),
        exit_code,
        excerpt: format!("{name} said {exit_code}"),
    }
}

#[test]
fn done_ends_the_loop_only_when_every_checkpoint_passed() {
    let s = spec(10, 3);
    let mut book = LoopBook::default();
    let p = progress(WorkStatus::Done, &["push"], &[]);
    assert_eq!(book.record(&s, &p, true, vec![run("build", 1)]), None);
    let prompt = continuation_prompt(2, &book);
    assert!(
        prompt.contains("Checkpoint `build` failed (exit 1)"),
        "{prompt}"
    );
    assert!(prompt.contains("build said 1"), "{prompt}");
    assert_eq!(
        book.record(&s, &p, true, vec![run("build", 0)]),
        Some(LoopEnd::Done)
    );
    assert_eq!(book.invocations, 2);
    assert_eq!(book.completed, vec!["push".to_string()], "no repeats");
    assert!(!continuation_prompt(3, &book).contains("failed"));
}

#[test]
fn invocations_that_move_nothing_end_as_stuck() {
    let s = spec(10, 2);
    let mut book = LoopBook::default();
    let more = progress(WorkStatus::MoreWork, &["a"], &["b"]);
    assert_eq!(book.record(&s, &more, true, vec![]), None);
    // Nothing committed, `remaining` as it was: idle once, then stuck.
    let same = progress(WorkStatus::MoreWork, &[], &["b"]);
    assert_eq!(book.record(&s, &same, false, vec![]), None);
    assert_eq!(book.record(&s, &same, false, vec![]), Some(LoopEnd::Stuck));
    // A commit in between resets the count.
    let mut book = LoopBook::default();
    assert_eq!(book.record(&s, &same, false, vec![]), None);
    assert_eq!(book.record(&s, &same, true, vec![]), None);
    assert_eq!(book.record(&s, &same, false, vec![]), None);
    assert_eq!(book.idle, 1);
}

#[test]
fn the_budget_ends_a_loop_that_keeps_moving() {
    let s = spec(3, 2);
    let mut book = LoopBook::default();
    for (i, end) in [None, None, Some(LoopEnd::Budget)].into_iter().enumerate() {
        let left = format!("f{i}");
        let p = progress(WorkStatus::MoreWork, &[], &[&left]);
        assert_eq!(
            book.record(&s, &p, true, vec![]),
            end,
            "invocation {}",
            i + 1
        );
    }
    let out = book.output(LoopEnd::Budget, Some(1), &json!({"x": 1}));
    assert_eq!(out["status"], "budget");
    assert_eq!(out["invocations"], 3);
    assert_eq!(out["resumed_after"], 1);
    assert_eq!(out["remaining"], json!(["f2"]));
}

#[test]
fn a_mailbox_numbers_its_messages_and_hands_out_what_is_unread() {
    let mut m = Mailbox::default();
    let a = m.push(NodeId::new("tests"), 1, "added prop_push");
    let b = m.push(NodeId::new("tests"), 2, "added prop_pop");
    assert_eq!((a.seq, b.seq), (1, 2));
    assert_eq!(m.undelivered().len(), 2);
    m.delivered = 1;
    assert_eq!(m.undelivered(), vec![b.clone()]);
    assert_eq!(m.after(2), vec![]);
    assert_eq!(
        b.as_user_text(),
        "[message from `tests`] added prop_pop".to_string()
    );
}

#[test]
fn a_long_message_is_cut_on_a_character_boundary() {
    let long = "é".repeat(MAX_MESSAGE_BYTES);
    let cut = bounded_message(&long);
    assert!(cut.ends_with(" [cut]"));
    assert!(cut.len() <= MAX_MESSAGE_BYTES + " [cut]".len());
    assert_eq!(bounded_message("short"), "short");
}

#[test]
fn an_invocation_answer_must_be_an_incremental_progress() {
    let ok = IncrementalProgress::read(&json!({"status": "more_work", "completed": ["a"]}));
    assert_eq!(ok.unwrap().status, WorkStatus::MoreWork);
    for bad in [
        json!({"status": "finished"}),
        json!({"completed": []}),
        json!("done"),
        json!({"status": "done", "completed": "a"}),
    ] {
        let e = IncrementalProgress::read(&bad).unwrap_err();
        assert!(e.contains("IncrementalProgress"), "{e}");
    }
}
