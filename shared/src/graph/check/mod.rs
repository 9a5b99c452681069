//! The static checker: rejects a bad graph before anything runs, naming file, node and field.
//!
//! The rooms: this file holds [`check`] (the limits first, then the graph as a whole: start,
//! exits, prepare hook, input schema, node names, reachability and loop budgets),
//! [`CheckError`] and the names the checker knows (reserved context names, harness ops, exit
//! assemblers); `nodes.rs` checks one node (routes, expressions, worktrees and write scopes,
//! and the fields of each node kind); `reach.rs` walks the graph (successors, reachability,
//! loops); `providers.rs` checks agent nodes' output schemas against the LLM providers' rules
//! (`crate::providers`), apart from [`check`]: which provider's rules are errors depends on the
//! run.

mod nodes;
mod providers;
mod reach;

use super::{GraphBundle, NodeKind};
use crate::ids::NodeId;
use nodes::check_node;
pub use providers::{check_providers, ProviderFindings};
use reach::{cycles, reachable_from};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckError {
    pub source: String,
    pub node: Option<String>,
    pub field: String,
    pub message: String,
}

impl CheckError {
    pub fn new(source: &str, node: Option<&str>, field: &str, message: impl Into<String>) -> Self {
        Self {
            source: source.to_string(),
            node: node.filter(|n| !n.is_empty()).map(str::to_string),
            field: field.to_string(),
            message: message.into(),
        }
    }
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.source)?;
        if let Some(node) = &self.node {
            write!(f, ": node `{node}`")?;
        }
        if !self.field.is_empty() {
            write!(f, ": field `{}`", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for CheckError {}

/// Names the engine puts in the expression context beside the node names.
pub const RESERVED: &[&str] = &[
    "input",
    "visits",
    "last",
    "run",
    "params",
    "files",
    "loop",
    "item",
    "branch",
    "output",
    "derived",
    "approvals",
    "all",
    "event",
    "index",
];

/// Variables a worker adds when it renders an agent's prompt.
const WORKER_VARS: &[&str] = &[
    "params",
    "context_files",
    "tools",
    "output_schema",
    "item",
    "branch",
];

pub fn check(bundle: &GraphBundle) -> Result<(), Vec<CheckError>> {
    let g = &bundle.graph;
    let src = bundle.source.as_str();
    // Bounds first: nothing below runs on a graph too big to analyse quickly.
    if let Some(why) = crate::limits::graph_exceeds(g) {
        return Err(vec![CheckError::new(src, None, "", why)]);
    }
    let mut errs = Vec::new();
    let mut err = |node: Option<&NodeId>, field: &str, msg: String| {
        errs.push(CheckError::new(src, node.map(|n| n.as_str()), field, msg));
    };

    if !g.nodes.contains_key(&g.start) {
        err(None, "start", format!("unknown node `{}`", g.start));
    }
    if !g.nodes.values().any(|n| n.kind() == NodeKind::Exit) {
        err(None, "nodes", "the graph has no exit node".to_string());
    }
    if let Some(prepare) = &g.prepare {
        if crate::builtins::prepare_hook(prepare).is_none() {
            err(None, "prepare", format!("unknown prepare hook `{prepare}`"));
        }
    }
    if let Some(path) = &g.input_schema {
        if let Err(e) = schema_check(bundle, path) {
            err(None, "input_schema", e);
        }
    }

    for (id, node) in &g.nodes {
        if RESERVED.contains(&id.as_str()) {
            err(Some(id), "", format!("`{id}` is a reserved name"));
        }
        if !id
            .as_str()
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            err(
                Some(id),
                "",
                "node names are letters, digits and `_`".into(),
            );
        }
        check_node(bundle, id, node, &mut err);
    }

    for (event, target) in &g.on_sibling {
        if !nodes::valid_event_name(event) {
            err(
                None,
                "on_sibling",
                format!("`{event}`: event names are letters, digits and `_`"),
            );
        }
        if !g.nodes.contains_key(target) {
            err(
                None,
                "on_sibling",
                format!("`{event}` starts unknown node `{target}`"),
            );
        }
    }

    if let Some(q) = &g.quarantine {
        if let Err(e) = crate::expr::compile_check(&q.pending) {
            err(None, "quarantine.pending", e.to_string());
        }
        if let Some(Err(e)) = q.details.as_deref().map(crate::expr::compile_check) {
            err(None, "quarantine.details", e.to_string());
        }
        if let Some(hold) = &q.hold {
            match g.nodes.get(hold) {
                Some(n) if n.kind() == NodeKind::Approval => {}
                _ => err(
                    None,
                    "quarantine.hold",
                    format!("`{hold}` is not an approval node"),
                ),
            }
        }
    }

    // Reachability from start and from sibling events' handlers; an observer is reachable
    // when a node it watches is.
    let mut reachable = reachable_from(g, &g.start);
    for target in g.on_sibling.values() {
        reachable.extend(reachable_from(g, target));
    }
    for (id, n) in &g.nodes {
        if n.observes.iter().any(|o| reachable.contains(o)) {
            reachable.insert(id.clone());
        }
    }
    for id in g.nodes.keys() {
        if !reachable.contains(id) {
            err(Some(id), "", "unreachable from the start node".into());
        }
    }

    // Every cycle needs a budget: some node on it with max_visits.
    for scc in cycles(g) {
        if !scc.iter().any(|n| g.nodes[n].max_visits.is_some()) {
            let names: Vec<_> = scc.iter().map(|n| n.to_string()).collect();
            err(
                Some(&scc[0]),
                "max_visits",
                format!(
                    "loop through [{}] has no visit budget: set max_visits on one of them",
                    names.join(", ")
                ),
            );
        }
    }

    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

pub(super) fn schema_check(bundle: &GraphBundle, path: &str) -> Result<(), String> {
    let text = bundle
        .file(path)
        .ok_or_else(|| format!("`{path}` not in the bundle"))?;
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("`{path}` is not JSON: {e}"))?;
    crate::schema::compile(&value)
        .map(|_| ())
        .map_err(|e| format!("`{path}` is not a valid JSON schema: {e}"))
}

#[cfg(test)]
mod tests;
