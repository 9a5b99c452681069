//! Messages between agent sessions (seed 003's crosstalk): each node has a mailbox in the run
//! state. An incremental job's progress notice (one per invocation, fenced by job, attempt and
//! invocation) books how far its session has read its own mailbox and, when the invocation
//! committed something, puts the node's `crosstalk` messages in the mailboxes of their targets.
//! A running target hears of them at once on the control channel (best effort); what a job's
//! progress shows it has not received is sent again, and a job published later finds what is
//! still unread in its spec. The worker skips a `seq` it has seen, so each message enters the
//! session once.

use super::step::Engine;
use super::EngineError;
use crate::expr;
use crate::ids::{JobId, NodeId};
use crate::session::{Delivery, ProgressNotice, SessionMessage};
use serde_json::{json, Value};

impl Engine<'_> {
    /// An invocation's progress from a live job of `node`.
    pub(super) fn progress(
        &mut self,
        node: &NodeId,
        notice: &ProgressNotice,
    ) -> Result<(), EngineError> {
        if let Some(r) = self.state.jobs.get_mut(&notice.job_id) {
            r.invocations = notice.invocation;
        }
        self.read_up_to(node, notice.delivered);
        let mut deliveries: Vec<Delivery> = Vec::new();
        let unread = self
            .state
            .mailboxes
            .get(node)
            .map(|m| m.after(notice.delivered))
            .unwrap_or_default();
        if !unread.is_empty() {
            deliveries.push(Delivery {
                job_id: notice.job_id.clone(),
                messages: unread,
            });
        }
        let talks = match &self.node(node)?.body {
            crate::graph::NodeBody::Agent(a) if notice.committed => a.crosstalk.clone(),
            _ => Vec::new(),
        };
        if !talks.is_empty() {
            let ctx = json!({
                "input": self.state.input,
                "node": node,
                "invocation": notice.invocation,
                "commit": notice.commit,
                "progress": notice.output,
            });
            for talk in talks {
                let text =
                    expr::render("crosstalk", &talk.message, &ctx).map_err(Self::expr_err(node))?;
                if text.trim().is_empty() {
                    continue;
                }
                let msg = self
                    .state
                    .mailboxes
                    .entry(talk.to.clone())
                    .or_default()
                    .push(node.clone(), notice.invocation, &text);
                if let Some(job_id) = self.running_job_of(&talk.to) {
                    match deliveries.iter_mut().find(|d| d.job_id == job_id) {
                        Some(d) => d.messages.push(msg),
                        None => deliveries.push(Delivery {
                            job_id,
                            messages: vec![msg],
                        }),
                    }
                }
            }
        }
        if !deliveries.is_empty() {
            self.fx.push(super::Effect::Deliver(deliveries));
        }
        Ok(())
    }

    /// A finished job of an incremental node: its output says how far it read.
    pub(super) fn session_ended(&mut self, node: &NodeId, output: &Value) {
        if let Some(seq) = output["delivered"].as_u64() {
            self.read_up_to(node, seq);
        }
    }

    /// The messages a new job of `node` starts with.
    pub(super) fn unread(&self, node: &NodeId) -> Vec<SessionMessage> {
        self.state
            .mailboxes
            .get(node)
            .map(|m| m.undelivered())
            .unwrap_or_default()
    }

    fn read_up_to(&mut self, node: &NodeId, seq: u64) {
        if let Some(m) = self.state.mailboxes.get_mut(node) {
            m.delivered = m.delivered.max(seq.min(m.messages.len() as u64));
        }
    }

    fn running_job_of(&self, node: &NodeId) -> Option<JobId> {
        self.state
            .pending_jobs()
            .find(|(_, r)| &r.node == node)
            .map(|(id, _)| id.clone())
    }
}
