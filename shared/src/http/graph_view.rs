//! A run's graph as the dashboard draws it: every node with its kind and its state now (idle,
//! running, waiting for a person, done, failed, with its jobs counted by state), every route as
//! an edge. Computed from the run state in one pass over its jobs and results, so a fan-out of a
//! thousand branches is a thousand counts on one node, not a thousand rows; the same view is
//! sent on every change of the run (`GET /v1/runs/:id/watch`).

use crate::engine::{JobState, RunState, RunStatus};
use crate::graph::Graph;
use crate::messages::JobStatus;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use utoipa::ToSchema;

/// A node's state in the run.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Not reached (yet).
    Idle,
    /// A job of the node is published or running, or a child run it started runs.
    Running,
    /// An approval node waits for a person.
    Waiting,
    /// Its last visit ended well.
    Done,
    /// Its last job failed (a verdict, an error, a timeout).
    Failed,
}

/// One node as drawn.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct NodeView {
    pub id: String,
    /// `agent`, `command`, `approval`, ...
    pub kind: String,
    pub state: NodeState,
    pub visits: u32,
    /// Its jobs now: published or running, finished well, finished otherwise.
    pub running: u32,
    pub ok: u32,
    pub failed: u32,
    /// The artifacts of its accepted results (the keys the run points to), latest first, at
    /// most [`ARTIFACTS_PER_NODE`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<String>,
}

/// Artifact keys a node's view lists at most (a fan-out's thousand results are not sent).
pub const ARTIFACTS_PER_NODE: usize = 50;

/// One route.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct EdgeView {
    pub from: String,
    pub to: String,
    /// The route's condition, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
}

/// `GET /v1/runs/:id/graph`, and each event of `GET /v1/runs/:id/watch`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct GraphView {
    #[serde(default = "super::api_version")]
    pub v: u32,
    pub run_id: String,
    pub graph: String,
    pub start: String,
    pub status: RunStatus,
    /// The run state's version this view was made from (grows with every change).
    pub version: u64,
    pub nodes: Vec<NodeView>,
    pub edges: Vec<EdgeView>,
    pub awaiting_approval: Vec<String>,
}

impl GraphView {
    pub fn of(graph: &Graph, s: &RunState, version: u64) -> GraphView {
        let finished: HashMap<&str, JobStatus> = s
            .history
            .iter()
            .map(|o| (o.job_id.as_str(), o.status))
            .collect();
        let awaiting: Vec<String> = s
            .awaiting_approval()
            .iter()
            .map(|n| n.to_string())
            .collect();
        #[derive(Default)]
        struct Count {
            running: u32,
            ok: u32,
            failed: u32,
            last_ok: Option<bool>,
        }
        let mut counts: HashMap<&str, Count> = HashMap::new();
        // Jobs in id order: a node's later visits come after its earlier ones.
        for (id, job) in &s.jobs {
            let c = counts.entry(job.node.as_str()).or_default();
            match (job.state, finished.get(id.as_str())) {
                (JobState::Pending, _) => c.running += 1,
                (_, Some(JobStatus::Ok)) => {
                    c.ok += 1;
                    c.last_ok = Some(true);
                }
                (JobState::Done, _) => {
                    c.failed += 1;
                    c.last_ok = Some(false);
                }
                (JobState::Cancelled, _) => {}
            }
        }
        let mut artifacts: HashMap<&str, Vec<String>> = HashMap::new();
        for o in s.history.iter().rev() {
            let list = artifacts.entry(o.node.as_str()).or_default();
            for key in o.artifacts.values() {
                if list.len() < ARTIFACTS_PER_NODE {
                    list.push(key.clone());
                }
            }
        }
        // The exit the run ended at: generic results name it.
        let exit = s.result.as_ref().and_then(|r| r["exit"].as_str());
        for group in s.children.values() {
            if !group.settled {
                counts.entry(group.node.as_str()).or_default().running += 1;
            }
        }
        let nodes = graph
            .nodes
            .iter()
            .map(|(id, node)| {
                let c = counts.remove(id.as_str()).unwrap_or_default();
                let visits = s.visits.get(id).copied().unwrap_or(0);
                let state = if awaiting.iter().any(|a| a == id.as_str()) {
                    NodeState::Waiting
                } else if exit == Some(id.as_str()) {
                    match s.status {
                        RunStatus::Succeeded => NodeState::Done,
                        _ => NodeState::Failed,
                    }
                } else if c.running > 0 {
                    NodeState::Running
                } else {
                    match c.last_ok {
                        Some(true) => NodeState::Done,
                        Some(false) => NodeState::Failed,
                        None if visits > 0 => NodeState::Done,
                        None => NodeState::Idle,
                    }
                };
                NodeView {
                    id: id.to_string(),
                    kind: serde_json::to_value(node.kind())
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    state,
                    visits,
                    running: c.running,
                    ok: c.ok,
                    failed: c.failed,
                    artifacts: artifacts.remove(id.as_str()).unwrap_or_default(),
                }
            })
            .collect();
        let edges = graph
            .nodes
            .iter()
            .flat_map(|(id, node)| {
                node.routes.iter().map(move |r| EdgeView {
                    from: id.to_string(),
                    to: r.to.to_string(),
                    when: r.when.clone(),
                })
            })
            .collect();
        GraphView {
            v: super::API_VERSION,
            run_id: s.run_id.to_string(),
            graph: s.graph_name.clone(),
            start: graph.start.to_string(),
            status: s.status,
            version,
            nodes,
            edges,
            awaiting_approval: awaiting,
        }
    }
}
