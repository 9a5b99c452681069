//! The result inbox: consumes job results and dead-lettered jobs, queues them per run and
//! applies each run's queue in one batch (a group commit), acking only after the commit and
//! its mirror. A message on the results queue is a `ResultMessage` (a start notice, a result,
//! or a message between runs of a tree: a child to start, a child's end, a cancel, a sibling
//! event), read by `ResultMessage::decode` alone; one it cannot read is dead-lettered.

use super::{Coordinator, DriverError};
use shared::engine::Event;
use shared::ids::RunId;
use shared::messages::{JobEnvelope, JobResult, ResultMessage, WIRE_VERSION};
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

/// What a message asks of the coordinator: an event for a run, or a child run to create.
enum Inbound {
    Event(RunId, Event),
    Start(Box<shared::engine::ChildRun>),
}

#[derive(Debug)]
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
                    Ok(Inbound::Event(run, event)) => {
                        by_run.entry(run).or_default().push((event, msg))
                    }
                    Ok(Inbound::Start(child)) => {
                        let me = self.clone();
                        tokio::spawn(async move { me.settle_start(*child, msg).await });
                    }
                    Err(e) => {
                        if matches!(e, HandleError::Poison(_)) {
                            self.metrics.poison.inc();
                        }
                        refuse(queue, msg, e).await
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
            let at = self.clock.now();
            let items = items
                .into_iter()
                .map(|(mut e, m)| {
                    match &mut e {
                        Event::JobFinished { at: t, .. } | Event::JobDead { at: t, .. } => *t = at,
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

    /// Creates a child run, acking once it exists (and is cancelled if its parent no longer
    /// waits for it).
    async fn settle_start(&self, child: shared::engine::ChildRun, msg: Incoming) {
        let run = child.run.run_id.clone();
        match self.start_child(child).await {
            Ok(()) => {
                let _ = msg.ack().await;
            }
            Err(e) => {
                warn!(run = %run, error = %e, "could not start a child run; requeueing");
                tokio::time::sleep(Duration::from_millis(200)).await;
                let _ = msg.requeue().await;
            }
        }
    }

    /// What a message stands for: an event for a run, or a child run to create.
    async fn decode(&self, queue: QueueName, body: &[u8]) -> Result<Inbound, HandleError> {
        match queue {
            QueueName::Results => {
                let env = match read_result(body)? {
                    ResultMessage::Started(notice) => {
                        let event = Event::JobStarted {
                            job_id: notice.job_id,
                            attempt: notice.attempt,
                            worker: notice.worker,
                            at: self.clock.now(),
                        };
                        return Ok(Inbound::Event(notice.run_id, event));
                    }
                    ResultMessage::Finished(env) => env,
                    ResultMessage::Progress(notice) => {
                        let run = notice.run_id.clone();
                        let event = Event::Progress {
                            notice: Box::new(notice),
                            at: self.clock.now(),
                        };
                        return Ok(Inbound::Event(run, event));
                    }
                    ResultMessage::StartRun(msg) => {
                        let child: shared::engine::ChildRun =
                            self.run_message_body(&msg).await.map_err(blob_error)?;
                        if child.run.run_id != msg.run_id {
                            return Err(HandleError::Poison(
                                "a start message names another run than its body".into(),
                            ));
                        }
                        return Ok(Inbound::Start(Box::new(child)));
                    }
                    ResultMessage::ChildFinished(msg) => {
                        let report: shared::engine::ChildReport =
                            self.run_message_body(&msg).await.map_err(blob_error)?;
                        if report.parent != msg.run_id {
                            return Err(HandleError::Poison(
                                "a child's report names another parent than its message".into(),
                            ));
                        }
                        return Ok(Inbound::Event(
                            msg.run_id,
                            self.child_finished_event(report),
                        ));
                    }
                    ResultMessage::SiblingEvent(msg) => {
                        let event =
                            Box::new(self.run_message_body(&msg).await.map_err(blob_error)?);
                        let at = self.clock.now();
                        return Ok(Inbound::Event(
                            msg.run_id,
                            Event::SiblingEvent { event, at },
                        ));
                    }
                    ResultMessage::FromSibling(msg) => {
                        let event =
                            Box::new(self.run_message_body(&msg).await.map_err(blob_error)?);
                        let at = self.clock.now();
                        return Ok(Inbound::Event(msg.run_id, Event::FromSibling { event, at }));
                    }
                    ResultMessage::CancelRun(msg) => {
                        let event = Event::Cancel {
                            at: self.clock.now(),
                        };
                        return Ok(Inbound::Event(msg.run_id, event));
                    }
                };
                let result: JobResult = match env.result {
                    Some(inline) => *inline,
                    None => self
                        .blobs
                        .get_content(&env.result_ref)
                        .await
                        .map_err(blob_error)?,
                };
                Ok(Inbound::Event(
                    env.run_id,
                    Event::JobFinished {
                        result: Box::new(result),
                        at: self.clock.now(),
                    },
                ))
            }
            QueueName::DeadJobs => {
                let env: JobEnvelope =
                    serde_json::from_slice(body).map_err(|e| HandleError::Poison(e.to_string()))?;
                check_wire_version(env.v)?;
                warn!(run = %env.run_id, job = %env.job_id, "job dead-lettered");
                Ok(Inbound::Event(
                    env.run_id,
                    Event::JobDead {
                        job_id: env.job_id.clone(),
                        attempt: env.attempt,
                        reason: "the job reached its delivery limit or was rejected as poison"
                            .into(),
                        at: self.clock.now(),
                    },
                ))
            }
            QueueName::Jobs => Err(HandleError::Poison(
                "the coordinator does not take jobs".into(),
            )),
        }
    }
}

/// A payload that does not read is poison; one that could not be fetched may read next time.
fn blob_error(e: BlobError) -> HandleError {
    match e {
        BlobError::Decode { .. } | BlobError::Corrupt { .. } => HandleError::Poison(e.to_string()),
        other => HandleError::Transient(other.to_string()),
    }
}

/// Settles a message that was not read: poison is dead-lettered with its reason in the log, a
/// message that may read next time (its result unreachable) is requeued.
async fn refuse(queue: QueueName, msg: Incoming, e: HandleError) {
    match e {
        HandleError::Poison(reason) => {
            error!(queue = ?queue, %reason, "dropping a poison message");
            let _ = msg.reject().await;
        }
        HandleError::Transient(reason) => {
            warn!(queue = ?queue, %reason, "could not read a message; requeueing");
            let _ = msg.requeue().await;
        }
    }
}

/// A message on the results queue that does not read as a `ResultMessage` of this wire version
/// (junk, another version, an unknown kind) is poison.
fn read_result(body: &[u8]) -> Result<ResultMessage, HandleError> {
    ResultMessage::decode(body).map_err(|e| HandleError::Poison(e.to_string()))
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

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use serde_json::json;
    use std::sync::Mutex;
    use worker::queue::Acker;

    /// Records how a message was settled.
    struct Settled(Arc<Mutex<Vec<&'static str>>>);

    #[async_trait]
    impl Acker for Settled {
        async fn ack(self: Box<Self>) -> Result<(), shared::ports::PortError> {
            self.0.lock().unwrap().push("ack");
            Ok(())
        }
        async fn requeue(
            self: Box<Self>,
            _: Vec<u8>,
            _: u32,
        ) -> Result<(), shared::ports::PortError> {
            self.0.lock().unwrap().push("requeue");
            Ok(())
        }
        async fn reject(
            self: Box<Self>,
            _: Vec<u8>,
            _: u32,
        ) -> Result<(), shared::ports::PortError> {
            self.0.lock().unwrap().push("reject");
            Ok(())
        }
    }

    fn notice(v: u32, kind: &str) -> Vec<u8> {
        json!({"v": v, "kind": kind, "job_id": "r1.a.1", "run_id": "r1", "attempt": 1,
               "worker": "w1"})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn start_notices_and_results_are_read_by_their_kind() {
        match read_result(&notice(WIRE_VERSION, "started")) {
            Ok(ResultMessage::Started(n)) => {
                assert_eq!((n.run_id.as_str(), n.worker.as_str()), ("r1", "w1"))
            }
            other => panic!("a start notice: {other:?}"),
        }
        let finished = json!({"v": WIRE_VERSION, "kind": "finished", "job_id": "r1.a.1",
                              "run_id": "r1", "attempt": 1, "result_ref": "blobs/abc"});
        match read_result(finished.to_string().as_bytes()) {
            Ok(ResultMessage::Finished(e)) => assert_eq!(e.result_ref, "blobs/abc"),
            other => panic!("a result: {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_unknown_kind_another_version_or_junk_is_dead_lettered() {
        let unknown = notice(WIRE_VERSION, "paused");
        let later = notice(WIRE_VERSION + 1, "started");
        for (body, why) in [
            (unknown, "unknown result message kind `paused`".to_string()),
            (later, format!("wire version {}", WIRE_VERSION + 1)),
            (b"{}".to_vec(), "not a result message".to_string()),
        ] {
            let Err(e) = read_result(&body) else {
                panic!("read: {}", String::from_utf8_lossy(&body))
            };
            assert!(
                matches!(&e, HandleError::Poison(r) if r.contains(&why)),
                "{e:?}"
            );
            let settled = Arc::new(Mutex::new(Vec::new()));
            let msg = Incoming {
                body,
                delivery_count: 0,
                acker: Box::new(Settled(settled.clone())),
            };
            refuse(QueueName::Results, msg, e).await;
            assert_eq!(*settled.lock().unwrap(), vec!["reject"]);
        }
    }
}
