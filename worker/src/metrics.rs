//! Prometheus metrics of a worker. Labels stay bounded: kinds and statuses, never ids.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};
use shared::graph::NodeKind;
use shared::messages::{JobStatus, Usage};
use std::time::{Duration, Instant};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    jobs: IntCounterVec,
    job_seconds: HistogramVec,
    llm_tokens: IntCounterVec,
    llm_calls: IntCounterVec,
    pub deliveries: IntCounterVec,
    /// Deliveries of an attempt already running here (held until it ends) or already reported
    /// by this worker (acked at once): never a second execution.
    pub duplicates: IntCounterVec,
    panics: IntCounter,
    /// Jobs that could not produce a result, by class: `transient` (requeued) or `permanent`
    /// (reported as an error at once).
    pub failures: IntCounterVec,
    disk_quota: IntCounter,
    /// Job folders removed by the sweeps: `start` (left by an earlier process) or `stale`.
    pub job_dirs_removed: IntCounterVec,
    step_cache: IntCounterVec,
    /// Containers started for jobs by a warm pool, by how: `warm` (handed from the pool) or
    /// `cold` (none of the job's kind was ready).
    pub containers: IntCounterVec,
    /// Warm containers ready now.
    pub warm_ready: IntGauge,
    /// Worktrees of jobs, by how: `private` (checked out for the job), `shared_new` (the
    /// commit's shared checkout made for it), `shared` (an existing shared checkout reused).
    pub worktrees: IntCounterVec,
    /// What the worker removed because its disk was low, by `what`: `checkout` (an idle shared
    /// checkout) or `job_dir` (a job folder no running execution owned).
    pub disk_pressure_evictions: IntCounterVec,
    /// Where a job's time goes on this worker, by `JobPhase`.
    job_phases: HistogramVec,
}

/// A part of a job's time on a worker (`fleet_worker_job_phase_seconds{phase}`): what a job
/// costs beside its step, measured where it is spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobPhase {
    /// The job folder made.
    Folder,
    /// The worktree materialised (its packs fetched, checked out, shared or layered).
    Worktree,
    /// The worktree given to the container's user.
    HandOver,
    /// The container's life: started (or taken from the warm pool) to removed.
    Container,
    /// After the container: the last disk measure and the commit handed on.
    AfterContainer,
    /// The job folder removed.
    FolderRemoval,
    /// The result stored or inlined and published, confirmed by the broker.
    Report,
}

impl JobPhase {
    pub const ALL: [JobPhase; 7] = [
        JobPhase::Folder,
        JobPhase::Worktree,
        JobPhase::HandOver,
        JobPhase::Container,
        JobPhase::AfterContainer,
        JobPhase::FolderRemoval,
        JobPhase::Report,
    ];

    pub fn label(self) -> &'static str {
        match self {
            JobPhase::Folder => "folder",
            JobPhase::Worktree => "worktree",
            JobPhase::HandOver => "hand_over",
            JobPhase::Container => "container",
            JobPhase::AfterContainer => "after_container",
            JobPhase::FolderRemoval => "folder_removal",
            JobPhase::Report => "report",
        }
    }
}

/// Observes its phase's time when dropped (whatever way the phase ends).
pub struct PhaseTimer<'a> {
    metrics: &'a Metrics,
    phase: JobPhase,
    since: Instant,
}

impl Drop for PhaseTimer<'_> {
    fn drop(&mut self) {
        self.metrics.job_phase(self.phase, self.since.elapsed());
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let jobs = IntCounterVec::new(
            Opts::new(
                "fleet_worker_jobs_total",
                "jobs finished by kind and status",
            ),
            &["kind", "status"],
        )
        .expect("valid metric");
        let job_seconds = HistogramVec::new(
            HistogramOpts::new("fleet_worker_job_seconds", "wall time of a job").buckets(vec![
                0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
            ]),
            &["kind"],
        )
        .expect("valid metric");
        let llm_tokens = IntCounterVec::new(
            Opts::new("fleet_worker_llm_tokens_total", "llm tokens by direction"),
            &["direction"],
        )
        .expect("valid metric");
        let llm_calls = IntCounterVec::new(
            Opts::new("fleet_worker_llm_calls_total", "successful llm calls"),
            &["kind"],
        )
        .expect("valid metric");
        let deliveries = IntCounterVec::new(
            Opts::new(
                "fleet_worker_deliveries_total",
                "job deliveries by how they were settled",
            ),
            &["settled"],
        )
        .expect("valid metric");
        let duplicates = IntCounterVec::new(
            Opts::new(
                "fleet_worker_duplicate_deliveries_total",
                "deliveries of an attempt already running or already reported here",
            ),
            &["state"],
        )
        .expect("valid metric");
        let panics = IntCounter::new(
            "fleet_worker_job_panics_total",
            "jobs whose execution panicked (reported as errors)",
        )
        .expect("valid metric");
        let failures = IntCounterVec::new(
            Opts::new(
                "fleet_worker_job_failures_total",
                "jobs that ended without a result of their own, by class (transient: requeued; permanent: reported as an error)",
            ),
            &["class"],
        )
        .expect("valid metric");
        let disk_quota = IntCounter::new(
            "fleet_worker_disk_quota_exceeded_total",
            "jobs ended because their folder went over its disk quota",
        )
        .expect("valid metric");
        let job_dirs_removed = IntCounterVec::new(
            Opts::new(
                "fleet_worker_job_dirs_removed_total",
                "job folders removed by a sweep (start: left by an earlier process; stale: too old)",
            ),
            &["why"],
        )
        .expect("valid metric");
        let step_cache = IntCounterVec::new(
            Opts::new(
                "fleet_worker_step_cache_total",
                "step cache lookups of cacheable steps (hit: a kept result reused; miss: run)",
            ),
            &["result"],
        )
        .expect("valid metric");
        let containers = IntCounterVec::new(
            Opts::new(
                "fleet_worker_containers_total",
                "containers started for jobs with a warm pool (warm: handed from it; cold: created for the job)",
            ),
            &["start"],
        )
        .expect("valid metric");
        let worktrees = IntCounterVec::new(
            Opts::new(
                "fleet_worker_worktrees_total",
                "worktrees of jobs (private: checked out for the job; shared_new: a commit's checkout for its read-only jobs made; shared: one reused; layered_new, layered: a writing job's overlay on that checkout, made or reused)",
            ),
            &["how"],
        )
        .expect("valid metric");
        let disk_pressure_evictions = IntCounterVec::new(
            Opts::new(
                "fleet_worker_disk_pressure_evictions_total",
                "what the worker removed because its work folder's disk was low (checkout: an idle shared checkout; mirror: the git mirror's packs, when no job held it; job_dir: a job folder no running execution owned; image: an image no container used and no tag named, when the image store's disk was low)",
            ),
            &["what"],
        )
        .expect("valid metric");
        let job_phases = HistogramVec::new(
            HistogramOpts::new(
                "fleet_worker_job_phase_seconds",
                "where a job's time goes on a worker, by phase (folder, worktree, hand_over, container, after_container, folder_removal, report)",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
                60.0,
            ]),
            &["phase"],
        )
        .expect("valid metric");
        let warm_ready = IntGauge::new(
            "fleet_worker_warm_containers",
            "warm containers started ahead and ready for a job",
        )
        .expect("valid metric");
        registry
            .register(Box::new(warm_ready.clone()))
            .expect("unique metric");
        for c in [&panics, &disk_quota] {
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
        }
        for c in [
            &jobs,
            &llm_tokens,
            &llm_calls,
            &deliveries,
            &duplicates,
            &failures,
            &job_dirs_removed,
            &step_cache,
            &containers,
            &worktrees,
            &disk_pressure_evictions,
        ] {
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
        }
        for h in [&job_seconds, &job_phases] {
            registry
                .register(Box::new(h.clone()))
                .expect("unique metric");
        }
        Self {
            registry,
            jobs,
            job_seconds,
            llm_tokens,
            llm_calls,
            deliveries,
            duplicates,
            panics,
            failures,
            disk_quota,
            job_dirs_removed,
            step_cache,
            containers,
            warm_ready,
            worktrees,
            disk_pressure_evictions,
            job_phases,
        }
    }

    pub fn job_phase(&self, phase: JobPhase, took: Duration) {
        self.job_phases
            .with_label_values(&[phase.label()])
            .observe(took.as_secs_f64());
    }

    /// Times `phase` from now until the timer is dropped.
    pub fn time(&self, phase: JobPhase) -> PhaseTimer<'_> {
        PhaseTimer {
            metrics: self,
            phase,
            since: Instant::now(),
        }
    }

    /// A cacheable step was looked up: reused (`hit`) or run (`miss`).
    pub fn step_cache(&self, hit: bool) {
        self.step_cache
            .with_label_values(&[if hit { "hit" } else { "miss" }])
            .inc();
    }

    pub fn job_panicked(&self) {
        self.panics.inc();
    }

    pub fn disk_quota_exceeded(&self) {
        self.disk_quota.inc();
    }

    pub fn observe_job(&self, kind: NodeKind, status: JobStatus, took: Duration, usage: &Usage) {
        let kind = format!("{kind:?}").to_lowercase();
        let status = format!("{status:?}").to_lowercase();
        self.jobs.with_label_values(&[&kind, &status]).inc();
        self.job_seconds
            .with_label_values(&[&kind])
            .observe(took.as_secs_f64());
        self.llm_tokens
            .with_label_values(&["input"])
            .inc_by(usage.input_tokens);
        self.llm_tokens
            .with_label_values(&["output"])
            .inc_by(usage.output_tokens);
        self.llm_calls
            .with_label_values(&[&kind])
            .inc_by(usage.llm_calls as u64);
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding");
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_is_observed_under_its_label_once_its_timer_is_dropped() {
        let m = Metrics::new();
        let count = |m: &Metrics| {
            m.render()
                .lines()
                .find(|l| l.starts_with("fleet_worker_job_phase_seconds_count{phase=\"report\"}"))
                .map(|l| l.rsplit(' ').next().unwrap_or_default().to_string())
        };
        let timer = m.time(JobPhase::Report);
        assert_eq!(count(&m), None, "observed before the phase ended");
        drop(timer);
        m.job_phase(JobPhase::Report, Duration::from_millis(3));
        assert_eq!(count(&m).as_deref(), Some("2"));
        assert!(!m.render().contains("phase=\"folder\""));
    }
}
