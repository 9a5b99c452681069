//! The queue port: publish with confirmation, subscribe with manual acks. One real adapter
//! (`rabbitmq`) and one in-process adapter (`memory`) for the embedded mode.

use async_trait::async_trait;
use shared::ports::PortError;
use tokio::sync::mpsc;

/// The three queues of a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueName {
    Jobs,
    Results,
    /// Jobs dead-lettered after too many deliveries or rejected as poison.
    DeadJobs,
}

impl QueueName {
    pub fn qualified(self, namespace: &str) -> String {
        match self {
            QueueName::Jobs => format!("{namespace}.jobs"),
            QueueName::Results => format!("{namespace}.results"),
            QueueName::DeadJobs => format!("{namespace}.jobs.dead"),
        }
    }
}

/// How a delivery is settled.
pub enum Acker {
    Amqp(lapin::acker::Acker),
    Memory {
        requeue: mpsc::UnboundedSender<Incoming>,
        dead: mpsc::UnboundedSender<Incoming>,
    },
}

/// One delivered message. Settle it exactly once: `ack` after its effects are stored, `requeue`
/// on a transient failure, `reject` for poison (dead-lettered).
pub struct Incoming {
    pub body: Vec<u8>,
    /// How many times the broker delivered it before (0 on first delivery).
    pub delivery_count: u32,
    pub acker: Acker,
}

impl Incoming {
    pub async fn ack(self) -> Result<(), PortError> {
        match self.acker {
            Acker::Amqp(a) => a
                .ack(lapin::options::BasicAckOptions::default())
                .await
                .map_err(|e| PortError::Connection(e.to_string())),
            Acker::Memory { .. } => Ok(()),
        }
    }

    pub async fn requeue(self) -> Result<(), PortError> {
        match self.acker {
            Acker::Amqp(a) => a
                .nack(lapin::options::BasicNackOptions {
                    multiple: false,
                    requeue: true,
                })
                .await
                .map_err(|e| PortError::Connection(e.to_string())),
            Acker::Memory { requeue, dead } => {
                let again = Incoming {
                    body: self.body,
                    delivery_count: self.delivery_count + 1,
                    acker: Acker::Memory {
                        requeue: requeue.clone(),
                        dead,
                    },
                };
                requeue
                    .send(again)
                    .map_err(|_| PortError::Connection("queue closed".into()))
            }
        }
    }

    pub async fn reject(self) -> Result<(), PortError> {
        match self.acker {
            Acker::Amqp(a) => a
                .reject(lapin::options::BasicRejectOptions { requeue: false })
                .await
                .map_err(|e| PortError::Connection(e.to_string())),
            Acker::Memory { requeue, dead } => {
                let gone = Incoming {
                    body: self.body,
                    delivery_count: self.delivery_count,
                    acker: Acker::Memory {
                        requeue,
                        dead: dead.clone(),
                    },
                };
                dead.send(gone)
                    .map_err(|_| PortError::Connection("queue closed".into()))
            }
        }
    }
}

#[async_trait]
pub trait Broker: Send + Sync {
    /// Publishes a persistent message and returns once the broker confirmed it.
    async fn publish(
        &self,
        queue: QueueName,
        body: &[u8],
        message_id: &str,
    ) -> Result<(), PortError>;
    /// Publishes several messages, then waits for every confirm (pipelined).
    async fn publish_many(
        &self,
        queue: QueueName,
        messages: &[(Vec<u8>, String)],
    ) -> Result<(), PortError> {
        for (body, id) in messages {
            self.publish(queue, body, id).await?;
        }
        Ok(())
    }

    /// Sends a control message to every worker listening now (not persisted: best effort).
    async fn broadcast(&self, body: &[u8]) -> Result<(), PortError>;

    /// Receives control messages; survives reconnects.
    fn listen(&self) -> mpsc::Receiver<Vec<u8>>;

    /// Consumes `queue` with at most `prefetch` unacknowledged messages; survives reconnects.
    fn subscribe(&self, queue: QueueName, prefetch: u16) -> mpsc::Receiver<Incoming>;
}
