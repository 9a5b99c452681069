//! The in-process broker of the embedded mode: unbounded channels, settled in memory. It keeps
//! the queue port's contract (see `queue::conformance`): a requeue comes back with its
//! delivery count raised, a rejected job goes to the dead jobs, and so does a job requeued past
//! the delivery limit, as RabbitMQ's quorum queue does. It has no image queues (one process
//! holds every image it runs): every job goes through the jobs queue.

use crate::queue::{Acker, Broker, Incoming, QueueName, DELIVERY_LIMIT};
use async_trait::async_trait;
use shared::ports::PortError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

type Channel = (
    mpsc::UnboundedSender<Incoming>,
    Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Incoming>>>,
);

pub struct MemoryBroker {
    queues: Mutex<HashMap<QueueName, Channel>>,
    control: tokio::sync::broadcast::Sender<Vec<u8>>,
}

impl Default for MemoryBroker {
    fn default() -> Self {
        Self {
            queues: Mutex::new(HashMap::new()),
            control: tokio::sync::broadcast::channel(256).0,
        }
    }
}

/// Where a delivery goes when it is settled other than by an ack.
#[derive(Clone)]
struct MemoryAcker {
    queue: mpsc::UnboundedSender<Incoming>,
    /// The dead-letter queue (only the jobs queue has one: elsewhere a rejected message is
    /// dropped) with the number of deliveries after which a requeue dead-letters.
    dead: Option<(mpsc::UnboundedSender<Incoming>, u32)>,
}

fn closed() -> PortError {
    PortError::Connection("queue closed".into())
}

impl MemoryAcker {
    fn send_dead(&self, body: Vec<u8>, delivery_count: u32) -> Result<(), PortError> {
        let Some((dead, _)) = &self.dead else {
            return Ok(());
        };
        let settle = MemoryAcker {
            queue: dead.clone(),
            dead: None,
        };
        dead.send(Incoming {
            body,
            delivery_count,
            acker: Box::new(settle),
        })
        .map_err(|_| closed())
    }
}

#[async_trait]
impl Acker for MemoryAcker {
    async fn ack(self: Box<Self>) -> Result<(), PortError> {
        Ok(())
    }

    async fn requeue(self: Box<Self>, body: Vec<u8>, delivery_count: u32) -> Result<(), PortError> {
        let count = delivery_count.saturating_add(1);
        if let Some((_, limit)) = &self.dead {
            if count > *limit {
                return self.send_dead(body, count);
            }
        }
        let queue = self.queue.clone();
        queue
            .send(Incoming {
                body,
                delivery_count: count,
                acker: self,
            })
            .map_err(|_| closed())
    }

    async fn reject(self: Box<Self>, body: Vec<u8>, delivery_count: u32) -> Result<(), PortError> {
        self.send_dead(body, delivery_count)
    }
}

impl MemoryBroker {
    fn channel(&self, q: QueueName) -> Channel {
        let mut queues = self.queues.lock().expect("queue map lock");
        queues
            .entry(q)
            .or_insert_with(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                (tx, Arc::new(tokio::sync::Mutex::new(rx)))
            })
            .clone()
    }
}

#[async_trait]
impl Broker for MemoryBroker {
    async fn publish(&self, queue: QueueName, body: &[u8], _id: &str) -> Result<(), PortError> {
        let (tx, _) = self.channel(queue);
        let dead = match queue {
            QueueName::Jobs => Some((self.channel(QueueName::DeadJobs).0, DELIVERY_LIMIT)),
            QueueName::Results | QueueName::DeadJobs => None,
        };
        tx.send(Incoming {
            body: body.to_vec(),
            delivery_count: 0,
            acker: Box::new(MemoryAcker {
                queue: tx.clone(),
                dead,
            }),
        })
        .map_err(|_| closed())
    }

    async fn broadcast(&self, body: &[u8]) -> Result<(), PortError> {
        // No listener is not an error: nothing runs that could stop.
        let _ = self.control.send(body.to_vec());
        Ok(())
    }

    fn listen(&self) -> mpsc::Receiver<Vec<u8>> {
        let mut rx = self.control.subscribe();
        let (tx, out) = mpsc::channel(256);
        tokio::spawn(async move {
            while let Ok(m) = rx.recv().await {
                if tx.send(m).await.is_err() {
                    return;
                }
            }
        });
        out
    }

    fn subscribe(&self, queue: QueueName, prefetch: u16) -> mpsc::Receiver<Incoming> {
        let (back, rx) = self.channel(queue);
        let (out_tx, out_rx) = mpsc::channel(prefetch.max(1) as usize);
        tokio::spawn(async move {
            loop {
                // Stop taking messages as soon as the consumer is gone (recv is cancel-safe).
                let next = tokio::select! {
                    biased;
                    _ = out_tx.closed() => return,
                    m = async { rx.lock().await.recv().await } => m,
                };
                let Some(msg) = next else { return };
                if let Err(mpsc::error::SendError(msg)) = out_tx.send(msg).await {
                    // The consumer went away while this one was on its way: back to the queue,
                    // as a broker does with the unacked messages of a closed channel.
                    let _ = back.send(msg);
                    return;
                }
            }
        });
        out_rx
    }
}

#[cfg(test)]
mod tests {
    //! The queue contract (`queue::conformance`) on the memory broker; the same suite runs on
    //! RabbitMQ in tests/conformance.rs.
    use super::MemoryBroker;
    use crate::queue::conformance as c;

    #[tokio::test]
    async fn publish_then_subscribe_delivers_once_with_count_zero() {
        c::publish_then_subscribe_delivers_once_with_count_zero(&MemoryBroker::default()).await;
    }
    #[tokio::test]
    async fn requeue_redelivers_with_a_raised_count() {
        c::requeue_redelivers_with_a_raised_count(&MemoryBroker::default()).await;
    }
    #[tokio::test]
    async fn reject_dead_letters_a_job() {
        c::reject_dead_letters_a_job(&MemoryBroker::default()).await;
    }
    #[tokio::test]
    async fn a_job_requeued_past_the_delivery_limit_is_dead_lettered() {
        c::a_job_requeued_past_the_delivery_limit_is_dead_lettered(&MemoryBroker::default()).await;
    }
    #[tokio::test]
    async fn publish_many_delivers_all_in_order() {
        c::publish_many_delivers_all_in_order(&MemoryBroker::default()).await;
    }
    #[tokio::test]
    async fn queues_are_separate() {
        c::queues_are_separate(&MemoryBroker::default()).await;
    }
    #[tokio::test]
    async fn a_consumer_that_goes_away_loses_no_message() {
        c::a_consumer_that_goes_away_loses_no_message(&MemoryBroker::default()).await;
    }
    #[tokio::test]
    async fn jobs_of_a_held_image_go_to_its_holders() {
        c::jobs_of_a_held_image_go_to_its_holders(&MemoryBroker::default()).await;
    }
    #[tokio::test]
    async fn a_job_its_holders_leave_goes_on_to_the_jobs_queue() {
        c::a_job_its_holders_leave_goes_on_to_the_jobs_queue(&MemoryBroker::default()).await;
    }
    #[tokio::test]
    async fn broadcast_reaches_every_listener() {
        c::broadcast_reaches_every_listener(&MemoryBroker::default()).await;
    }
}
