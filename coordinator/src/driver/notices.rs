//! Run notices to a run's webhook: taken from the outbox like any message, POSTed signed
//! (`X-Fleet-Signature`, HMAC-SHA256 under `FLEET_WEBHOOK_SECRET`), retried with backoff, and
//! forgotten only when delivered or out of attempts. Every attempt is written to the delivery
//! log (`runs/<run>/webhooks/<delivery>.json`). A coordinator that dies mid-delivery leaves it
//! in its in-flight list, which goes back to the outbox when its lease lapses: another
//! coordinator delivers it again under the same delivery id (receivers drop repeats by it).

use super::Coordinator;
use crate::schedules::webhook::{post, Post};
use serde::{Deserialize, Serialize};
use serde_json::json;
use shared::engine::RunNotice;
use shared::schedule::webhook::RetryPolicy;
use shared::schedule::Webhook;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// Five attempts, 1 s, 2 s, 4 s, 8 s apart.
pub(super) const NOTICE_RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 5,
    base: Duration::from_secs(1),
    cap: Duration::from_secs(30),
    lease: Duration::from_secs(60),
};

/// One attempt as the delivery log keeps it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Attempt {
    pub attempt: u32,
    pub at: chrono::DateTime<chrono::Utc>,
    /// The receiver's HTTP status, when it answered.
    pub status: Option<u16>,
    pub error: Option<String>,
}

/// A delivery as its log keeps it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DeliveryLog {
    pub delivery: String,
    pub event: String,
    /// `pending`, `delivered` or `failed` (out of attempts).
    pub state: String,
    pub attempts: Vec<Attempt>,
}

/// The log's key of a delivery.
pub fn log_key(run: &str, delivery: &str) -> String {
    format!("runs/{run}/webhooks/{delivery}.json")
}

impl Coordinator {
    /// Delivers one notice (its attempts, their log), then forgets its outbox message.
    pub(super) async fn deliver_notice(self: Arc<Self>, raw: String, notice: RunNotice) {
        let run = notice.run_id.to_string();
        let event = format!(
            "run.{}",
            json!(notice.event.event_type).as_str().unwrap_or("event")
        );
        let mut log = DeliveryLog {
            delivery: notice.delivery.clone(),
            event: event.clone(),
            state: "pending".into(),
            attempts: Vec::new(),
        };
        let Some(secret) = self.webhook_secret.clone() else {
            warn!(run = %run, delivery = %notice.delivery, "a run notice but no FLEET_WEBHOOK_SECRET: not delivered");
            log.state = "failed".into();
            self.write_log(&run, &log).await;
            self.forget(&raw).await;
            return;
        };
        // A team's run is signed with the team's own key, and says whose it is.
        let secret = match &notice.team {
            Some(team) => shared::schedule::webhook::team_secret(&secret, team),
            None => secret,
        };
        let hook = Webhook {
            url: notice.url.clone(),
            secret,
        };
        let body = serde_json::to_vec(&json!({
            "v": 1, "run_id": run, "team": notice.team, "delivery": notice.delivery,
            "event": notice.event,
        }))
        .expect("a notice serializes");
        let shot = Shot {
            http: &self.http,
            clock: self.clock.as_ref(),
            hook: &hook,
            body: &body,
            delivery: &notice.delivery,
            event: &event,
            timestamp: notice.event.timestamp.timestamp(),
            subject: &run,
        };
        let (me, run_ref) = (&self, run.as_str());
        shot.attempts(&mut log, |so_far| async move {
            me.write_log(run_ref, &so_far).await;
        })
        .await;
        self.write_log(&run, &log).await;
        self.forget(&raw).await;
    }

    async fn write_log(&self, run: &str, log: &DeliveryLog) {
        if let Err(e) = self.blobs.put_json(&log_key(run, &log.delivery), log).await {
            warn!(run = %run, delivery = %log.delivery, error = %e, "could not write the delivery log");
        }
    }

    async fn forget(&self, raw: &str) {
        if let Err(e) = self.store.outbox_done(&self.id, &[raw.to_string()]).await {
            warn!(error = %e, "could not forget a delivered notice; it may be delivered twice");
        }
    }
}

/// One notice's POSTs to one webhook.
pub(super) struct Shot<'a> {
    pub http: &'a crate::schedules::webhook::WebhookClient,
    pub clock: &'a dyn shared::time::Clock,
    pub hook: &'a Webhook,
    pub body: &'a [u8],
    pub delivery: &'a str,
    pub event: &'a str,
    pub timestamp: i64,
    /// The run or team it is for (logged).
    pub subject: &'a str,
}

impl Shot<'_> {
    /// POSTs until a 2xx, at most `NOTICE_RETRY.max_attempts` times, 1, 2, 4, 8 s apart; every
    /// attempt into `log`, whose state ends `delivered` or `failed`. `between` sees the log after
    /// each failed attempt that another follows.
    pub(super) async fn attempts<F, Fut>(&self, log: &mut DeliveryLog, between: F)
    where
        F: Fn(DeliveryLog) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        for n in 1..=NOTICE_RETRY.max_attempts {
            let sent = post(
                self.http,
                Post {
                    hook: self.hook,
                    body: self.body.to_vec(),
                    delivery: self.delivery,
                    timestamp: self.timestamp,
                    attempt: n,
                    event: self.event,
                },
            )
            .await;
            let (status, error) = match sent {
                Ok(s) => (Some(s), None),
                Err(e) => (None, Some(e)),
            };
            log.attempts.push(Attempt {
                attempt: n,
                at: self.clock.now(),
                status,
                error: error.clone(),
            });
            if status.is_some_and(|s| (200..300).contains(&s)) {
                log.state = "delivered".into();
                info!(subject = %self.subject, delivery = %self.delivery, attempt = n, "notice delivered");
                return;
            }
            warn!(subject = %self.subject, delivery = %self.delivery, attempt = n, status = ?status, error = ?error, "notice not delivered");
            if n == NOTICE_RETRY.max_attempts {
                log.state = "failed".into();
            } else {
                between(log.clone()).await;
                tokio::time::sleep(NOTICE_RETRY.delay_after(n)).await;
            }
        }
    }
}
