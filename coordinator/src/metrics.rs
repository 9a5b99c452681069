//! Prometheus metrics of a coordinator. Labels stay bounded.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

#[derive(Clone)]
pub struct CoordinatorMetrics {
    pub registry: Registry,
    pub runs_created: IntCounter,
    pub runs_finished: IntCounterVec,
    pub events: IntCounterVec,
    pub cas_conflicts: IntCounter,
    pub jobs_published: IntCounter,
    pub reissued: IntCounter,
    pub restored: IntCounter,
    /// Messages on the results or dead-letter queue that could not be read, dead-lettered.
    pub poison: IntCounter,
    /// Repository packs clients uploaded, by outcome: `stored` (new bytes), `known` (the
    /// bytes were stored already), `refused`.
    pub uploads: IntCounterVec,
    /// Bytes of uploaded packs written to object storage (not those found there already).
    pub upload_bytes_stored: IntCounter,
    /// Job messages that waited in their team's line (its `concurrent_jobs`).
    pub jobs_held: IntCounter,
    /// Whole runs read from the run store: a state this coordinator did not hold at the
    /// store's head (a run committed elsewhere, let go, or first seen here).
    pub store_loads: IntCounter,
    /// Seconds each phase of a group commit took (`load`, `engine`, `outbox`, `store`,
    /// `mirror`, `after`): where a result's cost goes in the coordinator.
    pub commit_phase: HistogramVec,
    /// Writes to a run's mirror in object storage, by kind (`snapshot`, `delta`).
    pub mirror_writes: IntCounterVec,
    /// Bytes written to runs' mirrors, by kind.
    pub mirror_bytes: IntCounterVec,
    /// Ids looked for in the mirror, by who answered: `found` or `missing` (object storage
    /// was asked), `store` (the reconciled store vouched that the mirror holds no such run).
    pub mirror_lookups: IntCounterVec,
    /// Reconciles of the store with the mirror (at start, and after the store was wiped or
    /// restarted), by outcome: `marked`, `superseded` (the store changed meanwhile).
    pub reconciles: IntCounterVec,
    /// Seconds the API took to answer, by route (its template, e.g. `/v1/runs/:id`), method
    /// and status class (`2xx`, `4xx`, `5xx`), the token guard included.
    pub api_seconds: HistogramVec,
    /// 1 while a server the coordinator needs (`redis`) answers, 0 while it is away; set
    /// when the metrics are read.
    pub dependency_up: IntGaugeVec,
}

impl CoordinatorMetrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let runs_created =
            IntCounter::new("fleet_runs_created_total", "runs created").expect("valid metric");
        let runs_finished = IntCounterVec::new(
            Opts::new("fleet_runs_finished_total", "runs finished by status"),
            &["status"],
        )
        .expect("valid metric");
        let events = IntCounterVec::new(
            Opts::new(
                "fleet_events_total",
                "events applied to runs, by what they did",
            ),
            &["applied"],
        )
        .expect("valid metric");
        let cas_conflicts = IntCounter::new(
            "fleet_state_conflicts_total",
            "compare-and-set conflicts between coordinators",
        )
        .expect("valid metric");
        let jobs_published = IntCounter::new(
            "fleet_jobs_published_total",
            "job messages confirmed by the broker",
        )
        .expect("valid metric");
        registry
            .register(Box::new(runs_created.clone()))
            .expect("unique");
        registry
            .register(Box::new(runs_finished.clone()))
            .expect("unique");
        registry.register(Box::new(events.clone())).expect("unique");
        registry
            .register(Box::new(cas_conflicts.clone()))
            .expect("unique");
        registry
            .register(Box::new(jobs_published.clone()))
            .expect("unique");
        let reissued = IntCounter::new(
            "fleet_jobs_reissued_total",
            "started jobs re-issued after passing their deadline",
        )
        .expect("valid metric");
        registry
            .register(Box::new(reissued.clone()))
            .expect("unique");
        let restored = IntCounter::new(
            "fleet_runs_restored_total",
            "runs the run store lost, restored from object storage",
        )
        .expect("valid metric");
        registry
            .register(Box::new(restored.clone()))
            .expect("unique");
        let poison = IntCounter::new(
            "fleet_poison_messages_total",
            "result or dead-letter messages that could not be read, dropped",
        )
        .expect("valid metric");
        registry.register(Box::new(poison.clone())).expect("unique");
        let uploads = IntCounterVec::new(
            Opts::new(
                "fleet_uploads_total",
                "repository packs uploaded by clients, by outcome",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(uploads.clone()))
            .expect("unique");
        let upload_bytes_stored = IntCounter::new(
            "fleet_upload_bytes_stored_total",
            "bytes of uploaded packs written to object storage",
        )
        .expect("valid metric");
        registry
            .register(Box::new(upload_bytes_stored.clone()))
            .expect("unique");
        let jobs_held = IntCounter::new(
            "fleet_jobs_held_total",
            "job messages that waited for a slot of their team's concurrent_jobs",
        )
        .expect("valid metric");
        registry
            .register(Box::new(jobs_held.clone()))
            .expect("unique");
        let store_loads = IntCounter::new(
            "fleet_run_store_loads_total",
            "whole runs read from the run store (a state this coordinator did not hold)",
        )
        .expect("valid metric");
        registry
            .register(Box::new(store_loads.clone()))
            .expect("unique");
        let commit_phase = HistogramVec::new(
            HistogramOpts::new(
                "fleet_commit_phase_seconds",
                "seconds each phase of a run's group commit took",
            )
            .buckets(vec![
                0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0,
            ]),
            &["phase"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(commit_phase.clone()))
            .expect("unique");
        let mirror_writes = IntCounterVec::new(
            Opts::new(
                "fleet_mirror_writes_total",
                "writes to runs' mirrors in object storage, by kind",
            ),
            &["kind"],
        )
        .expect("valid metric");
        let mirror_bytes = IntCounterVec::new(
            Opts::new(
                "fleet_mirror_bytes_total",
                "bytes written to runs' mirrors in object storage, by kind",
            ),
            &["kind"],
        )
        .expect("valid metric");
        let mirror_lookups = IntCounterVec::new(
            Opts::new(
                "fleet_mirror_lookups_total",
                "ids looked for in runs' mirrors, by who answered",
            ),
            &["answer"],
        )
        .expect("valid metric");
        let reconciles = IntCounterVec::new(
            Opts::new(
                "fleet_store_reconciles_total",
                "reconciles of the run store with the mirror, by outcome",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        for m in [&mirror_writes, &mirror_bytes, &mirror_lookups, &reconciles] {
            registry.register(Box::new(m.clone())).expect("unique");
        }
        let api_seconds = HistogramVec::new(
            HistogramOpts::new(
                "fleet_api_request_seconds",
                "seconds the API took to answer, by route, method and status class",
            )
            .buckets(vec![
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0,
            ]),
            &["route", "method", "status"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(api_seconds.clone()))
            .expect("unique");
        let dependency_up = IntGaugeVec::new(
            Opts::new(
                "fleet_dependency_up",
                "1 while the named server answers the coordinator, 0 while it is away",
            ),
            &["dependency"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(dependency_up.clone()))
            .expect("unique");
        Self {
            api_seconds,
            dependency_up,
            mirror_lookups,
            reconciles,
            mirror_writes,
            mirror_bytes,
            commit_phase,
            jobs_held,
            store_loads,
            uploads,
            upload_bytes_stored,
            registry,
            poison,
            runs_created,
            runs_finished,
            events,
            cas_conflicts,
            jobs_published,
            reissued,
            restored,
        }
    }

    pub fn render(&self) -> String {
        use prometheus::Encoder;
        let mut buf = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding");
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for CoordinatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Times the phases of one group commit into `fleet_commit_phase_seconds`.
pub struct CommitPhases<'a> {
    metrics: &'a CoordinatorMetrics,
    since: std::time::Instant,
}

impl<'a> CommitPhases<'a> {
    pub fn start(metrics: &'a CoordinatorMetrics) -> Self {
        CommitPhases {
            metrics,
            since: std::time::Instant::now(),
        }
    }

    /// Records the time since the last phase ended as `phase`'s.
    pub fn end(&mut self, phase: &str) {
        let now = std::time::Instant::now();
        self.metrics
            .commit_phase
            .with_label_values(&[phase])
            .observe((now - self.since).as_secs_f64());
        self.since = now;
    }
}
