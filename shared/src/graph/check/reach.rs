//! Walking the graph: the successors of a node, what is reachable from a node, and the loops
//! (strongly connected components) that need a visit budget.

use crate::graph::{Graph, Node, NodeBody};
use crate::ids::NodeId;
use std::collections::{BTreeMap, BTreeSet};

/// Every node control can pass to from `node`: routes, fan-out bodies and joins, budget and
/// stuck exits.
fn successors(node: &Node) -> impl Iterator<Item = &NodeId> {
    node.routes
        .iter()
        .flat_map(|r| r.to.nodes())
        .chain(match &node.body {
            NodeBody::Fanout { body, join, .. } => vec![body, join],
            _ => vec![],
        })
        .chain(node.budget_exit.iter())
        .chain(node.stuck.iter().map(|s| &s.to))
}

pub(super) fn reachable_from(g: &Graph, start: &NodeId) -> BTreeSet<NodeId> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![start.clone()];
    while let Some(n) = stack.pop() {
        if !seen.insert(n.clone()) {
            continue;
        }
        if let Some(node) = g.nodes.get(&n) {
            stack.extend(
                successors(node)
                    .filter(|s| g.nodes.contains_key(*s))
                    .cloned(),
            );
        }
    }
    seen
}

/// Strongly connected components that form a loop (more than one node, or a self route).
pub(super) fn cycles(g: &Graph) -> Vec<Vec<NodeId>> {
    let ids: Vec<&NodeId> = g.nodes.keys().collect();
    let reach: BTreeMap<&NodeId, BTreeSet<NodeId>> = ids
        .iter()
        .map(|id| {
            let direct: Vec<NodeId> = successors(&g.nodes[*id])
                .filter(|s| g.nodes.contains_key(*s))
                .cloned()
                .collect();
            let mut all = BTreeSet::new();
            for d in direct {
                all.extend(reachable_from(g, &d));
            }
            (*id, all)
        })
        .collect();
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for id in &ids {
        if assigned.contains(*id) || !reach[id].contains(*id) {
            continue;
        }
        let scc: Vec<NodeId> = ids
            .iter()
            .filter(|o| reach[id].contains(**o) && reach[**o].contains(*id))
            .map(|o| (*o).clone())
            .collect();
        assigned.extend(scc.iter().cloned());
        out.push(scc);
    }
    out
}
