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

/// The affinity key of a container image: jobs of the image go first to the workers that hold
/// it (have run a job of it), through the image's own queue. The first 16 hex digits of the
/// sha256 of the image's reference, so any reference makes a safe queue name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageKey(String);

impl ImageKey {
    pub fn of(image: &str) -> Self {
        Self(shared::hashing::sha256_hex(image.as_bytes())[..16].to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The image's queue in `namespace`.
    pub fn queue(&self, namespace: &str) -> String {
        format!("{namespace}.jobs.image.{}", self.0)
    }
}

/// A job to publish: its envelope, its message id, and the image it runs in (none for a job
/// that runs no container).
#[derive(Clone, Debug)]
pub struct JobMessage {
    pub body: Vec<u8>,
    pub id: String,
    pub image: Option<ImageKey>,
}

/// Deliveries of one job before the broker dead-letters it (a worker killed mid-job counts):
/// the jobs queue's delivery limit, the same in every adapter.
pub const DELIVERY_LIMIT: u32 = 5;

/// How a delivery is settled: each adapter brings its own (the AMQP delivery tag, a channel in
/// memory). Called at most once per delivery, through [`Incoming`].
#[async_trait]
pub trait Acker: Send + Sync {
    async fn ack(self: Box<Self>) -> Result<(), PortError>;
    /// Puts the message back for another delivery; `body` and `delivery_count` are the
    /// delivery's own (an adapter that holds the message itself may ignore them).
    async fn requeue(self: Box<Self>, body: Vec<u8>, delivery_count: u32) -> Result<(), PortError>;
    /// Dead-letters the message (queues without a dead-letter queue drop it).
    async fn reject(self: Box<Self>, body: Vec<u8>, delivery_count: u32) -> Result<(), PortError>;
}

/// One delivered message. Settle it exactly once: `ack` after its effects are stored, `requeue`
/// on a transient failure, `reject` for poison (dead-lettered).
pub struct Incoming {
    pub body: Vec<u8>,
    /// How many times the broker delivered it before (0 on first delivery).
    pub delivery_count: u32,
    pub acker: Box<dyn Acker>,
}

impl Incoming {
    pub async fn ack(self) -> Result<(), PortError> {
        self.acker.ack().await
    }

    pub async fn requeue(self) -> Result<(), PortError> {
        self.acker.requeue(self.body, self.delivery_count).await
    }

    pub async fn reject(self) -> Result<(), PortError> {
        self.acker.reject(self.body, self.delivery_count).await
    }
}

#[async_trait]
pub trait Broker: Send + Sync {
    /// The server this broker reaches (`rabbitmq`) and whether it answered last; `None` for
    /// a broker with nothing to reach (in memory).
    fn dependency(&self) -> Option<(&'static str, bool)> {
        None
    }
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

    /// Publishes jobs, each to the queue of its image when a worker holds the image (has
    /// subscribed to it), else to the jobs queue; then waits for every confirm. A broker
    /// without image queues publishes them all to the jobs queue.
    async fn publish_jobs(&self, jobs: &[JobMessage]) -> Result<(), PortError> {
        let plain: Vec<(Vec<u8>, String)> = (jobs.iter())
            .map(|j| (j.body.clone(), j.id.clone()))
            .collect();
        self.publish_many(QueueName::Jobs, &plain).await
    }

    /// Consumes the queue of `image`'s jobs (this worker holds the image), at most `prefetch`
    /// unacknowledged; a job no subscriber takes within the broker's affinity wait goes on to
    /// the jobs queue. None when this broker has no image queues (one process, or turned off).
    fn subscribe_image(&self, image: &ImageKey, prefetch: u16) -> Option<mpsc::Receiver<Incoming>> {
        let _ = (image, prefetch);
        None
    }

    /// Sends a control message to every worker listening now (not persisted: best effort).
    async fn broadcast(&self, body: &[u8]) -> Result<(), PortError>;

    /// Receives control messages; survives reconnects.
    fn listen(&self) -> mpsc::Receiver<Vec<u8>>;

    /// Consumes `queue` with at most `prefetch` unacknowledged messages; survives reconnects.
    fn subscribe(&self, queue: QueueName, prefetch: u16) -> mpsc::Receiver<Incoming>;
}

/// The contract of the queue port, written once and run against every adapter: the memory
/// broker in this crate's unit tests, RabbitMQ in `tests/conformance.rs`. Each case takes a
/// broker of its own (a fresh namespace) and settles everything it receives.
#[cfg(any(test, feature = "conformance"))]
pub mod conformance {
    use super::{Broker, Incoming, QueueName, DELIVERY_LIMIT};
    use std::time::Duration;
    use tokio::sync::mpsc;

    /// Longest wait for a delivery the contract promises.
    const WAIT: Duration = Duration::from_secs(10);
    /// How long "nothing more comes" is watched.
    const QUIET: Duration = Duration::from_millis(700);

    async fn next(rx: &mut mpsc::Receiver<Incoming>, what: &str) -> Incoming {
        match tokio::time::timeout(WAIT, rx.recv()).await {
            Ok(Some(m)) => m,
            Ok(None) => panic!("{what}: the subscription ended"),
            Err(_) => panic!("{what}: nothing delivered within {WAIT:?}"),
        }
    }

    async fn nothing(rx: &mut mpsc::Receiver<Incoming>, what: &str) {
        if let Ok(Some(m)) = tokio::time::timeout(QUIET, rx.recv()).await {
            panic!(
                "{what}: unexpected delivery {:?} (count {})",
                String::from_utf8_lossy(&m.body),
                m.delivery_count
            );
        }
    }

    pub async fn publish_then_subscribe_delivers_once_with_count_zero(b: &dyn Broker) {
        let mut jobs = b.subscribe(QueueName::Jobs, 8);
        b.publish(QueueName::Jobs, b"m1", "m1").await.unwrap();
        let m = next(&mut jobs, "first delivery").await;
        assert_eq!(m.body, b"m1");
        assert_eq!(m.delivery_count, 0);
        m.ack().await.unwrap();
        b.publish(QueueName::Jobs, b"m2", "m2").await.unwrap();
        let m = next(&mut jobs, "second message").await;
        assert_eq!(m.body, b"m2", "an acked message is not delivered again");
        m.ack().await.unwrap();
        nothing(&mut jobs, "after both acks").await;
    }

    pub async fn requeue_redelivers_with_a_raised_count(b: &dyn Broker) {
        let mut jobs = b.subscribe(QueueName::Jobs, 8);
        b.publish(QueueName::Jobs, b"again", "again").await.unwrap();
        let m = next(&mut jobs, "first delivery").await;
        assert_eq!(m.delivery_count, 0);
        m.requeue().await.unwrap();
        let m = next(&mut jobs, "redelivery").await;
        assert_eq!(m.body, b"again");
        assert_eq!(
            m.delivery_count, 1,
            "a requeued message counts its delivery"
        );
        m.ack().await.unwrap();
        nothing(&mut jobs, "after the ack").await;
    }

    pub async fn reject_dead_letters_a_job(b: &dyn Broker) {
        let mut jobs = b.subscribe(QueueName::Jobs, 8);
        let mut dead = b.subscribe(QueueName::DeadJobs, 8);
        b.publish(QueueName::Jobs, b"poison", "poison")
            .await
            .unwrap();
        let m = next(&mut jobs, "delivery").await;
        m.reject().await.unwrap();
        let d = next(&mut dead, "dead letter").await;
        assert_eq!(d.body, b"poison");
        d.ack().await.unwrap();
        nothing(&mut jobs, "a rejected job is not redelivered").await;
        nothing(&mut dead, "one dead letter").await;
    }

    pub async fn a_job_requeued_past_the_delivery_limit_is_dead_lettered(b: &dyn Broker) {
        let mut jobs = b.subscribe(QueueName::Jobs, 8);
        let mut dead = b.subscribe(QueueName::DeadJobs, 8);
        b.publish(QueueName::Jobs, b"flaky", "flaky").await.unwrap();
        let mut counts = Vec::new();
        for _ in 0..=DELIVERY_LIMIT {
            let m = next(&mut jobs, "delivery within the limit").await;
            counts.push(m.delivery_count);
            m.requeue().await.unwrap();
        }
        assert_eq!(
            counts,
            (0..=DELIVERY_LIMIT).collect::<Vec<_>>(),
            "delivered once and requeued up to the limit"
        );
        let d = next(&mut dead, "dead letter past the limit").await;
        assert_eq!(d.body, b"flaky");
        d.ack().await.unwrap();
        nothing(&mut jobs, "past the limit").await;
    }

    /// A consumer that stops (a coordinator or worker shutting down) loses nothing: what it had
    /// not acked, or was about to take, goes to the next consumer.
    pub async fn a_consumer_that_goes_away_loses_no_message(b: &dyn Broker) {
        let mut first = b.subscribe(QueueName::Jobs, 8);
        b.publish(QueueName::Jobs, b"warm", "warm").await.unwrap();
        next(&mut first, "the first consumer is up")
            .await
            .ack()
            .await
            .unwrap();
        drop(first);
        b.publish(QueueName::Jobs, b"kept", "kept").await.unwrap();
        let mut second = b.subscribe(QueueName::Jobs, 8);
        let m = next(
            &mut second,
            "the message published as the first consumer left",
        )
        .await;
        assert_eq!(m.body, b"kept");
        m.ack().await.unwrap();
        nothing(&mut second, "after the ack").await;
    }

    pub async fn publish_many_delivers_all_in_order(b: &dyn Broker) {
        let mut jobs = b.subscribe(QueueName::Jobs, 16);
        let batch: Vec<(Vec<u8>, String)> = (0..6)
            .map(|i| (format!("b{i}").into_bytes(), format!("id{i}")))
            .collect();
        b.publish_many(QueueName::Jobs, &batch).await.unwrap();
        b.publish_many(QueueName::Jobs, &[]).await.unwrap();
        for (body, _) in &batch {
            let m = next(&mut jobs, "batch member").await;
            assert_eq!(&m.body, body, "in publish order");
            assert_eq!(m.delivery_count, 0);
            m.ack().await.unwrap();
        }
        nothing(&mut jobs, "after the batch").await;
    }

    pub async fn queues_are_separate(b: &dyn Broker) {
        let mut jobs = b.subscribe(QueueName::Jobs, 8);
        let mut results = b.subscribe(QueueName::Results, 8);
        b.publish(QueueName::Results, b"r", "r").await.unwrap();
        let m = next(&mut results, "result").await;
        assert_eq!(m.body, b"r");
        m.ack().await.unwrap();
        nothing(&mut jobs, "a result is not a job").await;
        // A rejected result is dropped (only jobs have a dead-letter queue), not an error.
        b.publish(QueueName::Results, b"bad", "bad").await.unwrap();
        let m = next(&mut results, "second result").await;
        m.reject().await.unwrap();
        nothing(&mut results, "a rejected result").await;
    }

    fn job(body: &str, image: Option<&str>) -> super::JobMessage {
        super::JobMessage {
            body: body.as_bytes().to_vec(),
            id: body.to_string(),
            image: image.map(super::ImageKey::of),
        }
    }

    /// Publishes warm-up jobs of `image` until one reaches `holder`: a subscription binds its
    /// image's queue before its first delivery, and until then they go through `jobs`.
    async fn until_bound(
        b: &dyn Broker,
        image: &str,
        holder: &mut mpsc::Receiver<Incoming>,
        jobs: &mut mpsc::Receiver<Incoming>,
    ) {
        for tries in 1.. {
            assert!(
                tries <= 100,
                "no job of {image} reached its queue's subscriber"
            );
            b.publish_jobs(&[job("warm-up", Some(image))])
                .await
                .unwrap();
            tokio::select! {
                m = holder.recv() => { m.expect("image subscription").ack().await.unwrap(); return; }
                m = jobs.recv() => { m.expect("jobs subscription").ack().await.unwrap(); }
            }
        }
    }

    /// Jobs of an image go to the subscribers of its queue when there are any; jobs of an
    /// image nobody holds, and jobs without one, go to the jobs queue. A broker without image
    /// queues delivers every job through the jobs queue: nothing is lost either way.
    pub async fn jobs_of_a_held_image_go_to_its_holders(b: &dyn Broker) {
        let held = super::ImageKey::of("held:1");
        let mut jobs = b.subscribe(QueueName::Jobs, 8);
        let mut image = b.subscribe_image(&held, 8);
        if let Some(rx) = image.as_mut() {
            until_bound(b, "held:1", rx, &mut jobs).await;
        }
        b.publish_jobs(&[
            job("of-held", Some("held:1")),
            job("of-other", Some("other:1")),
            job("no-image", None),
        ])
        .await
        .unwrap();
        let mut general = Vec::new();
        if let Some(rx) = image.as_mut() {
            let m = next(rx, "the held image's job").await;
            assert_eq!(m.body, b"of-held");
            m.ack().await.unwrap();
            nothing(rx, "only the held image's job").await;
        } else {
            general.push("of-held".to_string());
        }
        general.extend(["of-other".to_string(), "no-image".to_string()]);
        let mut got = Vec::new();
        for _ in 0..general.len() {
            let m = next(&mut jobs, "a job through the jobs queue").await;
            got.push(String::from_utf8_lossy(&m.body).into_owned());
            m.ack().await.unwrap();
        }
        got.sort();
        general.sort();
        assert_eq!(got, general);
        nothing(&mut jobs, "each job once").await;
    }

    /// A job of a held image that its holders leave (none takes it, or one that took it went
    /// away unsettled) goes on to the jobs queue once the affinity wait is over.
    pub async fn a_job_its_holders_leave_goes_on_to_the_jobs_queue(b: &dyn Broker) {
        let held = super::ImageKey::of("left:1");
        let Some(mut image) = b.subscribe_image(&held, 1) else {
            return;
        };
        let mut jobs = b.subscribe(QueueName::Jobs, 8);
        until_bound(b, "left:1", &mut image, &mut jobs).await;
        // Taken and never settled: the holder goes away with it.
        b.publish_jobs(&[job("taken", Some("left:1"))])
            .await
            .unwrap();
        let m = next(&mut image, "the holder takes it").await;
        assert_eq!(m.body, b"taken");
        drop(image);
        drop(m);
        b.publish_jobs(&[job("untaken", Some("left:1"))])
            .await
            .unwrap();
        let mut got = Vec::new();
        for _ in 0..2 {
            let m = next(&mut jobs, "a job its holder left").await;
            got.push(String::from_utf8_lossy(&m.body).into_owned());
            m.ack().await.unwrap();
        }
        got.sort();
        assert_eq!(got, ["taken", "untaken"]);
        nothing(&mut jobs, "each once").await;
    }

    /// Control messages reach every listener that listens when they are sent (best effort:
    /// a listener still binding misses them, so the case sends until both heard one).
    pub async fn broadcast_reaches_every_listener(b: &dyn Broker) {
        let mut l1 = b.listen();
        let mut l2 = b.listen();
        let (mut got1, mut got2) = (None, None);
        let deadline = tokio::time::Instant::now() + WAIT;
        while got1.is_none() || got2.is_none() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "a listener heard nothing within {WAIT:?}"
            );
            b.broadcast(b"stop:j1").await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            while let Ok(m) = l1.try_recv() {
                got1 = Some(m);
            }
            while let Ok(m) = l2.try_recv() {
                got2 = Some(m);
            }
        }
        assert_eq!(got1.as_deref(), Some(&b"stop:j1"[..]));
        assert_eq!(got2.as_deref(), Some(&b"stop:j1"[..]));
    }
}
