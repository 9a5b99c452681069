//! The copy of each run in object storage, and the restore of runs the run store lost.
//!
//! Durability in one sentence: every committed state is mirrored to object storage before any
//! message its commit consumed is acked, and a run the store lost is restored from that mirror
//! with every job it still waits for issued again as a new attempt, so whatever was lost with
//! the store (outbox, deadlines, in-flight results) is redone, never waited for.
//!
//! The mirror is a snapshot (`runs/<run>/state.json`) and a chain of deltas after it: each
//! commit's events, stored under the id of the commit they apply to (`runs/<run>/deltas/<prev>`),
//! so a commit costs one small write, not the whole run. Every state carries the id of the
//! commit that wrote it (`RunState::commit`), so a chain only ever follows one history: after
//! the store rolled back, the next commit overwrites the delta that followed its base and the
//! old history's later deltas no longer link. A coordinator writes a delta only after a commit
//! whose base it mirrored itself; otherwise, when the deltas since the last snapshot outgrow
//! it, and when the run ends, it writes a snapshot.
//!
//! A run is listed under `active-runs/` from its first mirror until its final one, so runs
//! that nobody asks about (their outbox was lost with the store) are found by a sweep: at
//! start, whenever the store's epoch changes (it was wiped), and every `SWEEP_EVERY`.

use super::{Coordinator, DriverError};
use serde::{Deserialize, Serialize};
use shared::engine::{self, Applied, Event, RunState};
use shared::ids::RunId;
use shared::time::rfc3339;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use worker::blobs::{BlobError, Blobs};

const SWEEP_EVERY: Duration = Duration::from_secs(60);
const EPOCH_CHECK_EVERY: Duration = Duration::from_secs(2);

fn mirror_key(run: &RunId) -> String {
    format!("runs/{run}/state.json")
}

fn deltas_prefix(run: &RunId) -> String {
    format!("runs/{run}/deltas/")
}

fn delta_key(run: &RunId, prev: &str) -> String {
    format!("runs/{run}/deltas/{prev}")
}

fn active_key(run: &RunId) -> String {
    format!("active-runs/{run}")
}

/// One commit's events: applied to the state of commit `prev`, they give the state of `id`.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Delta {
    pub prev: String,
    pub id: String,
    pub events: Vec<Event>,
}

/// What this coordinator last mirrored of a run: the commit it reached and how much the
/// snapshot and the deltas after it weigh.
#[derive(Debug, Clone, Default)]
pub(super) struct MirrorMark {
    commit: String,
    snapshot_bytes: usize,
    delta_bytes: usize,
    /// The keys of the deltas it wrote, when this coordinator made every write of the run's
    /// mirror since its creation (none by another coordinator, no restore) and they are at
    /// most [`KNOWN_DELTAS`]; `None` when it cannot tell.
    history: Option<Vec<String>>,
}

/// The most delta keys a mirror mark keeps: a run that wrote more has them listed when it ends.
const KNOWN_DELTAS: usize = 64;

/// The deltas that follow `from`, in order: each one's `prev` is the one before's `id`. A delta
/// of another history (the store rolled back past it) does not link and ends the chain.
fn chain(from: &str, deltas: Vec<Delta>) -> Vec<Delta> {
    let mut by_prev: HashMap<String, Delta> =
        deltas.into_iter().map(|d| (d.prev.clone(), d)).collect();
    let mut out = Vec::new();
    let mut at = from.to_string();
    while let Some(next) = by_prev.remove(&at) {
        at = next.id.clone();
        out.push(next);
    }
    out
}

/// A fresh commit id, unique across coordinators and their restarts.
pub(super) fn commit_id() -> String {
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).expect("the system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Coordinator {
    /// Mirrors a commit that applied `events` to the state of commit `prev`: a delta when this
    /// coordinator mirrored `prev` itself and the deltas have not outgrown the snapshot, a
    /// snapshot otherwise.
    pub(super) async fn mirror_commit(
        &self,
        prev: &str,
        state: &RunState,
        delta: &str,
    ) -> Result<(), DriverError> {
        let mark = self.mark_of(&state.run_id).filter(|m| m.commit == prev);
        let history = mark.as_ref().and_then(|m| m.history.clone());
        let linked = mark
            .as_ref()
            .is_some_and(|m| m.delta_bytes < m.snapshot_bytes);
        if !linked || state.status.is_terminal() {
            return self.write_snapshot(state, history).await;
        }
        let bytes = delta.as_bytes().to_vec();
        let size = bytes.len();
        let key = delta_key(&state.run_id, prev);
        self.blobs.put(&key, bytes).await?;
        self.count_write("delta", size);
        let mut mark = mark.unwrap_or_default();
        mark.commit = state.commit.clone();
        mark.delta_bytes += size;
        mark.history = history
            .map(|mut keys| {
                keys.push(key);
                keys
            })
            .filter(|keys| keys.len() <= KNOWN_DELTAS);
        self.set_mark(&state.run_id, mark);
        Ok(())
    }

    /// Writes the whole state as the run's snapshot; a finished run's deltas are removed.
    pub(super) async fn snapshot(&self, state: &RunState) -> Result<(), DriverError> {
        self.write_snapshot(state, None).await
    }

    /// The snapshot a run's creation writes: the start of a history this coordinator knows.
    pub(super) async fn first_snapshot(&self, state: &RunState) -> Result<(), DriverError> {
        self.write_snapshot(state, Some(Vec::new())).await
    }

    /// Writes the snapshot; `history` is what this coordinator knows of the writes before it
    /// (`MirrorMark::history`). A finished run's deltas are removed: those it knows it wrote,
    /// else all that a listing finds (a listing less on the object store for every run that
    /// ends on the coordinator that created it).
    async fn write_snapshot(
        &self,
        state: &RunState,
        history: Option<Vec<String>>,
    ) -> Result<(), DriverError> {
        let bytes = serde_json::to_vec(state).expect("serializable state");
        let size = bytes.len();
        self.blobs.put(&mirror_key(&state.run_id), bytes).await?;
        self.count_write("snapshot", size);
        self.set_mark(
            &state.run_id,
            MirrorMark {
                commit: state.commit.clone(),
                snapshot_bytes: size,
                delta_bytes: 0,
                history: history.clone(),
            },
        );
        if state.status.is_terminal() && state.pending_jobs().next().is_none() {
            // Housekeeping, off the commit's path (the snapshot is what makes the end
            // durable): what it leaves behind is harmless.
            let (blobs, run) = (self.blobs.clone(), state.run_id.clone());
            tokio::spawn(async move {
                if let Err(e) = blobs.delete(&active_key(&run)).await {
                    warn!(run = %run, error = %e, "could not unlist a finished run; the sweep will look at it again");
                }
                drop_deltas(&blobs, &run, history).await;
            });
        }
        Ok(())
    }
    fn count_write(&self, kind: &str, bytes: usize) {
        self.metrics.mirror_writes.with_label_values(&[kind]).inc();
        (self.metrics.mirror_bytes.with_label_values(&[kind])).inc_by(bytes as u64);
    }

    fn mark_of(&self, run: &RunId) -> Option<MirrorMark> {
        self.mirrored
            .lock()
            .expect("mirror marks")
            .get(run)
            .cloned()
    }

    fn set_mark(&self, run: &RunId, mark: MirrorMark) {
        self.mirrored
            .lock()
            .expect("mirror marks")
            .insert(run.clone(), mark);
    }

    /// Writes a snapshot unless this coordinator knows the mirror already holds `state`.
    pub(super) async fn mirror_if_behind(&self, state: &RunState) -> Result<(), DriverError> {
        if self
            .mark_of(&state.run_id)
            .is_some_and(|m| m.commit == state.commit)
        {
            return Ok(());
        }
        self.snapshot(state).await
    }

    pub(super) async fn mark_active(&self, state: &RunState) -> Result<(), DriverError> {
        if !state.status.is_terminal() {
            self.blobs
                .put(&active_key(&state.run_id), Vec::new())
                .await?;
        }
        Ok(())
    }

    /// Loads a run from the run store; a run the store lost is restored from its mirror.
    pub(super) async fn load_versioned(&self, run: &RunId) -> Result<(RunState, u64), DriverError> {
        if let Some(held) = self.held_copy(run).await? {
            return Ok(held);
        }
        if let Some((state, version, _)) = self.stored(run).await? {
            return Ok((state, version));
        }
        self.restore(run).await?;
        self.stored(run)
            .await?
            .map(|(state, version, _)| (state, version))
            .ok_or_else(|| DriverError::UnknownRun(run.clone()))
    }

    /// Puts a run the store lost back from its mirror, with every job it still waits for
    /// issued again (the restored state and those jobs are created in one atomic write, so
    /// of racing coordinators exactly one restores).
    async fn restore(&self, run: &RunId) -> Result<(), DriverError> {
        let lookups = &self.metrics.mirror_lookups;
        let snapshot: RunState = match self.blobs.get_json(&mirror_key(run)).await {
            Ok(s) => s,
            Err(e) if BlobError::is_not_found(&e) => {
                lookups.with_label_values(&["missing"]).inc();
                return Err(DriverError::UnknownRun(run.clone()));
            }
            Err(e) => return Err(e.into()),
        };
        lookups.with_label_values(&["found"]).inc();
        let bundle = self.bundle(&snapshot.graph_ref).await?;
        let mirror = self.replay_deltas(&bundle, snapshot).await?;
        let mut t = engine::apply(
            &bundle,
            &mirror,
            &Event::Restored {
                at: self.clock.now(),
            },
            &shared::builtins::assembler,
        )?;
        t.state.commit = commit_id();
        let outbox = self.outbox_for(&t.effects).await?;
        if self.store.create(&t.state, &outbox).await? {
            let reissued = outbox.len();
            warn!(run = %run, reissued, "the run store had lost this run; restored it from object storage");
            self.metrics.restored.inc();
            self.snapshot(&t.state).await?;
            self.watch(&t.state, &t.effects).await;
            if t.applied == Applied::Changed {
                self.outbox_ready.notify_one();
            }
        }
        Ok(())
    }

    /// The snapshot with the chain of deltas after it applied; a delta the engine refuses
    /// ends the chain (logged), as one of another history would.
    async fn replay_deltas(
        &self,
        bundle: &shared::graph::GraphBundle,
        mut state: RunState,
    ) -> Result<RunState, DriverError> {
        let keys = self.blobs.list(&deltas_prefix(&state.run_id)).await?;
        let mut deltas = Vec::with_capacity(keys.len());
        for key in keys {
            match self.blobs.get_json::<Delta>(&key).await {
                Ok(d) => deltas.push(d),
                Err(e) if BlobError::is_not_found(&e) => {}
                Err(BlobError::Decode { key, source }) => {
                    warn!(run = %state.run_id, %key, error = %source, "skipping a delta that does not read")
                }
                Err(e) => return Err(e.into()),
            }
        }
        let run = state.run_id.clone();
        let mut replayed = 0;
        for delta in chain(&state.commit, deltas) {
            let mut next = state.clone();
            for event in &delta.events {
                if let Err(e) =
                    engine::apply_in_place(bundle, &mut next, event, &shared::builtins::assembler)
                {
                    warn!(run = %run, commit = %delta.id, error = %e, "the engine refused a mirrored delta; restoring the state before it");
                    return Ok(state);
                }
            }
            next.commit = delta.id;
            state = next;
            replayed += 1;
        }
        info!(run = %run, replayed, "replayed the mirror's deltas after its snapshot");
        Ok(state)
    }

    /// Finds active runs the store does not hold and restores them.
    async fn sweep(&self) -> Result<usize, DriverError> {
        let mut restored = 0;
        for key in self.blobs.list("active-runs/").await? {
            let Some(id) = key.rsplit('/').next().filter(|s| !s.is_empty()) else {
                continue;
            };
            let run = RunId::new(id);
            if self.store.exists(&run).await? {
                continue;
            }
            let lock = self.run_lock(&run);
            let _guard = lock.lock().await;
            match self.load_versioned(&run).await {
                Ok(_) => restored += 1,
                Err(DriverError::UnknownRun(_)) => {
                    warn!(run = %run, "an active run has no mirror; unlisting it");
                    let _ = self.blobs.delete(&key).await;
                }
                Err(e) => warn!(run = %run, error = %e, "could not restore a lost run"),
            }
        }
        Ok(restored)
    }

    /// Sweeps for lost runs at start, when the store's epoch changes and every `SWEEP_EVERY`.
    pub(super) async fn recover_lost_runs(self: Arc<Self>, shutdown: CancellationToken) {
        let mine = format!("{}-{}", self.id, rfc3339(&self.clock.now()));
        let mut epoch: Option<String> = None;
        let mut last_sweep: Option<std::time::Instant> = None;
        loop {
            let current = match self.store.epoch(&mine).await {
                Ok(e) => Some(e),
                Err(e) => {
                    warn!(error = %e, "could not read the run store's epoch");
                    None
                }
            };
            if current.is_some() {
                self.reconcile_if_needed().await;
            }
            let wiped = matches!((&epoch, &current), (Some(a), Some(b)) if a != b);
            if wiped {
                warn!("the run store's epoch changed (its data was lost); restoring active runs");
            }
            if current.is_some() && (wiped || last_sweep.is_none_or(|t| t.elapsed() >= SWEEP_EVERY))
            {
                match self.sweep().await {
                    Ok(0) => {}
                    Ok(n) => info!(restored = n, "restored runs the run store had lost"),
                    Err(e) => warn!(error = %e, "the sweep for lost runs failed"),
                }
                last_sweep = Some(std::time::Instant::now());
                epoch = current;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(EPOCH_CHECK_EVERY) => {}
            }
        }
    }
}

/// Removes a finished run's deltas (its snapshot holds them all); one left behind is harmless,
/// as no chain reaches it.
/// Removes a finished run's deltas: `known`, the keys this coordinator wrote when it made every
/// write of the mirror, else every key a listing finds.
async fn drop_deltas(blobs: &Blobs, run: &RunId, known: Option<Vec<String>>) {
    let keys = match known {
        Some(keys) => keys,
        None => match blobs.list(&deltas_prefix(run)).await {
            Ok(keys) => keys,
            Err(e) => {
                warn!(run = %run, error = %e, "could not list a finished run's deltas");
                return;
            }
        },
    };
    for key in keys {
        if let Err(e) = blobs.delete(&key).await {
            warn!(run = %run, error = %e, "could not remove a finished run's delta");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(prev: &str, id: &str) -> Delta {
        Delta {
            prev: prev.into(),
            id: id.into(),
            events: Vec::new(),
        }
    }

    fn ids(chain: &[Delta]) -> Vec<&str> {
        chain.iter().map(|d| d.id.as_str()).collect()
    }

    #[test]
    fn a_chain_follows_the_links_from_the_snapshot_whatever_the_listing_order() {
        let deltas = vec![delta("b", "c"), delta("s", "a"), delta("a", "b")];
        assert_eq!(ids(&chain("s", deltas)), ["a", "b", "c"]);
    }

    #[test]
    fn a_missing_delta_ends_the_chain_before_the_deltas_after_it() {
        // The delta from `a` was never written (its coordinator died before its mirror).
        let deltas = vec![delta("s", "a"), delta("b", "c")];
        assert_eq!(ids(&chain("s", deltas)), ["a"]);
    }

    #[test]
    fn after_a_rollback_the_old_historys_deltas_do_not_link() {
        // Old history s-a-b-c; the store rolled back to `a` and committed `b2` over the delta
        // from `a`: the old `b`'s successor no longer links.
        let deltas = vec![delta("s", "a"), delta("a", "b2"), delta("b", "c")];
        assert_eq!(ids(&chain("s", deltas)), ["a", "b2"]);
    }

    #[test]
    fn deltas_of_an_older_snapshot_are_not_replayed() {
        let deltas = vec![delta("s0", "s"), delta("x", "y")];
        assert!(chain("s", deltas).is_empty());
    }

    #[test]
    fn commit_ids_differ() {
        assert_ne!(commit_id(), commit_id());
    }
}
