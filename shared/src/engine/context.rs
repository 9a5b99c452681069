//! The context expressions and templates see: the run's outcomes by node, `last`, `all`, the
//! input, visits, approvals and the run; as seen from a fan-out branch, its item and its own
//! outcomes first. And the part of it an agent's prompt gets (only what its template reads).

use super::state::{Outcome, RunState};
use crate::expr;
use crate::graph::{GraphBundle, Node};
use serde_json::{json, Map, Value};

impl RunState {
    /// The context expressions and templates see.
    pub fn context(&self) -> Value {
        self.context_in(None)
    }

    /// The context as seen from a fan-out branch: its item, and its own outcomes first.
    pub fn context_in(&self, branch: Option<u32>) -> Value {
        let mut ctx = Map::new();
        for o in self.history.iter().filter(|o| o.branch.is_none()) {
            ctx.insert(o.node.to_string(), outcome_view(o));
        }
        if let Some(b) = branch {
            for o in self.history.iter().filter(|o| o.branch == Some(b)) {
                ctx.insert(o.node.to_string(), outcome_view(o));
            }
            ctx.insert("branch".into(), json!(b));
            ctx.insert(
                "item".into(),
                self.branches.get(&b).cloned().unwrap_or(Value::Null),
            );
        }
        let last = match branch {
            Some(b) => self
                .history
                .iter()
                .rev()
                .find(|o| o.branch == Some(b))
                .or(self.history.last()),
            None => self.history.last(),
        };
        if let Some(last) = last {
            ctx.insert("last".into(), outcome_view(last));
        }
        let mut all: Map<String, Value> = Map::new();
        for o in self
            .history
            .iter()
            .filter(|o| o.branch.is_none() || o.branch == branch)
        {
            if let Value::Array(list) = all
                .entry(o.node.to_string())
                .or_insert_with(|| Value::Array(Vec::new()))
            {
                list.push(json!({"ok": o.ok, "status": o.status, "output": o.output,
                    "derived": o.derived, "visit": o.visit}));
            }
        }
        ctx.insert("all".into(), Value::Object(all));
        ctx.insert("input".into(), self.input.clone());
        if let Some(e) = self.sibling_events.last() {
            ctx.insert(
                "event".into(),
                json!({"name": e.name, "from": e.from, "payload": e.payload}),
            );
        }
        ctx.insert("visits".into(), json!(self.visits));
        ctx.insert("quarantine".into(), json!(self.quarantine));
        ctx.insert(
            "approvals".into(),
            json!(self
                .approvals
                .iter()
                .map(|(n, a)| (n.to_string(), json!(a.decision)))
                .collect::<Map<_, _>>()),
        );
        ctx.insert(
            "run".into(),
            json!({"id": self.run_id, "meta": self.meta, "base_commit": self.repo.base_commit,
                   "usage": self.usage, "depth": self.depth(),
                   "parent": self.tree.as_ref().map(|t| &t.parent)}),
        );
        Value::Object(ctx)
    }
}

pub(super) fn outcome_view(o: &Outcome) -> Value {
    json!({
        "node": o.node,
        "ok": o.ok,
        "status": o.status,
        "output": o.output,
        "derived": o.derived,
        "error": o.error,
        "visit": o.visit,
        "commit": o.commit,
        "artifacts": o.artifacts,
        "usage": o.usage,
    })
}

/// The part of the context an agent's template reads (its top-level variables): a prompt never
/// carries what its template does not show, e.g. a sibling branch's outputs.
pub(super) fn template_context(bundle: &GraphBundle, n: &Node, ctx: &Value) -> Value {
    let Some(text) = n.agent().and_then(|a| bundle.file(&a.template)) else {
        return Value::Null;
    };
    let Ok(vars) = expr::template_variables("template", text) else {
        return ctx.clone();
    };
    let mut out = Map::new();
    for v in vars {
        if let Some(value) = ctx.get(&v) {
            out.insert(v, value.clone());
        }
    }
    Value::Object(out)
}
