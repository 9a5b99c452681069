//! A team's `concurrent_jobs` over the fleet. The relay admits each job message it claimed
//! before publishing it: the attempt takes one of the team's slots, or the message waits in
//! the team's line (`JobSlotStore`). The slot is freed when the attempt ends (its result, a
//! dead letter, a re-issue), before the messages that ended it are acked, so a coordinator
//! that dies in between frees it when the result comes again; a run's end frees all of its
//! slots and drops its waiting jobs. Each freed slot moves the front of the line to the
//! outbox. A sweep moves lines whose team has room again (a raised or lifted limit, a slot
//! that lapsed). Slots lapse after `SLOT_LEASE`, longer than any job may run.

use super::Coordinator;
use shared::engine::{Event, RunState};
use shared::ports::OutboxMessage;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

/// A slot no attempt freed lapses after this: a week (the longest job timeout) and a day.
pub const SLOT_LEASE: Duration = Duration::from_secs(8 * 24 * 3600);

/// How long a team's limit read from the ledger is used before it is read again.
const LIMIT_TTL: Duration = Duration::from_secs(2);

fn lease_ms() -> i64 {
    SLOT_LEASE.as_millis() as i64
}

impl Coordinator {
    /// The team's `concurrent_jobs`, read from the ledger at most every `LIMIT_TTL`. A ledger
    /// that cannot be read keeps the last value known (none: no limit).
    pub(super) async fn concurrent_jobs(&self, team: &str) -> Option<u32> {
        if let Some((at, limit)) = self.team_job_limits.lock().expect("limits").get(team) {
            if at.elapsed() < LIMIT_TTL {
                return *limit;
            }
        }
        match self.ledger.limits(team).await {
            Ok(l) => {
                let mut cache = self.team_job_limits.lock().expect("limits");
                cache.insert(team.to_string(), (Instant::now(), l.concurrent_jobs));
                l.concurrent_jobs
            }
            Err(e) => {
                warn!(team, error = %e, "could not read the team's limits; keeping the last known");
                let cache = self.team_job_limits.lock().expect("limits");
                cache.get(team).and_then(|(_, l)| *l)
            }
        }
    }

    /// Admits the job messages of `batch` (claimed by this coordinator) against their teams'
    /// `concurrent_jobs`: those of full teams leave the in-flight list for their team's line;
    /// the rest are returned, to be published. A store that cannot admit lets them all through
    /// (the limit is fairness between teams; losing or stalling the jobs would be worse).
    pub(super) async fn admit_claimed(&self, batch: Vec<String>) -> Vec<String> {
        let mut by_team: BTreeMap<String, Vec<(usize, String)>> = BTreeMap::new();
        for (i, raw) in batch.iter().enumerate() {
            if !raw.starts_with("{\"Job\"") {
                continue;
            }
            match serde_json::from_str::<OutboxMessage>(raw) {
                Ok(OutboxMessage::Job(env)) => {
                    if let Some(team) = env.team.clone() {
                        by_team.entry(team).or_default().push((i, env.slot()));
                    }
                }
                Ok(_) => {}
                Err(e) => error!(error = %e, "a malformed job message in the outbox"),
            }
        }
        let mut waiting = vec![false; batch.len()];
        let now = self.clock.now().timestamp_millis();
        for (team, jobs) in by_team {
            let Some(limit) = self.concurrent_jobs(&team).await else {
                continue;
            };
            let items: Vec<(String, String)> = jobs
                .iter()
                .map(|(i, slot)| (slot.clone(), batch[*i].clone()))
                .collect();
            match self
                .store
                .admit_jobs(&self.id, &team, limit, now, lease_ms(), &items)
                .await
            {
                Ok(admitted) => {
                    let held = admitted.iter().filter(|a| !**a).count();
                    if held > 0 {
                        info!(
                            team,
                            limit,
                            waiting = held,
                            "jobs wait for the team's concurrent_jobs"
                        );
                        self.metrics.jobs_held.inc_by(held as u64);
                    }
                    for ((i, _), ok) in jobs.iter().zip(admitted) {
                        waiting[*i] = !ok;
                    }
                }
                Err(e) => {
                    error!(team, error = %e, "could not admit jobs against the team's concurrent_jobs; publishing them")
                }
            }
        }
        batch
            .into_iter()
            .zip(waiting)
            .filter_map(|(raw, w)| (!w).then_some(raw))
            .collect()
    }

    /// Frees the slots of the attempts `events` ended, for the run's team; waiting jobs move.
    pub(super) async fn release_slots(&self, state: &RunState, events: &[Event]) {
        let Some(team) = state.team.as_deref() else {
            return;
        };
        let slots: Vec<String> = events.iter().filter_map(Event::ended_slot).collect();
        if slots.is_empty() {
            return;
        }
        let limit = self.concurrent_jobs(team).await;
        let now = self.clock.now().timestamp_millis();
        match self
            .store
            .release_jobs(team, limit, now, lease_ms(), &slots)
            .await
        {
            Ok(0) => {}
            Ok(_) => self.outbox_ready.notify_one(),
            Err(e) => {
                warn!(team, run = %state.run_id, error = %e, "could not free the team's job slots; they lapse")
            }
        }
    }

    /// The run ended: its slots are freed and its waiting jobs leave the team's line.
    pub(super) async fn release_run_slots(&self, state: &RunState) {
        let Some(team) = state.team.as_deref() else {
            return;
        };
        let limit = self.concurrent_jobs(team).await;
        let now = self.clock.now().timestamp_millis();
        match self
            .store
            .release_run_jobs(team, limit, now, lease_ms(), &state.run_id)
            .await
        {
            Ok(0) => {}
            Ok(_) => self.outbox_ready.notify_one(),
            Err(e) => {
                warn!(team, run = %state.run_id, error = %e, "could not free an ended run's job slots; they lapse")
            }
        }
    }

    /// Moves the lines of teams that have room again (a raised or lifted limit, lapsed slots).
    pub(super) async fn sweep_lines(&self) {
        let teams = match self.store.teams_waiting().await {
            Ok(t) => t,
            Err(e) => {
                warn!(error = %e, "could not list the teams with waiting jobs");
                return;
            }
        };
        let now = self.clock.now().timestamp_millis();
        for team in teams {
            let limit = self.concurrent_jobs(&team).await;
            match self
                .store
                .release_jobs(&team, limit, now, lease_ms(), &[])
                .await
            {
                Ok(0) => {}
                Ok(n) => {
                    info!(team, moved = n, "waiting jobs of the team move");
                    self.outbox_ready.notify_one();
                }
                Err(e) => warn!(team, error = %e, "could not move the team's waiting jobs"),
            }
        }
    }
}
