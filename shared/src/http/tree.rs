//! Views of a tree of child runs: where a run sits (the engine's `TreeLink`, in its status) and its
//! children by spawn visit ([`ChildView`]); `GET /v1/runs/:id/tree` nests them ([`RunTree`]).

use crate::engine::{RunState, RunStatus};
use crate::ids::{NodeId, RunId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One child run as its parent sees it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ChildView {
    pub run_id: RunId,
    pub node: NodeId,
    pub visit: u32,
    pub index: u32,
    /// None while the child runs.
    pub status: Option<RunStatus>,
}

/// `GET /v1/runs/:id/tree`: the run's tree.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct RunTree {
    #[serde(default = "super::api_version")]
    pub v: u32,
    pub tree: TreeView,
}

/// A run and, nested, every run below it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct TreeView {
    pub run_id: RunId,
    pub status: RunStatus,
    pub depth: u32,
    /// The spawn node of the parent that started this run (none for the root).
    pub node: Option<NodeId>,
    #[schema(no_recursion)]
    pub children: Vec<TreeView>,
    /// Children the parent recorded but whose runs could not be read (not created yet, or
    /// gone from the store).
    pub missing: Vec<RunId>,
}

impl ChildView {
    /// Every child of the run, by spawn visit and index.
    pub fn all(s: &RunState) -> Vec<Self> {
        s.children
            .values()
            .flat_map(|g| {
                g.children.iter().enumerate().map(|(i, c)| ChildView {
                    run_id: c.run_id.clone(),
                    node: g.node.clone(),
                    visit: g.visit,
                    index: i as u32,
                    status: c.status,
                })
            })
            .collect()
    }
}

impl TreeView {
    /// The tree below `s`, reading each child with `load` (none: not readable).
    pub fn build(s: &RunState, load: &mut dyn FnMut(&RunId) -> Option<RunState>) -> Self {
        let mut children = Vec::new();
        let mut missing = Vec::new();
        for c in ChildView::all(s) {
            match load(&c.run_id) {
                Some(child) => children.push(TreeView::build(&child, load)),
                None => missing.push(c.run_id),
            }
        }
        TreeView {
            run_id: s.run_id.clone(),
            status: s.status,
            depth: s.depth(),
            node: s.tree.as_ref().map(|t| t.node.clone()),
            children,
            missing,
        }
    }

    /// Every run in the tree.
    pub fn size(&self) -> usize {
        1 + self.children.iter().map(TreeView::size).sum::<usize>()
    }

    /// The tree as indented lines: `run_id  status  (node)`.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.push_lines(0, &mut out);
        out
    }

    fn push_lines(&self, indent: usize, out: &mut Vec<String>) {
        let status = serde_json::to_value(self.status)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let from = self
            .node
            .as_ref()
            .map(|n| format!("  (from {n})"))
            .unwrap_or_default();
        out.push(format!(
            "{}{}  {status}{from}",
            "  ".repeat(indent),
            self.run_id
        ));
        for c in &self.children {
            c.push_lines(indent + 1, out);
        }
        for m in &self.missing {
            out.push(format!("{}{m}  not started", "  ".repeat(indent + 1)));
        }
    }
}
