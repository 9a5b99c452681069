//! Image affinity on RabbitMQ. A job of an image is published to the direct exchange
//! `<ns>.jobs.images` under its image key. A worker that holds the image (has run a job of it)
//! binds the image's quorum queue `<ns>.jobs.image.<key>` there and consumes it; a key no queue
//! is bound to goes to the exchange's alternate, the fan-out `<ns>.jobs.any`, into the jobs
//! queue every worker consumes. A message waits in an image queue at most the affinity wait
//! (its `x-message-ttl`, counted from its publish) before it is dead-lettered, at least once,
//! to the jobs queue: holders that are busy, gone, or left it unsettled delay a job by that
//! much, never strand it. The image queue's delivery limit dead-letters there too, so a poison
//! job gets the jobs queue's deliveries after the image queue's before it is dead.

use super::conn_err;
use crate::queue::{ImageKey, QueueName, DELIVERY_LIMIT};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};
use shared::ports::PortError;
use std::time::Duration;

/// The exchange jobs of an image are published to, under its key.
pub(super) fn images_exchange(ns: &str) -> String {
    format!("{ns}.jobs.images")
}

/// Where a key no image queue is bound to goes: the jobs queue.
fn fallback_exchange(ns: &str) -> String {
    format!("{ns}.jobs.any")
}

fn durable() -> ExchangeDeclareOptions {
    ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

/// Declares the two exchanges and binds the jobs queue behind the fallback (idempotent; the
/// jobs queue must exist).
pub(super) async fn declare_routing(ch: &Channel, ns: &str) -> Result<(), PortError> {
    let fallback = fallback_exchange(ns);
    ch.exchange_declare(
        &fallback,
        ExchangeKind::Fanout,
        durable(),
        FieldTable::default(),
    )
    .await
    .map_err(conn_err)?;
    ch.queue_bind(
        &QueueName::Jobs.qualified(ns),
        &fallback,
        "",
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .map_err(conn_err)?;
    let mut args = FieldTable::default();
    args.insert(
        "alternate-exchange".into(),
        AMQPValue::LongString(fallback.as_str().into()),
    );
    ch.exchange_declare(&images_exchange(ns), ExchangeKind::Direct, durable(), args)
        .await
        .map_err(conn_err)
}

/// The image queue's arguments: every worker declares them alike (a queue declared again with
/// other arguments is refused by the broker, so workers of one namespace share one wait).
pub(super) fn image_queue_args(ns: &str, wait: Duration) -> FieldTable {
    let mut args = FieldTable::default();
    let mut put = |k: &str, v: AMQPValue| args.insert(k.into(), v);
    put("x-queue-type", AMQPValue::LongString("quorum".into()));
    put(
        "x-delivery-limit",
        AMQPValue::LongLongInt(i64::from(DELIVERY_LIMIT)),
    );
    put(
        "x-message-ttl",
        AMQPValue::LongLongInt(wait.as_millis().clamp(1, i64::MAX as u128) as i64),
    );
    put("x-dead-letter-exchange", AMQPValue::LongString("".into()));
    put(
        "x-dead-letter-routing-key",
        AMQPValue::LongString(QueueName::Jobs.qualified(ns).into()),
    );
    // At least once: a message is removed from the image queue only once the jobs queue
    // confirmed it, which needs the image queue to refuse publishes rather than drop when full.
    put(
        "x-dead-letter-strategy",
        AMQPValue::LongString("at-least-once".into()),
    );
    put("x-overflow", AMQPValue::LongString("reject-publish".into()));
    args
}

/// Declares `image`'s queue and binds it under its key (idempotent).
pub(super) async fn declare_image_queue(
    ch: &Channel,
    ns: &str,
    image: &ImageKey,
    wait: Duration,
) -> Result<(), PortError> {
    let queue = image.queue(ns);
    let options = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(&queue, options, image_queue_args(ns, wait))
        .await
        .map_err(conn_err)?;
    ch.queue_bind(
        &queue,
        &images_exchange(ns),
        image.as_str(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .map_err(conn_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_queue_dead_letters_to_the_jobs_queue_at_least_once_after_the_wait() {
        let args = image_queue_args("ns", Duration::from_millis(1500));
        let get = |k: &str| args.inner().get(k).cloned();
        assert_eq!(get("x-message-ttl"), Some(AMQPValue::LongLongInt(1500)));
        assert_eq!(
            get("x-dead-letter-routing-key"),
            Some(AMQPValue::LongString("ns.jobs".into()))
        );
        assert_eq!(
            get("x-dead-letter-strategy"),
            Some(AMQPValue::LongString("at-least-once".into()))
        );
        assert_eq!(
            get("x-overflow"),
            Some(AMQPValue::LongString("reject-publish".into()))
        );
        // A wait under a millisecond is still a wait (a TTL of 0 would drop nothing but
        // dead-letter every message at once).
        let tiny = image_queue_args("ns", Duration::from_micros(10));
        assert_eq!(
            tiny.inner().get("x-message-ttl").cloned(),
            Some(AMQPValue::LongLongInt(1))
        );
    }
}
