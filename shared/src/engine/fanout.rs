//! Joins and fan-out. A join keeps the *set* of arrivals (keyed by arriving node, or by fan-out
//! branch) and fires when the set is complete, exactly once per round; a fan-out records its
//! items as branches and sets the join's expected count in the same step that publishes the
//! branch jobs.

use super::state::{Outcome, RunStatus};
use super::step::Engine;
use super::EngineError;
use crate::expr;
use crate::graph::{Node, NodeKind};
use crate::ids::NodeId;
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// The body of a fan-out node, as the engine runs it.
#[derive(Clone, Copy)]
pub(super) struct FanOut<'a> {
    /// Expression giving the list of items.
    pub over: &'a str,
    pub body: &'a NodeId,
    pub join: &'a NodeId,
}

impl Engine<'_> {
    pub(super) fn arrive(
        &mut self,
        id: &NodeId,
        n: &Node,
        branch: Option<u32>,
        from: Option<&NodeId>,
    ) -> Result<(), EngineError> {
        let is_static = !n.wait_for().is_empty();
        let key = match (is_static, branch) {
            (false, Some(b)) => b.to_string(),
            _ => from.map(|f| f.to_string()).unwrap_or_default(),
        };
        let ok = from
            .and_then(|f| self.state.last_outcome_in(f, branch))
            .map(|o| o.ok)
            .unwrap_or(true);
        let expected = if is_static { n.wait_for().len() } else { 0 };
        let join = self.state.joins.entry(id.clone()).or_default();
        if is_static {
            join.expected = expected;
        }
        join.arrived.insert(key, ok);
        if join.arrived.len() < join.expected {
            return Ok(());
        }
        self.fire(id, n)
    }

    /// The join is complete: record its outcome (every arrival's output), reset, route on.
    pub(super) fn fire(&mut self, id: &NodeId, n: &Node) -> Result<(), EngineError> {
        let join = self.state.joins.entry(id.clone()).or_default();
        let arrived = std::mem::take(&mut join.arrived);
        join.fired += 1;
        let visit = self.state.visits.get(id).copied().unwrap_or(0) + 1;
        self.state.visits.insert(id.clone(), visit);
        // Each branch's newest outcome, in one pass over the history (not one per arrival:
        // a join of 100,000 branches would scan it 100,000 times).
        let mut newest: HashMap<u32, &Outcome> = HashMap::new();
        for o in self.state.history.iter().rev() {
            if let Some(b) = o.branch {
                newest.entry(b).or_insert(o);
            }
        }
        let mut outputs = Map::new();
        for key in arrived.keys() {
            let o = match key.parse::<u32>() {
                Ok(b) => newest.get(&b).copied(),
                Err(_) => self.state.last_outcome(&NodeId::new(key.clone())),
            };
            outputs.insert(
                key.clone(),
                o.map(|o| o.output.clone()).unwrap_or(Value::Null),
            );
        }
        let all_ok = arrived.values().all(|ok| *ok);
        let output = json!({"arrivals": outputs, "count": arrived.len()});
        let outcome =
            Outcome::of_engine(&self.state.run_id, id, visit, all_ok, output, self.at, None);
        self.state.history.push(outcome);
        for t in self.route(n, id, None)? {
            if self.state.status.is_terminal() {
                break;
            }
            self.enter(&t, None, Some(id))?;
        }
        Ok(())
    }

    pub(super) fn fan_out(
        &mut self,
        id: &NodeId,
        fanout: FanOut<'_>,
        visit: u32,
        branch: Option<u32>,
    ) -> Result<(), EngineError> {
        let ctx = self.state.context_in(branch);
        let FanOut { over, body, join } = fanout;
        let items = match expr::eval(over, &ctx).map_err(Self::expr_err(id))? {
            Value::Array(items) => items,
            Value::Null => Vec::new(),
            other => vec![other],
        };
        if items.len() > crate::limits::MAX_FANOUT {
            let result = json!({"reason": "fanout_too_wide", "node": id, "items": items.len(),
                "limit": crate::limits::MAX_FANOUT});
            self.finish(RunStatus::Failed, result);
            return Ok(());
        }
        let (body, join_id) = (body.clone(), join.clone());
        let join = self.state.joins.entry(join_id.clone()).or_default();
        join.arrived.clear();
        join.expected = items.len();
        let output = json!({"count": items.len()});
        let outcome =
            Outcome::of_engine(&self.state.run_id, id, visit, true, output, self.at, branch);
        self.state.history.push(outcome);
        if items.is_empty() {
            let jn = self.node(&join_id)?.clone();
            return self.fire(&join_id, &jn);
        }
        let body_node = self.node(&body)?.clone();
        let first = self
            .state
            .branches
            .keys()
            .next_back()
            .map(|b| b + 1)
            .unwrap_or(1);
        let mut base = self.state.context();
        for (i, item) in items.into_iter().enumerate() {
            let b = first + i as u32;
            self.state.branches.insert(b, item.clone());
            if matches!(
                body_node.kind(),
                NodeKind::Agent | NodeKind::Command | NodeKind::Harness | NodeKind::Git
            ) {
                // The common case, without rebuilding the context per branch.
                let v = self.state.visits.get(&body).copied().unwrap_or(0) + 1;
                if body_node.max_visits.is_some_and(|m| v > m) {
                    self.enter(&body, Some(b), Some(id))?;
                    continue;
                }
                self.state.visits.insert(body.clone(), v);
                base["branch"] = json!(b);
                base["item"] = item;
                self.publish(&body, &body_node, v, Some(b), Some(id), &base)?;
            } else {
                self.enter(&body, Some(b), Some(id))?;
            }
        }
        Ok(())
    }
}
