//! The embedded mode's run store: the same contract as Redis, in a mutex.

use async_trait::async_trait;
use shared::engine::RunState;
use shared::ids::RunId;
use shared::ports::{CasOutcome, OutboxMessage, PortError, RunStore};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

#[derive(Default)]
pub struct MemoryRunStore {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    runs: BTreeMap<RunId, (RunState, u64)>,
    order: Vec<RunId>,
    outbox: VecDeque<String>,
    deadlines: BTreeMap<String, i64>,
    epoch: Option<String>,
}

fn encode(m: &OutboxMessage) -> String {
    serde_json::to_string(m).expect("outbox message serializes")
}

#[async_trait]
impl RunStore for MemoryRunStore {
    async fn create(&self, state: &RunState, outbox: &[OutboxMessage]) -> Result<bool, PortError> {
        let mut g = self.inner.lock().expect("store lock");
        if g.runs.contains_key(&state.run_id) {
            return Ok(false);
        }
        g.runs.insert(state.run_id.clone(), (state.clone(), 1));
        g.order.push(state.run_id.clone());
        g.outbox.extend(outbox.iter().map(encode));
        Ok(true)
    }

    async fn load(&self, run: &RunId) -> Result<Option<(RunState, u64)>, PortError> {
        Ok(self
            .inner
            .lock()
            .expect("store lock")
            .runs
            .get(run)
            .cloned())
    }

    async fn commit(
        &self,
        state: &RunState,
        version: u64,
        outbox: &[OutboxMessage],
    ) -> Result<CasOutcome, PortError> {
        let mut g = self.inner.lock().expect("store lock");
        match g.runs.get_mut(&state.run_id) {
            Some((s, v)) if *v == version => {
                *s = state.clone();
                *v += 1;
            }
            _ => return Ok(CasOutcome::Conflict),
        }
        g.outbox.extend(outbox.iter().map(encode));
        Ok(CasOutcome::Committed)
    }

    async fn list(&self) -> Result<Vec<RunId>, PortError> {
        let g = self.inner.lock().expect("store lock");
        Ok(g.order.iter().rev().cloned().collect())
    }

    async fn outbox_claim(&self, _owner: &str, max: usize) -> Result<Vec<String>, PortError> {
        let mut g = self.inner.lock().expect("store lock");
        let n = max.min(g.outbox.len());
        Ok(g.outbox.drain(..n).collect())
    }

    async fn outbox_done(&self, _owner: &str, _raws: &[String]) -> Result<(), PortError> {
        Ok(())
    }

    async fn outbox_recover(&self, _owner: &str) -> Result<usize, PortError> {
        Ok(0)
    }

    async fn outbox_reclaim_own(&self, _owner: &str) -> Result<usize, PortError> {
        Ok(0)
    }

    async fn heartbeat(&self, _owner: &str) -> Result<(), PortError> {
        Ok(())
    }

    async fn watch(&self, watches: &[(String, i64)]) -> Result<(), PortError> {
        let mut g = self.inner.lock().expect("store lock");
        g.deadlines.extend(watches.iter().cloned());
        Ok(())
    }

    async fn due(&self, now: i64, max: usize, lease: i64) -> Result<Vec<String>, PortError> {
        let mut g = self.inner.lock().expect("store lock");
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
        self.inner
            .lock()
            .expect("store lock")
            .deadlines
            .remove(watch);
        Ok(())
    }

    async fn created_before(&self, _before_ms: i64, max: usize) -> Result<Vec<RunId>, PortError> {
        // The embedded store lives as long as its process: nothing is old enough to prune.
        let _ = max;
        Ok(Vec::new())
    }

    async fn remove(&self, run: &RunId) -> Result<(), PortError> {
        let mut g = self.inner.lock().expect("store lock");
        g.runs.remove(run);
        g.order.retain(|r| r != run);
        Ok(())
    }

    async fn exists(&self, run: &RunId) -> Result<bool, PortError> {
        Ok(self
            .inner
            .lock()
            .expect("store lock")
            .runs
            .contains_key(run))
    }

    async fn epoch(&self, candidate: &str) -> Result<String, PortError> {
        let mut g = self.inner.lock().expect("store lock");
        Ok(g.epoch.get_or_insert_with(|| candidate.to_string()).clone())
    }
}
