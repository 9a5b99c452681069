//! The schedule cases of the run-store contract: added once, listed by name, states written
//! by version and by the schedule's uid.

use super::Profile;
use shared::ports::{CasOutcome, RunStore};
use shared::schedule::{ScheduleDef, ScheduleState};

/// A schedule as a store sees it (opaque but for its name and its state's uid): its definition
/// and first state, `created` seconds into 2026.
pub fn schedule(name: &str, created: i64) -> (ScheduleDef, ScheduleState) {
    let yaml = "name: g\nstart: done\nnodes:\n  done:\n    kind: exit\n    status: 'true'\n";
    let graph = shared::graph::load_bundle("g.yaml", yaml, |p| Err(p.to_string())).expect("graph");
    let spec = serde_json::from_value(serde_json::json!({"max_running": 1})).expect("a spec");
    let dataset = "{\"id\": \"a\", \"repo\": \"/r\"}\n".to_string();
    let def = ScheduleDef {
        v: 1,
        name: name.into(),
        cron: "0 2 * * *".into(),
        graph,
        dataset_sha256: shared::hashing::sha256_hex(dataset.as_bytes()),
        dataset,
        agent: Default::default(),
        options: serde_json::Value::Null,
        spec,
        webhook: None,
        created_at: chrono::DateTime::from_timestamp(1_767_225_600 + created, 0).expect("a time"),
        team: None,
        mirror_dir: None,
    };
    let state = ScheduleState::new(&def);
    (def, state)
}

pub async fn schedules_are_added_once_and_listed_by_name(s: &dyn RunStore, _: &Profile) {
    let (def, state) = schedule("nightly", 0);
    assert!(s.add_schedule(&def, &state).await.unwrap());
    let (other, other_state) = schedule("nightly", 1);
    assert!(
        !s.add_schedule(&other, &other_state).await.unwrap(),
        "the name is taken"
    );
    assert_eq!(s.schedule_def("nightly").await.unwrap(), Some(def));
    assert_eq!(s.schedule_state("nightly").await.unwrap(), Some((state, 1)));
    let (b, b_state) = schedule("a-first", 2);
    assert!(s.add_schedule(&b, &b_state).await.unwrap());
    assert_eq!(
        s.list_schedules().await.unwrap(),
        vec!["a-first", "nightly"]
    );
    assert!(s.schedule_def("nope").await.unwrap().is_none());
    assert!(s.schedule_state("nope").await.unwrap().is_none());
}

pub async fn schedule_states_are_written_by_version_and_uid(s: &dyn RunStore, _: &Profile) {
    let (def, state) = schedule("n", 0);
    s.add_schedule(&def, &state).await.unwrap();
    let mut next = state.clone();
    next.claim_run_now(def.created_at, "c1");
    assert_eq!(
        s.commit_schedule(&next, 1).await.unwrap(),
        CasOutcome::Committed
    );
    assert_eq!(
        s.commit_schedule(&next, 1).await.unwrap(),
        CasOutcome::Conflict,
        "the version moved on"
    );
    assert_eq!(
        s.schedule_state("n").await.unwrap(),
        Some((next.clone(), 2))
    );
    // Removed, then added again: the same name, another schedule.
    assert!(s.remove_schedule("n").await.unwrap());
    assert!(!s.remove_schedule("n").await.unwrap(), "removed once");
    assert_eq!(
        s.commit_schedule(&next, 2).await.unwrap(),
        CasOutcome::Conflict
    );
    assert!(s.schedule_state("n").await.unwrap().is_none());
    assert!(s.list_schedules().await.unwrap().is_empty());
    let (again, fresh) = schedule("n", 5);
    assert_ne!(again.uid(), def.uid());
    s.add_schedule(&again, &fresh).await.unwrap();
    assert_eq!(
        s.commit_schedule(&state, 1).await.unwrap(),
        CasOutcome::Conflict,
        "a write meant for the removed schedule"
    );
    assert_eq!(s.schedule_state("n").await.unwrap(), Some((fresh, 1)));
}
