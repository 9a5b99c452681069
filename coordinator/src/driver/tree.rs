//! Child runs on the fleet: the engine's `StartChildren`, `NotifyParent`, `CancelRuns` and
//! the sibling events (`RelayToSiblings`, `DeliverToRuns`) become outbox messages (committed with the state change that caused them) published on the
//! results queue, so a child is created, its parent told of its end and a cancel delivered
//! exactly as reliably as a job result: acked only after the change they cause is committed.
//!
//! A child is created and then its parent is read again: a parent that ended (or stopped
//! waiting for it) meanwhile gets the child cancelled at once. So a cancel that reached the
//! results queue before the child existed cannot leave the child running: the parent's end was
//! committed before that cancel was sent, and so before this read.

use super::{Coordinator, DriverError};
use shared::engine::{ChildGroup, ChildReport, ChildRun, Effect, RunState};
use shared::messages::{ResultMessage, RunMessage, INLINE_LIMIT, WIRE_VERSION};
use shared::ports::OutboxMessage;
use tracing::{info, warn};
use worker::blobs::BlobError;

impl Coordinator {
    /// The outbox messages of an effect between runs (none for other effects).
    pub(super) async fn run_messages(
        &self,
        fx: &Effect,
        out: &mut Vec<OutboxMessage>,
    ) -> Result<(), DriverError> {
        match fx {
            Effect::StartChildren(children) => {
                for child in children {
                    let msg = self.run_message(&child.run_id, Some(child)).await?;
                    out.push(OutboxMessage::Run(ResultMessage::StartRun(msg)));
                }
            }
            Effect::NotifyParent(report) => {
                let msg = self.run_message(&report.parent, Some(report)).await?;
                out.push(OutboxMessage::Run(ResultMessage::ChildFinished(msg)));
            }
            Effect::CancelRuns(runs) => {
                for run in runs {
                    let msg = self.run_message::<()>(run, None).await?;
                    out.push(OutboxMessage::Run(ResultMessage::CancelRun(msg)));
                }
            }
            Effect::RelayToSiblings(event) => {
                let msg = self.run_message(&event.parent, Some(event)).await?;
                out.push(OutboxMessage::Run(ResultMessage::SiblingEvent(msg)));
            }
            Effect::DeliverToRuns(runs, event) => {
                for run in runs {
                    let msg = self.run_message(run, Some(event)).await?;
                    out.push(OutboxMessage::Run(ResultMessage::FromSibling(msg)));
                }
            }
            _ => {}
        }
        Ok(())
    }

    async fn run_message<T: serde::Serialize + Clone>(
        &self,
        run: &shared::ids::RunId,
        body: Option<&T>,
    ) -> Result<RunMessage, DriverError> {
        let (body_ref, body) = match body {
            None => (None, None),
            Some(b) => {
                let value = serde_json::to_value(b).expect("a run message body serializes");
                let (key, inline) = self.blobs.inline_or_store(&value, INLINE_LIMIT).await?;
                (Some(key), inline)
            }
        };
        Ok(RunMessage {
            v: WIRE_VERSION,
            run_id: run.clone(),
            body_ref,
            body,
        })
    }

    /// The payload of a run message: inline, or read by its content key.
    pub(super) async fn run_message_body<T: serde::de::DeserializeOwned>(
        &self,
        msg: &RunMessage,
    ) -> Result<T, BlobError> {
        let value = match (&msg.body, &msg.body_ref) {
            (Some(v), _) => v.clone(),
            (None, Some(key)) => self.blobs.get_content(key).await?,
            (None, None) => serde_json::Value::Null,
        };
        serde_json::from_value(value).map_err(|e| BlobError::Decode {
            key: msg.body_ref.clone().unwrap_or_default(),
            source: e,
        })
    }

    /// Creates and starts a child run, then cancels it if its parent no longer waits for it. A
    /// child that exists (in the store, or restored from its mirror) is not started again; one
    /// that ended sends its parent its report again (it counts once), since the first may
    /// have been lost with the store.
    pub(super) async fn start_child(&self, child: ChildRun) -> Result<(), DriverError> {
        let (id, link) = (child.run_id.clone(), child.tree.clone());
        match self.load(&id).await {
            // A run under this id that is not this child (a submitter chose the id first): the
            // parent hears its child failed, and the other run is left alone.
            Ok(existing) if existing.tree.as_ref() != Some(&link) => {
                warn!(run = %id, parent = %link.parent, "a child's run id is taken by another run; failing the child");
                let report = ChildReport {
                    parent: link.parent.clone(),
                    child: id.clone(),
                    node: link.node.clone(),
                    visit: link.visit,
                    index: link.index,
                    status: shared::engine::RunStatus::Failed,
                    result: serde_json::json!({"reason": "child_run_id_taken"}),
                    head: None,
                    packs: Vec::new(),
                    budget_left: 0,
                    usage: Default::default(),
                };
                let event = self.child_finished_event(report);
                match self.apply(&link.parent, &event).await {
                    Ok(_) | Err(DriverError::UnknownRun(_)) => {}
                    Err(e) => return Err(e),
                }
                return Ok(());
            }
            Ok(existing) if !existing.status.is_terminal() => {}
            Ok(existing) => {
                if let Some(report) = existing.child_report() {
                    let event = self.child_finished_event(report);
                    match self.apply(&link.parent, &event).await {
                        Ok(_) | Err(DriverError::UnknownRun(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
                return Ok(());
            }
            Err(DriverError::UnknownRun(_)) => {
                let bundle = self.bundle(&child.graph_ref).await?;
                let state = RunState::new_child(child, &bundle, self.clock.now());
                if self.create_run(state, &bundle).await? {
                    info!(run = %id, parent = %link.parent, depth = link.depth, "child run started");
                }
            }
            Err(e) => return Err(e),
        }
        let waited_for = match self.load(&link.parent).await {
            Ok(parent) => {
                !parent.status.is_terminal()
                    && parent
                        .children
                        .get(&ChildGroup::key(&link.node, link.visit))
                        .filter(|g| !g.settled)
                        .and_then(|g| g.children.get(link.index as usize))
                        .is_some_and(|c| c.run_id == id && c.status.is_none())
            }
            Err(DriverError::UnknownRun(_)) => false,
            Err(e) => return Err(e),
        };
        if !waited_for {
            warn!(run = %id, parent = %link.parent, "the parent no longer waits for this child; cancelling it");
            self.cancel(&id).await?;
        }
        Ok(())
    }

    /// The event a child's end is for its parent.
    pub(super) fn child_finished_event(&self, report: ChildReport) -> shared::engine::Event {
        shared::engine::Event::ChildFinished {
            report: Box::new(report),
            at: self.clock.now(),
        }
    }
}
