//! Batches in Redis: each a hash {state, version} written by a Lua compare-and-set, listed in a
//! sorted set by creation time; the unfinished ones in a set of their own, left in the same
//! script that commits a finished state.

use super::redis::{cas, encode, timed, RedisRunStore};
use async_trait::async_trait;
use redis::{AsyncCommands, Script};
use shared::batch::BatchState;
use shared::ids::BatchId;
use shared::ports::{BatchStore, CasOutcome, PortError};
use std::sync::LazyLock;

const CREATE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'version', 1)
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('SADD', KEYS[3], ARGV[3])
return 1
"#;

const COMMIT: &str = r#"
local v = redis.call('HGET', KEYS[1], 'version')
if v ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'version', tonumber(v) + 1)
if ARGV[3] == '1' then redis.call('SREM', KEYS[2], ARGV[4]) end
return 1
"#;

// Compiled (hashed) once per process.
static CREATE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(CREATE));
static COMMIT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(COMMIT));

impl RedisRunStore {
    fn batch_key(&self, id: &BatchId) -> String {
        format!("{}:batch:{id}", self.ns)
    }
    fn batches_key(&self) -> String {
        format!("{}:batches", self.ns)
    }
    fn active_batches_key(&self) -> String {
        format!("{}:batches:active", self.ns)
    }
}

fn ids(raw: Vec<String>) -> Vec<BatchId> {
    raw.into_iter().map(BatchId::new).collect()
}

#[async_trait]
impl BatchStore for RedisRunStore {
    async fn create_batch(&self, state: &BatchState) -> Result<bool, PortError> {
        let mut inv = CREATE_SCRIPT.prepare_invoke();
        inv.key(self.batch_key(&state.batch_id))
            .key(self.batches_key())
            .key(self.active_batches_key())
            .arg(encode(state)?)
            .arg(state.created_at.timestamp_millis())
            .arg(state.batch_id.as_str());
        let created: i64 = self.invoke("create batch", &inv).await?;
        Ok(created == 1)
    }

    async fn load_batch(&self, id: &BatchId) -> Result<Option<(BatchState, u64)>, PortError> {
        self.load_versioned("load batch", self.batch_key(id)).await
    }

    async fn commit_batch(
        &self,
        state: &BatchState,
        version: u64,
    ) -> Result<CasOutcome, PortError> {
        let mut inv = COMMIT_SCRIPT.prepare_invoke();
        inv.key(self.batch_key(&state.batch_id))
            .key(self.active_batches_key())
            .arg(version.to_string())
            .arg(encode(state)?)
            .arg(if state.is_finished() { "1" } else { "0" })
            .arg(state.batch_id.as_str());
        Ok(cas(self.invoke("commit batch", &inv).await?))
    }

    async fn list_batches(&self) -> Result<Vec<BatchId>, PortError> {
        let key = self.batches_key();
        let raw: Vec<String> = timed("list batches", &self.conn, |mut c| {
            let key = key.clone();
            async move { c.zrevrange(key, 0, 999).await }
        })
        .await?;
        Ok(ids(raw))
    }

    async fn active_batches(&self) -> Result<Vec<BatchId>, PortError> {
        let key = self.active_batches_key();
        let mut raw: Vec<String> = timed("active batches", &self.conn, |mut c| {
            let key = key.clone();
            async move { c.smembers(key).await }
        })
        .await?;
        raw.sort();
        Ok(ids(raw))
    }
}
