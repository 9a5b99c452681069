//! Batches in Redis, each in four keys so a pass of the driver touches only what it needs:
//!
//! - `batch:<id>`: a hash {state (the header, with its books), version};
//! - `batch:<id>:items`: a hash from item index to item;
//! - `batch:<id>:queued`: a sorted set of the queued items' indexes, scored by index (so the
//!   first queued come first);
//! - `batch:<id>:running`: a set of the running items' indexes.
//!
//! Every write goes through one Lua compare-and-set on the header's version that rewrites the
//! header and the changed items and moves their indexes between the sets; the batches are
//! listed in a sorted set by creation time, the unfinished ones in a set left in the same
//! script that commits a finished header. A batch is created items first (never over items
//! already there), header last: until its header exists nobody drives it.

use super::redis::{cas, encode, timed, RedisRunStore};
use async_trait::async_trait;
use redis::{AsyncCommands, Script};
use shared::batch::{BatchHeader, BatchItem, BatchSlice, BatchState, ItemState};
use shared::ids::BatchId;
use shared::ports::{BatchStore, CasOutcome, PortError};
use std::sync::LazyLock;

/// Items written by one script call when a batch is created.
const CREATE_CHUNK: usize = 1000;

/// Writes items (index, item, state triples) of a batch whose header does not exist yet; an
/// item already there is left as it is.
const CREATE_ITEMS: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
for i = 1, #ARGV, 3 do
  if redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1]) == 1 then
    if ARGV[i + 2] == 'queued' then redis.call('ZADD', KEYS[3], ARGV[i], ARGV[i]) end
    if ARGV[i + 2] == 'running' then redis.call('SADD', KEYS[4], ARGV[i]) end
  end
end
return 1
"#;

const CREATE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'version', 1)
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
if ARGV[4] == '0' then redis.call('SADD', KEYS[3], ARGV[3]) end
return 1
"#;

/// The header, its version, then index and item of every running item and of the first
/// `ARGV[1]` queued ones; nil when the batch does not exist.
const SLICE: &str = r#"
local h = redis.call('HMGET', KEYS[1], 'state', 'version')
if not h[1] then return false end
local out = {h[1], h[2]}
local function add(indexes)
  for _, idx in ipairs(indexes) do
    table.insert(out, idx)
    table.insert(out, redis.call('HGET', KEYS[2], idx))
  end
end
add(redis.call('SMEMBERS', KEYS[4]))
local n = tonumber(ARGV[1])
if n > 0 then add(redis.call('ZRANGE', KEYS[3], 0, n - 1)) end
return out
"#;

const COMMIT: &str = r#"
local v = redis.call('HGET', KEYS[1], 'version')
if v ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'version', tonumber(v) + 1)
for i = 5, #ARGV, 3 do
  local idx, st = ARGV[i], ARGV[i + 2]
  redis.call('HSET', KEYS[2], idx, ARGV[i + 1])
  if st == 'queued' then redis.call('ZADD', KEYS[3], idx, idx) else redis.call('ZREM', KEYS[3], idx) end
  if st == 'running' then redis.call('SADD', KEYS[4], idx) else redis.call('SREM', KEYS[4], idx) end
end
if ARGV[3] == '1' then redis.call('SREM', KEYS[5], ARGV[4]) end
return 1
"#;

// Compiled (hashed) once per process.
static CREATE_ITEMS_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(CREATE_ITEMS));
static CREATE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(CREATE));
static SLICE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SLICE));
static COMMIT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(COMMIT));

/// The keys of one batch.
struct BatchKeys {
    header: String,
    items: String,
    queued: String,
    running: String,
}

impl RedisRunStore {
    fn batch_keys(&self, id: &BatchId) -> BatchKeys {
        let header = format!("{}:batch:{id}", self.ns);
        BatchKeys {
            items: format!("{header}:items"),
            queued: format!("{header}:queued"),
            running: format!("{header}:running"),
            header,
        }
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

/// The name the scripts file an item's state under.
fn state_name(state: ItemState) -> &'static str {
    match state {
        ItemState::Queued => "queued",
        ItemState::Running => "running",
        _ => "settled",
    }
}

fn decode<T: serde::de::DeserializeOwned>(raw: &str) -> Result<T, PortError> {
    serde_json::from_str(raw).map_err(|e| PortError::Encoding(e.to_string()))
}

fn index(raw: &str) -> Result<usize, PortError> {
    raw.parse()
        .map_err(|_| PortError::Encoding(format!("`{raw}` is not an item index")))
}

#[async_trait]
impl BatchStore for RedisRunStore {
    async fn create_batch(&self, state: &BatchState) -> Result<bool, PortError> {
        let keys = self.batch_keys(&state.batch_id);
        for (c, chunk) in state.items.chunks(CREATE_CHUNK).enumerate() {
            let mut inv = CREATE_ITEMS_SCRIPT.prepare_invoke();
            inv.key(&keys.header)
                .key(&keys.items)
                .key(&keys.queued)
                .key(&keys.running);
            for (i, item) in chunk.iter().enumerate() {
                inv.arg(c * CREATE_CHUNK + i)
                    .arg(encode(item)?)
                    .arg(state_name(item.state));
            }
            let written: i64 = self.invoke("create batch items", &inv).await?;
            if written == 0 {
                return Ok(false);
            }
        }
        let mut inv = CREATE_SCRIPT.prepare_invoke();
        inv.key(&keys.header)
            .key(self.batches_key())
            .key(self.active_batches_key())
            .arg(encode(state.header())?)
            .arg(state.created_at.timestamp_millis())
            .arg(state.batch_id.as_str())
            .arg(if state.is_finished() { "1" } else { "0" });
        let created: i64 = self.invoke("create batch", &inv).await?;
        Ok(created == 1)
    }

    async fn load_batch(&self, id: &BatchId) -> Result<Option<(BatchState, u64)>, PortError> {
        let keys = self.batch_keys(id);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HMGET")
            .arg(&keys.header)
            .arg("state")
            .arg("version")
            .cmd("HGETALL")
            .arg(&keys.items);
        type Read = ((Option<String>, Option<u64>), Vec<(String, String)>);
        let ((header, version), raw_items): Read = timed("load batch", &self.conn, |mut c| {
            let pipe = &pipe;
            async move { pipe.query_async(&mut c).await }
        })
        .await?;
        let (Some(header), Some(version)) = (header, version) else {
            return Ok(None);
        };
        let header: BatchHeader = decode(&header)?;
        let mut items: Vec<(usize, BatchItem)> = raw_items
            .iter()
            .map(|(i, item)| Ok((index(i)?, decode(item)?)))
            .collect::<Result<_, PortError>>()?;
        items.sort_unstable_by_key(|(i, _)| *i);
        if items.len() != header.counts.total || items.iter().enumerate().any(|(n, (i, _))| n != *i)
        {
            return Err(PortError::Encoding(format!(
                "batch `{id}` holds {} items, its header counts {}",
                items.len(),
                header.counts.total
            )));
        }
        let items = items.into_iter().map(|(_, item)| item).collect();
        Ok(Some((BatchState::from_parts(header, items), version)))
    }

    async fn batch_header(&self, id: &BatchId) -> Result<Option<(BatchHeader, u64)>, PortError> {
        self.load_versioned("batch header", self.batch_keys(id).header)
            .await
    }

    async fn batch_slice(
        &self,
        id: &BatchId,
        queued: usize,
    ) -> Result<Option<(BatchSlice, u64)>, PortError> {
        let keys = self.batch_keys(id);
        let mut inv = SLICE_SCRIPT.prepare_invoke();
        inv.key(&keys.header)
            .key(&keys.items)
            .key(&keys.queued)
            .key(&keys.running)
            .arg(queued);
        let raw: Option<Vec<String>> = self.invoke("batch slice", &inv).await?;
        let Some(raw) = raw else {
            return Ok(None);
        };
        let [header, version, rest @ ..] = &raw[..] else {
            return Err(PortError::Encoding(
                "a batch slice without its header".into(),
            ));
        };
        let header: BatchHeader = decode(header)?;
        let version: u64 = version
            .parse()
            .map_err(|_| PortError::Encoding(format!("`{version}` is not a version")))?;
        let items: Vec<(usize, BatchItem)> = rest
            .chunks_exact(2)
            .map(|pair| Ok((index(&pair[0])?, decode(&pair[1])?)))
            .collect::<Result<_, PortError>>()?;
        Ok(Some((BatchSlice::new(header, items), version)))
    }

    async fn commit_batch(
        &self,
        slice: &BatchSlice,
        version: u64,
    ) -> Result<CasOutcome, PortError> {
        let header = slice.header();
        let keys = self.batch_keys(&header.batch_id);
        let mut inv = COMMIT_SCRIPT.prepare_invoke();
        inv.key(&keys.header)
            .key(&keys.items)
            .key(&keys.queued)
            .key(&keys.running)
            .key(self.active_batches_key())
            .arg(version.to_string())
            .arg(encode(header)?)
            .arg(if header.is_finished() { "1" } else { "0" })
            .arg(header.batch_id.as_str());
        for (i, item) in slice.changed() {
            inv.arg(i).arg(encode(item)?).arg(state_name(item.state));
        }
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
