//! RabbitMQ adapter. Durable quorum queues with a delivery limit and a dead-letter queue,
//! persistent messages, publisher confirms, manual acks. It owns its reconnect-and-redeclare loop
//! rather than relying on lapin's (seen never to recover after a broker restart).

use crate::queue::{Acker, Broker, Incoming, QueueName, DELIVERY_LIMIT};
use async_trait::async_trait;
use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use shared::ports::PortError;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Mutex};
use tracing::{info, warn};

/// Longest wait for the broker's confirms of one publish.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// First pause before a reconnect; it doubles per failed attempt up to [`RECONNECT_CAP`].
const RECONNECT_BASE: Duration = Duration::from_millis(200);
/// Longest pause between two reconnect attempts.
const RECONNECT_CAP: Duration = Duration::from_secs(10);
/// An outage that lasts this long is worth one warning (reconnects before that are expected:
/// a broker restart, a network blip) and are logged at INFO.
const LONG_OUTAGE: Duration = Duration::from_secs(30);

/// The pause before reconnect attempt `attempt` (0 for the first): exponential from
/// [`RECONNECT_BASE`], capped at [`RECONNECT_CAP`], with "equal jitter": half of it fixed, the
/// other half scaled by `jitter` (in 0..=1), so workers that lost the broker together do not
/// all come back in the same instant.
fn reconnect_delay(attempt: u32, jitter: f64) -> Duration {
    let exp = RECONNECT_BASE
        .saturating_mul(1u32 << attempt.min(16))
        .min(RECONNECT_CAP);
    let half = exp / 2;
    half + half.mul_f64(jitter.clamp(0.0, 1.0))
}

/// A number in 0..1 that differs between processes and calls (no `rand` crate needed).
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The reconnect state of one connection loop: INFO per attempt (a reconnect is expected),
/// backoff with jitter, and one WARN per outage once it has lasted [`LONG_OUTAGE`].
#[derive(Default)]
struct Outage {
    attempt: u32,
    since: Option<Instant>,
    warned: bool,
}

impl Outage {
    /// A connection attempt failed or a live connection broke: logs and returns the pause.
    fn failed(&mut self, what: &str, error: &PortError) -> Duration {
        let since = *self.since.get_or_insert_with(Instant::now);
        let delay = reconnect_delay(self.attempt, jitter());
        self.attempt = self.attempt.saturating_add(1);
        let down = since.elapsed();
        info!(
            error = %error,
            attempt = self.attempt,
            backoff_ms = delay.as_millis() as u64,
            down_s = down.as_secs(),
            "{what} lost its connection, reconnecting"
        );
        if down >= LONG_OUTAGE && !self.warned {
            self.warned = true;
            let secs = down.as_secs();
            warn!(
                error = %error,
                down_s = secs,
                "{what} has been without RabbitMQ for {secs}s, still reconnecting"
            );
        }
        delay
    }

    /// The connection is up again: the next outage starts from the first pause.
    fn connected(&mut self, what: &str) {
        if let Some(since) = self.since.take() {
            info!(
                attempts = self.attempt,
                down_ms = since.elapsed().as_millis() as u64,
                "{what} reconnected"
            );
        }
        self.attempt = 0;
        self.warned = false;
    }
}

/// Settles a delivery on the channel it came from (RabbitMQ holds the message itself).
struct AmqpAcker(lapin::acker::Acker);

#[async_trait]
impl Acker for AmqpAcker {
    async fn ack(self: Box<Self>) -> Result<(), PortError> {
        self.0
            .ack(lapin::options::BasicAckOptions::default())
            .await
            .map_err(conn_err)
    }

    async fn requeue(self: Box<Self>, _body: Vec<u8>, _count: u32) -> Result<(), PortError> {
        self.0
            .nack(lapin::options::BasicNackOptions {
                multiple: false,
                requeue: true,
            })
            .await
            .map_err(conn_err)
    }

    async fn reject(self: Box<Self>, _body: Vec<u8>, _count: u32) -> Result<(), PortError> {
        self.0
            .reject(lapin::options::BasicRejectOptions { requeue: false })
            .await
            .map_err(conn_err)
    }
}

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
        AMQPValue::LongLongInt(i64::from(DELIVERY_LIMIT)),
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
        let publish = async {
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
        };
        // A broker that takes the messages but never confirms (blocked by a resource alarm)
        // is an error the caller retries, not a hang that outlives its leases.
        let outcome = match tokio::time::timeout(CONFIRM_TIMEOUT, publish).await {
            Ok(r) => r,
            Err(_) => Err(PortError::Connection(format!(
                "the broker did not confirm {} message(s) within {CONFIRM_TIMEOUT:?}",
                messages.len()
            ))),
        };
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
            let mut outage = Outage::default();
            loop {
                match listen_once(&uri, &exchange, &tx, &mut outage).await {
                    Ok(()) => return,
                    Err(e) => {
                        let delay = outage.failed("control listener", &e);
                        tokio::time::sleep(delay).await;
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
            let mut outage = Outage::default();
            let what = format!("consumer of {}", queue.qualified(&ns));
            loop {
                match consume_once(&uri, &ns, queue, prefetch, &tx, &mut outage).await {
                    Ok(()) => return, // the receiver is gone: shut down
                    Err(e) => {
                        let delay = outage.failed(&what, &e);
                        tokio::time::sleep(delay).await;
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
    outage: &mut Outage,
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
    outage.connected("control listener");
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
    outage: &mut Outage,
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
    outage.connected(&format!("consumer of {}", queue.qualified(ns)));
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
            acker: Box::new(AmqpAcker(delivery.acker)),
        };
        if tx.send(incoming).await.is_err() {
            let _ = conn.close(200, "shutting down").await;
            return Ok(());
        }
    }
    Err(PortError::Connection("consumer stream ended".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_pauses_grow_exponentially_up_to_the_cap() {
        // Without jitter: half the exponential pause.
        assert_eq!(reconnect_delay(0, 0.0), Duration::from_millis(100));
        assert_eq!(reconnect_delay(1, 0.0), Duration::from_millis(200));
        assert_eq!(reconnect_delay(2, 0.0), Duration::from_millis(400));
        // With full jitter: the whole pause.
        assert_eq!(reconnect_delay(0, 1.0), Duration::from_millis(200));
        assert_eq!(reconnect_delay(3, 1.0), Duration::from_millis(1600));
        // Capped, however long the outage.
        for attempt in [6, 7, 20, 64, u32::MAX] {
            let d = reconnect_delay(attempt, 1.0);
            assert_eq!(d, RECONNECT_CAP, "attempt {attempt}");
            assert!(reconnect_delay(attempt, 0.0) >= RECONNECT_CAP / 2);
        }
        // Out-of-range jitter is clamped.
        assert_eq!(reconnect_delay(0, 7.0), Duration::from_millis(200));
        assert_eq!(reconnect_delay(0, -1.0), Duration::from_millis(100));
    }

    #[test]
    fn jitter_is_in_range_and_varies() {
        let xs: Vec<f64> = (0..64).map(|_| jitter()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)), "{xs:?}");
        assert!(xs.windows(2).any(|w| w[0] != w[1]), "{xs:?}");
    }

    #[test]
    fn an_outage_backs_off_and_a_reconnect_starts_over() {
        let mut o = Outage::default();
        let err = PortError::Connection("refused".into());
        let first = o.failed("test", &err);
        assert!(first <= Duration::from_millis(200));
        for _ in 0..10 {
            o.failed("test", &err);
        }
        let late = o.failed("test", &err);
        assert!(
            late >= RECONNECT_CAP / 2 && late <= RECONNECT_CAP,
            "{late:?}"
        );
        assert!(o.since.is_some());
        o.connected("test");
        assert_eq!(o.attempt, 0);
        assert!(o.since.is_none());
        assert!(o.failed("test", &err) <= Duration::from_millis(200));
    }
}
