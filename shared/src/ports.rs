//! The run store port: one real adapter (Redis) and one embedded adapter (memory). The queue,
//! object store and sandbox ports live with their adapters in `worker` (they carry I/O types).
//!
//! The contract below is checked by one suite on every adapter
//! (`coordinator::store::conformance`: memory in unit tests, Redis in tests/conformance.rs);
//! where adapters may differ (the owner lease's length, a cap on `list`) the suite says so.

use crate::batch::{BatchHeader, BatchSlice, BatchState};
use crate::engine::RunState;
use crate::ids::{BatchId, RunId};
use crate::messages::JobEnvelope;
use crate::schedule::{ScheduleDef, ScheduleState};
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
    /// A message between runs, published on the results queue.
    Run(crate::messages::ResultMessage),
    /// A notice for a run's webhook, delivered (signed, retried) by the relay.
    Notice(crate::engine::RunNotice),
}

/// Result of a compare-and-set write of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CasOutcome {
    Committed,
    /// Someone else wrote first; reload and re-apply.
    Conflict,
}

/// Batches: a header and items kept apart, all under one version that every write bumps (a
/// compare-and-set over the whole batch), listed newest first, and the set of unfinished ones
/// every coordinator drives. A pass of the driver reads a [`BatchSlice`] and writes back only
/// what it changed, so its cost does not grow with the batch.
#[async_trait]
pub trait BatchStore: Send + Sync {
    /// Creates the batch if absent; false when a batch with that id exists (its items are
    /// left as they are, whatever `state` holds).
    async fn create_batch(&self, state: &BatchState) -> Result<bool, PortError>;
    /// The whole batch, read at one version.
    async fn load_batch(&self, id: &BatchId) -> Result<Option<(BatchState, u64)>, PortError>;
    /// The batch's header (its books) without its items.
    async fn batch_header(&self, id: &BatchId) -> Result<Option<(BatchHeader, u64)>, PortError>;
    /// The batch's header, every running item and the first `queued` queued items (in item
    /// order), read at one version.
    async fn batch_slice(
        &self,
        id: &BatchId,
        queued: usize,
    ) -> Result<Option<(BatchSlice, u64)>, PortError>;
    /// Writes the slice's header and changed items if the stored version is still `version`;
    /// a finished batch leaves the active set in the same atomic write.
    async fn commit_batch(&self, slice: &BatchSlice, version: u64)
        -> Result<CasOutcome, PortError>;
    /// Batches, newest first (an adapter may cap the list, as for runs).
    async fn list_batches(&self) -> Result<Vec<BatchId>, PortError>;
    /// Batches not finished yet.
    async fn active_batches(&self) -> Result<Vec<BatchId>, PortError>;
}

/// Schedules, by name: a definition written once when added, and a state written by
/// compare-and-set (the claims of ticks and of delivery attempts). A schedule removed and
/// added again under its name is another one: a write meant for the first (its state's `uid`)
/// never lands on the second.
#[async_trait]
pub trait ScheduleStore: Send + Sync {
    /// Adds the schedule (its definition and first state) if no schedule has its name; false
    /// when one has.
    async fn add_schedule(
        &self,
        def: &ScheduleDef,
        state: &ScheduleState,
    ) -> Result<bool, PortError>;
    async fn schedule_def(&self, name: &str) -> Result<Option<ScheduleDef>, PortError>;
    async fn schedule_state(&self, name: &str) -> Result<Option<(ScheduleState, u64)>, PortError>;
    /// Writes `state` if the stored one is still at `version` and of the same schedule
    /// (`uid`); a conflict otherwise, also when the schedule is gone.
    async fn commit_schedule(
        &self,
        state: &ScheduleState,
        version: u64,
    ) -> Result<CasOutcome, PortError>;
    /// Forgets the schedule; false when there was none.
    async fn remove_schedule(&self, name: &str) -> Result<bool, PortError>;
    /// Every schedule's name, sorted.
    async fn list_schedules(&self) -> Result<Vec<String>, PortError>;
}

/// API tokens, by the hash of the token (the token itself is never stored).
#[async_trait]
pub trait TokenStore: Send + Sync {
    async fn add_token(&self, record: &crate::auth::TokenRecord) -> Result<(), PortError>;
    async fn token_by_hash(
        &self,
        hash: &str,
    ) -> Result<Option<crate::auth::TokenRecord>, PortError>;
    /// Every token, revoked ones too, oldest first.
    async fn list_tokens(&self) -> Result<Vec<crate::auth::TokenRecord>, PortError>;
    /// Marks the token revoked (kept, so the list shows it); false when there is none.
    async fn revoke_token(
        &self,
        id: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<bool, PortError>;
}

/// A team's jobs in flight (its `concurrent_jobs`): slots held by job attempts (`<job>.a<n>`,
/// each lapsing `lease_ms` after it was taken) and the team's line of outbox messages waiting
/// for one. A message is always in exactly one place until it is published: the outbox, a
/// relay's in-flight list, or the team's line; every move between them is atomic.
#[async_trait]
pub trait JobSlotStore: Send + Sync {
    /// For each claimed `(slot, raw)` of `owner`, in order: true when the attempt holds its
    /// slot already or fewer than `limit` are held (it takes one); false when the team is
    /// full, and then the raw leaves `owner`'s in-flight list for the end of the team's line.
    async fn admit_jobs(
        &self,
        owner: &str,
        team: &str,
        limit: u32,
        now_ms: i64,
        lease_ms: i64,
        items: &[(String, String)],
    ) -> Result<Vec<bool>, PortError>;
    /// Frees `slots` (attempts that ended) and lapsed slots, then moves messages from the
    /// front of the team's line to the outbox, each taking a slot, while fewer than `limit`
    /// are held (`None`: no limit, the whole line moves). How many moved.
    async fn release_jobs(
        &self,
        team: &str,
        limit: Option<u32>,
        now_ms: i64,
        lease_ms: i64,
        slots: &[String],
    ) -> Result<usize, PortError>;
    /// Frees every slot of `run` and drops its messages from the team's line (the run ended),
    /// then moves waiting messages as `release_jobs` does. How many moved.
    async fn release_run_jobs(
        &self,
        team: &str,
        limit: Option<u32>,
        now_ms: i64,
        lease_ms: i64,
        run: &RunId,
    ) -> Result<usize, PortError>;
    /// Slots held (lapsed ones not counted) and messages in the team's line.
    async fn job_slots(&self, team: &str, now_ms: i64) -> Result<(u64, u64), PortError>;
    /// Teams with messages in their line.
    async fn teams_waiting(&self) -> Result<Vec<String>, PortError>;
}

/// A run as the store holds it: a snapshot and the deltas appended after it, oldest first.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredRun {
    pub snapshot: RunState,
    /// The version the deltas reach: the snapshot's plus their number.
    pub version: u64,
    pub deltas: Vec<String>,
    /// The snapshot's encoded size (a writer snapshots again once the deltas outgrow it).
    pub snapshot_bytes: usize,
}

impl StoredRun {
    /// The deltas' encoded size.
    pub fn delta_bytes(&self) -> usize {
        self.deltas.iter().map(String::len).sum()
    }
}

/// What the store knows of the runs the mirror (object storage) holds and the store does not,
/// so that asking whether an id is taken costs no request to object storage when the store can
/// answer. The store vouches for an id only after it was reconciled with the mirror (every run
/// folder the mirror held noted) under its current identity: its epoch and the server process
/// holding it, so a store wiped, restarted or restored from an older copy must be reconciled
/// again. A run the store removes (retention) is noted as the mirror's.
#[async_trait]
pub trait MirrorIndex: Send + Sync {
    /// The store's identity now (its epoch and its server process), `None` before its epoch
    /// is set. A reconcile starts from it and marks it.
    async fn index_token(&self) -> Result<Option<String>, PortError>;
    /// Notes runs the mirror holds (found by a reconcile): their ids stay the mirror's to
    /// answer for.
    async fn note_mirror_runs(&self, runs: &[RunId]) -> Result<(), PortError>;
    /// Marks the store reconciled with the mirror as `token`; false when the store's identity
    /// is no longer `token` (wiped or restarted meanwhile), and nothing is marked.
    async fn mark_reconciled(&self, token: &str) -> Result<bool, PortError>;
    /// Whether the store is reconciled under its current identity.
    async fn reconciled(&self) -> Result<bool, PortError>;
    /// Whether a run the store does not hold may still be in the mirror: true unless the
    /// store is reconciled under its current identity and `run` was never noted or removed.
    async fn mirror_may_hold(&self, run: &RunId) -> Result<bool, PortError>;
}

/// Run state with versioned, atomic transitions and an outbox; batches, schedules, API tokens
/// and the teams' job slots beside them.
#[async_trait]
pub trait RunStore:
    BatchStore + ScheduleStore + TokenStore + JobSlotStore + MirrorIndex + Send + Sync
{
    /// The server this store reaches (e.g. `redis`) and whether it answered the store's last
    /// call; `None` for a store with nothing to reach (in memory).
    fn dependency(&self) -> Option<(&'static str, bool)> {
        None
    }
    /// Creates the run if absent; returns false when a run with that id exists (idempotent submit).
    async fn create(&self, state: &RunState, outbox: &[OutboxMessage]) -> Result<bool, PortError>;
    /// The run as stored: its last snapshot and the deltas appended after it.
    async fn load(&self, run: &RunId) -> Result<Option<StoredRun>, PortError>;
    /// Appends one commit's `delta` (opaque to the store) if the stored version is still
    /// `version`, with `outbox`, atomically: the version moves on by one and the head names
    /// `commit`. What changed is written, not the whole run.
    async fn append(
        &self,
        run: &RunId,
        version: u64,
        commit: &str,
        delta: &str,
        outbox: &[OutboxMessage],
    ) -> Result<CasOutcome, PortError>;
    /// The stored run's version and commit id (`RunState::commit`), without reading its
    /// state: enough to tell whether a copy held in memory is still the stored one.
    async fn head(&self, run: &RunId) -> Result<Option<(u64, String)>, PortError>;
    /// Writes `state` as the run's snapshot (its deltas dropped) if the stored version is
    /// still `version`, and appends `outbox` atomically.
    async fn commit(
        &self,
        state: &RunState,
        version: u64,
        outbox: &[OutboxMessage],
    ) -> Result<CasOutcome, PortError>;
    /// Runs, newest first; an adapter may cap the list (Redis: the newest 1000).
    async fn list(&self) -> Result<Vec<RunId>, PortError>;
    /// Claims up to `max` outbox messages for `owner`, oldest first (moved to the owner's
    /// in-flight list, where they stay until `outbox_done`); takes or renews the owner's lease.
    async fn outbox_claim(&self, owner: &str, max: usize) -> Result<Vec<String>, PortError>;
    /// Forgets claimed messages once the broker confirmed them.
    async fn outbox_done(&self, owner: &str, raws: &[String]) -> Result<(), PortError>;
    /// Returns in-flight messages of other owners whose lease lapsed to the end of the outbox
    /// (never `owner`'s own).
    async fn outbox_recover(&self, owner: &str) -> Result<usize, PortError>;
    /// Returns `owner`'s own in-flight messages to the outbox: a coordinator starting under
    /// the id of one that died holds nothing in flight yet, so whatever its list holds is lost
    /// work of the earlier process.
    async fn outbox_reclaim_own(&self, owner: &str) -> Result<usize, PortError>;
    /// Keeps `owner`'s lease alive (its in-flight list stays its own while the lease holds).
    async fn heartbeat(&self, owner: &str) -> Result<(), PortError>;
    /// Remembers deadlines (unix seconds) of job attempts; each watch is opaque.
    async fn watch(&self, watches: &[(String, i64)]) -> Result<(), PortError>;
    /// Leases up to `max` watches whose deadline passed for `lease_seconds` (a coordinator
    /// that dies before `unwatch` leaves them to be handed out again).
    async fn due(&self, now: i64, max: usize, lease_seconds: i64)
        -> Result<Vec<String>, PortError>;
    /// Forgets a watch once its deadline was acted on.
    async fn unwatch(&self, watch: &str) -> Result<(), PortError>;
    /// Up to `max` runs created at or before `before_ms` (unix milliseconds), oldest first.
    async fn created_before(&self, before_ms: i64, max: usize) -> Result<Vec<RunId>, PortError>;
    /// Forgets a run (its state and its place in the list); its id is noted as the mirror's
    /// (`MirrorIndex`).
    async fn remove(&self, run: &RunId) -> Result<(), PortError>;
    /// Does the store hold the run?
    async fn exists(&self, run: &RunId) -> Result<bool, PortError>;
    /// The store's epoch: a token set once when the store is first used (to `candidate`) and
    /// lost with the store's data, so a changed epoch tells that the store was wiped.
    async fn epoch(&self, candidate: &str) -> Result<String, PortError>;
}
