//! The state of each run as this coordinator last committed it, so a commit (and a read)
//! whose run the store still holds at that version and commit id loads nothing but the
//! store's head. The head names the commit by its random id as well as its version, so a copy
//! of a history the store lost (and restored past, reaching the same version) never passes.

use super::store_log::Weight;
use super::{Coordinator, DriverError};
use shared::engine::RunState;
use shared::ids::RunId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// At most this many runs' states are held, whatever they weigh.
const HELD_RUNS: usize = 4096;

/// The stored weight of the states held unless `FLEET_STATE_CACHE_MB` says otherwise.
pub const DEFAULT_STATE_CACHE_MB: u64 = 256;

/// A run's state, its version and its weight in the store.
pub(super) type Held = (RunState, u64, Weight);

/// A held state: shared with the reads looking at it, with what eviction weighs.
struct Entry {
    state: Arc<RunState>,
    version: u64,
    weight: Weight,
    /// When it was last put or read (a tick of the cache's own clock).
    used: u64,
    /// A finished run is only read; it goes before any run still committing.
    finished: bool,
}

impl Entry {
    fn bytes(&self) -> usize {
        self.weight.snapshot_bytes + self.weight.delta_bytes
    }
}

#[derive(Default)]
struct Cached {
    runs: HashMap<RunId, Entry>,
    /// The sum of the held entries' `bytes`.
    bytes: usize,
    tick: u64,
}

/// The states are shared, so a read copies one outside the lock: a copy of a 100,000-job run
/// takes milliseconds, and holding the lock for it would stall every commit meanwhile.
///
/// Bounded by count and by the runs' weight in the store (`FLEET_STATE_CACHE_MB`): past either,
/// finished runs go first, least recently used first, then runs under way the same way. The
/// state just put is never the one let go, so a run heavier than the bound is still held while
/// it commits. A state let go is loaded from the store when next needed.
pub(super) struct StateCache {
    held: Mutex<Cached>,
    max_bytes: usize,
}

impl Default for StateCache {
    fn default() -> Self {
        Self::with_bound(DEFAULT_STATE_CACHE_MB as usize * (1 << 20))
    }
}

impl StateCache {
    pub(super) fn with_bound(max_bytes: usize) -> Self {
        Self {
            held: Mutex::default(),
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cached> {
        self.held.lock().expect("state cache")
    }

    /// Takes a run's state out (a commit changes it in place); copied only if a read is
    /// copying it right now.
    pub(super) fn take(&self, run: &RunId) -> Option<Held> {
        let entry = {
            let mut held = self.lock();
            let entry = held.runs.remove(run)?;
            held.bytes -= entry.bytes();
            entry
        };
        let state = Arc::try_unwrap(entry.state).unwrap_or_else(|shared| (*shared).clone());
        Some((state, entry.version, entry.weight))
    }

    /// A copy of a run's state (a read).
    pub(super) fn copy(&self, run: &RunId) -> Option<(RunState, u64)> {
        let (state, version) = self.share(run)?;
        Some(((*state).clone(), version))
    }

    /// The held state itself, shared (a look that copies nothing).
    pub(super) fn share(&self, run: &RunId) -> Option<(Arc<RunState>, u64)> {
        let mut held = self.lock();
        held.tick += 1;
        let tick = held.tick;
        let entry = held.runs.get_mut(run)?;
        entry.used = tick;
        Some((entry.state.clone(), entry.version))
    }

    /// Holds a state this coordinator committed (replacing what it held of the run).
    pub(super) fn put(&self, state: RunState, version: u64, weight: Weight) {
        self.insert(state, version, weight, true);
    }

    /// Holds a state read from the store, unless a newer one of the run is held.
    pub(super) fn offer(&self, state: RunState, version: u64, weight: Weight) {
        self.insert(state, version, weight, false);
    }

    fn insert(&self, state: RunState, version: u64, weight: Weight, replace_newer: bool) {
        let mut held = self.lock();
        let run = state.run_id.clone();
        if let Some(old) = held.runs.get(&run) {
            if !replace_newer && old.version >= version {
                return;
            }
        }
        held.tick += 1;
        let finished = state.status.is_terminal() && state.pending_jobs().next().is_none();
        let entry = Entry {
            finished,
            state: Arc::new(state),
            version,
            weight,
            used: held.tick,
        };
        held.bytes += entry.bytes();
        if let Some(old) = held.runs.insert(run.clone(), entry) {
            held.bytes -= old.bytes();
        }
        while held.runs.len() > HELD_RUNS || held.bytes > self.max_bytes {
            let Some(victim) = victim(&held.runs, &run) else {
                break;
            };
            let gone = held.runs.remove(&victim).expect("the victim is held");
            held.bytes -= gone.bytes();
        }
    }

    pub(super) fn forget(&self, run: &RunId) {
        let mut held = self.lock();
        if let Some(gone) = held.runs.remove(run) {
            held.bytes -= gone.bytes();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().runs.len()
    }

    #[cfg(test)]
    fn holds(&self, run: &str) -> bool {
        self.lock().runs.contains_key(&RunId::new(run))
    }
}

/// The run to let go: a finished one before one under way, the least recently used first;
/// never `keep`.
fn victim(runs: &HashMap<RunId, Entry>, keep: &RunId) -> Option<RunId> {
    (runs.iter())
        .filter(|(run, _)| *run != keep)
        .min_by_key(|(_, e)| (!e.finished, e.used))
        .map(|(run, _)| run.clone())
}

/// Is `state` at `version` the state the store's head names?
fn current(state: &RunState, version: u64, head: Option<&(u64, String)>) -> bool {
    !state.commit.is_empty() && head.is_some_and(|(v, c)| *v == version && *c == state.commit)
}

impl Coordinator {
    /// The run and its state's version.
    pub async fn load_with_version(&self, run: &RunId) -> Result<(RunState, u64), DriverError> {
        self.load_versioned(run).await
    }

    /// The run's state (the held copy while the store's head names it).
    pub async fn load(&self, run: &RunId) -> Result<RunState, DriverError> {
        Ok(self.load_versioned(run).await?.0)
    }

    /// `look` at the run's state without copying it while this coordinator holds it (and the
    /// store's head still names it); loaded from the store otherwise, and held from then on.
    /// For readers that need a little of a big run often (a waiter looking for its end at
    /// every commit, status reads of a finished run).
    pub async fn peek<T>(
        &self,
        run: &RunId,
        look: impl FnOnce(&RunState) -> T,
    ) -> Result<T, DriverError> {
        {
            // A commit here takes the state out while it runs: a look in that window would
            // find nothing held and load the whole run from the store (at every commit of a
            // big run a waiter watches). So the look waits for the commit in flight, and holds
            // off the next one for a head read.
            let _between_commits = match self.existing_run_lock(run) {
                Some(lock) => Some(lock.lock_owned().await),
                None => None,
            };
            // The head first: a held state is shared only for the look itself, never across
            // an await (a commit that takes a state a reader shares must copy it).
            let head = self.store.head(run).await?;
            if let Some((state, version)) = self.states.share(run) {
                if current(&state, version, head.as_ref()) {
                    return Ok(look(&state));
                }
            }
        }
        // Not held (a run that ended before this coordinator started, or one let go): read
        // from the store and held for the next look.
        match self.stored(run).await? {
            Some((state, version, weight)) => {
                let seen = look(&state);
                self.states.offer(state, version, weight);
                Ok(seen)
            }
            None => Ok(look(&self.load(run).await?)),
        }
    }

    /// The run's commit lock if this coordinator has made one (a commit may be in flight);
    /// never makes one (a look at a run that ended must not leave a lock behind).
    fn existing_run_lock(&self, run: &RunId) -> Option<Arc<tokio::sync::Mutex<()>>> {
        self.run_locks.lock().expect("run locks").get(run).cloned()
    }

    /// The run's state to commit on: the held one when the store's head still names it.
    pub(super) async fn load_for_commit(&self, run: &RunId) -> Result<Held, DriverError> {
        if let Some(held) = self.states.take(run) {
            if current(&held.0, held.1, self.store.head(run).await?.as_ref()) {
                return Ok(held);
            }
        }
        if let Some(stored) = self.stored(run).await? {
            return Ok(stored);
        }
        // Lost by the store: restored from the mirror (its weight unknown until read again).
        let (state, version) = self.load_versioned(run).await?;
        Ok((state, version, Weight::default()))
    }

    /// A copy of the run's held state when the store's head still names it.
    pub(super) async fn held_copy(
        &self,
        run: &RunId,
    ) -> Result<Option<(RunState, u64)>, DriverError> {
        let head = self.store.head(run).await?;
        let Some(held) = self.states.copy(run) else {
            return Ok(None);
        };
        Ok(current(&held.0, held.1, head.as_ref()).then_some(held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance::state;

    fn at(commit: &str) -> RunState {
        let mut s = state("r1");
        s.commit = commit.into();
        s
    }

    #[test]
    fn a_held_state_passes_only_at_the_heads_version_and_commit() {
        let held = at("c7");
        assert!(current(&held, 7, Some(&(7, "c7".into()))));
        assert!(
            !current(&held, 7, Some(&(8, "c8".into()))),
            "committed since"
        );
        assert!(
            !current(&held, 7, Some(&(7, "x7".into()))),
            "another history at the same version (restored after a loss)"
        );
        assert!(!current(&held, 7, None), "the store lost the run");
        assert!(
            !current(&at(""), 7, Some(&(7, String::new()))),
            "a state without a commit id is never trusted"
        );
    }

    #[test]
    fn the_cache_holds_a_bounded_number_of_runs() {
        let cache = StateCache::default();
        for i in 0..HELD_RUNS + 10 {
            cache.put(state(&format!("r{i}")), 1, Weight::default());
        }
        assert_eq!(cache.len(), HELD_RUNS);
        cache.put(at("c2"), 2, Weight::default());
        assert_eq!(cache.take(&RunId::new("r1")).map(|(_, v, _)| v), Some(2));
        assert!(cache.take(&RunId::new("r1")).is_none(), "taken out");
    }

    fn weighing(bytes: usize) -> Weight {
        Weight {
            snapshot_bytes: bytes,
            delta_bytes: 0,
        }
    }

    fn finished(run: &str) -> RunState {
        let mut s = state(run);
        s.status = shared::engine::RunStatus::Succeeded;
        s
    }

    #[test]
    fn past_its_weight_the_cache_lets_finished_runs_go_first_least_recently_read_first() {
        let cache = StateCache::with_bound(300);
        cache.put(finished("old"), 1, weighing(100));
        cache.put(state("busy"), 1, weighing(100));
        cache.put(finished("read"), 1, weighing(100));
        assert!(
            cache.share(&RunId::new("old")).is_some(),
            "read: now the newest"
        );
        cache.put(state("new"), 1, weighing(100));
        assert!(
            !cache.holds("read"),
            "the finished run read least recently went"
        );
        assert!(cache.holds("old") && cache.holds("busy") && cache.holds("new"));
        cache.put(state("newer"), 1, weighing(100));
        assert!(!cache.holds("old"), "the other finished run went next");
        assert!(
            cache.holds("busy"),
            "a run under way goes only when no finished run is left"
        );
        cache.put(state("newest"), 1, weighing(100));
        assert!(
            !cache.holds("busy"),
            "then the least recently used run under way"
        );
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn a_run_heavier_than_the_bound_is_held_while_it_commits() {
        let cache = StateCache::with_bound(100);
        cache.put(state("small"), 1, weighing(50));
        cache.put(state("big"), 1, weighing(1_000));
        assert!(cache.holds("big"), "the state just put stays");
        assert!(!cache.holds("small"));
        let (_, version, weight) = cache.take(&RunId::new("big")).expect("held");
        cache.put(state("big"), version + 1, weight);
        assert_eq!(cache.len(), 1, "its weight was counted once: {weight:?}");
    }

    #[test]
    fn a_state_read_from_the_store_never_replaces_a_newer_one() {
        let cache = StateCache::default();
        cache.put(at("c7"), 7, weighing(10));
        cache.offer(at("c6"), 6, weighing(10));
        assert_eq!(cache.share(&RunId::new("r1")).map(|(_, v)| v), Some(7));
        cache.offer(at("c8"), 8, weighing(10));
        assert_eq!(cache.share(&RunId::new("r1")).map(|(_, v)| v), Some(8));
        // A commit puts what it committed, whatever is held.
        cache.put(at("x8"), 8, weighing(10));
        let (s, _) = cache.share(&RunId::new("r1")).expect("held");
        assert_eq!(s.commit, "x8");
    }

    #[test]
    fn the_weight_held_is_the_sum_of_what_is_held() {
        let cache = StateCache::with_bound(1_000);
        cache.put(state("a"), 1, weighing(300));
        cache.put(state("b"), 1, weighing(300));
        cache.put(state("a"), 2, weighing(400));
        cache.offer(state("c"), 1, weighing(200));
        assert_eq!(cache.lock().bytes, 900);
        cache.forget(&RunId::new("b"));
        assert!(cache.take(&RunId::new("c")).is_some());
        assert_eq!(cache.lock().bytes, 400);
    }
}
