//! RabbitMQ adapter. Durable quorum queues with a delivery limit and a dead-letter queue,
//! persistent messages, publisher confirms, manual acks. It owns its reconnect-and-redeclare loop
//! rather than relying on lapin's (seen never to recover after a broker restart).

use crate::queue::{Acker, Broker, Incoming, QueueName};
use async_trait::async_trait;
use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use shared::ports::PortError;
use std::time::Duration;
use tokio::sync::{mpsc, Mutex};
use tracing::{info, warn};

/// Deliveries of one job before RabbitMQ dead-letters it (a worker killed mid-job counts).
pub const DELIVERY_LIMIT: i64 = 5;

pub struct RabbitBroker {
    uri: String,
    namespace: String,
    publish: Mutex<Option<(Connection, Channel)>>,
}

fn conn_err(e: impl std::fmt::Display) -> PortError {
    PortError::Connection(e.to_string())
}

async fn connect(uri: &str) -> Result<Connection, PortError> {
    Connection::connect(uri, ConnectionProperties::default())
        .await
        .map_err(conn_err)
}

/// Declares the namespace's queues (idempotent; run after every reconnect).
async fn declare(channel: &Channel, ns: &str) -> Result<(), PortError> {
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let mut dead_args = FieldTable::default();
    dead_args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    channel
        .queue_declare(&QueueName::DeadJobs.qualified(ns), durable, dead_args)
        .await
        .map_err(conn_err)?;

    let mut jobs_args = FieldTable::default();
    jobs_args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    jobs_args.insert(
        "x-delivery-limit".into(),
        AMQPValue::LongLongInt(DELIVERY_LIMIT),
    );
    jobs_args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    jobs_args.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(QueueName::DeadJobs.qualified(ns).into()),
    );
    channel
        .queue_declare(&QueueName::Jobs.qualified(ns), durable, jobs_args)
        .await
        .map_err(conn_err)?;

    let mut results_args = FieldTable::default();
    results_args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    channel
        .queue_declare(&QueueName::Results.qualified(ns), durable, results_args)
        .await
        .map_err(conn_err)?;
    Ok(())
}

impl RabbitBroker {
    /// Connects once to fail fast on a bad address; later failures reconnect on their own.
    pub async fn connect(uri: &str, namespace: &str) -> Result<Self, PortError> {
        let broker = Self {
            uri: uri.to_string(),
            namespace: namespace.to_string(),
            publish: Mutex::new(None),
        };
        broker.publish_channel().await?;
        Ok(broker)
    }

    async fn publish_channel(&self) -> Result<Channel, PortError> {
        let mut slot = self.publish.lock().await;
        if let Some((conn, ch)) = slot.as_ref() {
            if conn.status().connected() && ch.status().connected() {
                return Ok(ch.clone());
            }
        }
        let conn = connect(&self.uri).await?;
        let ch = conn.create_channel().await.map_err(conn_err)?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(conn_err)?;
        declare(&ch, &self.namespace).await?;
        *slot = Some((conn, ch.clone()));
        Ok(ch)
    }

    async fn drop_publish_channel(&self) {
        *self.publish.lock().await = None;
    }
}

#[async_trait]
impl Broker for RabbitBroker {
    async fn publish(&self, queue: QueueName, body: &[u8], id: &str) -> Result<(), PortError> {
        let ch = self.publish_channel().await?;
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type(ShortString::from("application/json"))
            .with_message_id(ShortString::from(id));
        let routing = queue.qualified(&self.namespace);
        let outcome = async {
            let confirm = ch
                .basic_publish("", &routing, BasicPublishOptions::default(), body, props)
                .await
                .map_err(conn_err)?
                .await
                .map_err(conn_err)?;
            if confirm.is_nack() {
                return Err(PortError::Connection("broker refused the message".into()));
            }
            Ok(())
        }
        .await;
        if outcome.is_err() {
            self.drop_publish_channel().await;
        }
        outcome
    }

    async fn publish_many(
        &self,
        queue: QueueName,
        messages: &[(Vec<u8>, String)],
    ) -> Result<(), PortError> {
        let ch = self.publish_channel().await?;
        let routing = queue.qualified(&self.namespace);
        let outcome = async {
            let mut confirms = Vec::with_capacity(messages.len());
            for (body, id) in messages {
                let props = BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_content_type(ShortString::from("application/json"))
                    .with_message_id(ShortString::from(id.as_str()));
                confirms.push(
                    ch.basic_publish("", &routing, BasicPublishOptions::default(), body, props)
                        .await
                        .map_err(conn_err)?,
                );
            }
            for c in confirms {
                if c.await.map_err(conn_err)?.is_nack() {
                    return Err(PortError::Connection("broker refused a message".into()));
                }
            }
            Ok(())
        }
        .await;
        if outcome.is_err() {
            self.drop_publish_channel().await;
        }
        outcome
    }

    async fn broadcast(&self, body: &[u8]) -> Result<(), PortError> {
        let ch = self.publish_channel().await?;
        let exchange = control_exchange(&self.namespace);
        declare_control(&ch, &exchange).await?;
        let outcome = async {
            ch.basic_publish(
                &exchange,
                "",
                BasicPublishOptions::default(),
                body,
                BasicProperties::default(),
            )
            .await
            .map_err(conn_err)?
            .await
            .map_err(conn_err)?;
            Ok(())
        }
        .await;
        if outcome.is_err() {
            self.drop_publish_channel().await;
        }
        outcome
    }

    fn listen(&self) -> mpsc::Receiver<Vec<u8>> {
        let (tx, rx) = mpsc::channel(256);
        let uri = self.uri.clone();
        let exchange = control_exchange(&self.namespace);
        tokio::spawn(async move {
            loop {
                match listen_once(&uri, &exchange, &tx).await {
                    Ok(()) => return,
                    Err(e) => {
                        warn!(error = %e, "control listener lost its connection, reconnecting");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
        rx
    }

    fn subscribe(&self, queue: QueueName, prefetch: u16) -> mpsc::Receiver<Incoming> {
        let (tx, rx) = mpsc::channel(prefetch.max(1) as usize);
        let uri = self.uri.clone();
        let ns = self.namespace.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(200);
            loop {
                match consume_once(&uri, &ns, queue, prefetch, &tx).await {
                    Ok(()) => return, // the receiver is gone: shut down
                    Err(e) => {
                        warn!(queue = ?queue, error = %e, backoff_ms = backoff.as_millis() as u64, "consumer lost its connection, reconnecting");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        });
        rx
    }
}

fn control_exchange(ns: &str) -> String {
    format!("{ns}.control")
}

async fn declare_control(ch: &Channel, exchange: &str) -> Result<(), PortError> {
    ch.exchange_declare(
        exchange,
        lapin::ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .map_err(conn_err)
}

/// One connection's life of the control listener: an exclusive queue bound to the fan-out
/// exchange, consumed without acks (control messages are best effort).
async fn listen_once(
    uri: &str,
    exchange: &str,
    tx: &mpsc::Sender<Vec<u8>>,
) -> Result<(), PortError> {
    let conn = connect(uri).await?;
    let ch = conn.create_channel().await.map_err(conn_err)?;
    declare_control(&ch, exchange).await?;
    let q = ch
        .queue_declare(
            "",
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(conn_err)?;
    ch.queue_bind(
        q.name().as_str(),
        exchange,
        "",
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .map_err(conn_err)?;
    let mut consumer = ch
        .basic_consume(
            q.name().as_str(),
            "",
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(conn_err)?;
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery.map_err(conn_err)?;
        if tx.send(delivery.data).await.is_err() {
            let _ = conn.close(200, "shutting down").await;
            return Ok(());
        }
    }
    Err(PortError::Connection("control stream ended".into()))
}

/// One connection's life: consume until the connection breaks (Err) or the receiver is gone (Ok).
async fn consume_once(
    uri: &str,
    ns: &str,
    queue: QueueName,
    prefetch: u16,
    tx: &mpsc::Sender<Incoming>,
) -> Result<(), PortError> {
    let conn = connect(uri).await?;
    let ch = conn.create_channel().await.map_err(conn_err)?;
    declare(&ch, ns).await?;
    ch.basic_qos(prefetch.max(1), BasicQosOptions::default())
        .await
        .map_err(conn_err)?;
    let mut consumer = ch
        .basic_consume(
            &queue.qualified(ns),
            "",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(conn_err)?;
    info!(queue = %queue.qualified(ns), prefetch, "consuming");
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery.map_err(conn_err)?;
        let delivery_count = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-delivery-count").cloned())
            .and_then(|v| match v {
                AMQPValue::LongLongInt(n) => Some(n as u32),
                AMQPValue::LongInt(n) => Some(n as u32),
                AMQPValue::ShortInt(n) => Some(n as u32),
                _ => None,
            })
            .unwrap_or(if delivery.redelivered { 1 } else { 0 });
        let incoming = Incoming {
            body: delivery.data,
            delivery_count,
            acker: Acker::Amqp(delivery.acker),
        };
        if tx.send(incoming).await.is_err() {
            let _ = conn.close(200, "shutting down").await;
            return Ok(());
        }
    }
    Err(PortError::Connection("consumer stream ended".into()))
}
