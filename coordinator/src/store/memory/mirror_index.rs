//! The memory store's `MirrorIndex`: its identity is its epoch (the store lives and dies with
//! this process), the runs the mirror holds a set beside the runs.

use super::MemoryRunStore;
use async_trait::async_trait;
use shared::ids::RunId;
use shared::ports::{MirrorIndex, PortError};

#[async_trait]
impl MirrorIndex for MemoryRunStore {
    async fn index_token(&self) -> Result<Option<String>, PortError> {
        Ok(self.lock().epoch.clone())
    }

    async fn note_mirror_runs(&self, runs: &[RunId]) -> Result<(), PortError> {
        self.lock().mirror_runs.extend(runs.iter().cloned());
        Ok(())
    }

    async fn mark_reconciled(&self, token: &str) -> Result<bool, PortError> {
        let mut g = self.lock();
        let current = g.epoch.as_deref() == Some(token);
        if current {
            g.reconciled = Some(token.to_string());
        }
        Ok(current)
    }

    async fn reconciled(&self) -> Result<bool, PortError> {
        let g = self.lock();
        Ok(g.epoch.is_some() && g.reconciled == g.epoch)
    }

    async fn mirror_may_hold(&self, run: &RunId) -> Result<bool, PortError> {
        let g = self.lock();
        Ok(g.epoch.is_none() || g.reconciled != g.epoch || g.mirror_runs.contains(run))
    }
}
