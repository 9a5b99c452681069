//! The run store port: one real adapter (Redis) and one embedded adapter (memory). The queue,
//! object store and sandbox ports live with their adapters in `worker` (they carry I/O types).

use crate::engine::RunState;
use crate::ids::RunId;
use crate::messages::JobEnvelope;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PortError {
    #[error("connection: {0}")]
    Connection(String),
    #[error("encoding: {0}")]
    Encoding(String),
    #[error("{0}")]
    Other(String),
}

/// A message for the queue, recorded in the outbox in the same atomic write as the state change
/// that caused it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum OutboxMessage {
    Job(JobEnvelope),
}

/// Result of a compare-and-set write of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CasOutcome {
    Committed,
    /// Someone else wrote first; reload and re-apply.
    Conflict,
}

/// Run state with versioned, atomic transitions and an outbox.
#[async_trait]
pub trait RunStore: Send + Sync {
    /// Creates the run if absent; returns false when a run with that id exists (idempotent submit).
    async fn create(&self, state: &RunState, outbox: &[OutboxMessage]) -> Result<bool, PortError>;
    async fn load(&self, run: &RunId) -> Result<Option<(RunState, u64)>, PortError>;
    /// Writes `state` if the stored version is still `version`, and appends `outbox` atomically.
    async fn commit(
        &self,
        state: &RunState,
        version: u64,
        outbox: &[OutboxMessage],
    ) -> Result<CasOutcome, PortError>;
    async fn list(&self) -> Result<Vec<RunId>, PortError>;
    /// Claims up to `max` outbox messages for `owner` (moved to the owner's in-flight list).
    async fn outbox_claim(&self, owner: &str, max: usize) -> Result<Vec<String>, PortError>;
    /// Forgets claimed messages once the broker confirmed them.
    async fn outbox_done(&self, owner: &str, raws: &[String]) -> Result<(), PortError>;
    /// Returns in-flight messages of owners that stopped heartbeating to the outbox.
    async fn outbox_recover(&self, owner: &str) -> Result<usize, PortError>;
    /// Remembers a deadline (unix seconds) for a started job attempt; `watch` is opaque.
    async fn watch(&self, watch: &str, deadline: i64) -> Result<(), PortError>;
    /// Takes up to `max` watches whose deadline passed (each is handed out once).
    async fn due(&self, now: i64, max: usize) -> Result<Vec<String>, PortError>;
}
