//! RabbitMQ adapter. Durable quorum queues with a delivery limit and a dead-letter queue,
//! persistent messages, publisher confirms, manual acks. It owns its reconnect-and-redeclare loop
//! rather than relying on lapin's (seen never to recover after a broker restart).

use crate::queue::{Acker, Broker, ImageKey, Incoming, JobMessage, QueueName, DELIVERY_LIMIT};
use async_trait::async_trait;
use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use shared::ports::PortError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Mutex};
use tracing::info;

mod images;
mod reconnect;

use reconnect::Outage;

/// Longest wait for the broker's confirms of one publish.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for a connection (TCP and the AMQP handshake): a broker that accepts but does
/// not answer (paused, or behind a dropped link) is an error to retry, not a loop that hangs.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// How long a job waits in its image's queue for a holder; none: this process subscribes
    /// to no image queue (its jobs of an image still go to the image's holders).
    affinity_wait: Option<Duration>,
    /// Whether the broker answered: kept by the publishes and every consumer's loop.
    up: Arc<AtomicBool>,
}

fn conn_err(e: impl std::fmt::Display) -> PortError {
    PortError::Connection(e.to_string())
}

async fn connect(uri: &str) -> Result<Connection, PortError> {
    match tokio::time::timeout(
        CONNECT_TIMEOUT,
        Connection::connect(uri, ConnectionProperties::default()),
    )
    .await
    {
        Ok(conn) => conn.map_err(conn_err),
        Err(_) => Err(PortError::Connection(format!(
            "the broker did not answer a connect within {CONNECT_TIMEOUT:?}"
        ))),
    }
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
    images::declare_routing(channel, ns).await
}

impl RabbitBroker {
    /// Connects once to fail fast on a bad address; later failures reconnect on their own.
    pub async fn connect(uri: &str, namespace: &str) -> Result<Self, PortError> {
        let broker = Self {
            uri: uri.to_string(),
            namespace: namespace.to_string(),
            publish: Mutex::new(None),
            affinity_wait: None,
            up: Arc::new(AtomicBool::new(true)),
        };
        broker.publish_channel().await?;
        Ok(broker)
    }

    /// Sets how long a job of a held image waits for a holder (`None`, the default, or zero:
    /// subscribe to no image queue; jobs of an image still go to holders other processes are).
    pub fn with_affinity_wait(mut self, wait: Option<Duration>) -> Self {
        self.affinity_wait = wait.filter(|w| !w.is_zero());
        self
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
        self.up.store(false, Ordering::Relaxed);
        *self.publish.lock().await = None;
    }

    /// A publish went through: the broker answers.
    fn answered(&self) {
        self.up.store(true, Ordering::Relaxed);
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
        match outcome {
            Ok(()) => self.answered(),
            Err(_) => self.drop_publish_channel().await,
        }
        outcome
    }

    async fn publish_many(
        &self,
        queue: QueueName,
        messages: &[(Vec<u8>, String)],
    ) -> Result<(), PortError> {
        let routing = queue.qualified(&self.namespace);
        let routed: Vec<Routed<'_>> = (messages.iter())
            .map(|(body, id)| ("", routing.as_str(), body.as_slice(), id.as_str()))
            .collect();
        self.publish_routed(&routed).await
    }

    async fn publish_jobs(&self, jobs: &[JobMessage]) -> Result<(), PortError> {
        let (exchange, queue) = (
            images::images_exchange(&self.namespace),
            QueueName::Jobs.qualified(&self.namespace),
        );
        let routed: Vec<Routed<'_>> = (jobs.iter())
            .map(|j| match &j.image {
                Some(key) => (exchange.as_str(), key.as_str(), &j.body[..], &j.id[..]),
                None => ("", queue.as_str(), &j.body[..], &j.id[..]),
            })
            .collect();
        self.publish_routed(&routed).await
    }

    fn subscribe_image(&self, image: &ImageKey, prefetch: u16) -> Option<mpsc::Receiver<Incoming>> {
        let wait = self.affinity_wait?;
        Some(self.consume(Consumed::Image(image.clone(), wait), prefetch))
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
        match outcome {
            Ok(()) => self.answered(),
            Err(_) => self.drop_publish_channel().await,
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
        self.consume(Consumed::Queue(queue), prefetch)
    }

    fn dependency(&self) -> Option<(&'static str, bool)> {
        Some(("rabbitmq", self.up.load(Ordering::Relaxed)))
    }
}

/// A message to publish: exchange, routing key, body, message id.
type Routed<'a> = (&'a str, &'a str, &'a [u8], &'a str);

/// What a consumer reads: one of the namespace's queues, or an image's queue (declared and
/// bound with its wait on every connect).
#[derive(Clone)]
enum Consumed {
    Queue(QueueName),
    Image(ImageKey, Duration),
}

impl Consumed {
    fn name(&self, ns: &str) -> String {
        match self {
            Consumed::Queue(q) => q.qualified(ns),
            Consumed::Image(key, _) => key.queue(ns),
        }
    }
}

impl RabbitBroker {
    /// Publishes every message and waits for every confirm (pipelined), within
    /// [`CONFIRM_TIMEOUT`].
    async fn publish_routed(&self, messages: &[Routed<'_>]) -> Result<(), PortError> {
        let ch = self.publish_channel().await?;
        let publish = async {
            let mut confirms = Vec::with_capacity(messages.len());
            for (exchange, routing, body, id) in messages {
                let props = BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_content_type(ShortString::from("application/json"))
                    .with_message_id(ShortString::from(*id));
                confirms.push(
                    ch.basic_publish(
                        exchange,
                        routing,
                        BasicPublishOptions::default(),
                        body,
                        props,
                    )
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
        match outcome {
            Ok(()) => self.answered(),
            Err(_) => self.drop_publish_channel().await,
        }
        outcome
    }

    /// Consumes `what` with its own reconnect loop until the receiver is dropped.
    fn consume(&self, what: Consumed, prefetch: u16) -> mpsc::Receiver<Incoming> {
        let (tx, rx) = mpsc::channel(prefetch.max(1) as usize);
        let uri = self.uri.clone();
        let ns = self.namespace.clone();
        let up = self.up.clone();
        tokio::spawn(async move {
            let mut outage = Outage::watching(up);
            let name = format!("consumer of {}", what.name(&ns));
            loop {
                match consume_once(&uri, &ns, &what, prefetch, &tx, &mut outage).await {
                    Ok(()) => return, // the receiver is gone: shut down
                    Err(e) => {
                        let delay = outage.failed(&name, &e);
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
    what: &Consumed,
    prefetch: u16,
    tx: &mpsc::Sender<Incoming>,
    outage: &mut Outage,
) -> Result<(), PortError> {
    let conn = connect(uri).await?;
    let ch = conn.create_channel().await.map_err(conn_err)?;
    declare(&ch, ns).await?;
    if let Consumed::Image(key, wait) = what {
        images::declare_image_queue(&ch, ns, key, *wait).await?;
    }
    let queue = what.name(ns);
    ch.basic_qos(prefetch.max(1), BasicQosOptions::default())
        .await
        .map_err(conn_err)?;
    let mut consumer = ch
        .basic_consume(
            &queue,
            "",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(conn_err)?;
    outage.connected(&format!("consumer of {queue}"));
    info!(%queue, prefetch, "consuming");
    loop {
        // An image queue's receiver dropped while nothing is delivered (every prefetched
        // message in hand) ends its consumer too: the unsettled messages go back, to go on to
        // the jobs queue. (A namespace queue's consumer ends at its next delivery, so the
        // deliveries in hand can still be settled.)
        let next = tokio::select! {
            _ = tx.closed(), if matches!(what, Consumed::Image(..)) => None,
            d = consumer.next() => Some(d),
        };
        let Some(next) = next else {
            let _ = conn.close(200, "shutting down").await;
            return Ok(());
        };
        let Some(delivery) = next else { break };
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
