//! A team's notices (its budget marks, from the fleet's ledger) to its webhook: each notice goes
//! to one coordinator (the ledger's consumer group), is POSTed signed like a run's notices
//! (`X-Fleet-Event: team.budget_warning` or `team.budget_exhausted`), retried with backoff, every
//! attempt written to the team's delivery log, and marked done only when delivered or out of
//! attempts. A coordinator that dies mid-delivery leaves it taken; another takes it over after
//! a minute and delivers it again under the same delivery id (the stream entry's). A batch's end
//! (`team.batch_finished`) is delivered the same way by the coordinator that committed it.

use super::notices::{DeliveryLog, Shot};
use super::Coordinator;
use serde_json::Value;
use shared::quota::QuotaNotice;
use shared::schedule::Webhook;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// How often a coordinator looks for notices to deliver.
const POLL: Duration = Duration::from_millis(500);

impl Coordinator {
    /// Delivers the fleet's team notices until shutdown.
    pub(super) async fn team_notices(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(POLL) => {}
            }
            let taken = match self.ledger.take_notices(&self.id).await {
                Ok(t) => t,
                Err(e) => {
                    warn!(error = %e, "cannot read the team notices");
                    continue;
                }
            };
            for (id, notice) in taken {
                self.deliver_team_notice(&id, &notice).await;
                if let Err(e) = self.ledger.notice_done(&id).await {
                    warn!(error = %e, delivery = %id, "a team notice delivered but not marked done; it may be delivered twice");
                }
            }
        }
    }

    async fn deliver_team_notice(&self, id: &str, notice: &QuotaNotice) {
        let team = notice.team.as_str();
        let event = format!("team.{}", notice.event);
        let delivery = format!("team-{team}-{id}");
        let body = serde_json::json!({
            "v": 1, "delivery": delivery, "event": event, "notice": notice,
        });
        self.team_post()
            .deliver(team, &event, &delivery, body)
            .await;
    }

    /// What delivering to a team's webhook needs, apart from the coordinator (for tasks).
    pub(crate) fn team_post(&self) -> TeamPost {
        TeamPost {
            ledger: self.ledger.clone(),
            http: self.http.clone(),
            secret: self.webhook_secret.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// Delivers one notice to a team's webhook: signed, retried 1, 2, 4, 8 s apart, every attempt
/// in the team's delivery log.
#[derive(Clone)]
pub(crate) struct TeamPost {
    ledger: Arc<dyn worker::quota::Ledger>,
    http: crate::schedules::webhook::WebhookClient,
    secret: Option<String>,
    clock: Arc<dyn shared::time::Clock>,
}

impl TeamPost {
    /// Delivers `body` as `event` under `delivery` (its id), if the team has a webhook.
    pub(crate) async fn deliver(&self, team: &str, event: &str, delivery: &str, mut body: Value) {
        if let Some(obj) = body.as_object_mut() {
            obj.insert("team".into(), Value::String(team.to_string()));
        }
        let url = match self.ledger.webhook(team).await {
            Ok(Some(url)) => url,
            Ok(None) => return,
            Err(e) => {
                warn!(team, error = %e, "cannot read the team's webhook; its notice is not delivered");
                return;
            }
        };
        let mut log = DeliveryLog {
            delivery: delivery.to_string(),
            event: event.to_string(),
            state: "pending".into(),
            attempts: Vec::new(),
        };
        let Some(secret) = self.secret.clone() else {
            warn!(
                team,
                "a team notice but no FLEET_WEBHOOK_SECRET: not delivered"
            );
            log.state = "failed".into();
            self.log(team, &log, &body).await;
            return;
        };
        let secret = shared::schedule::webhook::team_secret(&secret, team);
        let hook = Webhook { url, secret };
        let bytes = serde_json::to_vec(&body).expect("a notice serializes");
        let shot = Shot {
            http: &self.http,
            clock: self.clock.as_ref(),
            hook: &hook,
            body: &bytes,
            delivery,
            event,
            timestamp: self.clock.now().timestamp(),
            subject: team,
        };
        shot.attempts(&mut log, |_| async {}).await;
        self.log(team, &log, &body).await;
    }

    async fn log(&self, team: &str, log: &DeliveryLog, body: &Value) {
        let mut entry = serde_json::to_value(log).expect("a log serializes");
        entry["body"] = body.clone();
        if let Err(e) = self.ledger.log_delivery(team, &entry).await {
            warn!(team, error = %e, "could not write the team's delivery log");
        }
    }
}
