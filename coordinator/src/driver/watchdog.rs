//! Deadlines of jobs and their re-issue. A job is watched twice: from its publish (it may
//! wait in the queue for its own timeout plus `queue_grace`) and, if it announces its start,
//! from the start (its timeout plus `reissue_grace`). A passed deadline becomes a `Reissue`
//! event; the engine ignores the ones a later start, a result or a newer attempt superseded.
//! A due deadline is leased, not removed, until the event is applied: a coordinator that dies
//! in between leaves it to the next.
//!
//! A commit that leaves its run waiting for nothing (`shared::engine::stall`: running, no job
//! in flight, nothing held, no decision, no child run) is watched the same way, for the stall
//! grace (`FLEET_STALL_GRACE_SECONDS`, 60 s): past it, `Event::Stalled` ends the run
//! `run_stalled` unless it moved meanwhile (the engine decides, from the state).

use super::{Coordinator, DriverError};
use chrono::{DateTime, Utc};
use shared::engine::{stall, Applied, Effect, Event, RunState};
use shared::ids::{JobId, RunId};
use shared::time::rfc3339;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Seconds a due deadline is leased to the coordinator acting on it.
const LEASE_SECONDS: i64 = 30;

/// The job a stall watch names (no job id has a `~`); its start is the run's last change.
const STALL: &str = "~stall";

/// A deadline as stored: `<run>|<job>|<attempt>|<started_at>` (`started_at` in RFC 3339,
/// empty for a queued job).
struct Watch<'a> {
    run: &'a str,
    job: &'a str,
    attempt: u32,
    started_at: Option<DateTime<Utc>>,
}

impl<'a> Watch<'a> {
    fn parse(raw: &'a str) -> Option<Self> {
        let mut parts = raw.splitn(4, '|');
        let (run, job, attempt, started_at) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let started_at = match started_at {
            "" => None,
            text => Some(text.parse().ok()?),
        };
        Some(Watch {
            run,
            job,
            attempt: attempt.parse().ok()?,
            started_at,
        })
    }
}

fn encode(run: &RunId, job: &JobId, attempt: u32, started_at: Option<&DateTime<Utc>>) -> String {
    let started_at = started_at.map(rfc3339).unwrap_or_default();
    format!("{run}|{job}|{attempt}|{started_at}")
}

impl Coordinator {
    /// Records the deadlines of the jobs a transition published or saw start, and the
    /// stall grace of a run it left waiting for nothing.
    pub(super) async fn watch(&self, state: &RunState, effects: &[Effect]) {
        let run = &state.run_id;
        let now = self.clock.now().timestamp();
        let secs = |d: Duration| d.as_secs() as i64;
        let mut watches = Vec::new();
        if stall::is_stalled(state) {
            let since = Some(&state.updated_at);
            watches.push((
                encode(run, &JobId::new(STALL), 0, since),
                now + secs(self.stall_grace),
            ));
        }
        for fx in effects {
            match fx {
                Effect::Watch {
                    job_id,
                    attempt,
                    started_at,
                    timeout_seconds,
                } => watches.push((
                    encode(run, job_id, *attempt, Some(started_at)),
                    now + *timeout_seconds as i64 + secs(self.reissue_grace),
                )),
                Effect::Publish(spec) => watches.push((
                    encode(run, &spec.job_id, spec.attempt, None),
                    now + spec.timeout_seconds as i64 + secs(self.queue_grace),
                )),
                _ => {}
            }
        }
        if let Err(e) = self.store.watch(&watches).await {
            warn!(run = %run, count = watches.len(), error = %e, "could not record job deadlines");
        }
    }

    /// Re-issues jobs whose deadline passed without a result (a hung or cut-off worker, a
    /// message that never reached a worker).
    pub(super) async fn watchdog(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            let due = match self
                .store
                .due(self.clock.now().timestamp(), 100, LEASE_SECONDS)
                .await
            {
                Ok(d) => d,
                Err(e) => {
                    warn!(error = %e, "watchdog could not read deadlines");
                    continue;
                }
            };
            for raw in due {
                if self.act_on(&raw).await {
                    if let Err(e) = self.store.unwatch(&raw).await {
                        warn!(error = %e, "could not forget a deadline acted on; it comes back and is ignored");
                    }
                }
            }
        }
    }

    /// Applies one passed deadline; false when it must be tried again.
    async fn act_on(&self, raw: &str) -> bool {
        let Some(w) = Watch::parse(raw) else {
            warn!(watch = raw, "dropping a malformed deadline");
            return true;
        };
        if w.job == STALL {
            return self.act_on_stall(&w).await;
        }
        let event = Event::Reissue {
            job_id: JobId::new(w.job),
            attempt: w.attempt,
            started_at: w.started_at,
            at: self.clock.now(),
        };
        match self.apply(&RunId::new(w.run), &event).await {
            Ok(Applied::Changed) => {
                let queued = w.started_at.is_none();
                warn!(
                    run = w.run,
                    job = w.job,
                    attempt = w.attempt,
                    queued,
                    "job passed its deadline; re-issued"
                );
                self.metrics.reissued.inc();
                true
            }
            Ok(_) | Err(DriverError::UnknownRun(_)) => true,
            Err(e) => {
                warn!(run = w.run, job = w.job, error = %e, "could not re-issue a job; trying again");
                false
            }
        }
    }
}

impl Coordinator {
    /// Ends a run still waiting for nothing a grace after it was seen so; false when it must
    /// be tried again.
    async fn act_on_stall(&self, w: &Watch<'_>) -> bool {
        let Some(since) = w.started_at else {
            warn!(run = w.run, "dropping a stall watch without its time");
            return true;
        };
        let event = Event::Stalled {
            since,
            at: self.clock.now(),
        };
        match self.apply(&RunId::new(w.run), &event).await {
            Ok(Applied::Changed) => {
                warn!(run = w.run, since = %rfc3339(&since),
                    "run waited for nothing (no job in flight, nothing queued or held, no decision); ended it as stalled");
                true
            }
            Ok(_) | Err(DriverError::UnknownRun(_)) => true,
            Err(e) => {
                warn!(run = w.run, error = %e, "could not end a stalled run; trying again");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_round_trips_and_junk_is_refused() {
        let at: DateTime<Utc> = "2026-01-01T00:00:00.123Z".parse().unwrap();
        let raw = encode(&RunId::new("r1"), &JobId::new("r1.se.1"), 2, Some(&at));
        assert_eq!(raw, "r1|r1.se.1|2|2026-01-01T00:00:00.123Z");
        let w = Watch::parse(&raw).unwrap();
        assert_eq!((w.run, w.job, w.attempt), ("r1", "r1.se.1", 2));
        assert_eq!(w.started_at, Some(at));
        let queued = encode(&RunId::new("r1"), &JobId::new("j"), 1, None);
        assert_eq!(Watch::parse(&queued).unwrap().started_at, None);
        // Deadlines the previous version stored read the same.
        let old = Watch::parse("r1|j|1|2026-01-01T00:00:00.123Z").unwrap();
        assert_eq!(old.started_at, Some(at));
        assert!(Watch::parse("r|j|x|t").is_none());
        assert!(Watch::parse("r|j|1|t0").is_none());
        assert!(Watch::parse("r|j").is_none());
    }
}
