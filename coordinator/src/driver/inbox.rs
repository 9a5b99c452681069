//! The result inbox: consumes job results and dead-lettered jobs, queues them per run and
//! applies each run's queue in one batch (a group commit), acking only after the commit and
//! its mirror.

use super::{now, Coordinator, DriverError};
use shared::engine::Event;
use shared::ids::RunId;
use shared::messages::{JobEnvelope, JobResult, ResultEnvelope, WIRE_VERSION};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};
use worker::blobs::BlobError;
use worker::queue::{Incoming, QueueName};

/// Messages waiting to be applied, per run, and the runs with a flusher at work.
#[derive(Default)]
pub(super) struct Inbox {
    pending: HashMap<RunId, Vec<(Event, Incoming)>>,
    flushing: HashSet<RunId>,
}

enum HandleError {
    Poison(String),
    Transient(String),
}

impl Coordinator {
    /// Consumes job results and dead-lettered jobs, applying them as events and acking after
    /// the commit. Messages that arrive together are applied per run in one batch.
    pub async fn consume(self: Arc<Self>, queue: QueueName, shutdown: CancellationToken) {
        let mut rx = self.broker.subscribe(queue, 1024);
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => return,
                m = rx.recv() => match m { Some(m) => m, None => return },
            };
            let mut batch = vec![first];
            while batch.len() < 1024 {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            let mut by_run: HashMap<RunId, Vec<(Event, Incoming)>> = HashMap::new();
            for msg in batch {
                match self.decode(queue, &msg.body).await {
                    Ok((run, event)) => by_run.entry(run).or_default().push((event, msg)),
                    Err(HandleError::Poison(reason)) => {
                        error!(queue = ?queue, %reason, "dropping a poison message");
                        let _ = msg.reject().await;
                    }
                    Err(HandleError::Transient(reason)) => {
                        warn!(queue = ?queue, %reason, "could not read a message; requeueing");
                        let _ = msg.requeue().await;
                    }
                }
            }
            for (run, items) in by_run {
                self.clone().enqueue(run, items);
            }
        }
    }

    /// Queues messages for a run; one flusher per run applies everything queued in one batch,
    /// so batches grow with the load instead of queueing behind each other.
    fn enqueue(self: Arc<Self>, run: RunId, items: Vec<(Event, Incoming)>) {
        let start = {
            let mut inbox = self.inbox.lock().expect("inbox");
            inbox.pending.entry(run.clone()).or_default().extend(items);
            inbox.flushing.insert(run.clone())
        };
        if start {
            tokio::spawn(async move { self.flush(run).await });
        }
    }

    async fn flush(&self, run: RunId) {
        loop {
            let items = {
                let mut inbox = self.inbox.lock().expect("inbox");
                match inbox.pending.remove(&run) {
                    Some(items) if !items.is_empty() => items,
                    _ => {
                        inbox.flushing.remove(&run);
                        return;
                    }
                }
            };
            // Events take the time they are applied at.
            let at = now();
            let items = items
                .into_iter()
                .map(|(mut e, m)| {
                    match &mut e {
                        Event::JobFinished { at: t, .. } | Event::JobDead { at: t, .. } => {
                            *t = at.clone()
                        }
                        _ => {}
                    }
                    (e, m)
                })
                .collect();
            self.settle(run.clone(), items).await;
        }
    }

    async fn settle(&self, run: RunId, items: Vec<(Event, Incoming)>) {
        let (events, msgs): (Vec<Event>, Vec<Incoming>) = items.into_iter().unzip();
        match self.apply_batch(&run, &events).await {
            Ok(_) => {
                for m in msgs {
                    let _ = m.ack().await;
                }
            }
            Err(DriverError::UnknownRun(_)) => {
                warn!(run = %run, "messages for an unknown run; dropping them");
                for m in msgs {
                    let _ = m.reject().await;
                }
            }
            Err(e) => {
                warn!(run = %run, error = %e, "could not apply messages; requeueing");
                tokio::time::sleep(Duration::from_millis(200)).await;
                for m in msgs {
                    let _ = m.requeue().await;
                }
            }
        }
    }

    /// The run and event a message stands for.
    async fn decode(&self, queue: QueueName, body: &[u8]) -> Result<(RunId, Event), HandleError> {
        match queue {
            QueueName::Results => {
                let env: ResultEnvelope =
                    serde_json::from_slice(body).map_err(|e| HandleError::Poison(e.to_string()))?;
                check_wire_version(env.v)?;
                if let Some(worker) = env.started {
                    let event = Event::JobStarted {
                        job_id: env.job_id,
                        attempt: env.attempt,
                        worker,
                        at: now(),
                    };
                    return Ok((env.run_id, event));
                }
                let result: JobResult = match env.result {
                    Some(inline) => *inline,
                    None => self
                        .blobs
                        .get_content(&env.result_ref)
                        .await
                        .map_err(|e| match e {
                            BlobError::Decode { .. } | BlobError::Corrupt { .. } => {
                                HandleError::Poison(e.to_string())
                            }
                            other => HandleError::Transient(other.to_string()),
                        })?,
                };
                Ok((
                    env.run_id,
                    Event::JobFinished {
                        result: Box::new(result),
                        at: now(),
                    },
                ))
            }
            QueueName::DeadJobs => {
                let env: JobEnvelope =
                    serde_json::from_slice(body).map_err(|e| HandleError::Poison(e.to_string()))?;
                check_wire_version(env.v)?;
                warn!(run = %env.run_id, job = %env.job_id, "job dead-lettered");
                Ok((
                    env.run_id,
                    Event::JobDead {
                        job_id: env.job_id.clone(),
                        attempt: env.attempt,
                        reason: "the job reached its delivery limit or was rejected as poison"
                            .into(),
                        at: now(),
                    },
                ))
            }
            QueueName::Jobs => Err(HandleError::Poison(
                "the coordinator does not take jobs".into(),
            )),
        }
    }
}

/// A message of another wire version is not guessed at: it is refused as poison (dead-lettered
/// with its reason in the log), so a mixed-version fleet fails loudly instead of misreading.
fn check_wire_version(v: u32) -> Result<(), HandleError> {
    if v == WIRE_VERSION {
        Ok(())
    } else {
        Err(HandleError::Poison(format!(
            "wire version {v}; this coordinator speaks {WIRE_VERSION}"
        )))
    }
}
