//! Events between sibling runs (children of one spawn): a node with `broadcast: NAME` sends
//! each ok visit, as a [`SiblingEvent`], to its parent, which relays it to every other child
//! of that spawn still running; a child that receives it records it (`event` in its context)
//! and enters the graph's `on_sibling` handler for that name. Each step is fenced: the event's
//! id is the broadcasting job's id, the parent relays an id once per spawn, and a child takes
//! an id once, so a redelivered message starts nothing twice.

use super::state::RunStatus;
use super::step::Engine;
use super::{ChildGroup, Effect, EngineError, Outcome};
use crate::ids::{NodeId, RunId};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// An event one child run sends its siblings.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SiblingEvent {
    /// The broadcasting visit's job id: unique, and the same on every redelivery.
    pub id: String,
    pub name: String,
    pub from: RunId,
    pub parent: RunId,
    /// The parent's spawn node and visit the siblings share.
    pub spawn: NodeId,
    pub visit: u32,
    /// `{node, output, derived, commit}` of the broadcasting visit.
    pub payload: Value,
    /// Packs holding the sender's commits, so a sibling can start a worktree from them.
    #[serde(default)]
    pub packs: Vec<String>,
}

impl Engine<'_> {
    /// After an ok visit of a node with `broadcast`: the event, for the parent to relay. Its
    /// commit is the visit's own, or for a node that does not commit (a check on a merge) the
    /// commit its worktree was made from.
    pub(super) fn broadcast(
        &mut self,
        name: &str,
        outcome: &Outcome,
        worktree_from: Option<String>,
    ) {
        let Some(link) = &self.state.tree else {
            return;
        };
        let commit = outcome.commit.clone().or(worktree_from);
        let event = SiblingEvent {
            id: outcome.job_id.to_string(),
            name: name.to_string(),
            from: self.state.run_id.clone(),
            parent: link.parent.clone(),
            spawn: link.node.clone(),
            visit: link.visit,
            payload: json!({
                "node": outcome.node,
                "output": outcome.output,
                "derived": outcome.derived,
                "commit": commit,
            }),
            packs: self.state.repo.packs.clone(),
        };
        self.fx.push(Effect::RelayToSiblings(Box::new(event)));
    }

    /// In the parent: relays the event to every other child of the spawn still running, once.
    pub(super) fn relay(&mut self, event: &SiblingEvent) {
        let key = ChildGroup::key(&event.spawn, event.visit);
        let Some(group) = self.state.children.get_mut(&key) else {
            return;
        };
        if group.settled || !group.relayed.insert(event.id.clone()) {
            return;
        }
        let to: Vec<RunId> = group
            .running()
            .filter(|c| c.run_id != event.from)
            .map(|c| c.run_id.clone())
            .collect();
        if !to.is_empty() {
            self.fx
                .push(Effect::DeliverToRuns(to, Box::new(event.clone())));
        }
    }

    /// In a sibling: records the event and starts its handler, once.
    pub(super) fn receive(&mut self, event: &SiblingEvent) -> Result<(), EngineError> {
        self.state.sibling_events.push(event.clone());
        for pack in &event.packs {
            if !self.state.repo.packs.contains(pack) {
                self.state.repo.packs.push(pack.clone());
            }
        }
        let Some(handler) = self.bundle.graph.on_sibling.get(&event.name).cloned() else {
            return Ok(());
        };
        if self.state.status != RunStatus::Running {
            return Ok(());
        }
        self.enter(&handler, None, None)
    }
}
