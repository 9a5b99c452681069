//! The HTTP API's response bodies, shared by the server (`coordinator::api`) and its client
//! (`coordinator::cli::client`): one definition per body, so the two cannot drift apart. Every
//! body names the API version it speaks (`v`); a client refuses a body of another version.

mod graph_view;
mod quarantine;
mod tree;
mod upload;

pub use graph_view::{EdgeView, GraphView, NodeState, NodeView, ARTIFACTS_PER_NODE};
pub use quarantine::{QuarantineDecided, QuarantineItem, QuarantineView};
pub use tree::{ChildView, RunTree, TreeView};
pub use upload::{is_commit_id, is_sha256_hex, RepoUpload, Uploaded};

use crate::engine::{ApprovalState, JobState, RunState, RunStatus};
use crate::ids::{JobId, NodeId, RunId};
use crate::messages::{JobStatus, Usage};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// The version of the bodies below.
pub const API_VERSION: u32 = 1;

fn api_version() -> u32 {
    API_VERSION
}

/// An error: a message and a detail per problem found.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ErrorBody {
    pub error: String,
    #[serde(default)]
    pub details: Vec<String>,
}

/// `POST /v1/runs`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Submitted {
    #[serde(default = "api_version")]
    pub v: u32,
    pub run_id: String,
    /// False when the same submission was made before: the existing run is returned.
    pub created: bool,
}

/// One entry of `GET /v1/runs`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct RunListing {
    pub run_id: RunId,
    #[serde(default)]
    pub graph: String,
    pub status: RunStatus,
    /// Absent in bodies of servers before this field.
    #[serde(
        default,
        deserialize_with = "crate::time::empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
}

impl RunListing {
    pub fn of(s: &RunState) -> Self {
        RunListing {
            run_id: s.run_id.clone(),
            graph: s.graph_name.clone(),
            status: s.status,
            created_at: Some(s.created_at),
            finished_at: s.finished_at,
        }
    }
}

/// `GET /v1/runs/:id/summary`: the status without the job list.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct RunSummary {
    #[serde(default = "api_version")]
    pub v: u32,
    pub run_id: String,
    #[serde(default)]
    pub graph: String,
    pub status: RunStatus,
    #[serde(default)]
    pub awaiting_approval: Vec<String>,
    #[serde(default)]
    pub visits: BTreeMap<String, u64>,
    #[serde(default)]
    pub usage: Usage,
    #[serde(default)]
    pub jobs_total: u64,
    #[serde(default)]
    pub jobs_pending: u64,
    /// Absent in bodies of servers before this field.
    #[serde(
        default,
        deserialize_with = "crate::time::empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub created_at: Option<DateTime<Utc>>,
    /// Absent in bodies of servers before this field.
    #[serde(
        default,
        deserialize_with = "crate::time::empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub updated_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
    /// The run's budget, when it has one (paused at 100%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::tracking::RunBudget>,
    /// Jobs held while the run is paused on its budget (counted in `jobs_pending`).
    #[serde(default)]
    pub jobs_held: u64,
}

impl RunSummary {
    /// Paused on its budget with nothing left running: only a raise moves it on.
    pub fn stopped_on_budget(&self) -> bool {
        self.budget.as_ref().is_some_and(|b| b.paused) && self.jobs_pending == self.jobs_held
    }

    pub fn of(s: &RunState) -> Self {
        RunSummary {
            v: API_VERSION,
            run_id: s.run_id.to_string(),
            graph: s.graph_name.clone(),
            status: s.status,
            awaiting_approval: s
                .awaiting_approval()
                .iter()
                .map(|n| n.to_string())
                .collect(),
            visits: s
                .visits
                .iter()
                .map(|(n, v)| (n.to_string(), u64::from(*v)))
                .collect(),
            usage: s.usage,
            jobs_total: s.jobs.len() as u64,
            jobs_pending: s.pending_jobs().count() as u64,
            created_at: Some(s.created_at),
            updated_at: Some(s.updated_at),
            finished_at: s.finished_at,
            budget: s.budget.clone(),
            jobs_held: s.held.len() as u64,
        }
    }
}

/// A job in the status view.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct JobView {
    pub job_id: JobId,
    pub node: NodeId,
    pub visit: u32,
    pub attempt: u32,
    pub state: JobState,
    pub published_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub status: Option<JobStatus>,
    pub worker: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    pub container_seconds: Option<f64>,
    pub error: Option<String>,
}

/// A join in the status view: arrivals of the round under way.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct JoinView {
    pub fired: u32,
    pub arrived: Vec<String>,
    pub expected: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct RepoView {
    pub url: String,
    pub base_commit: String,
}

/// `GET /v1/runs/:id`: the run, its joins, approvals and every job with its state.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct StatusView {
    #[serde(default = "api_version")]
    pub v: u32,
    pub run_id: RunId,
    pub graph: String,
    pub status: RunStatus,
    pub awaiting_approval: Vec<NodeId>,
    pub approvals: BTreeMap<NodeId, ApprovalState>,
    /// People's decisions on items the run put on hold (`fleet quarantine`), per item.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub quarantine: BTreeMap<String, Vec<crate::engine::Decision>>,
    pub joins: BTreeMap<NodeId, JoinView>,
    pub branches: usize,
    pub visits: BTreeMap<NodeId, u32>,
    pub jobs: Vec<JobView>,
    pub usage: Usage,
    pub repo: RepoView,
    pub meta: Value,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Where this run sits in a tree of child runs (none for a root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<crate::engine::TreeLink>,
    /// The child runs its spawn nodes started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ChildView>,
    /// The team the run belongs to (its quotas: `GET /v1/team`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

impl StatusView {
    pub fn of(s: &RunState) -> Self {
        Self::of_node(s, None)
    }

    /// The status with only the jobs of `node` (every job when `None`): what a look at one
    /// node of a large run needs, without rendering its other jobs.
    pub fn of_node(s: &RunState, node: Option<&NodeId>) -> Self {
        let wanted = |n: &NodeId| node.is_none_or(|want| want == n);
        // Each job's first outcome, found in one pass (not one scan of the history per job).
        let mut outcomes = std::collections::HashMap::new();
        for o in s.history.iter().filter(|o| wanted(&o.node)) {
            outcomes.entry(&o.job_id).or_insert(o);
        }
        let jobs = s
            .jobs
            .iter()
            .filter(|(_, j)| wanted(&j.node))
            .map(|(id, j)| {
                let outcome = outcomes.get(id).copied();
                JobView {
                    job_id: id.clone(),
                    node: j.node.clone(),
                    visit: j.visit,
                    attempt: j.attempt,
                    state: j.state,
                    published_at: j.published_at,
                    finished_at: j.finished_at,
                    status: outcome.map(|o| o.status),
                    worker: outcome.map(|o| o.worker.clone()),
                    started_at: outcome.map(|o| o.started_at),
                    ended_at: outcome.map(|o| o.finished_at),
                    container_seconds: outcome.map(|o| o.container_seconds),
                    error: outcome.and_then(|o| o.error.clone()),
                }
            })
            .collect();
        let joins = s
            .joins
            .iter()
            .map(|(n, j)| {
                let view = JoinView {
                    fired: j.fired,
                    arrived: j.arrived.keys().cloned().collect(),
                    expected: j.expected,
                };
                (n.clone(), view)
            })
            .collect();
        StatusView {
            v: API_VERSION,
            run_id: s.run_id.clone(),
            graph: s.graph_name.clone(),
            status: s.status,
            awaiting_approval: s.awaiting_approval().into_iter().cloned().collect(),
            approvals: s.approvals.clone(),
            quarantine: s.quarantine.clone(),
            joins,
            branches: s.branches.len(),
            visits: s.visits.clone(),
            jobs,
            usage: s.usage,
            repo: RepoView {
                url: s.repo.url.clone(),
                base_commit: s.repo.base_commit.clone(),
            },
            meta: s.meta.clone(),
            created_at: s.created_at,
            updated_at: s.updated_at,
            finished_at: s.finished_at,
            tree: s.tree.clone(),
            children: ChildView::all(s),
            team: s.team.clone(),
        }
    }
}

/// `GET /v1/runs/:id/result` (a finished run).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct RunOutcome {
    #[serde(default = "api_version")]
    pub v: u32,
    pub status: RunStatus,
    #[serde(default)]
    pub result: Value,
    #[serde(default)]
    pub usage: Usage,
}

impl RunOutcome {
    /// The result's verdict (`PASS`, ...), or the status in capitals.
    pub fn verdict(&self) -> String {
        self.result["verdict"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| {
                serde_json::to_value(self.status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_uppercase))
                    .unwrap_or_else(|| format!("{:?}", self.status).to_uppercase())
            })
    }

    pub fn ended_stage(&self) -> Option<&str> {
        self.result["ended_stage"].as_str()
    }
}

/// What a cancel did.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CancelEffect {
    Cancelled,
    /// The run had ended before: nothing changed.
    AlreadyFinished,
}

/// `POST /v1/runs/:id/cancel`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct CancelAnswer {
    #[serde(default = "api_version")]
    pub v: u32,
    pub run_id: RunId,
    /// The run's status after the request.
    pub status: RunStatus,
    /// Absent in bodies of servers before this field: read the status then.
    #[serde(default)]
    pub applied: Option<CancelEffect>,
}

/// `POST /v1/runs/:id/approvals/:node`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Decided {
    #[serde(default = "api_version")]
    pub v: u32,
    pub run_id: RunId,
    pub node: NodeId,
    /// `decided`, or `already decided` (a second decision changes nothing).
    pub applied: String,
    pub status: RunStatus,
}

/// One entry of `GET /v1/runs/:id/logs`: a finished job.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct LogEntry {
    pub job_id: JobId,
    pub node: NodeId,
    pub visit: u32,
    pub status: JobStatus,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub worker: String,
    /// The execution whose result the run accepted; its artifacts are the ones listed.
    #[serde(default)]
    pub execution: String,
    /// Absent in bodies of servers before this field.
    #[serde(
        default,
        deserialize_with = "crate::time::empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub started_at: Option<DateTime<Utc>>,
    /// Absent in bodies of servers before this field.
    #[serde(
        default,
        deserialize_with = "crate::time::empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub finished_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub artifacts: BTreeMap<String, String>,
    #[serde(default)]
    pub usage: Usage,
    /// The earlier job whose kept result was reused (the step cache) instead of running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_from: Option<crate::step_cache::CachedFrom>,
}

impl LogEntry {
    pub fn all(s: &RunState) -> Vec<LogEntry> {
        s.history
            .iter()
            .map(|o| LogEntry {
                job_id: o.job_id.clone(),
                node: o.node.clone(),
                visit: o.visit,
                status: o.status,
                error: o.error.clone(),
                worker: o.worker.clone(),
                execution: o.execution.clone(),
                started_at: Some(o.started_at),
                finished_at: Some(o.finished_at),
                artifacts: o.artifacts.clone(),
                usage: o.usage,
                cached_from: o.cached_from.clone(),
            })
            .collect()
    }
}

/// `GET /v1/runs/:id/artifacts`: the run's objects, split by whether the run points to them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ArtifactListing {
    #[serde(default = "api_version")]
    pub v: u32,
    /// What the run stands on: the artifacts of every accepted execution, and the files the
    /// coordinator wrote for the run (its state mirror, result, summary).
    pub keys: Vec<String>,
    /// Artifacts of executions whose result was not the one accepted (a duplicate execution of
    /// an attempt, a superseded attempt): kept for inspection, never read by the run.
    pub superseded: Vec<String>,
}

impl ArtifactListing {
    /// Splits `stored` (every key under `runs/<run>/`) by the run's outcomes: a key in an
    /// execution's folder (`exec-<tag>/`) counts only when an accepted outcome names it.
    pub fn of(s: &RunState, stored: Vec<String>) -> Self {
        Self::split(s.history.iter().flat_map(|o| o.artifacts.values()), stored)
    }

    /// `of` with the keys the accepted outcomes name given directly.
    pub fn split<'a>(named: impl Iterator<Item = &'a String>, stored: Vec<String>) -> Self {
        let named: std::collections::BTreeSet<&String> = named.collect();
        let (mut keys, mut superseded) = (Vec::new(), Vec::new());
        for key in stored {
            let in_execution = key.split('/').any(|seg| seg.starts_with("exec-"));
            if !in_execution || named.contains(&key) {
                keys.push(key);
            } else {
                superseded.push(key);
            }
        }
        // An accepted artifact outside `runs/<run>/` (none today) is still the run's.
        for key in named {
            if !keys.contains(key) {
                keys.push(key.clone());
            }
        }
        keys.sort();
        superseded.sort();
        ArtifactListing {
            v: API_VERSION,
            keys,
            superseded,
        }
    }
}

/// Refuses a body that speaks another version of the API.
pub fn check_version(v: u32) -> Result<(), String> {
    if v == API_VERSION {
        Ok(())
    } else {
        Err(format!(
            "the server speaks API version {v}; this client speaks {API_VERSION}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_without_a_version_are_read_as_this_version_and_others_are_refused() {
        let s: Submitted = serde_json::from_str(r#"{"run_id": "r1", "created": true}"#).unwrap();
        assert_eq!(s.v, API_VERSION);
        assert!(check_version(s.v).is_ok());
        let later: Submitted =
            serde_json::from_str(r#"{"v": 2, "run_id": "r1", "created": true}"#).unwrap();
        assert!(check_version(later.v).unwrap_err().contains("version 2"));
    }

    #[test]
    fn artifacts_of_executions_the_run_did_not_accept_are_listed_apart() {
        let accepted = "runs/r1/attempt_1/exec-e1-aa/verify_result.json".to_string();
        let stored = vec![
            "runs/r1/state.json".to_string(),
            accepted.clone(),
            "runs/r1/attempt_1/exec-e1-bb/verify_result.json".to_string(),
            "runs/r1/run_summary.json".to_string(),
        ];
        let l = ArtifactListing::split([&accepted].into_iter(), stored);
        assert_eq!(
            l.keys,
            vec![
                accepted.clone(),
                "runs/r1/run_summary.json".to_string(),
                "runs/r1/state.json".to_string(),
            ]
        );
        assert_eq!(
            l.superseded,
            vec!["runs/r1/attempt_1/exec-e1-bb/verify_result.json".to_string()]
        );
        // An accepted key the listing missed (written elsewhere) is still listed.
        let l = ArtifactListing::split([&accepted].into_iter(), vec![]);
        assert_eq!(l.keys, vec![accepted]);
    }

    #[test]
    fn a_cancel_answer_round_trips_with_its_effect() {
        let a = CancelAnswer {
            v: API_VERSION,
            run_id: RunId::new("r1"),
            status: RunStatus::Succeeded,
            applied: Some(CancelEffect::AlreadyFinished),
        };
        let text = serde_json::to_string(&a).unwrap();
        assert!(text.contains(r#""applied":"already_finished""#), "{text}");
        assert_eq!(serde_json::from_str::<CancelAnswer>(&text).unwrap(), a);
    }

    #[test]
    fn times_of_earlier_servers_read_and_an_empty_or_missing_one_is_none() {
        let summary = |times: serde_json::Value| {
            let mut body = serde_json::json!({"run_id": "r1", "status": "running"});
            body.as_object_mut()
                .unwrap()
                .extend(times.as_object().unwrap().clone());
            serde_json::from_value::<RunSummary>(body).unwrap()
        };
        let old = summary(serde_json::json!({"created_at": "2026-11-22T10:00:00.123Z",
            "updated_at": "", "finished_at": null}));
        assert_eq!(
            old.created_at.map(|t| t.timestamp_millis()),
            Some(1_795_341_600_123)
        );
        assert_eq!((old.updated_at, old.finished_at), (None, None));
        let older = summary(serde_json::json!({}));
        assert_eq!((older.created_at, older.updated_at), (None, None));
        // An unset time is left out, so a client of the previous version reads it as empty.
        let text = serde_json::to_string(&older).unwrap();
        assert!(!text.contains("created_at"), "{text}");
        let written = serde_json::to_value(&old).unwrap();
        assert_eq!(written["created_at"], "2026-11-22T10:00:00.123Z");
        assert_eq!(serde_json::from_value::<RunSummary>(written).unwrap(), old);

        let log: LogEntry = serde_json::from_value(serde_json::json!({
            "job_id": "r1.a.1", "node": "a", "visit": 1, "status": "ok",
            "started_at": "", "finished_at": "2026-11-22T10:00:01.500Z"}))
        .unwrap();
        assert_eq!(log.started_at, None);
        assert_eq!(
            log.finished_at.map(|t| t.timestamp_millis()),
            Some(1_795_341_601_500)
        );
    }
}
