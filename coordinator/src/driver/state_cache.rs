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

/// At most this many runs' states are held; past it, an arbitrary one is let go (it is
/// loaded from the store on its next commit).
const HELD_RUNS: usize = 256;

/// A run's state, its version and its weight in the store.
pub(super) type Held = (RunState, u64, Weight);

/// A held state as the cache keeps it: shared with the reads copying it.
type Shared = (Arc<RunState>, u64, Weight);

/// The states are shared, so a read copies one outside the lock: a copy of a 100,000-job run
/// takes milliseconds, and holding the lock for it would stall every commit meanwhile.
#[derive(Default)]
pub(super) struct StateCache {
    runs: Mutex<HashMap<RunId, Shared>>,
}

impl StateCache {
    /// Takes a run's state out (a commit changes it in place); copied only if a read is
    /// copying it right now.
    pub(super) fn take(&self, run: &RunId) -> Option<Held> {
        let (state, version, weight) = self.runs.lock().expect("state cache").remove(run)?;
        let state = Arc::try_unwrap(state).unwrap_or_else(|shared| (*shared).clone());
        Some((state, version, weight))
    }

    /// A copy of a run's state (a read).
    pub(super) fn copy(&self, run: &RunId) -> Option<(RunState, u64)> {
        let (state, version) = {
            let runs = self.runs.lock().expect("state cache");
            runs.get(run).map(|(s, v, _)| (s.clone(), *v))?
        };
        Some(((*state).clone(), version))
    }

    /// The held state itself, shared (a look that copies nothing).
    pub(super) fn share(&self, run: &RunId) -> Option<(Arc<RunState>, u64)> {
        let runs = self.runs.lock().expect("state cache");
        runs.get(run).map(|(s, v, _)| (s.clone(), *v))
    }

    pub(super) fn put(&self, state: RunState, version: u64, weight: Weight) {
        let mut runs = self.runs.lock().expect("state cache");
        if runs.len() >= HELD_RUNS && !runs.contains_key(&state.run_id) {
            if let Some(other) = runs.keys().next().cloned() {
                runs.remove(&other);
            }
        }
        runs.insert(state.run_id.clone(), (Arc::new(state), version, weight));
    }

    pub(super) fn forget(&self, run: &RunId) {
        self.runs.lock().expect("state cache").remove(run);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.runs.lock().expect("state cache").len()
    }
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
    /// store's head still names it); loaded from the store otherwise. For readers that need a
    /// little of a big run often (a waiter looking for its end at every commit).
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
        Ok(look(&self.load(run).await?))
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
}
