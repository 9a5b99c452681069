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
use shared::ids::JobId;
use shared::messages::{JobResult, JobStatus};
use shared::time::ManualClock;
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
    async fn image_id(&self, _image: &str) -> Result<Option<String>, SandboxError> {
        Ok(None)
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
            gateway: None,
        }
    }
    async fn kill_strays(&self) -> Result<(), SandboxError> {
        Ok(())
    }
    fn isolated(&self) -> bool {
        true
    }
}

/// The time on the runner's clock (a manual one: results carry it).
fn now() -> chrono::DateTime<chrono::Utc> {
    "2026-11-22T10:00:00.123Z".parse().unwrap()
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
        images: Default::default(),
    };
    let runner = Runner::new(config, blobs, sandbox.clone(), Metrics::new())
        .unwrap()
        .with_clock(Arc::new(ManualClock::new(now())));
    let runner = Arc::new(runner);
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
        team: None,
        image: None,
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
        for m in self.messages().await {
            match m {
                ResultMessage::Finished(env) => {
                    out.push(*env.result.expect("small results ride inline"))
                }
                ResultMessage::Started(n) => panic!("a start notice nobody asked for: {n:?}"),
                other => panic!("workers send no message between runs: {other:?}"),
            }
        }
        out
    }

    /// Every message published on the results queue so far.
    async fn messages(&mut self) -> Vec<ResultMessage> {
        let mut out = Vec::new();
        while let Ok(Some(m)) =
            tokio::time::timeout(Duration::from_millis(300), self.results.recv()).await
        {
            out.push(ResultMessage::decode(&m.body).expect("a result message"));
        }
        out
    }

    /// The job asks for a start notice (`JobSpec::notify_start`).
    fn announcing(mut self) -> Self {
        let mut env: JobEnvelope = serde_json::from_slice(&self.envelope).unwrap();
        env.spec.as_mut().expect("an inline spec").notify_start = true;
        self.envelope = serde_json::to_vec(&env).unwrap();
        self
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
async fn a_job_that_asks_announces_its_start_before_its_result() {
    let mut f = fixture(FakeSandbox::default()).await.announcing();
    f.sandbox.gate.add_permits(100);
    let msg = f.deliver().await;
    handle(&f.runner, f.broker.as_ref(), &Executions::default(), msg).await;
    match f.messages().await.as_slice() {
        [ResultMessage::Started(notice), ResultMessage::Finished(env)] => {
            assert_eq!(notice.v, WIRE_VERSION);
            assert_eq!(notice.worker, "w1");
            assert_eq!((notice.job_id.as_str(), notice.attempt), ("r1.a.1", 1));
            assert_eq!(notice.run_id, env.run_id);
            assert_eq!(env.result.as_ref().map(|r| r.status), Some(JobStatus::Ok));
            let times = env.result.as_ref().map(|r| (r.started_at, r.finished_at));
            assert_eq!(
                times,
                Some((now(), now())),
                "the times are the runner's clock's"
            );
        }
        other => panic!("a start notice, then the result: {other:?}"),
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
    assert_eq!(
        (results[0].started_at, results[0].finished_at),
        (now(), now())
    );
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
    assert_eq!(
        (results[0].started_at, results[0].finished_at),
        (now(), now())
    );
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
