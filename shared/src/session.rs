//! Agent sessions that outlive one answer (seed 003): messages appended to a running session
//! (crosstalk between agents, a harness's note), and the incremental loop's rules: what one
//! invocation reports (`IncrementalProgress`), when the loop stops (done, its budget, stuck),
//! the prompt of the next invocation, and the checkpoint a killed worker resumes from. Pure:
//! the worker runs the loop, the engine keeps the mailboxes.

use crate::ids::{JobId, NodeId};
use crate::messages::Usage;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The most text one session message may carry (longer ones are cut, and say so).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024;
/// The most of a failed checkpoint's output the next invocation is shown.
pub const MAX_CHECKPOINT_EXCERPT: usize = 2 * 1024;

/// A user message for an agent session, numbered in its mailbox (1, 2, ...).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SessionMessage {
    pub seq: u64,
    /// The node whose session sent it.
    pub from: NodeId,
    /// The sender's invocation it followed.
    pub invocation: u32,
    pub text: String,
}

impl SessionMessage {
    /// How the session sees it: who sent it, then its text.
    pub fn as_user_text(&self) -> String {
        format!("[message from `{}`] {}", self.from, self.text)
    }
}

/// `text` cut to `MAX_MESSAGE_BYTES` on a character boundary, marked when cut.
pub fn bounded_message(text: &str) -> String {
    if text.len() <= MAX_MESSAGE_BYTES {
        return text.to_string();
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} [cut]", &text[..end])
}

/// Messages for running jobs, broadcast on the control channel (best effort: the engine sends
/// again what a job's progress shows it has not received).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Delivery {
    pub job_id: JobId,
    pub messages: Vec<SessionMessage>,
}

/// The messages of one node's session and how far its jobs have read them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Mailbox {
    pub messages: Vec<SessionMessage>,
    /// The highest `seq` a job of the node reported delivered.
    pub delivered: u64,
}

impl Mailbox {
    /// Appends a message, numbered next.
    pub fn push(&mut self, from: NodeId, invocation: u32, text: &str) -> SessionMessage {
        let msg = SessionMessage {
            seq: self.messages.len() as u64 + 1,
            from,
            invocation,
            text: bounded_message(text),
        };
        self.messages.push(msg.clone());
        msg
    }

    /// The messages after `seq`.
    pub fn after(&self, seq: u64) -> Vec<SessionMessage> {
        self.messages
            .iter()
            .filter(|m| m.seq > seq)
            .cloned()
            .collect()
    }

    pub fn undelivered(&self) -> Vec<SessionMessage> {
        self.after(self.delivered)
    }
}

/// Whether one invocation leaves work.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WorkStatus {
    MoreWork,
    Done,
}

/// What each invocation of an incremental session answers (the node's schema may ask more).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IncrementalProgress {
    pub status: WorkStatus,
    /// What this invocation completed.
    #[serde(default)]
    pub completed: Vec<String>,
    /// What still needs work.
    #[serde(default)]
    pub remaining: Vec<String>,
    #[serde(default)]
    pub notes: Option<String>,
}

impl IncrementalProgress {
    /// Reads an invocation's output, or says what it lacks.
    pub fn read(output: &Value) -> Result<Self, String> {
        serde_json::from_value(output.clone()).map_err(|e| {
            format!("an incremental invocation must answer an IncrementalProgress: {e}")
        })
    }
}

/// One checkpoint command's run after an invocation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CheckpointRun {
    pub name: String,
    pub exit_code: i64,
    /// The tail of its output (for the next prompt), at most `MAX_CHECKPOINT_EXCERPT`.
    pub excerpt: String,
}

impl CheckpointRun {
    pub fn ok(&self) -> bool {
        self.exit_code == 0
    }
}

/// Why the loop stopped.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LoopEnd {
    /// The agent said done and every checkpoint passed.
    Done,
    /// `max_invocations` ran without that.
    Budget,
    /// `stuck_after` invocations in a row committed nothing and left `remaining` as it was.
    Stuck,
}

/// The loop's book, kept in each checkpoint: a resumed loop goes on from it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LoopBook {
    /// Invocations finished.
    pub invocations: u32,
    /// Everything completed so far, in order, without repeats.
    pub completed: Vec<String>,
    pub remaining: Vec<String>,
    pub notes: Option<String>,
    /// Invocations in a row without progress.
    pub idle: u32,
    /// The checkpoints of the last invocation.
    pub checkpoints: Vec<CheckpointRun>,
    /// The highest message `seq` the session has received.
    pub delivered: u64,
    pub usage: Usage,
}

/// The loop's limits, from the node's `incremental` (checkpoint commands rendered).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LoopSpec {
    pub max_invocations: u32,
    pub stuck_after: u32,
    /// (name, command line) in order.
    pub checkpoints: Vec<(String, String)>,
}

impl LoopBook {
    /// Books one finished invocation (its progress, whether it committed, its checkpoints) and
    /// says whether the loop ends.
    pub fn record(
        &mut self,
        spec: &LoopSpec,
        progress: &IncrementalProgress,
        committed: bool,
        checkpoints: Vec<CheckpointRun>,
    ) -> Option<LoopEnd> {
        self.invocations += 1;
        let moved = committed || progress.remaining != self.remaining;
        self.idle = if moved { 0 } else { self.idle + 1 };
        for c in &progress.completed {
            if !self.completed.contains(c) {
                self.completed.push(c.clone());
            }
        }
        self.remaining = progress.remaining.clone();
        self.notes = progress.notes.clone();
        self.checkpoints = checkpoints;
        let green = self.checkpoints.iter().all(CheckpointRun::ok);
        if progress.status == WorkStatus::Done && green {
            Some(LoopEnd::Done)
        } else if self.idle >= spec.stuck_after {
            Some(LoopEnd::Stuck)
        } else if self.invocations >= spec.max_invocations {
            Some(LoopEnd::Budget)
        } else {
            None
        }
    }

    /// The node's output when the loop ends.
    pub fn output(&self, end: LoopEnd, resumed_after: Option<u32>, last: &Value) -> Value {
        serde_json::json!({
            "status": end,
            "invocations": self.invocations,
            "completed": self.completed,
            "remaining": self.remaining,
            "notes": self.notes,
            "checkpoints": self.checkpoints,
            "delivered": self.delivered,
            "resumed_after": resumed_after,
            "last": last,
        })
    }
}

/// The prompt of invocation `n` > 1: where the loop stands and what failed at the last
/// checkpoint (messages from other sessions come as their own user turns).
pub fn continuation_prompt(n: u32, book: &LoopBook) -> String {
    let mut p = format!(
        "Invocation {n}. Continue the work in the worktree; do one more increment and answer \
         with your progress (`status` `done` only when nothing remains)."
    );
    if !book.remaining.is_empty() {
        p.push_str(&format!("\nRemaining: {}.", book.remaining.join(", ")));
    }
    for c in book.checkpoints.iter().filter(|c| !c.ok()) {
        p.push_str(&format!(
            "\n\nCheckpoint `{}` failed (exit {}):\n```\n{}\n```",
            c.name, c.exit_code, c.excerpt
        ));
    }
    p
}

/// What a worker keeps after each invocation (object storage, one per job and visit): a
/// worker that takes the job over resumes from here, not from scratch.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Checkpoint {
    pub job_id: JobId,
    pub book: LoopBook,
    /// The session's transcript so far.
    pub transcript: Value,
    /// The worktree's commit after the invocation, and the pack of its commits since the
    /// job's base (none: nothing committed yet).
    pub commit: String,
    pub pack: Option<String>,
    /// The last invocation's output.
    pub last: Value,
    /// How the loop ended, when that invocation ended it.
    #[serde(default)]
    pub end: Option<LoopEnd>,
    /// Whether that invocation committed something.
    #[serde(default)]
    pub committed: bool,
}

/// One invocation's progress, published on the results queue after its checkpoint is kept.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProgressNotice {
    pub v: u32,
    pub job_id: JobId,
    pub run_id: crate::ids::RunId,
    pub attempt: crate::ids::Attempt,
    pub invocation: u32,
    /// The invocation's output (an `IncrementalProgress`).
    pub output: Value,
    /// Whether the invocation committed something.
    pub committed: bool,
    pub commit: String,
    /// The highest message `seq` the session has received.
    pub delivered: u64,
}

#[cfg(test)]
mod tests;
