//! Items a graph puts on hold for people (`quarantine:`, seed 004): which items wait now (the
//! graph's `pending` expression over the run context), a person's decision on one of them
//! (recorded once per decision, in order, in `RunState.quarantine`), and the release of the
//! graph's `hold` approval node when the run waits there, so the decision is applied at once.

use super::state::{Decision, RunState, RunStatus};
use super::step::Engine;
use super::EngineError;
use crate::expr;
use crate::graph::GraphBundle;
use serde_json::Value;

/// An item as the API names it: a string as is, any other value as JSON.
fn item_key(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The items waiting for a person now; empty when the graph has no quarantine or the run has
/// not put anything on hold (an expression that does not evaluate holds nothing).
pub fn pending(bundle: &GraphBundle, state: &RunState) -> Vec<String> {
    let Some(q) = &bundle.graph.quarantine else {
        return Vec::new();
    };
    match expr::eval(&q.pending, &state.context_in(None)) {
        Ok(Value::Array(items)) => items.iter().map(item_key).collect(),
        _ => Vec::new(),
    }
}

/// What the graph's `details` says about each item (a map; `Null` without one).
pub fn details(bundle: &GraphBundle, state: &RunState) -> Value {
    let Some(expr_text) = bundle
        .graph
        .quarantine
        .as_ref()
        .and_then(|q| q.details.as_ref())
    else {
        return Value::Null;
    };
    expr::eval(expr_text, &state.context_in(None)).unwrap_or(Value::Null)
}

/// Why a decision is not taken, if it is not.
pub(super) fn refusal(bundle: &GraphBundle, state: &RunState, item: &str) -> Option<&'static str> {
    if bundle.graph.quarantine.is_none() {
        return Some("the graph has no quarantine");
    }
    if state.status != RunStatus::Running {
        return Some("run is not running");
    }
    if !pending(bundle, state).iter().any(|p| p == item) {
        return Some("the item is not in quarantine");
    }
    None
}

impl Engine<'_> {
    pub(super) fn quarantine_decision(
        &mut self,
        item: &str,
        decision: Decision,
    ) -> Result<(), EngineError> {
        let note = format!(
            "quarantine: {} {item}{}",
            if decision.approved {
                "approved"
            } else {
                "rejected"
            },
            if decision.comment.is_empty() {
                String::new()
            } else {
                format!(": {}", decision.comment)
            }
        );
        let by = decision.by.clone();
        self.state
            .quarantine
            .entry(item.to_string())
            .or_default()
            .push(decision);
        let hold = self
            .bundle
            .graph
            .quarantine
            .as_ref()
            .and_then(|q| q.hold.clone());
        let Some(hold) = hold else {
            return Ok(());
        };
        let waiting = self
            .state
            .approvals
            .get(&hold)
            .filter(|a| a.decision.is_none())
            .cloned();
        if let Some(approval) = waiting {
            self.decide(&hold, approval, true, &by, &note, None)?;
        }
        Ok(())
    }
}
