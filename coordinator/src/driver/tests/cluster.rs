//! The in-process test cluster: real [`Coordinator`]s over one [`MemoryRunStore`], one
//! [`MemoryBroker`] and object_store's in-memory store (through the worker's [`Blobs`]), and a
//! [`TestWorker`] that answers each job with what the test's closure says, publishing start
//! notices and result envelopes exactly as the real worker does (`worker::consumer`: the
//! result inlined when small, stored under its content key otherwise).
//!
//! No servers, no containers, no network, no fixed sleeps: a wait polls the run store (or the
//! worker's records, or a metric) every `POLL` until its condition holds, and fails the test
//! after `WAIT`. The worker takes one job at a time, in the order the broker delivers them.
//!
//! Coordinators share the broker: one can stop and another take over (a stopped consumer
//! hands back what it had not delivered, as RabbitMQ does when a channel closes).

use crate::driver::Coordinator;
use crate::metrics::CoordinatorMetrics;
use crate::store::memory::MemoryRunStore;
use serde_json::{json, Value};
use shared::engine::{NewRun, RunState};
use shared::graph::{load_bundle, GraphBundle};
use shared::ids::{JobId, RunId};
use shared::messages::{
    AgentConfig, Control, JobEnvelope, JobResult, JobSpec, JobStatus, RepoSnapshot, ResultEnvelope,
    ResultMessage, StartNotice, Usage, INLINE_LIMIT, WIRE_VERSION,
};
use shared::time::{Clock, SystemClock};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use worker::blobs::Blobs;
use worker::memory_queue::MemoryBroker;
use worker::queue::{Broker, Incoming, QueueName};

/// The longest any wait lasts before the test fails.
pub(super) const WAIT: Duration = Duration::from_secs(20);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(5);
/// The test worker's id, as results and start notices carry it.
pub(super) const WORKER: &str = "test-worker";

/// What the test worker does with a job.
pub(super) enum Answer {
    /// Reports this result once.
    Report(JobResult),
    /// Reports this result twice (a redelivered result: the same envelope published again).
    Twice(JobResult),
    /// Reports nothing (a hung or cut-off worker); the job is kept in [`TestWorker::held`].
    Silent,
}

/// The test's closure: the answer to each job the worker takes.
pub(super) type Answerer = Arc<dyn Fn(&JobSpec) -> Answer + Send + Sync>;

/// Three no-op nodes in a row and an exit that succeeds when all three did.
pub(super) const CHAIN: &str = r#"
name: chain
start: a
nodes:
  a: {kind: harness, op: noop, routes: [{to: b}]}
  b: {kind: harness, op: noop, routes: [{to: c}]}
  c: {kind: harness, op: noop, routes: [{to: done}]}
  done: {kind: exit, status: a.ok and b.ok and c.ok}
"#;

/// The result of `spec` with `status` and `output`, as a worker reports it (an error message
/// unless it is ok).
pub(super) fn result(spec: &JobSpec, status: JobStatus, output: Value) -> JobResult {
    let at = SystemClock.now();
    JobResult {
        v: WIRE_VERSION,
        job_id: spec.job_id.clone(),
        run_id: spec.run_id.clone(),
        attempt: spec.attempt,
        status,
        output,
        error: (status != JobStatus::Ok).then(|| format!("{} went wrong", spec.node)),
        commit: None,
        pack: None,
        artifacts: BTreeMap::new(),
        usage: Usage::default(),
        worker: WORKER.into(),
        execution: format!("e{}-test", spec.attempt),
        started_at: at,
        finished_at: at,
        container_seconds: 0.0,
        cached_from: None,
        events: Vec::new(),
    }
}

/// An ok result whose output is [`echo`].
pub(super) fn ok(spec: &JobSpec) -> Answer {
    Answer::Report(result(spec, JobStatus::Ok, echo(spec)))
}

/// The output [`ok`] reports: `{"node", "attempt", "value"}` (`value`: the job's `with.value`).
pub(super) fn echo(spec: &JobSpec) -> Value {
    json!({"node": spec.node, "attempt": spec.attempt, "value": spec.params.get("value")})
}

/// The graph bundle of `yaml` (no files beside it), checked.
fn bundle(yaml: &str) -> GraphBundle {
    load_bundle("graph.yaml", yaml, |p| {
        Err(format!("no file `{p}` in a test graph"))
    })
    .unwrap_or_else(|e| panic!("the test graph does not load: {e:?}"))
}

/// What the test worker saw.
#[derive(Default)]
struct Records {
    /// Every job taken, in order.
    jobs: Vec<JobSpec>,
    /// Jobs answered with [`Answer::Silent`].
    held: Vec<JobSpec>,
    /// Every result published, in order.
    reported: Vec<JobResult>,
    /// Jobs the coordinators asked the workers to stop.
    stops: Vec<JobId>,
    /// What went wrong inside the worker (shown by a wait that times out).
    problems: Vec<String>,
}

/// Consumes the jobs queue and answers each job with the test's closure.
pub(super) struct TestWorker {
    broker: Arc<MemoryBroker>,
    blobs: Blobs,
    answer: Answerer,
    records: Mutex<Records>,
}

impl TestWorker {
    fn records(&self) -> std::sync::MutexGuard<'_, Records> {
        self.records.lock().expect("worker records")
    }

    /// Every job taken so far, in order.
    pub(super) fn jobs(&self) -> Vec<JobSpec> {
        self.records().jobs.clone()
    }

    /// The jobs answered with silence so far.
    pub(super) fn held(&self) -> Vec<JobSpec> {
        self.records().held.clone()
    }

    /// The results published so far, in order.
    pub(super) fn reported(&self) -> Vec<JobResult> {
        self.records().reported.clone()
    }

    /// The jobs the coordinators asked to stop so far.
    pub(super) fn stops(&self) -> Vec<JobId> {
        self.records().stops.clone()
    }

    fn problem(&self, what: String) {
        self.records().problems.push(what);
    }

    async fn serve(
        self: Arc<Self>,
        mut jobs: mpsc::Receiver<Incoming>,
        mut control: mpsc::Receiver<Vec<u8>>,
        shutdown: CancellationToken,
    ) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                m = jobs.recv() => match m {
                    Some(m) => self.handle(m).await,
                    None => return,
                },
                Some(body) = control.recv() => match serde_json::from_slice::<Control>(&body) {
                    Ok(c) => self.records().stops.extend(c.stop_jobs),
                    Err(e) => self.problem(format!("a malformed control message: {e}")),
                },
            }
        }
    }

    /// One delivery, as `worker::consumer::handle` takes it: envelope, spec (inline or
    /// stored), start notice when asked, the result, then the ack.
    async fn handle(&self, msg: Incoming) {
        let env: JobEnvelope = match serde_json::from_slice(&msg.body) {
            Ok(e) => e,
            Err(e) => {
                self.problem(format!("not a job envelope: {e}"));
                let _ = msg.reject().await;
                return;
            }
        };
        let spec = match env.spec {
            Some(inline) => *inline,
            None => match self.blobs.get_content::<JobSpec>(&env.spec_ref).await {
                Ok(s) => s,
                Err(e) => {
                    self.problem(format!("the spec of {} is not readable: {e}", env.job_id));
                    let _ = msg.reject().await;
                    return;
                }
            },
        };
        if (&spec.job_id, spec.attempt) != (&env.job_id, env.attempt) {
            self.problem(format!("envelope {} does not match its spec", env.job_id));
        }
        self.records().jobs.push(spec.clone());
        if spec.notify_start {
            let notice = ResultMessage::Started(StartNotice {
                v: WIRE_VERSION,
                job_id: spec.job_id.clone(),
                run_id: spec.run_id.clone(),
                attempt: spec.attempt,
                worker: WORKER.into(),
            });
            let body = serde_json::to_vec(&notice).expect("a start notice serializes");
            let id = format!("{}.a{}.started", spec.job_id, spec.attempt);
            if let Err(e) = self.broker.publish(QueueName::Results, &body, &id).await {
                self.problem(format!("could not announce {}: {e}", spec.job_id));
            }
        }
        match (self.answer)(&spec) {
            Answer::Report(r) => self.report(&r).await,
            Answer::Twice(r) => {
                self.report(&r).await;
                self.report(&r).await;
            }
            Answer::Silent => self.records().held.push(spec),
        }
        let _ = msg.ack().await;
    }

    /// Publishes `result` as the real worker does: inlined when small, stored under its
    /// content key otherwise, in a `finished` result message.
    pub(super) async fn report(&self, result: &JobResult) {
        let (key, inline) = self
            .blobs
            .inline_or_store(result, INLINE_LIMIT)
            .await
            .expect("the result is stored");
        let envelope = ResultMessage::Finished(ResultEnvelope {
            v: WIRE_VERSION,
            job_id: result.job_id.clone(),
            run_id: result.run_id.clone(),
            attempt: result.attempt,
            result_ref: key,
            result: inline.map(Box::new),
        });
        let body = serde_json::to_vec(&envelope).expect("a result envelope serializes");
        let id = format!("{}.a{}", result.job_id, result.attempt);
        self.broker
            .publish(QueueName::Results, &body, &id)
            .await
            .expect("the result is published");
        self.records().reported.push(result.clone());
    }
}

/// A coordinator serving (relay, result consumers, watchdog, recovery, retention) until it is
/// stopped or dropped.
pub(super) struct Running {
    pub(super) coord: Arc<Coordinator>,
    shutdown: CancellationToken,
    serving: Option<JoinHandle<()>>,
}

impl Running {
    /// Stops every task of the coordinator and waits until they ended.
    pub(super) async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(serving) = self.serving.take() {
            serving.await.expect("the coordinator stops cleanly");
        }
    }

    /// How many events this coordinator applied with the outcome `applied` (`changed`,
    /// `duplicate`, `stale`, `ignored`).
    pub(super) fn events(&self, applied: &str) -> u64 {
        self.coord
            .metrics
            .events
            .with_label_values(&[applied])
            .get()
    }

    /// How many runs this coordinator finished with `status` (`succeeded`, `failed`, ...).
    pub(super) fn finished(&self, status: &str) -> u64 {
        self.coord
            .metrics
            .runs_finished
            .with_label_values(&[status])
            .get()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// One store, one broker, one object store and one test worker; coordinators on demand.
pub(super) struct Cluster {
    pub(super) store: Arc<MemoryRunStore>,
    pub(super) blobs: Blobs,
    pub(super) worker: Arc<TestWorker>,
    broker: Arc<MemoryBroker>,
    shutdown: CancellationToken,
}

impl Cluster {
    /// A cluster whose worker answers each job with `answer`.
    pub(super) fn new(answer: impl Fn(&JobSpec) -> Answer + Send + Sync + 'static) -> Self {
        let broker = Arc::new(MemoryBroker::default());
        let store = object_store::memory::InMemory::new();
        let blobs = Blobs::from_store(Arc::new(store), "cluster");
        let worker = Arc::new(TestWorker {
            broker: broker.clone(),
            blobs: blobs.clone(),
            answer: Arc::new(answer),
            records: Mutex::default(),
        });
        let shutdown = CancellationToken::new();
        // Both before any coordinator runs: no job and no stop is missed.
        let jobs = broker.subscribe(QueueName::Jobs, 64);
        let control = broker.listen();
        tokio::spawn(worker.clone().serve(jobs, control, shutdown.clone()));
        Self {
            store: Arc::new(MemoryRunStore::default()),
            blobs,
            worker,
            broker,
            shutdown,
        }
    }

    /// Starts a coordinator `id` over the cluster.
    pub(super) fn coordinator(&self, id: &str) -> Running {
        self.coordinator_with(id, |_| {})
    }

    /// Starts a coordinator `id` over the cluster, `configure`d first (graces, retention).
    pub(super) fn coordinator_with(
        &self,
        id: &str,
        configure: impl FnOnce(&mut Coordinator),
    ) -> Running {
        let mut coord = Coordinator::new(
            id.into(),
            self.store.clone(),
            self.broker.clone(),
            self.blobs.clone(),
            CoordinatorMetrics::new(),
        );
        configure(&mut coord);
        let coord = Arc::new(coord);
        let shutdown = CancellationToken::new();
        let serving = tokio::spawn(coord.clone().serve(shutdown.clone()));
        Running {
            coord,
            shutdown,
            serving: Some(serving),
        }
    }

    /// The run's state (its stored deltas replayed on its snapshot) and store version.
    pub(super) async fn load(&self, run: &RunId) -> (RunState, u64) {
        let reader = Coordinator::new(
            "reader".into(),
            self.store.clone(),
            self.broker.clone(),
            self.blobs.clone(),
            CoordinatorMetrics::new(),
        );
        let (state, version, _) = (reader.stored(run).await)
            .expect("the memory store answers")
            .unwrap_or_else(|| panic!("run `{run}` is not in the store"));
        (state, version)
    }

    /// Waits until the stored state of `run` satisfies `done` and returns it.
    pub(super) async fn wait_run(
        &self,
        run: &RunId,
        what: &str,
        done: impl Fn(&RunState) -> bool,
    ) -> RunState {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let (state, _) = self.load(run).await;
            if done(&state) {
                return state;
            }
            if tokio::time::Instant::now() > deadline {
                let history: Vec<&str> = state.history.iter().map(|o| o.node.as_str()).collect();
                panic!(
                    "run `{run}`: not {what} within {WAIT:?}: status {:?}, history {history:?}, \
                     jobs {:?}, worker problems {:?}",
                    state.status,
                    state.jobs,
                    self.worker.records().problems
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until the run is finished (succeeded, failed or cancelled).
    pub(super) async fn wait_finished(&self, run: &RunId) -> RunState {
        self.wait_run(run, "finished", |s| s.status.is_terminal())
            .await
    }

    /// Waits until `probe` holds (a metric, the worker's records).
    pub(super) async fn eventually(&self, what: &str, probe: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !probe() {
            assert!(
                tokio::time::Instant::now() <= deadline,
                "not {what} within {WAIT:?}; worker problems {:?}",
                self.worker.records().problems
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until the worker holds (answered with silence) a job of `node` and returns it.
    pub(super) async fn held(&self, node: &str) -> JobSpec {
        let find = || {
            self.worker
                .held()
                .into_iter()
                .rev()
                .find(|j| j.node.as_str() == node)
        };
        self.eventually(&format!("holding a job of `{node}`"), || find().is_some())
            .await;
        find().expect("found above")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Creates a run of `yaml` with `input` through `coord` (what `submit` does once its preflight
/// passed: the bundle stored, the run created with its first jobs), under the graph's name.
pub(super) async fn start_run(coord: &Coordinator, yaml: &str, input: Value) -> RunId {
    let bundle = bundle(yaml);
    let graph_ref = format!("graphs/{}.json", bundle.hash());
    coord
        .blobs
        .put_json(&graph_ref, &bundle)
        .await
        .expect("the bundle is stored");
    let run_id = RunId::new(format!("{}-run", bundle.graph.name));
    let state = RunState::new(
        NewRun {
            run_id: run_id.clone(),
            graph_ref,
            input,
            meta: json!({}),
            repo: RepoSnapshot::default(),
            agent: AgentConfig::default(),
        },
        &bundle,
        coord.clock.now(),
    );
    let created = coord
        .create_run(state, &bundle)
        .await
        .expect("the run starts");
    assert!(created, "run `{run_id}` is new");
    run_id
}

/// The nodes of the run's history, in order.
pub(super) fn history(state: &RunState) -> Vec<&str> {
    state.history.iter().map(|o| o.node.as_str()).collect()
}

/// The run's result file as the driver wrote it to object storage.
pub(super) async fn result_file(blobs: &Blobs, run: &RunId) -> Value {
    blobs
        .get_json(&format!("runs/{run}/result.json"))
        .await
        .expect("the result file is written")
}
