//! Seed 004's status dashboard as data: progress (overall and by category, from the feature
//! list the harness last wrote), sessions, costs against the budget, the last gates, what
//! waits in quarantine and the seed's success metrics. Read from the run state and the nodes
//! that ran seed 004's harness ops; the CLI draws it, the API serves it.

use super::costs::{cost_report, CostReport};
use super::RunBudget;
use crate::engine::{Outcome, RunState, RunStatus};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// Passing features of a total.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Tally {
    pub passing: u32,
    pub total: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Progress {
    pub overall: Tally,
    pub by_category: BTreeMap<String, Tally>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Sessions {
    /// Agent sessions finished, by node.
    pub completed: BTreeMap<String, u32>,
    pub runtime_seconds: f64,
    /// The last one: its node, when it ended and how.
    pub last: Option<LastSession>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct LastSession {
    pub session_id: String,
    pub node: String,
    pub finished_at: chrono::DateTime<chrono::Utc>,
    pub ok: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct GateLine {
    pub name: String,
    pub passed: bool,
}

/// The seed's success metrics.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct SuccessMetrics {
    pub claims: u64,
    pub verified: u64,
    pub revert_rate: f64,
    pub quarantine_rate: f64,
    pub human_intervention_rate: f64,
    /// Total cost over verified features; none before the first is verified.
    pub cost_per_verified_test: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Dashboard {
    pub run_id: String,
    pub graph: String,
    pub model: String,
    pub status: RunStatus,
    pub progress: Option<Progress>,
    pub sessions: Sessions,
    pub costs: CostReport,
    pub budget: Option<RunBudget>,
    /// Jobs held while the run is paused on its budget.
    pub held_jobs: usize,
    /// The last gate run: each gate and whether it passed.
    pub gates: Vec<GateLine>,
    pub quarantine_pending: Vec<Value>,
    pub metrics: Option<SuccessMetrics>,
}

/// What the graph's nodes are, as the dashboard needs them.
pub struct NodeKinds<'a> {
    pub is_agent: &'a dyn Fn(&str) -> bool,
    /// Nodes whose output carries the feature list (`review_features`, `settle_claims`).
    pub lists_features: &'a dyn Fn(&str) -> bool,
    pub runs_gates: &'a dyn Fn(&str) -> bool,
    /// Nodes whose output carries the seed's metrics (`settle_claims`).
    pub settles: &'a dyn Fn(&str) -> bool,
}

fn last<'a>(state: &'a RunState, pick: &dyn Fn(&str) -> bool) -> Option<&'a Outcome> {
    state
        .history
        .iter()
        .rev()
        .find(|o| pick(o.node.as_str()) && o.ok)
}

pub fn dashboard(state: &RunState, kinds: &NodeKinds<'_>, pending: Vec<Value>) -> Dashboard {
    let costs = cost_report(state);
    let progress = last(state, kinds.lists_features).and_then(|o| {
        let list = o.output.get("features")?.as_array()?;
        let mut p = Progress::default();
        for f in list {
            let passing = u32::from(f["passes"].as_bool() == Some(true));
            let category = f["category"].as_str().unwrap_or("other").to_string();
            let t = p.by_category.entry(category).or_default();
            t.passing += passing;
            t.total += 1;
            p.overall.passing += passing;
            p.overall.total += 1;
        }
        Some(p)
    });
    let mut sessions = Sessions::default();
    for o in state
        .history
        .iter()
        .filter(|o| (kinds.is_agent)(o.node.as_str()))
    {
        *sessions.completed.entry(o.node.to_string()).or_default() += 1;
        sessions.runtime_seconds +=
            (o.finished_at - o.started_at).num_milliseconds() as f64 / 1000.0;
        sessions.last = Some(LastSession {
            session_id: o.job_id.to_string(),
            node: o.node.to_string(),
            finished_at: o.finished_at,
            ok: o.ok,
        });
    }
    let gates = state
        .history
        .iter()
        .rev()
        .find(|o| (kinds.runs_gates)(o.node.as_str()))
        .and_then(|o| o.output.get("gates")?.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|g| {
            let name = g["name"].as_str().unwrap_or("?").to_string();
            GateLine {
                name,
                passed: g["passed"].as_bool() == Some(true),
            }
        })
        .collect();
    let metrics = last(state, kinds.settles).map(|o| {
        let m = &o.output["metrics"];
        let verified = m["verified"].as_u64().unwrap_or(0);
        SuccessMetrics {
            claims: m["claims"].as_u64().unwrap_or(0),
            verified,
            revert_rate: m["revert_rate"].as_f64().unwrap_or(0.0),
            quarantine_rate: m["quarantine_rate"].as_f64().unwrap_or(0.0),
            human_intervention_rate: m["human_intervention_rate"].as_f64().unwrap_or(0.0),
            cost_per_verified_test: (verified > 0).then(|| costs.total_usd / verified as f64),
        }
    });
    Dashboard {
        run_id: state.run_id.to_string(),
        graph: state.graph_name.clone(),
        model: state.agent.model_identity(),
        status: state.status,
        progress,
        sessions,
        costs,
        budget: state.budget.clone(),
        held_jobs: state.held.len(),
        gates,
        quarantine_pending: pending,
        metrics,
    }
}
