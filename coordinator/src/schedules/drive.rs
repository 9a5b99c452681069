//! Every coordinator drives every schedule: each tick it claims the tick due (one
//! compare-and-set: `last_tick` moves forward once, so of coordinators racing one fires it),
//! creates the batches of claimed firings (the id is the firing's, so creating twice finds the
//! first), notices finished batches and writes their reports, and claims and makes the due
//! delivery attempts (each claimed before it is made, its outcome recorded after). Any step a
//! coordinator dies in is taken up by the next tick of any coordinator.

use super::report::{self, body_key};
use super::webhook::{self, Post};
use super::{create_batch, load, retry_policy, update, Loaded, ScheduleError};
use crate::driver::Coordinator;
use chrono::{DateTime, Utc};
use shared::ids::BatchId;
use shared::schedule::{DeliveryState, Firing, FiringStage, RetryPolicy, ScheduleState};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often a coordinator looks at the schedules.
const TICK: Duration = Duration::from_millis(500);

/// What a coordinator keeps between ticks.
struct Driver {
    coord: Arc<Coordinator>,
    policy: RetryPolicy,
    http: webhook::WebhookClient,
    /// Definitions by name (checked against the state's uid every tick).
    loaded: HashMap<String, Arc<Loaded>>,
    /// Per schedule: the last tick claimed and the tick after it (the cron is not searched
    /// again until one of them changes).
    next: HashMap<String, (DateTime<Utc>, Option<DateTime<Utc>>)>,
    /// Deliveries this process is making now.
    under_way: Arc<Mutex<HashSet<BatchId>>>,
}

pub async fn drive(coord: Arc<Coordinator>, shutdown: CancellationToken) {
    let mut d = Driver {
        coord,
        policy: retry_policy(),
        http: webhook::client(),
        loaded: HashMap::new(),
        next: HashMap::new(),
        under_way: Arc::default(),
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(TICK) => {}
        }
        let names = match d.coord.store.list_schedules().await {
            Ok(n) => n,
            Err(e) => {
                warn!(error = %e, "cannot list the schedules");
                continue;
            }
        };
        d.loaded.retain(|n, _| names.contains(n));
        d.next.retain(|n, _| names.contains(n));
        if names.is_empty() {
            continue;
        }
        // A firing's batch is read only once it left this set (it finished).
        let active: HashSet<BatchId> = match d.coord.store.active_batches().await {
            Ok(a) => a.into_iter().collect(),
            Err(e) => {
                warn!(error = %e, "cannot list the unfinished batches");
                continue;
            }
        };
        for name in names {
            if let Err(e) = d.step(&name, &active).await {
                warn!(schedule = %name, error = %e, "schedule tick failed; retrying next tick");
            }
        }
    }
}

impl Driver {
    /// The schedule's definition for the state's `uid`; None while the two disagree (the
    /// schedule is being removed and added again).
    async fn definition(
        &mut self,
        name: &str,
        uid: &str,
    ) -> Result<Option<Arc<Loaded>>, ScheduleError> {
        if let Some(l) = self.loaded.get(name).filter(|l| l.uid == uid) {
            return Ok(Some(l.clone()));
        }
        let l = match load(&self.coord, name).await {
            Ok(l) => Arc::new(l),
            Err(ScheduleError::Unknown(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        if l.uid != uid {
            return Ok(None);
        }
        self.loaded.insert(name.to_string(), l.clone());
        Ok(Some(l))
    }

    async fn step(&mut self, name: &str, active: &HashSet<BatchId>) -> Result<(), ScheduleError> {
        let coord = self.coord.clone();
        let Some((mut state, _)) = coord.store.schedule_state(name).await? else {
            return Ok(());
        };
        let Some(loaded) = self.definition(name, &state.uid).await? else {
            return Ok(());
        };
        let now = coord.clock.now();
        let next = match self.next.get(name) {
            Some((last, next)) if *last == state.last_tick => *next,
            _ => {
                let next = loaded.cron.next_after(state.last_tick);
                self.next.insert(name.to_string(), (state.last_tick, next));
                next
            }
        };
        if next.is_some_and(|n| n <= now) {
            let claimed = update(&coord, name, |s| {
                if s.uid != loaded.uid {
                    return None;
                }
                s.claim_tick(&loaded.cron, now, &coord.id)
            })
            .await?;
            if let Some((answer, after)) = claimed {
                if let Some(id) = answer {
                    let f = after.firing(&id);
                    info!(schedule = %name, batch = %id, scheduled_for = ?f.map(|f| f.scheduled_for), missed = f.map_or(0, |f| f.missed), "tick claimed");
                }
                state = after;
            }
        }
        for firing in state.firings.iter().filter(|f| !f.is_settled()) {
            if firing.stage == FiringStage::Running && active.contains(&firing.batch_id) {
                continue;
            }
            // One firing's trouble (its batch unreadable now) holds up no other.
            if let Err(e) = self.advance(&loaded, firing, now).await {
                warn!(schedule = %name, batch = %firing.batch_id, error = %e, "firing step failed; retrying next tick");
            }
        }
        Ok(())
    }

    /// Takes one firing as far as it can go now.
    async fn advance(
        &self,
        loaded: &Arc<Loaded>,
        firing: &Firing,
        now: DateTime<Utc>,
    ) -> Result<(), ScheduleError> {
        let coord = &self.coord;
        let name = &loaded.def.name;
        let id = &firing.batch_id;
        let mut firing = firing.clone();
        if firing.stage == FiringStage::Claimed {
            return create_batch(coord, &loaded.def, &firing).await;
        }
        if firing.stage == FiringStage::Running {
            let finished = match report::load_batch(coord, id).await? {
                Some(b) => b.is_finished(),
                None => {
                    warn!(schedule = %name, batch = %id, "the firing's batch is gone");
                    false
                }
            };
            if !finished {
                return Ok(());
            }
            let webhook = loaded.def.webhook.is_some();
            match step(coord, loaded, id, |s| s.finished(id, now, webhook)).await? {
                Some(f) => firing = f,
                None => return Ok(()),
            }
        }
        if firing.stage == FiringStage::Finished {
            report::write(coord, name, &firing).await?;
            match step(coord, loaded, id, |s| s.reported(id)).await? {
                Some(f) => firing = f,
                None => return Ok(()),
            }
        }
        if firing.stage == FiringStage::Reported {
            self.deliver(loaded, &firing, now).await?;
        }
        Ok(())
    }

    /// Claims the firing's next delivery attempt when one is due and makes it in a task of
    /// its own (a slow webhook holds up no other schedule).
    async fn deliver(
        &self,
        loaded: &Arc<Loaded>,
        firing: &Firing,
        now: DateTime<Utc>,
    ) -> Result<(), ScheduleError> {
        let Some(delivery) = &firing.delivery else {
            return Ok(());
        };
        let id = firing.batch_id.clone();
        if delivery.state != DeliveryState::Pending
            || delivery.next_attempt_at > now
            || self.lock().contains(&id)
        {
            return Ok(());
        }
        let (coord, policy, uid) = (self.coord.clone(), self.policy, loaded.uid.clone());
        let claimed = update(&coord, &loaded.def.name, |s| {
            if s.uid != uid {
                return None;
            }
            s.claim_attempt(&id, now, &coord.id, &policy)
        })
        .await?;
        let Some((Some(n), _)) = claimed else {
            return Ok(());
        };
        self.lock().insert(id.clone());
        let (loaded, firing, http) = (loaded.clone(), firing.clone(), self.http.clone());
        let under_way = self.under_way.clone();
        tokio::spawn(async move {
            let name = &loaded.def.name;
            let outcome = attempt(&coord, &loaded, &firing, n, &http).await;
            let delivery = delivery_of(&firing);
            match &outcome {
                Ok(status) if (200..300).contains(status) => {
                    info!(schedule = %name, batch = %id, delivery, attempt = n, status, "report delivered")
                }
                Ok(status) => {
                    warn!(schedule = %name, batch = %id, delivery, attempt = n, status, "the webhook refused the report")
                }
                Err(e) => {
                    warn!(schedule = %name, batch = %id, delivery, attempt = n, error = %e, "webhook not reached")
                }
            }
            let done = coord.clock.now();
            let recorded = update(&coord, name, |s| {
                if s.uid == loaded.uid {
                    s.attempt_done(&id, n, outcome.clone(), done, &policy);
                }
            })
            .await;
            if let Err(e) = recorded {
                warn!(schedule = %name, batch = %id, attempt = n, error = %e, "cannot record the delivery attempt; its lease will lapse and it is made again");
            }
            under_way
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&id);
        });
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<BatchId>> {
        self.under_way
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn delivery_of(firing: &Firing) -> &str {
    firing.delivery.as_ref().map_or("", |d| d.id.as_str())
}

/// Attempt `n` of the firing's delivery: the stored body, signed and POSTed.
async fn attempt(
    coord: &Coordinator,
    loaded: &Loaded,
    firing: &Firing,
    n: u32,
    http: &webhook::WebhookClient,
) -> Result<u16, String> {
    let hook = loaded
        .def
        .webhook
        .as_ref()
        .ok_or_else(|| "the schedule has no webhook".to_string())?;
    let key = body_key(&loaded.def.name, &firing.batch_id);
    let body = coord
        .blobs
        .get(&key)
        .await
        .map_err(|e| format!("cannot read the report body `{key}`: {e}"))?;
    let post = Post {
        hook,
        body,
        delivery: delivery_of(firing),
        timestamp: firing.finished_at.map_or(0, |t| t.timestamp()),
        attempt: n,
        event: shared::schedule::webhook::EVENT,
    };
    webhook::post(http, post).await
}

/// Moves firing `id` of this schedule on by `change` (compare-and-set, only while the stored
/// schedule is the loaded one); the firing as it stands after, none when the schedule or the
/// firing is gone.
async fn step(
    coord: &Coordinator,
    loaded: &Loaded,
    id: &BatchId,
    change: impl Fn(&mut ScheduleState),
) -> Result<Option<Firing>, ScheduleError> {
    let uid = &loaded.uid;
    let after = update(coord, &loaded.def.name, |s| {
        if &s.uid == uid {
            change(s)
        }
    })
    .await?;
    Ok(after.and_then(|(_, state)| state.firing(id).cloned()))
}
