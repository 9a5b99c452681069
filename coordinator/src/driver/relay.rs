//! The outbox relay: claims outbox messages into this coordinator's in-flight list, publishes
//! them with confirms and forgets them only once the broker has them. A lease (refreshed by
//! its own task, also while publishing is retried) keeps the in-flight list this coordinator's;
//! in-flight lists of coordinators whose lease lapsed go back to the outbox, and at start a
//! coordinator takes back its own (left by an earlier process with the same id).

use super::Coordinator;
use shared::ports::OutboxMessage;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};
use worker::queue::{ImageKey, JobMessage, QueueName};

/// What one publish of the relay sends: jobs (each to its image's holders when it has one and
/// they exist) or run messages (to the results queue).
enum Outgoing {
    Jobs(Vec<JobMessage>),
    Runs(Vec<(Vec<u8>, String)>),
}

impl Outgoing {
    fn len(&self) -> usize {
        match self {
            Outgoing::Jobs(m) => m.len(),
            Outgoing::Runs(m) => m.len(),
        }
    }
}

const HEARTBEAT_EVERY: Duration = Duration::from_secs(3);
const RECOVER_EVERY: Duration = Duration::from_secs(5);

impl Coordinator {
    /// Refreshes this coordinator's lease on its in-flight outbox list until shutdown.
    pub(super) async fn heartbeat(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            if let Err(e) = self.store.heartbeat(&self.id).await {
                warn!(error = %e, "could not refresh the outbox lease");
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(HEARTBEAT_EVERY) => {}
            }
        }
    }

    /// Publishes outbox messages with confirms; forgets each one only after the broker has it.
    pub async fn relay(self: Arc<Self>, shutdown: CancellationToken) {
        tokio::spawn(self.clone().heartbeat(shutdown.clone()));
        loop {
            match self.store.outbox_reclaim_own(&self.id).await {
                Ok(0) => break,
                Ok(n) => {
                    info!(
                        moved = n,
                        "took back outbox messages an earlier process with this id had in flight"
                    );
                    break;
                }
                Err(e) => {
                    warn!(error = %e, "could not take back this id's in-flight messages; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        }
        let mut last_recover: Option<std::time::Instant> = None;
        loop {
            if last_recover.is_none_or(|t| t.elapsed() > RECOVER_EVERY) {
                match self.store.outbox_recover(&self.id).await {
                    Ok(0) => {}
                    Ok(n) => info!(
                        moved = n,
                        "recovered outbox messages of a stopped coordinator"
                    ),
                    Err(e) => warn!(error = %e, "outbox recovery failed"),
                }
                self.sweep_lines().await;
                last_recover = Some(std::time::Instant::now());
            }
            let batch = match self.store.outbox_claim(&self.id, 256).await {
                Ok(b) => b,
                Err(e) => {
                    warn!(error = %e, "outbox claim failed; retrying");
                    Vec::new()
                }
            };
            if !batch.is_empty() {
                worker::faults::point("coordinator.after_claim").await;
            }
            // Jobs of teams at their concurrent_jobs wait in their team's line.
            let claimed = batch.len();
            let batch = self.admit_claimed(batch).await;
            let held = claimed - batch.len();
            // Notices are delivered by tasks of their own, each forgetting its message when
            // done; the rest is published now.
            let (notices, batch): (Vec<String>, Vec<String>) = batch
                .into_iter()
                .partition(|raw| raw.starts_with("{\"Notice\""));
            for raw in notices {
                match serde_json::from_str::<OutboxMessage>(&raw) {
                    Ok(OutboxMessage::Notice(n)) => {
                        tokio::spawn(self.clone().deliver_notice(raw, n));
                    }
                    _ => error!("dropping a malformed notice"),
                }
            }
            if !self.publish_batch(&batch, &shutdown).await {
                return;
            }
            if !batch.is_empty() {
                worker::faults::point("coordinator.after_publish").await;
                if let Err(e) = self.store.outbox_done(&self.id, &batch).await {
                    warn!(error = %e, "could not forget published outbox messages; they may be published twice");
                }
                continue;
            }
            if held > 0 {
                continue;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.outbox_ready.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }

    /// Publishes the whole batch and waits for every confirm, retrying the batch on failure
    /// (duplicates are harmless: job ids are deterministic and results deduplicated). False
    /// when shut down before the broker had it.
    async fn publish_batch(&self, batch: &[String], shutdown: &CancellationToken) -> bool {
        let mut jobs = Vec::new();
        let mut runs = Vec::new();
        for raw in batch {
            match serde_json::from_str::<OutboxMessage>(raw) {
                Ok(OutboxMessage::Job(env)) => {
                    let body = serde_json::to_vec(&env).expect("envelope serializes");
                    jobs.push(JobMessage {
                        body,
                        id: format!("{}.a{}", env.job_id, env.attempt),
                        image: env.image.as_deref().map(ImageKey::of),
                    });
                }
                Ok(OutboxMessage::Run(msg)) => {
                    let body = serde_json::to_vec(&msg).expect("a run message serializes");
                    let id = format!("run.{}", shared::hashing::sha256_hex(&body));
                    runs.push((body, id));
                }
                Ok(OutboxMessage::Notice(_)) => {}
                Err(e) => error!(error = %e, "dropping a malformed outbox message"),
            }
        }
        self.publish_confirmed(Outgoing::Jobs(jobs), shutdown).await
            && self.publish_confirmed(Outgoing::Runs(runs), shutdown).await
    }

    /// Publishes `messages` and waits for every confirm, retrying until the broker has them
    /// all. False when shut down first.
    async fn publish_confirmed(&self, messages: Outgoing, shutdown: &CancellationToken) -> bool {
        let mut delay = Duration::from_millis(250);
        let count = messages.len();
        if count == 0 {
            return true;
        }
        loop {
            let sent = match &messages {
                Outgoing::Jobs(jobs) => self.broker.publish_jobs(jobs).await,
                Outgoing::Runs(runs) => self.broker.publish_many(QueueName::Results, runs).await,
            };
            match sent {
                Ok(()) => {
                    if let Outgoing::Jobs(_) = messages {
                        self.metrics.jobs_published.inc_by(count as u64);
                    }
                    return true;
                }
                Err(e) => {
                    info!(error = %e, count, retry_in = ?delay, "publish failed; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return false,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}
