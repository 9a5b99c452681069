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
use shared::engine::{ChildReport, ChildRun, Effect, RunState};
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
                    let msg = self.run_message(&child.run.run_id, Some(child)).await?;
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
            Effect::Notify(notice) => out.push(OutboxMessage::Notice((**notice).clone())),
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
        let (id, link) = (child.run.run_id.clone(), child.tree.clone());
        match self.load(&id).await {
            // A run under this id that is not this child (a submitter chose the id first): the
            // parent hears its child failed, and the other run is left alone.
            Ok(existing) if existing.tree.as_ref() != Some(&link) => {
                warn!(run = %id, parent = %link.parent, "a child's run id is taken by another run; failing the child");
                let report = ChildReport::failed_before_start(&link, &id, "child_run_id_taken");
                return self.report_to_parent(report).await;
            }
            Ok(existing) if !existing.status.is_terminal() => {}
            Ok(existing) => {
                if let Some(report) = existing.child_report() {
                    self.report_to_parent(report).await?;
                }
                return Ok(());
            }
            Err(DriverError::UnknownRun(_)) => {
                let bundle = self.bundle(&child.run.graph_ref).await?;
                let mut state = RunState::new_child(child, &bundle, self.clock.now());
                // A child run is its parent's team's.
                state.team = self.load(&link.parent).await.ok().and_then(|p| p.team);
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
                        .open_child(&link.node, link.visit, link.index, &id)
                        .is_some_and(|(group, _)| !group.settled)
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

    /// Applies a child's report to its parent (a parent that is gone hears nothing).
    async fn report_to_parent(&self, report: ChildReport) -> Result<(), DriverError> {
        let parent = report.parent.clone();
        match self
            .apply(&parent, &self.child_finished_event(report))
            .await
        {
            Ok(_) | Err(DriverError::UnknownRun(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The event a child's end is for its parent.
    pub(super) fn child_finished_event(&self, report: ChildReport) -> shared::engine::Event {
        shared::engine::Event::ChildFinished {
            report: Box::new(report),
            at: self.clock.now(),
        }
    }
}
