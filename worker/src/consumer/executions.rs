//! Admission and holding: one execution per (job, attempt) in this worker. A delivery of an
//! attempt that already runs here is held and settled with the first; one whose result this
//! worker reported lately is acked at once. A `Delivery` dropped unsettled requeues itself, and a
//! `Claim` dropped without `finish` (a panic) requeues the deliveries held for it.

use crate::queue::Incoming;
use shared::ids::{Attempt, JobId};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};
use tracing::warn;

/// A delivery that cannot be stranded: dropped unsettled (a panic on the way, a task torn
/// down), it is requeued rather than left holding a prefetch slot until the consumer timeout.
pub(crate) struct Delivery {
    msg: Option<Incoming>,
}

impl Delivery {
    pub(crate) fn new(msg: Incoming) -> Self {
        Self { msg: Some(msg) }
    }

    pub(super) fn incoming(&self) -> &Incoming {
        self.msg.as_ref().expect("a delivery is settled once")
    }

    /// Takes the message out to settle it.
    pub(super) fn settle(mut self) -> Incoming {
        self.msg.take().expect("a delivery is settled once")
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        let Some(msg) = self.msg.take() else {
            return;
        };
        warn!("a delivery was dropped unsettled; requeueing it");
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if let Err(e) = msg.requeue().await {
                        warn!(error = %e, "requeue failed; the broker will redeliver after the connection closes");
                    }
                });
            }
            Err(_) => {
                warn!("no runtime to requeue on; the broker will redeliver after the connection closes")
            }
        }
    }
}

type Key = (JobId, Attempt);

/// How many reported attempts a worker remembers (to ack their late duplicates at once).
const REMEMBERED: usize = 4096;

/// The (job, attempt) executions running in this worker, with the deliveries of each that came
/// while it ran, and the attempts it reported lately.
#[derive(Default)]
pub(crate) struct Executions {
    state: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    running: HashMap<Key, Vec<Delivery>>,
    reported: HashSet<Key>,
    order: VecDeque<Key>,
}

impl Registry {
    fn remember(&mut self, key: Key) {
        if self.reported.insert(key.clone()) {
            self.order.push_back(key);
            while self.order.len() > REMEMBERED {
                if let Some(old) = self.order.pop_front() {
                    self.reported.remove(&old);
                }
            }
        }
    }
}

/// What to do with a delivery.
pub(crate) enum Admission<'a> {
    /// Run it: the first execution of its attempt here.
    Run(Claim<'a>, Delivery),
    /// Its attempt runs here: the delivery is held and settled when that execution ends.
    Held,
    /// Its attempt's result was reported by this worker: ack it.
    Reported(Delivery),
}

impl Executions {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn admit(&self, job: &JobId, attempt: Attempt, delivery: Delivery) -> Admission<'_> {
        let key = (job.clone(), attempt);
        let mut st = self.lock();
        if st.reported.contains(&key) {
            return Admission::Reported(delivery);
        }
        if let Some(held) = st.running.get_mut(&key) {
            held.push(delivery);
            return Admission::Held;
        }
        st.running.insert(key.clone(), Vec::new());
        Admission::Run(
            Claim {
                executions: self,
                key,
                finished: false,
            },
            delivery,
        )
    }

    /// Attempts running here.
    #[cfg(test)]
    pub(super) fn running(&self) -> usize {
        self.lock().running.len()
    }
}

/// The one execution of an attempt in this worker. Dropped without `finish` (a panic), its held
/// deliveries are requeued.
pub(crate) struct Claim<'a> {
    executions: &'a Executions,
    key: Key,
    finished: bool,
}

impl Claim<'_> {
    /// Ends the execution; `reported` when its result is stored and published. Returns the
    /// deliveries held for it meanwhile.
    pub(crate) fn finish(mut self, reported: bool) -> Vec<Delivery> {
        self.finished = true;
        let mut st = self.executions.lock();
        let held = st.running.remove(&self.key).unwrap_or_default();
        if reported {
            st.remember(self.key.clone());
        }
        held
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let held = self.executions.lock().running.remove(&self.key);
            drop(held); // each one requeues itself
        }
    }
}
