//! The worker's loop: take a job, run it, store the result, publish the result envelope, and
//! only then ack. A poison message (unreadable envelope or spec) is rejected and dead-lettered;
//! a transient failure requeues the job (the delivery limit bounds how often).

use crate::queue::{Broker, Incoming, QueueName};
use crate::runner::{RunError, Runner};
use shared::messages::{JobEnvelope, JobSpec, ResultEnvelope, INLINE_LIMIT, WIRE_VERSION};
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
                }
                Err(e) => warn!(error = %e, "ignoring a malformed control message"),
            }
        }
    });
    let concurrency = runner.config.concurrency.max(1);
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut jobs = broker.subscribe(QueueName::Jobs, concurrency as u16);
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
        tokio::spawn(async move {
            handle(&runner, broker.as_ref(), msg).await;
            drop(permit);
        });
    }
    // Wait for the jobs in hand.
    let _ = permits.acquire_many(concurrency as u32).await;
    info!(worker = %runner.config.id, "worker stopped");
}

async fn handle(runner: &Runner, broker: &dyn Broker, msg: Incoming) {
    let settled = |how: &str| runner.metrics.deliveries.with_label_values(&[how]).inc();
    let env: JobEnvelope = match serde_json::from_slice(&msg.body) {
        Ok(e) => e,
        Err(e) => {
            error!(error = %e, "poison message: not a job envelope; dead-lettering");
            settled("rejected");
            let _ = msg.reject().await;
            return;
        }
    };
    let fetched = match env.spec.clone() {
        Some(inline) => Ok(*inline),
        None => runner.blobs.get_content::<JobSpec>(&env.spec_ref).await,
    };
    let spec: JobSpec = match fetched {
        Ok(s) => s,
        Err(crate::blobs::BlobError::Store(object_store::Error::NotFound { .. }))
        | Err(crate::blobs::BlobError::Decode { .. })
        | Err(crate::blobs::BlobError::Corrupt { .. }) => {
            error!(job = %env.job_id, spec = %env.spec_ref, "poison job: spec missing or unreadable; dead-lettering");
            settled("rejected");
            let _ = msg.reject().await;
            return;
        }
        Err(e) => {
            warn!(job = %env.job_id, error = %e, "cannot read the job spec; requeueing");
            requeue(msg, &settled).await;
            return;
        }
    };
    info!(job = %spec.job_id, attempt = spec.attempt, delivery = msg.delivery_count, node = %spec.node, "job started");
    if spec.notify_start {
        let notice = ResultEnvelope {
            v: WIRE_VERSION,
            job_id: spec.job_id.clone(),
            run_id: spec.run_id.clone(),
            attempt: spec.attempt,
            result_ref: String::new(),
            result: None,
            started: Some(runner.config.id.clone()),
        };
        let body = serde_json::to_vec(&notice).expect("envelope serializes");
        let id = format!("{}.a{}.started", spec.job_id, spec.attempt);
        if let Err(e) = broker.publish(QueueName::Results, &body, &id).await {
            // Only the watchdog misses it: the job itself goes on.
            warn!(job = %spec.job_id, error = %e, "could not announce the job's start");
        }
    }
    let result = match runner.run(&spec).await {
        Ok(r) => r,
        Err(RunError::Transient(reason)) => {
            warn!(job = %spec.job_id, %reason, "job hit a transient failure; requeueing");
            requeue(msg, &settled).await;
            return;
        }
    };
    let stored = async {
        let (key, inline) = runner
            .blobs
            .inline_or_store(&result, INLINE_LIMIT)
            .await
            .map_err(|e| e.to_string())?;
        let envelope = ResultEnvelope {
            v: WIRE_VERSION,
            job_id: spec.job_id.clone(),
            run_id: spec.run_id.clone(),
            attempt: spec.attempt,
            result_ref: key,
            result: inline.map(Box::new),
            started: None,
        };
        let body = serde_json::to_vec(&envelope).expect("envelope serializes");
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
    match stored {
        Ok(()) => {
            settled("acked");
            if let Err(e) = msg.ack().await {
                warn!(job = %spec.job_id, error = %e, "ack failed; the job will be redelivered and its result deduplicated");
            }
        }
        Err(e) => {
            warn!(job = %spec.job_id, error = %e, "could not report the result; requeueing");
            requeue(msg, &settled).await;
        }
    }
}

async fn requeue(msg: Incoming, settled: &impl Fn(&str)) {
    settled("requeued");
    tokio::time::sleep(Duration::from_millis(500)).await;
    if let Err(e) = msg.requeue().await {
        warn!(error = %e, "requeue failed; the broker will redeliver after the connection closes");
    }
}
