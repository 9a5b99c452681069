//! The worker's loop: take a job, run it, store the result, publish the result envelope, and
//! only then ack. A poison message (unreadable envelope or spec) is rejected and dead-lettered;
//! a transient failure requeues the job (the delivery limit bounds how often); a permanent one
//! (the error says which it is: `RunError::is_transient`) is reported at once as an `Error`
//! result of the attempt and acked, never requeued.
//!
//! At start the worker reaps its containers and the job folders a killed process left; while it
//! serves, job folders older than `FLEET_JOB_DIR_MAX_AGE_SECONDS` that no execution owns are
//! removed.
//!
//! One execution per attempt: a delivery of a (job, attempt) that already runs in this worker
//! (a redelivery after a broker blip, a duplicate publish) is not started again but held, and
//! acked with the first once its result is reported; a delivery of an attempt whose result this
//! worker already reported is acked at once. A delivery is never stranded: one dropped unsettled
//! (a panic on the way) is requeued, and a panic in the job itself becomes an error result
//! (`Runner::run`).
//!
//! Here: `serve` (reaping, sweeps, stops, the loop) and `handle` (one delivery, from envelope to
//! ack). `executions.rs`: admission and holding of deliveries per (job, attempt).

mod executions;
#[cfg(test)]
mod tests;

pub(crate) use executions::{Admission, Delivery, Executions};

use crate::metrics::JobPhase;
use crate::queue::{Broker, ImageKey, Incoming, QueueName};
use crate::runner::Runner;
use shared::messages::{
    JobEnvelope, JobSpec, ResultEnvelope, ResultMessage, StartNotice, INLINE_LIMIT, WIRE_VERSION,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Consumes jobs until `shutdown` fires; then waits for the jobs in hand to finish.
pub async fn serve(runner: Arc<Runner>, broker: Arc<dyn Broker>, shutdown: CancellationToken) {
    match runner.sandbox.reap(&runner.config.id).await {
        Ok(0) => {}
        Ok(n) => info!(worker = %runner.config.id, removed = n, "reaped orphaned containers"),
        Err(e) => {
            warn!(worker = %runner.config.id, error = %e, "could not reap orphaned containers")
        }
    }
    match runner.remove_leftover_job_dirs().await {
        0 => {}
        n => {
            info!(worker = %runner.config.id, removed = n, "removed job folders left by an earlier process")
        }
    }
    let sweeper = runner.clone();
    let stop_sweeping = shutdown.clone();
    tokio::spawn(async move {
        let every = sweeper.resources.sweep_every();
        loop {
            tokio::select! {
                _ = stop_sweeping.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
            match sweeper.remove_stale_job_dirs().await {
                0 => {}
                n => info!(removed = n, "removed stale job folders"),
            }
        }
    });
    runner.send_notices_to(broker.clone());
    let mut control = broker.listen();
    let listener = runner.clone();
    tokio::spawn(async move {
        while let Some(body) = control.recv().await {
            match serde_json::from_slice::<shared::messages::Control>(&body) {
                Ok(c) => {
                    for job in &c.stop_jobs {
                        if listener.stop(job) {
                            info!(job = %job, "stopping a job whose run ended");
                        }
                    }
                    for d in c.deliver {
                        listener.deliver(&d.job_id, d.messages);
                    }
                }
                Err(e) => warn!(error = %e, "ignoring a malformed control message"),
            }
        }
    });
    let concurrency = runner.config.concurrency.max(1);
    let permits = Arc::new(Semaphore::new(concurrency));
    let executions = Arc::new(Executions::default());
    // Every queue this worker consumes feeds one inbox: the jobs queue, and the queue of each
    // image it holds once it has started a container of it (image affinity).
    let (inbox_tx, mut jobs) = tokio::sync::mpsc::channel::<Incoming>(1);
    forward(
        broker.subscribe(QueueName::Jobs, concurrency as u16),
        inbox_tx.clone(),
    );
    if let Some(mut held) = runner.held_images() {
        let (broker, worker) = (broker.clone(), runner.config.id.clone());
        tokio::spawn(async move {
            while let Some(image) = held.recv().await {
                let key = ImageKey::of(&image);
                if let Some(rx) = broker.subscribe_image(&key, concurrency as u16) {
                    info!(worker = %worker, image = %image, key = key.as_str(), "holding an image: taking its jobs first");
                    forward(rx, inbox_tx.clone());
                }
            }
        });
    }
    info!(worker = %runner.config.id, concurrency, sandbox = runner.sandbox.name(), "worker ready");
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = permits.clone().acquire_owned() => p.expect("semaphore open"),
        };
        let msg = tokio::select! {
            _ = shutdown.cancelled() => break,
            m = jobs.recv() => match m { Some(m) => m, None => break },
        };
        let runner = runner.clone();
        let broker = broker.clone();
        let executions = executions.clone();
        tokio::spawn(async move {
            handle(&runner, broker.as_ref(), &executions, msg).await;
            drop(permit);
        });
    }
    // Wait for the jobs in hand (they settle the deliveries held for them).
    let _ = permits.acquire_many(concurrency as u32).await;
    info!(worker = %runner.config.id, "worker stopped");
}

/// Feeds `from`'s deliveries into the worker's inbox until either is gone.
fn forward(
    mut from: tokio::sync::mpsc::Receiver<Incoming>,
    to: tokio::sync::mpsc::Sender<Incoming>,
) {
    tokio::spawn(async move {
        while let Some(m) = from.recv().await {
            if to.send(m).await.is_err() {
                return;
            }
        }
    });
}

async fn handle(runner: &Runner, broker: &dyn Broker, executions: &Executions, msg: Incoming) {
    let settled = |how: &str| runner.metrics.deliveries.with_label_values(&[how]).inc();
    let delivery = Delivery::new(msg);
    let env: JobEnvelope = match serde_json::from_slice(&delivery.incoming().body) {
        Ok(e) => e,
        Err(e) => {
            error!(error = %e, "poison message: not a job envelope; dead-lettering");
            settled("rejected");
            let _ = delivery.settle().reject().await;
            return;
        }
    };
    let fetched = match env.spec.clone() {
        Some(inline) => Ok(*inline),
        None => runner.blobs.get_content::<JobSpec>(&env.spec_ref).await,
    };
    let spec: JobSpec = match fetched {
        Ok(s) => s,
        // The error's own class: a spec that is not there or not what its key says will never
        // be (permanent), a store that is unreachable may be next time (transient).
        Err(e) if !e.is_transient() => {
            error!(job = %env.job_id, spec = %env.spec_ref, error = %e, "poison job: spec missing or unreadable; dead-lettering");
            settled("rejected");
            let _ = delivery.settle().reject().await;
            return;
        }
        Err(e) => {
            warn!(job = %env.job_id, error = %e, "cannot read the job spec; requeueing");
            requeue(delivery, &settled).await;
            return;
        }
    };
    let count = delivery.incoming().delivery_count;
    let (claim, delivery) = match executions.admit(&spec.job_id, spec.attempt, delivery) {
        Admission::Run(claim, delivery) => (claim, delivery),
        Admission::Held => {
            runner
                .metrics
                .duplicates
                .with_label_values(&["running"])
                .inc();
            info!(job = %spec.job_id, attempt = spec.attempt, delivery = count, "a delivery of an attempt already running here: held until that execution ends, never run twice");
            return;
        }
        Admission::Reported(delivery) => {
            runner
                .metrics
                .duplicates
                .with_label_values(&["reported"])
                .inc();
            info!(job = %spec.job_id, attempt = spec.attempt, delivery = count, "a delivery of an attempt this worker already reported: acking it");
            ack(delivery, &spec, &settled).await;
            return;
        }
    };
    info!(job = %spec.job_id, attempt = spec.attempt, delivery = count, node = %spec.node, "job started");
    if spec.notify_start {
        let notice = ResultMessage::Started(StartNotice {
            v: WIRE_VERSION,
            job_id: spec.job_id.clone(),
            run_id: spec.run_id.clone(),
            attempt: spec.attempt,
            worker: runner.config.id.clone(),
        });
        let body = serde_json::to_vec(&notice).expect("a start notice serializes");
        let id = format!("{}.a{}.started", spec.job_id, spec.attempt);
        if let Err(e) = broker.publish(QueueName::Results, &body, &id).await {
            // Only the watchdog misses it: the job itself goes on.
            warn!(job = %spec.job_id, error = %e, "could not announce the job's start");
        }
    }
    let started_at = runner.clock.now();
    let exec = runner.execution(&spec);
    let result = match runner.run_as(&spec, &exec).await {
        Ok(r) => r,
        Err(e) if e.is_transient() => {
            let reason = e.reason();
            warn!(job = %spec.job_id, %reason, "job hit a transient failure; requeueing");
            runner
                .metrics
                .failures
                .with_label_values(&["transient"])
                .inc();
            let held = claim.finish(false);
            requeue(delivery, &settled).await;
            for d in held {
                requeue(d, &settled).await;
            }
            return;
        }
        Err(e) => {
            let reason = e.reason();
            warn!(job = %spec.job_id, attempt = spec.attempt, delivery = count, %reason, "job hit a permanent failure; reporting it as an error, not requeueing");
            runner
                .metrics
                .failures
                .with_label_values(&["permanent"])
                .inc();
            let ran = crate::runner::Ran {
                started_at,
                finished_at: runner.clock.now(),
            };
            crate::runner::permanent_result(&spec, &runner.config.id, &exec.tag, ran, reason)
        }
    };
    let report = runner.metrics.time(JobPhase::Report);
    let stored = async {
        let (key, inline) = runner
            .blobs
            .inline_or_store(&result, INLINE_LIMIT)
            .await
            .map_err(|e| e.to_string())?;
        let envelope = ResultMessage::Finished(ResultEnvelope {
            v: WIRE_VERSION,
            job_id: spec.job_id.clone(),
            run_id: spec.run_id.clone(),
            attempt: spec.attempt,
            result_ref: key,
            result: inline.map(Box::new),
        });
        let body = serde_json::to_vec(&envelope).map_err(|e| e.to_string())?;
        broker
            .publish(
                QueueName::Results,
                &body,
                &format!("{}.a{}", spec.job_id, spec.attempt),
            )
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    drop(report);
    match stored {
        Ok(()) => {
            crate::faults::point("worker.after_store").await;
            let held = claim.finish(true);
            ack(delivery, &spec, &settled).await;
            for d in held {
                info!(job = %spec.job_id, attempt = spec.attempt, "acking a held delivery: its attempt's result is reported");
                ack(d, &spec, &settled).await;
            }
            crate::faults::point("worker.after_ack").await;
        }
        Err(e) => {
            warn!(job = %spec.job_id, error = %e, "could not report the result; requeueing");
            let held = claim.finish(false);
            requeue(delivery, &settled).await;
            for d in held {
                requeue(d, &settled).await;
            }
        }
    }
}

async fn ack(delivery: Delivery, spec: &JobSpec, settled: &impl Fn(&str)) {
    settled("acked");
    if let Err(e) = delivery.settle().ack().await {
        warn!(job = %spec.job_id, error = %e, "ack failed; the job will be redelivered and its result deduplicated");
    }
}

async fn requeue(delivery: Delivery, settled: &impl Fn(&str)) {
    settled("requeued");
    tokio::time::sleep(Duration::from_millis(500)).await;
    if let Err(e) = delivery.settle().requeue().await {
        warn!(error = %e, "requeue failed; the broker will redeliver after the connection closes");
    }
}
