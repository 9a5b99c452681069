//! The in-process broker of the embedded mode: unbounded channels, settled in memory.

use crate::queue::{Acker, Broker, Incoming, QueueName};
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
            QueueName::Jobs => self.channel(QueueName::DeadJobs).0,
            // Other queues have no dead-letter queue: a rejected message is dropped.
            _ => mpsc::unbounded_channel().0,
        };
        tx.send(Incoming {
            body: body.to_vec(),
            delivery_count: 0,
            acker: Acker::Memory {
                requeue: tx.clone(),
                dead,
            },
        })
        .map_err(|_| PortError::Connection("queue closed".into()))
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
        let (_, rx) = self.channel(queue);
        let (out_tx, out_rx) = mpsc::channel(prefetch.max(1) as usize);
        tokio::spawn(async move {
            loop {
                let next = rx.lock().await.recv().await;
                match next {
                    Some(msg) => {
                        if out_tx.send(msg).await.is_err() {
                            return;
                        }
                    }
                    None => return,
                }
            }
        });
        out_rx
    }
}
