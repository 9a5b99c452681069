//! What a coordinator remembers having stored: content-addressed blobs, repository
//! snapshots and teams' upload records, so a second submission of the same bytes costs no
//! request to the object store.

use super::{Coordinator, DriverError};

/// Repository snapshots remembered (`Coordinator::known_snapshot`).
const SNAPSHOTS_MAX: usize = 64;
/// Content keys remembered as stored (`Coordinator::put_content_once`).
const STORED_KEYS_MAX: usize = 4096;
/// Upload records remembered (`Coordinator::known_upload`).
const UPLOADS_MAX: usize = 4096;

impl Coordinator {
    /// Stores `bytes` under the content-addressed `key` unless this coordinator knows it is
    /// there already (stored by it, or found by a check).
    pub async fn put_content_once(&self, key: &str, bytes: Vec<u8>) -> Result<(), DriverError> {
        if self.stored.lock().expect("stored keys").contains(key) {
            return Ok(());
        }
        if !self.blobs.exists(key).await? {
            self.blobs.put(key, bytes).await?;
        }
        let mut stored = self.stored.lock().expect("stored keys");
        if stored.len() >= STORED_KEYS_MAX {
            stored.clear();
        }
        stored.insert(key.to_string());
        Ok(())
    }

    /// The pack key and tree hash of `repo` at `commit`, when this coordinator stored them.
    pub fn known_snapshot(&self, repo: &str, commit: &str) -> Option<(String, String)> {
        self.snapshots
            .lock()
            .expect("snapshots")
            .get(&(repo.to_string(), commit.to_string()))
            .cloned()
    }

    /// Notes that `repo` at `commit` is stored as the pack `known.0` with tree hash `known.1`.
    pub fn remember_snapshot(&self, repo: &str, commit: &str, known: (String, String)) {
        let key = (repo.to_string(), commit.to_string());
        remember(&self.snapshots, SNAPSHOTS_MAX, key, known);
    }

    /// The upload record stored under `key` as this coordinator last read or wrote it. A
    /// record is a checked fact (that pack holds that commit, with that tree hash) that stays
    /// true; another coordinator may have recorded a newer pack for the commit since, so a
    /// caller that needs one pack in particular reads the store when this one differs.
    pub fn known_upload(&self, key: &str) -> Option<shared::http::Uploaded> {
        self.uploads.lock().expect("uploads").get(key).cloned()
    }

    /// Notes the upload record stored under `key`.
    pub fn remember_upload(&self, key: &str, record: &shared::http::Uploaded) {
        remember(&self.uploads, UPLOADS_MAX, key.to_string(), record.clone());
    }
}

/// Inserts into a memo bounded at `max` entries: a full memo starts again empty (a bound, not
/// an LRU).
fn remember<K: std::hash::Hash + Eq, V>(
    memo: &std::sync::Mutex<std::collections::HashMap<K, V>>,
    max: usize,
    key: K,
    value: V,
) {
    let mut memo = memo.lock().unwrap_or_else(|p| p.into_inner());
    if memo.len() >= max {
        memo.clear();
    }
    memo.insert(key, value);
}
