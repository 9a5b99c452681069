//! Costs per session and per model, from the run's history (seed 004's `CostTracker`), and
//! the seed's success metrics for the run.

use crate::engine::RunState;
use crate::messages::Usage;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One agent session's spending.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct SessionCost {
    pub session_id: String,
    pub node: String,
    pub model: String,
    pub usage: Usage,
}

/// The run's spending, by session, by node and by model.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct CostReport {
    pub total_usd: f64,
    pub sessions: Vec<SessionCost>,
    pub by_node: BTreeMap<String, f64>,
    pub by_model: BTreeMap<String, f64>,
}

/// Every job that spent anything, in the order they finished.
pub fn cost_report(state: &RunState) -> CostReport {
    let model = state.agent.model_identity();
    let mut report = CostReport::default();
    for o in &state.history {
        if o.usage.llm_calls == 0 && o.usage.cost_usd == 0.0 {
            continue;
        }
        report.total_usd += o.usage.cost_usd;
        *report.by_node.entry(o.node.to_string()).or_default() += o.usage.cost_usd;
        *report.by_model.entry(model.clone()).or_default() += o.usage.cost_usd;
        report.sessions.push(SessionCost {
            session_id: o.job_id.to_string(),
            node: o.node.to_string(),
            model: model.clone(),
            usage: o.usage,
        });
    }
    report
}
