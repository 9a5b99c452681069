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

use crate::queue::{Broker, Incoming, QueueName};
use crate::runner::Runner;
use shared::ids::{Attempt, JobId};
use shared::messages::{JobEnvelope, JobSpec, ResultEnvelope, INLINE_LIMIT, WIRE_VERSION};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
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
    let executions = Arc::new(Executions::default());
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

/// A delivery that cannot be stranded: dropped unsettled (a panic on the way, a task torn
/// down), it is requeued rather than left holding a prefetch slot until the consumer timeout.
pub(crate) struct Delivery {
    msg: Option<Incoming>,
}

impl Delivery {
    pub(crate) fn new(msg: Incoming) -> Self {
        Self { msg: Some(msg) }
    }

    fn incoming(&self) -> &Incoming {
        self.msg.as_ref().expect("a delivery is settled once")
    }

    /// Takes the message out to settle it.
    fn settle(mut self) -> Incoming {
        self.msg.take().expect("a delivery is settled once")
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        let Some(msg) = self.msg.take() else {
            return;
        };
        warn!("a delivery was dropped unsettled; requeueing it");
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if let Err(e) = msg.requeue().await {
                        warn!(error = %e, "requeue failed; the broker will redeliver after the connection closes");
                    }
                });
            }
            Err(_) => {
                warn!("no runtime to requeue on; the broker will redeliver after the connection closes")
            }
        }
    }
}

type Key = (JobId, Attempt);

/// How many reported attempts a worker remembers (to ack their late duplicates at once).
const REMEMBERED: usize = 4096;

/// The (job, attempt) executions running in this worker, with the deliveries of each that came
/// while it ran, and the attempts it reported lately.
#[derive(Default)]
pub(crate) struct Executions {
    state: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    running: HashMap<Key, Vec<Delivery>>,
    reported: HashSet<Key>,
    order: VecDeque<Key>,
}

impl Registry {
    fn remember(&mut self, key: Key) {
        if self.reported.insert(key.clone()) {
            self.order.push_back(key);
            while self.order.len() > REMEMBERED {
                if let Some(old) = self.order.pop_front() {
                    self.reported.remove(&old);
                }
            }
        }
    }
}

/// What to do with a delivery.
pub(crate) enum Admission<'a> {
    /// Run it: the first execution of its attempt here.
    Run(Claim<'a>, Delivery),
    /// Its attempt runs here: the delivery is held and settled when that execution ends.
    Held,
    /// Its attempt's result was reported by this worker: ack it.
    Reported(Delivery),
}

impl Executions {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn admit(&self, job: &JobId, attempt: Attempt, delivery: Delivery) -> Admission<'_> {
        let key = (job.clone(), attempt);
        let mut st = self.lock();
        if st.reported.contains(&key) {
            return Admission::Reported(delivery);
        }
        if let Some(held) = st.running.get_mut(&key) {
            held.push(delivery);
            return Admission::Held;
        }
        st.running.insert(key.clone(), Vec::new());
        Admission::Run(
            Claim {
                executions: self,
                key,
                finished: false,
            },
            delivery,
        )
    }

    /// Attempts running here.
    #[cfg(test)]
    fn running(&self) -> usize {
        self.lock().running.len()
    }
}

/// The one execution of an attempt in this worker. Dropped without `finish` (a panic), its held
/// deliveries are requeued.
pub(crate) struct Claim<'a> {
    executions: &'a Executions,
    key: Key,
    finished: bool,
}

impl Claim<'_> {
    /// Ends the execution; `reported` when its result is stored and published. Returns the
    /// deliveries held for it meanwhile.
    pub(crate) fn finish(mut self, reported: bool) -> Vec<Delivery> {
        self.finished = true;
        let mut st = self.executions.lock();
        let held = st.running.remove(&self.key).unwrap_or_default();
        if reported {
            st.remember(self.key.clone());
        }
        held
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let held = self.executions.lock().running.remove(&self.key);
            drop(held); // each one requeues itself
        }
    }
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
        Err(crate::blobs::BlobError::Store(object_store::Error::NotFound { .. }))
        | Err(crate::blobs::BlobError::Decode { .. })
        | Err(crate::blobs::BlobError::Corrupt { .. }) => {
            error!(job = %env.job_id, spec = %env.spec_ref, "poison job: spec missing or unreadable; dead-lettering");
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
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let result = match runner.run(&spec).await {
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
            crate::runner::permanent_result(&spec, &runner.config.id, started_at, reason)
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

#[cfg(test)]
mod tests {
    //! The supervised paths in process: the memory broker, a file store, and a fake sandbox
    //! whose `start` panics or whose commands wait for the test.
    use super::*;
    use crate::blobs::Blobs;
    use crate::memory_queue::MemoryBroker;
    use crate::metrics::Metrics;
    use crate::runner::WorkerConfig;
    use crate::sandbox::{ExecOutput, Limits, Mounts, Sandbox, SandboxError, SandboxSpec, Session};
    use async_trait::async_trait;
    use serde_json::json;
    use shared::messages::{JobResult, JobStatus};
    use tokio::sync::mpsc;

    struct FakeSandbox {
        panic_on_start: bool,
        /// `start` fails with this error (made anew each time).
        fail_on_start: Option<fn() -> SandboxError>,
        /// Commands wait for a permit: the test decides when the job ends.
        gate: Arc<Semaphore>,
        started: std::sync::Mutex<Vec<String>>,
        removed_by_name: std::sync::Mutex<Vec<String>>,
    }

    impl Default for FakeSandbox {
        fn default() -> Self {
            Self {
                panic_on_start: false,
                fail_on_start: None,
                gate: Arc::new(Semaphore::new(0)),
                started: Default::default(),
                removed_by_name: Default::default(),
            }
        }
    }

    struct FakeSession {
        gate: Arc<Semaphore>,
    }

    #[async_trait]
    impl Sandbox for FakeSandbox {
        async fn start(&self, spec: &SandboxSpec) -> Result<Box<dyn Session>, SandboxError> {
            self.started.lock().unwrap().push(spec.name.clone());
            if self.panic_on_start {
                panic!("boom in the sandbox");
            }
            if let Some(fail) = self.fail_on_start {
                return Err(fail());
            }
            Ok(Box::new(FakeSession {
                gate: self.gate.clone(),
            }))
        }
        async fn reap(&self, _worker_id: &str) -> Result<usize, SandboxError> {
            Ok(0)
        }
        async fn remove_named(&self, name: &str) -> Result<(), SandboxError> {
            self.removed_by_name.lock().unwrap().push(name.to_string());
            Ok(())
        }
        fn name(&self) -> &'static str {
            "fake"
        }
    }

    #[async_trait]
    impl Session for FakeSession {
        async fn exec(
            &self,
            _argv: &[String],
            _stdin: Option<Vec<u8>>,
            _timeout: Duration,
        ) -> Result<ExecOutput, SandboxError> {
            let _permit = self.gate.acquire().await.expect("gate open");
            Ok(ExecOutput::default())
        }
        async fn remove(&self) -> Result<(), SandboxError> {
            Ok(())
        }
        fn mounts(&self) -> Mounts {
            Mounts {
                work: "/work".into(),
                harness: None,
            }
        }
        async fn kill_strays(&self) -> Result<(), SandboxError> {
            Ok(())
        }
        fn isolated(&self) -> bool {
            true
        }
    }

    struct Fixture {
        _tmp: tempfile::TempDir,
        jobs_dir: std::path::PathBuf,
        runner: Arc<Runner>,
        sandbox: Arc<FakeSandbox>,
        broker: Arc<MemoryBroker>,
        jobs: mpsc::Receiver<Incoming>,
        results: mpsc::Receiver<Incoming>,
        envelope: Vec<u8>,
    }

    async fn fixture(sandbox: FakeSandbox) -> Fixture {
        fixture_for(sandbox, "a").await
    }

    /// A job of the node `node` of a graph whose only job node is `a`.
    async fn fixture_for(sandbox: FakeSandbox, node: &str) -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let store = format!("file://{}", tmp.path().join("store").display());
        let blobs = Blobs::open(&store, "").unwrap();
        let yaml = "name: t\nstart: a\ndefaults:\n  image: img\nnodes:\n  a:\n    kind: command\n    commands: ['true']\n    routes:\n      - to: done\n  done:\n    kind: exit\n    status: a.ok\n";
        let bundle = shared::graph::load_bundle("t.yaml", yaml, |_| Err("no files".into()))
            .expect("a valid graph");
        blobs.put_json("graphs/t.json", &bundle).await.unwrap();
        let sandbox = Arc::new(sandbox);
        let config = WorkerConfig {
            id: "w1".into(),
            work_dir: tmp.path().join("work"),
            concurrency: 2,
            sandbox_user: "1000:1000".into(),
            llm: Default::default(),
            limits: Limits::default(),
        };
        let runner = Arc::new(Runner::new(config, blobs, sandbox.clone(), Metrics::new()).unwrap());
        let spec: JobSpec = serde_json::from_value(json!({
            "v": WIRE_VERSION, "job_id": "r1.a.1", "run_id": "r1", "node": node, "visit": 1,
            "attempt": 1, "kind": "command", "graph_ref": "graphs/t.json", "image": "img",
            "timeout_seconds": 60, "params": {}, "context_files": [], "commands": ["true"],
            "worktree": null, "artifact_prefix": "runs/r1/a_1/",
            "agent": shared::messages::AgentConfig::default(), "vars": null,
        }))
        .unwrap();
        let envelope = serde_json::to_vec(&JobEnvelope {
            v: WIRE_VERSION,
            job_id: spec.job_id.clone(),
            run_id: spec.run_id.clone(),
            attempt: spec.attempt,
            spec_ref: "blobs/unused".into(),
            spec: Some(Box::new(spec)),
        })
        .unwrap();
        let broker = Arc::new(MemoryBroker::default());
        let jobs = broker.subscribe(QueueName::Jobs, 8);
        let results = broker.subscribe(QueueName::Results, 8);
        Fixture {
            jobs_dir: tmp.path().join("work/jobs"),
            _tmp: tmp,
            runner,
            sandbox,
            broker,
            jobs,
            results,
            envelope,
        }
    }

    impl Fixture {
        async fn deliver(&mut self) -> Incoming {
            self.broker
                .publish(QueueName::Jobs, &self.envelope, "job")
                .await
                .unwrap();
            self.jobs.recv().await.unwrap()
        }

        /// The results published so far (the memory broker forwards them on a task of its own).
        async fn results(&mut self) -> Vec<JobResult> {
            let mut out = Vec::new();
            while let Ok(Some(m)) =
                tokio::time::timeout(Duration::from_millis(300), self.results.recv()).await
            {
                let env: ResultEnvelope = serde_json::from_slice(&m.body).unwrap();
                out.push(*env.result.expect("small results ride inline"));
            }
            out
        }

        /// Nothing comes back to the jobs queue (a requeue would, after 500 ms).
        async fn assert_nothing_requeued(&mut self) {
            let again = tokio::time::timeout(Duration::from_millis(1200), self.jobs.recv()).await;
            assert!(again.is_err(), "a delivery was requeued");
        }

        fn job_folders(&self) -> usize {
            std::fs::read_dir(&self.jobs_dir).unwrap().count()
        }

        fn deliveries(&self, how: &str) -> u64 {
            self.runner
                .metrics
                .deliveries
                .with_label_values(&[how])
                .get()
        }
    }

    #[tokio::test]
    async fn a_panicking_job_is_cleaned_up_reported_as_an_error_and_acked() {
        let mut f = fixture(FakeSandbox {
            panic_on_start: true,
            ..Default::default()
        })
        .await;
        let executions = Executions::default();
        let msg = f.deliver().await;
        handle(&f.runner, f.broker.as_ref(), &executions, msg).await;

        let results = f.results().await;
        assert_eq!(results.len(), 1, "exactly one result: {results:?}");
        assert_eq!(results[0].status, JobStatus::Error);
        assert_eq!(
            results[0].error.as_deref(),
            Some("the worker panicked running this job: boom in the sandbox")
        );
        assert_eq!(results[0].attempt, 1);
        // The container of the execution was removed by its name; the folder is gone.
        let started = f.sandbox.started.lock().unwrap().clone();
        assert_eq!(started.len(), 1);
        assert!(
            started[0].starts_with("fleet-w1-r1.a.1-a1-e1-"),
            "{started:?}"
        );
        assert_eq!(*f.sandbox.removed_by_name.lock().unwrap(), started);
        assert_eq!(f.job_folders(), 0, "the job folder was removed");
        assert_eq!(executions.running(), 0);
        // The delivery was acked, not requeued nor left unsettled.
        assert_eq!(f.deliveries("acked"), 1);
        f.assert_nothing_requeued().await;
        assert!(f
            .runner
            .metrics
            .render()
            .contains("fleet_worker_job_panics_total 1"));
    }

    #[tokio::test]
    async fn a_second_delivery_of_a_running_attempt_is_held_then_acked_with_the_first() {
        let mut f = fixture(FakeSandbox::default()).await;
        let executions = Arc::new(Executions::default());

        let first = f.deliver().await;
        let (runner, broker, ex) = (f.runner.clone(), f.broker.clone(), executions.clone());
        let running = tokio::spawn(async move {
            handle(&runner, broker.as_ref(), &ex, first).await;
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while f.sandbox.started.lock().unwrap().is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the job never started"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        // The duplicate returns at once: held, not run, not settled.
        let second = f.deliver().await;
        handle(&f.runner, f.broker.as_ref(), &executions, second).await;
        assert_eq!(
            f.sandbox.started.lock().unwrap().len(),
            1,
            "never run twice"
        );
        assert_eq!(executions.running(), 1);
        assert_eq!(f.deliveries("acked"), 0);
        assert_eq!(f.job_folders(), 1);

        // The first ends: one result, both deliveries acked, nothing left behind.
        f.sandbox.gate.add_permits(100);
        running.await.unwrap();
        let results = f.results().await;
        assert_eq!(results.len(), 1, "one result for the attempt: {results:?}");
        assert_eq!(results[0].status, JobStatus::Ok, "{results:?}");
        assert_eq!(f.deliveries("acked"), 2);
        assert_eq!(executions.running(), 0);
        assert_eq!(f.job_folders(), 0);
        f.assert_nothing_requeued().await;

        // A late delivery of the reported attempt is acked without running.
        let late = f.deliver().await;
        handle(&f.runner, f.broker.as_ref(), &executions, late).await;
        assert_eq!(f.sandbox.started.lock().unwrap().len(), 1);
        assert!(f.results().await.is_empty());
        assert_eq!(f.deliveries("acked"), 3);
        let metrics = f.runner.metrics.render();
        assert!(
            metrics.contains(r#"fleet_worker_duplicate_deliveries_total{state="running"} 1"#),
            "{metrics}"
        );
        assert!(
            metrics.contains(r#"fleet_worker_duplicate_deliveries_total{state="reported"} 1"#),
            "{metrics}"
        );
    }

    #[tokio::test]
    async fn a_delivery_dropped_unsettled_is_requeued() {
        let mut f = fixture(FakeSandbox::default()).await;
        let msg = f.deliver().await;
        drop(Delivery::new(msg));
        let again = tokio::time::timeout(Duration::from_secs(5), f.jobs.recv())
            .await
            .expect("requeued")
            .unwrap();
        assert_eq!(again.delivery_count, 1);
    }

    #[tokio::test]
    async fn an_execution_torn_down_requeues_the_deliveries_held_for_it() {
        let mut f = fixture(FakeSandbox::default()).await;
        let executions = Executions::default();
        let job = JobId::new("r1.a.1");
        let first = Delivery::new(f.deliver().await);
        let Admission::Run(claim, first) = executions.admit(&job, 1, first) else {
            panic!("the first delivery runs");
        };
        let second = Delivery::new(f.deliver().await);
        assert!(matches!(executions.admit(&job, 1, second), Admission::Held));
        // Another attempt of the same job is another execution.
        let other = Delivery::new(f.deliver().await);
        let Admission::Run(other_claim, other) = executions.admit(&job, 2, other) else {
            panic!("attempt 2 runs");
        };
        drop(claim); // as a panic in `handle` would
        assert_eq!(executions.running(), 1);
        let again = tokio::time::timeout(Duration::from_secs(5), f.jobs.recv())
            .await
            .expect("the held delivery was requeued")
            .unwrap();
        assert_eq!(again.delivery_count, 1);
        drop(other_claim.finish(true));
        let _ = first.settle();
        let _ = other.settle();
    }

    #[tokio::test]
    async fn a_permanent_failure_is_reported_as_an_error_at_once_and_acked() {
        // The job names a node its graph does not have: no other try can pass.
        let mut f = fixture_for(FakeSandbox::default(), "ghost").await;
        let executions = Executions::default();
        let msg = f.deliver().await;
        handle(&f.runner, f.broker.as_ref(), &executions, msg).await;

        let results = f.results().await;
        assert_eq!(results.len(), 1, "one result: {results:?}");
        assert_eq!(results[0].status, JobStatus::Error);
        assert_eq!(results[0].attempt, 1, "the attempt is counted");
        let error = results[0].error.as_deref().unwrap();
        assert!(error.contains("permanent"), "{error}");
        assert!(error.contains("node `ghost` is not in"), "{error}");
        assert!(f.sandbox.started.lock().unwrap().is_empty());
        assert_eq!(f.deliveries("acked"), 1);
        assert_eq!(f.deliveries("requeued"), 0);
        f.assert_nothing_requeued().await;
        assert_eq!(f.job_folders(), 0, "the job folder was removed");
        assert_eq!(executions.running(), 0);
        let metrics = f.runner.metrics.render();
        assert!(
            metrics.contains(r#"fleet_worker_job_failures_total{class="permanent"} 1"#),
            "{metrics}"
        );
    }

    #[tokio::test]
    async fn a_transient_failure_is_requeued_as_before() {
        let mut f = fixture(FakeSandbox {
            fail_on_start: Some(|| SandboxError::Io(std::io::Error::other("docker socket"))),
            ..Default::default()
        })
        .await;
        let executions = Executions::default();
        let msg = f.deliver().await;
        handle(&f.runner, f.broker.as_ref(), &executions, msg).await;
        let again = tokio::time::timeout(Duration::from_secs(5), f.jobs.recv())
            .await
            .expect("requeued")
            .unwrap();
        assert_eq!(again.delivery_count, 1);
        assert!(
            f.results().await.is_empty(),
            "no result for a transient failure"
        );
        assert_eq!(f.deliveries("requeued"), 1);
        assert_eq!(f.deliveries("acked"), 0);
        assert_eq!(f.job_folders(), 0);
        let _ = again.ack().await;
    }

    #[tokio::test]
    async fn a_sandbox_that_refuses_is_a_permanent_failure() {
        let mut f = fixture(FakeSandbox {
            fail_on_start: Some(|| SandboxError::Refused("the sandbox user is root".into())),
            ..Default::default()
        })
        .await;
        let executions = Executions::default();
        let msg = f.deliver().await;
        handle(&f.runner, f.broker.as_ref(), &executions, msg).await;
        let results = f.results().await;
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].status, JobStatus::Error);
        assert!(results[0].error.as_deref().unwrap().contains("root"));
        f.assert_nothing_requeued().await;
    }
}
