//! The job-slot cases of the run-store contract: a full team's messages leave the relay's
//! in-flight list for the team's line, a freed slot moves the front of the line to the outbox,
//! an attempt keeps its slot, lapsed slots free room, and an ended run leaves nothing behind.

use super::{decode, message, state, Profile};
use shared::ids::RunId;
use shared::ports::{OutboxMessage, RunStore};

const LEASE_MS: i64 = 60_000;

/// Claims every outbox message for `owner`, each with its slot.
async fn claim(s: &dyn RunStore, owner: &str) -> Vec<(String, String)> {
    let raws = s.outbox_claim(owner, 100).await.unwrap();
    decode(&raws)
        .into_iter()
        .zip(raws)
        .map(|(m, raw)| match m {
            OutboxMessage::Job(env) => (env.slot(), raw),
            other => panic!("not a job: {other:?}"),
        })
        .collect()
}

pub async fn a_full_team_waits_in_line_and_a_freed_slot_moves_the_line(
    s: &dyn RunStore,
    _: &Profile,
) {
    let sent: Vec<_> = (1..=3).map(|i| message("r1", i)).collect();
    s.create(&state("r1"), &sent).await.unwrap();
    let items = claim(s, "relay").await;
    let now = 1_000_000;
    let admitted = s
        .admit_jobs("relay", "team-a", 2, now, LEASE_MS, &items)
        .await
        .unwrap();
    assert_eq!(admitted, vec![true, true, false]);
    let published: Vec<String> = items[..2].iter().map(|(_, r)| r.clone()).collect();
    s.outbox_done("relay", &published).await.unwrap();
    assert_eq!(
        s.outbox_reclaim_own("relay").await.unwrap(),
        0,
        "the message in line is no longer in flight"
    );
    assert_eq!(s.job_slots("team-a", now).await.unwrap(), (2, 1));
    assert_eq!(s.teams_waiting().await.unwrap(), vec!["team-a".to_string()]);
    assert_eq!(
        s.job_slots("team-b", now).await.unwrap(),
        (0, 0),
        "teams are apart"
    );

    let moved = s
        .release_jobs("team-a", Some(2), now, LEASE_MS, &[items[0].0.clone()])
        .await
        .unwrap();
    assert_eq!(moved, 1);
    let again = claim(s, "relay").await;
    assert_eq!(
        again,
        vec![items[2].clone()],
        "the line's front is in the outbox"
    );
    assert_eq!(s.job_slots("team-a", now).await.unwrap(), (2, 0));
    assert!(s.teams_waiting().await.unwrap().is_empty());
    assert_eq!(
        s.admit_jobs("relay", "team-a", 2, now, LEASE_MS, &again)
            .await
            .unwrap(),
        vec![true],
        "a message moved from the line holds its slot already"
    );
    assert_eq!(
        s.release_jobs("team-a", Some(2), now, LEASE_MS, &[])
            .await
            .unwrap(),
        0,
        "nothing waits"
    );
}

pub async fn lapsed_slots_free_room_and_an_ended_run_leaves_nothing(s: &dyn RunStore, _: &Profile) {
    let a: Vec<_> = (1..=2).map(|i| message("ra", i)).collect();
    let b = vec![message("rb", 1)];
    s.create(&state("ra"), &a[..1]).await.unwrap();
    s.create(&state("rb"), &b).await.unwrap();
    let first = claim(s, "relay").await;
    let now = 2_000_000;
    assert_eq!(
        s.admit_jobs("relay", "team-a", 1, now, 100, &first)
            .await
            .unwrap(),
        vec![true, false],
        "ra.n.1 takes the only slot, rb.n.1 waits"
    );
    // ra.n.1's slot lapses after 100 ms: at now + 200 there is room again, and the line goes
    // first: rb.n.1 moves to the outbox, the newcomer ra.n.2 waits.
    let later = now + 200;
    assert_eq!(s.job_slots("team-a", later).await.unwrap(), (0, 1));
    s.commit(&state("ra"), 1, &a[1..]).await.unwrap();
    let second = claim(s, "relay").await;
    assert_eq!(
        s.admit_jobs("relay", "team-a", 1, later, LEASE_MS, &second)
            .await
            .unwrap(),
        vec![false],
        "those in line go before newcomers"
    );
    assert_eq!(decode(&s.outbox_claim("relay", 10).await.unwrap()), b);
    assert_eq!(s.job_slots("team-a", later).await.unwrap(), (1, 1));
    // ra ends: its waiting job leaves the line; rb's slot stays.
    let moved = s
        .release_run_jobs("team-a", Some(1), later, LEASE_MS, &RunId::new("ra"))
        .await
        .unwrap();
    assert_eq!(moved, 0);
    assert_eq!(s.job_slots("team-a", later).await.unwrap(), (1, 0));
    assert!(s.outbox_claim("relay", 10).await.unwrap().is_empty());

    // A run that ends while its jobs wait takes them out of the line.
    s.create(&state("rc"), &[message("rc", 1), message("rc", 2)])
        .await
        .unwrap();
    let third = claim(s, "relay").await;
    assert_eq!(
        s.admit_jobs("relay", "team-a", 1, later, LEASE_MS, &third)
            .await
            .unwrap(),
        vec![false, false]
    );
    s.release_run_jobs("team-a", Some(1), later, LEASE_MS, &RunId::new("rc"))
        .await
        .unwrap();
    assert_eq!(s.job_slots("team-a", later).await.unwrap(), (1, 0));
    assert!(s.teams_waiting().await.unwrap().is_empty());
    assert!(s.outbox_claim("relay", 10).await.unwrap().is_empty());
}

pub async fn without_a_limit_the_whole_line_moves(s: &dyn RunStore, _: &Profile) {
    let sent: Vec<_> = (1..=3).map(|i| message("r1", i)).collect();
    s.create(&state("r1"), &sent).await.unwrap();
    let items = claim(s, "relay").await;
    let now = 3_000_000;
    s.admit_jobs("relay", "team-a", 1, now, LEASE_MS, &items)
        .await
        .unwrap();
    assert_eq!(
        s.release_jobs("team-a", None, now, LEASE_MS, &[])
            .await
            .unwrap(),
        2,
        "the limit was lifted"
    );
    assert_eq!(
        decode(&s.outbox_claim("other", 10).await.unwrap()),
        sent[1..]
    );
}
