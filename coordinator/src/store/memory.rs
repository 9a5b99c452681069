//! The embedded mode's run store: the same contract as Redis (see `conformance`), in a mutex.
//! Outbox messages a relay claimed stay in its in-flight list until it says they are done;
//! in-flight lists whose owner's lease lapsed go back to the outbox.

use async_trait::async_trait;
use shared::auth::TokenRecord;
use shared::batch::{BatchHeader, BatchSlice, BatchState};
use shared::engine::RunState;
use shared::ids::{BatchId, RunId};
use shared::ports::{
    BatchStore, CasOutcome, JobSlotStore, OutboxMessage, PortError, RunStore, ScheduleStore,
    StoredRun, TokenStore,
};
use shared::schedule::{ScheduleDef, ScheduleState};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod mirror_index;

/// How long an owner's lease lasts without a heartbeat (as in Redis).
const LEASE: Duration = Duration::from_secs(10);

pub struct MemoryRunStore {
    inner: Mutex<Inner>,
    lease: Duration,
}

impl Default for MemoryRunStore {
    fn default() -> Self {
        Self {
            inner: Mutex::default(),
            lease: LEASE,
        }
    }
}

impl MemoryRunStore {
    /// The same store with owners' leases lasting `lease` (the conformance suite's short one).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("store lock")
    }
}

/// A run: its snapshot, the deltas after it, its head and its creation time (unix ms).
struct Stored {
    run: StoredRun,
    commit: String,
    created: i64,
}

fn snapshot_of(state: &RunState, version: u64) -> StoredRun {
    StoredRun {
        snapshot: state.clone(),
        version,
        deltas: Vec::new(),
        snapshot_bytes: serde_json::to_vec(state).map_or(0, |b| b.len()),
    }
}

#[derive(Default)]
struct Inner {
    runs: BTreeMap<RunId, Stored>,
    /// Run ids in creation order.
    order: Vec<RunId>,
    outbox: VecDeque<String>,
    inflight: BTreeMap<String, VecDeque<String>>,
    /// When each owner's lease ends.
    leases: HashMap<String, Instant>,
    deadlines: BTreeMap<String, i64>,
    epoch: Option<String>,
    /// State and version per batch, and the ids in creation order.
    batches: BTreeMap<BatchId, (BatchState, u64)>,
    batch_order: Vec<BatchId>,
    /// Definition, state and version per schedule name.
    schedules: BTreeMap<String, (ScheduleDef, ScheduleState, u64)>,
    /// API tokens in the order they were added.
    tokens: Vec<TokenRecord>,
    /// Per team: the attempts holding a slot, each with when it lapses (unix milliseconds).
    slots: BTreeMap<String, BTreeMap<String, i64>>,
    /// Per team: its line of (slot, outbox message) waiting for a slot.
    lines: BTreeMap<String, VecDeque<(String, String)>>,
    /// Runs the mirror holds that this store may not (`MirrorIndex`), and the identity it
    /// was reconciled as (its epoch: the memory store's server is this process).
    mirror_runs: HashSet<RunId>,
    reconciled: Option<String>,
}

impl Inner {
    /// Frees lapsed slots of `team`, then moves messages from its line to the outbox while
    /// there is room under `limit`.
    fn promote(&mut self, team: &str, limit: Option<u32>, now_ms: i64, lease_ms: i64) -> usize {
        let held = self.slots.entry(team.to_string()).or_default();
        held.retain(|_, lapses| *lapses > now_ms);
        let line = self.lines.entry(team.to_string()).or_default();
        let mut moved = Vec::new();
        while limit.is_none_or(|l| held.len() < l as usize) {
            let Some((slot, raw)) = line.pop_front() else {
                break;
            };
            held.insert(slot, now_ms + lease_ms);
            moved.push(raw);
        }
        if line.is_empty() {
            self.lines.remove(team);
        }
        let n = moved.len();
        self.outbox.extend(moved);
        n
    }
}

fn encode(m: &OutboxMessage) -> String {
    serde_json::to_string(m).expect("outbox message serializes")
}

#[async_trait]
impl BatchStore for MemoryRunStore {
    async fn create_batch(&self, state: &BatchState) -> Result<bool, PortError> {
        let mut g = self.lock();
        if g.batches.contains_key(&state.batch_id) {
            return Ok(false);
        }
        g.batches.insert(state.batch_id.clone(), (state.clone(), 1));
        g.batch_order.push(state.batch_id.clone());
        Ok(true)
    }

    async fn load_batch(&self, id: &BatchId) -> Result<Option<(BatchState, u64)>, PortError> {
        Ok(self.lock().batches.get(id).cloned())
    }

    async fn batch_header(&self, id: &BatchId) -> Result<Option<(BatchHeader, u64)>, PortError> {
        Ok(self
            .lock()
            .batches
            .get(id)
            .map(|(s, v)| (s.header().clone(), *v)))
    }

    async fn batch_slice(
        &self,
        id: &BatchId,
        queued: usize,
    ) -> Result<Option<(BatchSlice, u64)>, PortError> {
        Ok(self
            .lock()
            .batches
            .get(id)
            .map(|(s, v)| (BatchSlice::of(s, queued), *v)))
    }

    async fn commit_batch(
        &self,
        slice: &BatchSlice,
        version: u64,
    ) -> Result<CasOutcome, PortError> {
        let mut g = self.lock();
        match g.batches.get_mut(&slice.header().batch_id) {
            Some((s, v)) if *v == version => {
                slice.apply_to(s);
                *v += 1;
                Ok(CasOutcome::Committed)
            }
            _ => Ok(CasOutcome::Conflict),
        }
    }

    async fn list_batches(&self) -> Result<Vec<BatchId>, PortError> {
        Ok(self.lock().batch_order.iter().rev().cloned().collect())
    }

    async fn active_batches(&self) -> Result<Vec<BatchId>, PortError> {
        let g = self.lock();
        Ok(g.batch_order
            .iter()
            .filter(|id| g.batches.get(*id).is_some_and(|(s, _)| !s.is_finished()))
            .cloned()
            .collect())
    }
}

#[async_trait]
impl TokenStore for MemoryRunStore {
    async fn add_token(&self, record: &TokenRecord) -> Result<(), PortError> {
        self.lock().tokens.push(record.clone());
        Ok(())
    }
    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>, PortError> {
        Ok(self.lock().tokens.iter().find(|t| t.hash == hash).cloned())
    }
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, PortError> {
        let mut all = self.lock().tokens.clone();
        all.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(all)
    }
    async fn revoke_token(
        &self,
        id: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<bool, PortError> {
        let mut inner = self.lock();
        match inner.tokens.iter_mut().find(|t| t.id == id) {
            Some(t) => {
                t.revoked_at.get_or_insert(at);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

#[async_trait]
impl ScheduleStore for MemoryRunStore {
    async fn add_schedule(
        &self,
        def: &ScheduleDef,
        state: &ScheduleState,
    ) -> Result<bool, PortError> {
        let mut g = self.lock();
        if g.schedules.contains_key(&def.name) {
            return Ok(false);
        }
        g.schedules
            .insert(def.name.clone(), (def.clone(), state.clone(), 1));
        Ok(true)
    }

    async fn schedule_def(&self, name: &str) -> Result<Option<ScheduleDef>, PortError> {
        Ok(self.lock().schedules.get(name).map(|(d, _, _)| d.clone()))
    }

    async fn schedule_state(&self, name: &str) -> Result<Option<(ScheduleState, u64)>, PortError> {
        Ok(self
            .lock()
            .schedules
            .get(name)
            .map(|(_, s, v)| (s.clone(), *v)))
    }

    async fn commit_schedule(
        &self,
        state: &ScheduleState,
        version: u64,
    ) -> Result<CasOutcome, PortError> {
        let mut g = self.lock();
        match g.schedules.get_mut(&state.name) {
            Some((_, s, v)) if *v == version && s.uid == state.uid => {
                *s = state.clone();
                *v += 1;
                Ok(CasOutcome::Committed)
            }
            _ => Ok(CasOutcome::Conflict),
        }
    }

    async fn remove_schedule(&self, name: &str) -> Result<bool, PortError> {
        Ok(self.lock().schedules.remove(name).is_some())
    }

    async fn list_schedules(&self) -> Result<Vec<String>, PortError> {
        Ok(self.lock().schedules.keys().cloned().collect())
    }
}

#[async_trait]
impl JobSlotStore for MemoryRunStore {
    async fn admit_jobs(
        &self,
        owner: &str,
        team: &str,
        limit: u32,
        now_ms: i64,
        lease_ms: i64,
        items: &[(String, String)],
    ) -> Result<Vec<bool>, PortError> {
        let mut g = self.lock();
        let g = &mut *g;
        // Those waiting go before newcomers.
        g.promote(team, Some(limit), now_ms, lease_ms);
        let mut admitted = Vec::with_capacity(items.len());
        for (slot, raw) in items {
            let held = g.slots.entry(team.to_string()).or_default();
            let line_empty = g.lines.get(team).is_none_or(VecDeque::is_empty);
            if held.contains_key(slot) || (line_empty && held.len() < limit as usize) {
                held.insert(slot.clone(), now_ms + lease_ms);
                admitted.push(true);
                continue;
            }
            if let Some(list) = g.inflight.get_mut(owner) {
                if let Some(i) = list.iter().position(|r| r == raw) {
                    list.remove(i);
                }
            }
            g.lines
                .entry(team.to_string())
                .or_default()
                .push_back((slot.clone(), raw.clone()));
            admitted.push(false);
        }
        Ok(admitted)
    }

    async fn release_jobs(
        &self,
        team: &str,
        limit: Option<u32>,
        now_ms: i64,
        lease_ms: i64,
        slots: &[String],
    ) -> Result<usize, PortError> {
        let mut g = self.lock();
        if let Some(held) = g.slots.get_mut(team) {
            for s in slots {
                held.remove(s);
            }
        }
        Ok(g.promote(team, limit, now_ms, lease_ms))
    }

    async fn release_run_jobs(
        &self,
        team: &str,
        limit: Option<u32>,
        now_ms: i64,
        lease_ms: i64,
        run: &RunId,
    ) -> Result<usize, PortError> {
        let prefix = format!("{run}.");
        let mut g = self.lock();
        if let Some(held) = g.slots.get_mut(team) {
            held.retain(|slot, _| !slot.starts_with(&prefix));
        }
        if let Some(line) = g.lines.get_mut(team) {
            line.retain(|(slot, _)| !slot.starts_with(&prefix));
        }
        Ok(g.promote(team, limit, now_ms, lease_ms))
    }

    async fn job_slots(&self, team: &str, now_ms: i64) -> Result<(u64, u64), PortError> {
        let g = self.lock();
        let held = g
            .slots
            .get(team)
            .map_or(0, |h| h.values().filter(|lapses| **lapses > now_ms).count());
        let waiting = g.lines.get(team).map_or(0, VecDeque::len);
        Ok((held as u64, waiting as u64))
    }

    async fn teams_waiting(&self) -> Result<Vec<String>, PortError> {
        Ok(self.lock().lines.keys().cloned().collect())
    }
}

#[async_trait]
impl RunStore for MemoryRunStore {
    async fn create(&self, state: &RunState, outbox: &[OutboxMessage]) -> Result<bool, PortError> {
        let mut g = self.lock();
        if g.runs.contains_key(&state.run_id) {
            return Ok(false);
        }
        let stored = Stored {
            run: snapshot_of(state, 1),
            commit: state.commit.clone(),
            created: chrono::Utc::now().timestamp_millis(),
        };
        g.runs.insert(state.run_id.clone(), stored);
        g.order.push(state.run_id.clone());
        g.outbox.extend(outbox.iter().map(encode));
        Ok(true)
    }

    async fn load(&self, run: &RunId) -> Result<Option<StoredRun>, PortError> {
        Ok(self.lock().runs.get(run).map(|s| s.run.clone()))
    }

    async fn head(&self, run: &RunId) -> Result<Option<(u64, String)>, PortError> {
        Ok(self
            .lock()
            .runs
            .get(run)
            .map(|s| (s.run.version, s.commit.clone())))
    }

    async fn append(
        &self,
        run: &RunId,
        version: u64,
        commit: &str,
        delta: &str,
        outbox: &[OutboxMessage],
    ) -> Result<CasOutcome, PortError> {
        let mut g = self.lock();
        match g.runs.get_mut(run) {
            Some(s) if s.run.version == version => {
                s.run.deltas.push(delta.to_string());
                s.run.version += 1;
                s.commit = commit.to_string();
            }
            _ => return Ok(CasOutcome::Conflict),
        }
        g.outbox.extend(outbox.iter().map(encode));
        Ok(CasOutcome::Committed)
    }

    async fn commit(
        &self,
        state: &RunState,
        version: u64,
        outbox: &[OutboxMessage],
    ) -> Result<CasOutcome, PortError> {
        let mut g = self.lock();
        match g.runs.get_mut(&state.run_id) {
            Some(s) if s.run.version == version => {
                s.run = snapshot_of(state, version + 1);
                s.commit = state.commit.clone();
            }
            _ => return Ok(CasOutcome::Conflict),
        }
        g.outbox.extend(outbox.iter().map(encode));
        Ok(CasOutcome::Committed)
    }

    async fn list(&self) -> Result<Vec<RunId>, PortError> {
        Ok(self.lock().order.iter().rev().cloned().collect())
    }

    async fn outbox_claim(&self, owner: &str, max: usize) -> Result<Vec<String>, PortError> {
        let mut g = self.lock();
        g.leases
            .insert(owner.to_string(), Instant::now() + self.lease);
        let n = max.min(g.outbox.len());
        let claimed: Vec<String> = g.outbox.drain(..n).collect();
        g.inflight
            .entry(owner.to_string())
            .or_default()
            .extend(claimed.iter().cloned());
        Ok(claimed)
    }

    async fn outbox_done(&self, owner: &str, raws: &[String]) -> Result<(), PortError> {
        let mut g = self.lock();
        if let Some(list) = g.inflight.get_mut(owner) {
            for raw in raws {
                if let Some(i) = list.iter().position(|m| m == raw) {
                    list.remove(i);
                }
            }
            if list.is_empty() {
                g.inflight.remove(owner);
            }
        }
        Ok(())
    }

    async fn outbox_recover(&self, owner: &str) -> Result<usize, PortError> {
        let mut g = self.lock();
        let now = Instant::now();
        let lapsed: Vec<String> = g
            .inflight
            .keys()
            .filter(|o| o.as_str() != owner)
            .filter(|o| g.leases.get(o.as_str()).is_none_or(|until| *until <= now))
            .cloned()
            .collect();
        let mut moved = 0;
        for other in lapsed {
            let list = g.inflight.remove(&other).unwrap_or_default();
            moved += list.len();
            g.outbox.extend(list);
        }
        Ok(moved)
    }

    async fn outbox_reclaim_own(&self, owner: &str) -> Result<usize, PortError> {
        let mut g = self.lock();
        let list = g.inflight.remove(owner).unwrap_or_default();
        let moved = list.len();
        g.outbox.extend(list);
        Ok(moved)
    }

    async fn heartbeat(&self, owner: &str) -> Result<(), PortError> {
        self.lock()
            .leases
            .insert(owner.to_string(), Instant::now() + self.lease);
        Ok(())
    }

    async fn watch(&self, watches: &[(String, i64)]) -> Result<(), PortError> {
        let mut g = self.lock();
        g.deadlines.extend(watches.iter().cloned());
        Ok(())
    }

    async fn due(&self, now: i64, max: usize, lease: i64) -> Result<Vec<String>, PortError> {
        let mut g = self.lock();
        let mut due: Vec<(i64, String)> = g
            .deadlines
            .iter()
            .filter(|(_, d)| **d <= now)
            .map(|(w, d)| (*d, w.clone()))
            .collect();
        due.sort();
        due.truncate(max);
        for (_, w) in &due {
            g.deadlines.insert(w.clone(), now + lease);
        }
        Ok(due.into_iter().map(|(_, w)| w).collect())
    }

    async fn unwatch(&self, watch: &str) -> Result<(), PortError> {
        self.lock().deadlines.remove(watch);
        Ok(())
    }

    async fn created_before(&self, before_ms: i64, max: usize) -> Result<Vec<RunId>, PortError> {
        let g = self.lock();
        // `order` is creation order, so the first ones found are the oldest.
        Ok(g.order
            .iter()
            .filter(|r| g.runs.get(*r).is_some_and(|s| s.created <= before_ms))
            .take(max)
            .cloned()
            .collect())
    }

    async fn remove(&self, run: &RunId) -> Result<(), PortError> {
        let mut g = self.lock();
        g.runs.remove(run);
        g.order.retain(|r| r != run);
        g.mirror_runs.insert(run.clone());
        Ok(())
    }

    async fn exists(&self, run: &RunId) -> Result<bool, PortError> {
        Ok(self.lock().runs.contains_key(run))
    }

    async fn epoch(&self, candidate: &str) -> Result<String, PortError> {
        let mut g = self.lock();
        Ok(g.epoch.get_or_insert_with(|| candidate.to_string()).clone())
    }
}

#[cfg(test)]
mod tests {
    //! The run store contract (`store::conformance`) on the memory store; the same suite runs
    //! on Redis in tests/conformance.rs.
    use super::MemoryRunStore;
    use crate::store::conformance::Profile;
    use std::time::Duration;

    fn profile() -> Profile {
        Profile {
            lease: Duration::from_millis(300),
            list_limit: None,
        }
    }

    fn fresh() -> MemoryRunStore {
        MemoryRunStore::default().with_lease(profile().lease)
    }

    crate::run_store_conformance!(fresh(), profile());
}
