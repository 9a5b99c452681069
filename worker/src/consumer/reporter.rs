//! Publishes finished jobs' results to the results queue, several in one message when they are
//! ready together. A result never waits for a timer: it waits only while the message before it
//! is being confirmed, and goes out with whatever else became ready meanwhile (at most
//! [`MAX_RESULTS`] in one message, each at most `INLINE_LIMIT` bytes inline). Under load one
//! confirm then covers many jobs, and the broker, the worker and the coordinator each handle one
//! message where they handled many; alone, a result goes out at once, as before.
//!
//! Each caller hears back once the broker confirmed the message holding its result, and only
//! then acks its job; a publish that failed fails every result in it (each job is requeued).

use crate::queue::{Broker, QueueName};
use prometheus::Histogram;
use shared::messages::{ResultBatch, ResultEnvelope, ResultMessage, WIRE_VERSION};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tracing::debug;

/// Most results in one message: 64 results of at most 16 KiB inline each keep a message
/// around 1 MiB, far below the broker's limit.
pub const MAX_RESULTS: usize = 64;

/// A result waiting to be published, and who waits for its confirm.
struct Waiting {
    envelope: ResultEnvelope,
    confirmed: oneshot::Sender<Result<(), String>>,
}

/// The worker's one publisher of results (see the module's doc).
pub(crate) struct Reporter {
    queue: mpsc::UnboundedSender<Waiting>,
}

impl Reporter {
    /// Starts the publishing task; it ends when the reporter is dropped.
    pub fn start(broker: Arc<dyn Broker>, per_message: Histogram) -> Self {
        let (queue, mut waiting) = mpsc::unbounded_channel::<Waiting>();
        tokio::spawn(async move {
            while let Some(first) = waiting.recv().await {
                let mut batch = vec![first];
                while batch.len() < MAX_RESULTS {
                    match waiting.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let (envelopes, confirms): (Vec<_>, Vec<_>) =
                    batch.into_iter().map(|w| (w.envelope, w.confirmed)).unzip();
                per_message.observe(envelopes.len() as f64);
                let outcome = publish(broker.as_ref(), envelopes).await;
                for c in confirms {
                    // A caller that stopped waiting has nothing left to ack.
                    let _ = c.send(outcome.clone());
                }
            }
        });
        Self { queue }
    }

    /// Publishes a job's result; returns once the broker confirmed it (or failed to).
    pub async fn report(&self, envelope: ResultEnvelope) -> Result<(), String> {
        let (confirmed, heard) = oneshot::channel();
        self.queue
            .send(Waiting {
                envelope,
                confirmed,
            })
            .map_err(|_| "the result publisher has stopped".to_string())?;
        heard
            .await
            .map_err(|_| "the result publisher has stopped".to_string())?
    }
}

/// One message for the results: a `Finished` for one, a `FinishedBatch` for several.
async fn publish(broker: &dyn Broker, mut envelopes: Vec<ResultEnvelope>) -> Result<(), String> {
    let (message, id) = match envelopes.len() {
        1 => {
            let env = envelopes.pop().expect("one result");
            let id = format!("{}.a{}", env.job_id, env.attempt);
            (ResultMessage::Finished(env), id)
        }
        n => {
            let first = &envelopes[0];
            let id = format!("{}.a{}+{}", first.job_id, first.attempt, n - 1);
            debug!(results = n, "publishing results together");
            let batch = ResultBatch {
                v: WIRE_VERSION,
                results: envelopes,
            };
            (ResultMessage::FinishedBatch(batch), id)
        }
    };
    let body = serde_json::to_vec(&message).map_err(|e| e.to_string())?;
    broker
        .publish(QueueName::Results, &body, &id)
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use shared::ids::{JobId, RunId};
    use shared::ports::PortError;
    use std::sync::Mutex;
    use tokio::sync::Semaphore;

    /// Records each published message; a publish waits for a permit (the test is the broker's
    /// confirm) and fails while `refuse` is set.
    struct HeldBroker {
        published: Mutex<Vec<(Vec<u8>, String)>>,
        confirms: Semaphore,
        refuse: std::sync::atomic::AtomicBool,
    }

    impl Default for HeldBroker {
        fn default() -> Self {
            Self {
                published: Mutex::default(),
                confirms: Semaphore::new(0),
                refuse: Default::default(),
            }
        }
    }

    #[async_trait]
    impl Broker for HeldBroker {
        async fn publish(&self, _: QueueName, body: &[u8], id: &str) -> Result<(), PortError> {
            self.published
                .lock()
                .unwrap()
                .push((body.to_vec(), id.to_string()));
            self.confirms.acquire().await.expect("open").forget();
            if self.refuse.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(PortError::Connection("broker refused the message".into()));
            }
            Ok(())
        }
        async fn broadcast(&self, _: &[u8]) -> Result<(), PortError> {
            Ok(())
        }
        fn listen(&self) -> mpsc::Receiver<Vec<u8>> {
            mpsc::channel(1).1
        }
        fn subscribe(&self, _: QueueName, _: u16) -> mpsc::Receiver<crate::queue::Incoming> {
            mpsc::channel(1).1
        }
    }

    fn envelope(i: usize) -> ResultEnvelope {
        ResultEnvelope {
            v: WIRE_VERSION,
            job_id: JobId::new(format!("r1.n.{i}")),
            run_id: RunId::new("r1"),
            attempt: 1,
            result_ref: format!("blobs/{i}"),
            result: None,
        }
    }

    fn published(broker: &HeldBroker) -> Vec<ResultMessage> {
        let published = broker.published.lock().unwrap();
        published
            .iter()
            .map(|(body, _)| ResultMessage::decode(body).expect("a result message"))
            .collect()
    }

    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while !done() {
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn results_ready_while_a_publish_is_unconfirmed_go_out_together_and_wait_for_their_confirm(
    ) {
        let broker = Arc::new(HeldBroker::default());
        let per_message = Histogram::with_opts(prometheus::HistogramOpts::new("t", "t")).unwrap();
        let reporter = Arc::new(Reporter::start(broker.clone(), per_message.clone()));
        let report = |i| {
            let reporter = reporter.clone();
            tokio::spawn(async move { reporter.report(envelope(i)).await })
        };
        // Alone, a result goes out at once, as a `Finished` of its own.
        let first = report(0);
        until("the first publish", || {
            broker.published.lock().unwrap().len() == 1
        })
        .await;
        // Four more become ready while its confirm is awaited.
        let rest: Vec<_> = (1..5).map(report).collect();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(broker.published.lock().unwrap().len(), 1, "one at a time");
        assert!(!first.is_finished(), "no answer before the confirm");
        broker.confirms.add_permits(1);
        assert_eq!(first.await.unwrap(), Ok(()));
        until("the second publish", || {
            broker.published.lock().unwrap().len() == 2
        })
        .await;
        assert!(rest.iter().all(|r| !r.is_finished()), "not yet confirmed");
        broker.confirms.add_permits(1);
        for r in rest {
            assert_eq!(r.await.unwrap(), Ok(()));
        }
        match published(&broker).as_slice() {
            [ResultMessage::Finished(one), ResultMessage::FinishedBatch(batch)] => {
                assert_eq!(one.job_id.as_str(), "r1.n.0");
                let jobs: Vec<&str> = batch.results.iter().map(|e| e.job_id.as_str()).collect();
                assert_eq!(jobs, ["r1.n.1", "r1.n.2", "r1.n.3", "r1.n.4"]);
                assert_eq!(batch.v, WIRE_VERSION);
            }
            other => panic!("one result, then the four together: {other:?}"),
        }
        let ids: Vec<String> = (broker.published.lock().unwrap().iter())
            .map(|(_, id)| id.clone())
            .collect();
        assert_eq!(ids, ["r1.n.0.a1", "r1.n.1.a1+3"]);
        assert_eq!(per_message.get_sample_count(), 2);
        assert_eq!(per_message.get_sample_sum(), 5.0);
    }

    #[tokio::test]
    async fn a_refused_publish_fails_every_result_in_it_and_the_next_ones_go_out() {
        let broker = Arc::new(HeldBroker::default());
        let per_message = Histogram::with_opts(prometheus::HistogramOpts::new("t", "t")).unwrap();
        let reporter = Arc::new(Reporter::start(broker.clone(), per_message));
        broker
            .refuse
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let first = {
            let reporter = reporter.clone();
            tokio::spawn(async move { reporter.report(envelope(0)).await })
        };
        until("the first publish", || {
            broker.published.lock().unwrap().len() == 1
        })
        .await;
        let held: Vec<_> = (1..4)
            .map(|i| {
                let reporter = reporter.clone();
                tokio::spawn(async move { reporter.report(envelope(i)).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        broker.confirms.add_permits(2);
        let refused = Err("connection: broker refused the message".to_string());
        assert_eq!(first.await.unwrap(), refused);
        for r in held {
            assert_eq!(r.await.unwrap(), refused, "the batch failed as a whole");
        }
        broker
            .refuse
            .store(false, std::sync::atomic::Ordering::SeqCst);
        broker.confirms.add_permits(1);
        assert_eq!(reporter.report(envelope(9)).await, Ok(()));
        assert_eq!(published(&broker).len(), 3);
    }
}
