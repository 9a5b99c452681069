//! Redis run store. Each run is a hash {state, version, commit} (its snapshot and head) and a
//! list of the deltas committed after the snapshot; a transition is a Lua script that
//! checks the version, writes the new state and appends the outbox messages in one atomic step.
//! The outbox is a list; a relay claims messages into its own in-flight list (LMOVE), publishes
//! them with confirms, then forgets them. In-flight lists of relays that stopped heartbeating are
//! moved back. The connection is a `worker::redis_link::RedisLink`: one connection, replaced
//! the moment it is seen dead, so a restarted Redis is used again on the next call.

use async_trait::async_trait;
use redis::{AsyncCommands, Script};
use shared::engine::RunState;
use shared::ids::RunId;
use shared::ports::{CasOutcome, OutboxMessage, PortError, RunStore, StoredRun};
use worker::redis_link::{RedisLink, CONNECT_TIMEOUT, RESPONSE_TIMEOUT};

const CREATE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[4])
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'version', 1, 'commit', ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
for i = 5, #ARGV do redis.call('RPUSH', KEYS[3], ARGV[i]) end
return 1
"#;

const COMMIT: &str = r#"
local v = redis.call('HGET', KEYS[1], 'version')
if v ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'version', tonumber(v) + 1, 'commit', ARGV[3])
redis.call('DEL', KEYS[3])
for i = 4, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
return 1
"#;

const APPEND: &str = r#"
local v = redis.call('HGET', KEYS[1], 'version')
if v ~= ARGV[1] then return 0 end
redis.call('RPUSH', KEYS[3], ARGV[3])
redis.call('HSET', KEYS[1], 'version', tonumber(v) + 1, 'commit', ARGV[2])
for i = 4, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
return 1
"#;

const CLAIM: &str = r#"
redis.call('SET', KEYS[3], 1, 'PX', tonumber(ARGV[2]))
local out = {}
for i = 1, tonumber(ARGV[1]) do
  local m = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
  if not m then break end
  out[#out + 1] = m
end
return out
"#;

// Leases due watches: their deadline moves `lease` seconds on, so a coordinator that dies
// before acting on one leaves it to be handed out again.
const DUE: &str = r#"
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for i = 1, #due do redis.call('ZADD', KEYS[1], tonumber(ARGV[1]) + tonumber(ARGV[3]), due[i]) end
return due
"#;

const RECLAIM_OWN: &str = r#"
local n = 0
while redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT') do n = n + 1 end
return n
"#;

const EPOCH: &str = r#"
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
"#;

/// No call to Redis waits longer than this (a blocked server is an error, not a hang): a
/// connect and an answer, each within the link's own timeout, and a second more.
const CALL_TIMEOUT: std::time::Duration = RESPONSE_TIMEOUT
    .saturating_add(CONNECT_TIMEOUT)
    .saturating_add(std::time::Duration::from_secs(1));

/// How long an owner's lease lasts without a heartbeat.
const LEASE: std::time::Duration = std::time::Duration::from_secs(10);

const DONE: &str = r#"
for i = 1, #ARGV do redis.call('LREM', KEYS[1], 1, ARGV[i]) end
return #ARGV
"#;

pub struct RedisRunStore {
    pub(super) conn: RedisLink,
    pub(super) ns: String,
    lease: std::time::Duration,
    create: Script,
    commit: Script,
    append: Script,
    claim: Script,
    done: Script,
    due: Script,
    reclaim_own: Script,
    epoch: Script,
}

fn err(e: redis::RedisError) -> PortError {
    PortError::Connection(e.to_string())
}

/// A compare-and-set script's answer (1: written).
pub(super) fn cas(written: i64) -> CasOutcome {
    if written == 1 {
        CasOutcome::Committed
    } else {
        CasOutcome::Conflict
    }
}

pub(super) fn encode<T: serde::Serialize>(v: &T) -> Result<String, PortError> {
    serde_json::to_string(v).map_err(|e| PortError::Encoding(e.to_string()))
}

/// Runs one Redis call with the call timeout; a call that found the connection dropped or
/// Redis refusing (the server restarted: the link connects again on the next call) is tried
/// once more. A call without an answer is not: it may have been applied.
pub(super) async fn timed<T, F, Fut>(what: &str, conn: &RedisLink, call: F) -> Result<T, PortError>
where
    F: Fn(RedisLink) -> Fut,
    Fut: std::future::Future<Output = redis::RedisResult<T>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match tokio::time::timeout(CALL_TIMEOUT, call(conn.clone())).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if tries < 2 && (e.is_connection_dropped() || e.is_connection_refusal()) => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Ok(Err(e)) if e.is_timeout() => {
                return Err(PortError::Connection(format!(
                    "redis did not answer `{what}` within {RESPONSE_TIMEOUT:?}"
                )))
            }
            Ok(Err(e)) => return Err(err(e)),
            Err(_) => {
                return Err(PortError::Connection(format!(
                    "redis did not answer `{what}` within {CALL_TIMEOUT:?}"
                )))
            }
        }
    }
}

impl RedisRunStore {
    pub async fn connect(url: &str, namespace: &str) -> Result<Self, PortError> {
        let conn = RedisLink::connect(url).await.map_err(err)?;
        Ok(Self {
            conn,
            ns: namespace.to_string(),
            lease: LEASE,
            create: Script::new(CREATE),
            commit: Script::new(COMMIT),
            append: Script::new(APPEND),
            claim: Script::new(CLAIM),
            done: Script::new(DONE),
            due: Script::new(DUE),
            reclaim_own: Script::new(RECLAIM_OWN),
            epoch: Script::new(EPOCH),
        })
    }

    /// The same store with owners' leases lasting `lease` (the conformance suite's short one).
    pub fn with_lease(mut self, lease: std::time::Duration) -> Self {
        self.lease = lease;
        self
    }

    fn lease_ms(&self) -> u64 {
        (self.lease.as_millis() as u64).max(1)
    }

    /// Runs a prepared script with the store's timeout.
    pub(super) async fn invoke<T: redis::FromRedisValue>(
        &self,
        what: &str,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<T, PortError> {
        timed(what, &self.conn, |mut c| async move {
            inv.invoke_async(&mut c).await
        })
        .await
    }

    /// A versioned document (a hash {state, version}): its decoded state and version.
    pub(super) async fn load_versioned<T: serde::de::DeserializeOwned>(
        &self,
        what: &str,
        key: String,
    ) -> Result<Option<(T, u64)>, PortError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(key).arg("state").arg("version");
        let (state, version): (Option<String>, Option<u64>) = timed(what, &self.conn, |mut c| {
            let cmd = &cmd;
            async move { cmd.query_async(&mut c).await }
        })
        .await?;
        match (state, version) {
            (Some(s), Some(v)) => {
                let state =
                    serde_json::from_str(&s).map_err(|e| PortError::Encoding(e.to_string()))?;
                Ok(Some((state, v)))
            }
            _ => Ok(None),
        }
    }

    fn run_key(&self, run: &RunId) -> String {
        format!("{}:run:{run}", self.ns)
    }
    fn deltas_key(&self, run: &RunId) -> String {
        format!("{}:run:{run}:deltas", self.ns)
    }
    fn runs_key(&self) -> String {
        format!("{}:runs", self.ns)
    }
    pub(super) fn outbox_key(&self) -> String {
        format!("{}:outbox", self.ns)
    }
    pub(super) fn inflight_key(&self, owner: &str) -> String {
        format!("{}:outbox:inflight:{owner}", self.ns)
    }
    fn deadlines_key(&self) -> String {
        format!("{}:deadlines", self.ns)
    }
    fn owner_key(&self, owner: &str) -> String {
        format!("{}:owner:{owner}", self.ns)
    }
}

#[async_trait]
impl RunStore for RedisRunStore {
    fn dependency(&self) -> Option<(&'static str, bool)> {
        Some(("redis", self.conn.is_up()))
    }

    async fn create(&self, state: &RunState, outbox: &[OutboxMessage]) -> Result<bool, PortError> {
        let mut inv = self.create.prepare_invoke();
        inv.key(self.run_key(&state.run_id))
            .key(self.runs_key())
            .key(self.outbox_key())
            .key(self.deltas_key(&state.run_id))
            .arg(encode(state)?)
            .arg(chrono::Utc::now().timestamp_millis())
            .arg(state.run_id.as_str())
            .arg(&state.commit);
        for m in outbox {
            inv.arg(encode(m)?);
        }
        let created: i64 = self.invoke("create", &inv).await?;
        Ok(created == 1)
    }

    async fn load(&self, run: &RunId) -> Result<Option<StoredRun>, PortError> {
        let (key, deltas_key) = (self.run_key(run), self.deltas_key(run));
        let (state, version, deltas): (Option<String>, Option<u64>, Vec<String>) =
            timed("load", &self.conn, |mut c| {
                let (key, deltas_key) = (&key, &deltas_key);
                async move {
                    redis::pipe()
                        .atomic()
                        .hget(key, "state")
                        .hget(key, "version")
                        .lrange(deltas_key, 0, -1)
                        .query_async(&mut c)
                        .await
                }
            })
            .await?;
        let (Some(state), Some(version)) = (state, version) else {
            return Ok(None);
        };
        let snapshot =
            serde_json::from_str(&state).map_err(|e| PortError::Encoding(e.to_string()))?;
        Ok(Some(StoredRun {
            snapshot,
            version,
            deltas,
            snapshot_bytes: state.len(),
        }))
    }

    async fn append(
        &self,
        run: &RunId,
        version: u64,
        commit: &str,
        delta: &str,
        outbox: &[OutboxMessage],
    ) -> Result<CasOutcome, PortError> {
        let mut inv = self.append.prepare_invoke();
        inv.key(self.run_key(run))
            .key(self.outbox_key())
            .key(self.deltas_key(run))
            .arg(version.to_string())
            .arg(commit)
            .arg(delta);
        for m in outbox {
            inv.arg(encode(m)?);
        }
        Ok(cas(self.invoke("append", &inv).await?))
    }

    async fn commit(
        &self,
        state: &RunState,
        version: u64,
        outbox: &[OutboxMessage],
    ) -> Result<CasOutcome, PortError> {
        let mut inv = self.commit.prepare_invoke();
        inv.key(self.run_key(&state.run_id))
            .key(self.outbox_key())
            .key(self.deltas_key(&state.run_id))
            .arg(version.to_string())
            .arg(encode(state)?)
            .arg(&state.commit);
        for m in outbox {
            inv.arg(encode(m)?);
        }
        Ok(cas(self.invoke("commit", &inv).await?))
    }

    async fn head(&self, run: &RunId) -> Result<Option<(u64, String)>, PortError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.run_key(run)).arg("version").arg("commit");
        let (version, commit): (Option<u64>, Option<String>) =
            timed("head", &self.conn, |mut c| {
                let cmd = &cmd;
                async move { cmd.query_async(&mut c).await }
            })
            .await?;
        Ok(version.map(|v| (v, commit.unwrap_or_default())))
    }

    async fn list(&self) -> Result<Vec<RunId>, PortError> {
        let key = self.runs_key();
        let ids: Vec<String> = timed("list", &self.conn, |mut c| {
            let key = key.clone();
            async move { c.zrevrange(key, 0, 999).await }
        })
        .await?;
        Ok(ids.into_iter().map(RunId::new).collect())
    }

    async fn outbox_claim(&self, owner: &str, max: usize) -> Result<Vec<String>, PortError> {
        let mut inv = self.claim.prepare_invoke();
        inv.key(self.outbox_key())
            .key(self.inflight_key(owner))
            .key(self.owner_key(owner))
            .arg(max)
            .arg(self.lease_ms());
        self.invoke("outbox claim", &inv).await
    }

    async fn outbox_done(&self, owner: &str, raws: &[String]) -> Result<(), PortError> {
        if raws.is_empty() {
            return Ok(());
        }
        let mut inv = self.done.prepare_invoke();
        inv.key(self.inflight_key(owner));
        for r in raws {
            inv.arg(r);
        }
        let _: i64 = self.invoke("outbox done", &inv).await?;
        Ok(())
    }

    async fn outbox_recover(&self, owner: &str) -> Result<usize, PortError> {
        let pattern = self.inflight_key("*");
        let keys: Vec<String> = timed("scan in-flight lists", &self.conn, |mut c| {
            let pattern = pattern.clone();
            async move {
                let mut iter: redis::AsyncIter<String> = c.scan_match(&pattern).await?;
                let mut keys = Vec::new();
                while let Some(k) = futures::StreamExt::next(&mut iter).await {
                    keys.push(k);
                }
                Ok(keys)
            }
        })
        .await?;
        let prefix = self.inflight_key("");
        let mut moved = 0;
        for key in keys {
            let other = key.trim_start_matches(&prefix).to_string();
            if other == owner {
                continue;
            }
            let lease = self.owner_key(&other);
            let alive: bool = timed("owner lease", &self.conn, |mut c| {
                let lease = lease.clone();
                async move { c.exists(lease).await }
            })
            .await?;
            if alive {
                continue;
            }
            let mut inv = self.reclaim_own.prepare_invoke();
            inv.key(&key).key(self.outbox_key());
            let n: usize = self.invoke("recover in-flight", &inv).await?;
            moved += n;
        }
        Ok(moved)
    }

    async fn outbox_reclaim_own(&self, owner: &str) -> Result<usize, PortError> {
        let mut inv = self.reclaim_own.prepare_invoke();
        inv.key(self.inflight_key(owner)).key(self.outbox_key());
        self.invoke("reclaim own in-flight", &inv).await
    }

    async fn heartbeat(&self, owner: &str) -> Result<(), PortError> {
        let (key, ms) = (self.owner_key(owner), self.lease_ms());
        timed("heartbeat", &self.conn, |mut c| {
            let key = key.clone();
            async move { c.pset_ex::<_, _, ()>(key, 1, ms).await }
        })
        .await
    }

    async fn watch(&self, watches: &[(String, i64)]) -> Result<(), PortError> {
        if watches.is_empty() {
            return Ok(());
        }
        let items: Vec<(i64, &str)> = watches.iter().map(|(w, d)| (*d, w.as_str())).collect();
        let key = self.deadlines_key();
        let _: i64 = timed("watch", &self.conn, |mut c| {
            let (key, items) = (key.clone(), &items);
            async move { c.zadd_multiple(key, items).await }
        })
        .await?;
        Ok(())
    }

    async fn due(&self, now: i64, max: usize, lease: i64) -> Result<Vec<String>, PortError> {
        let mut inv = self.due.prepare_invoke();
        inv.key(self.deadlines_key()).arg(now).arg(max).arg(lease);
        self.invoke("due", &inv).await
    }

    async fn unwatch(&self, watch: &str) -> Result<(), PortError> {
        let key = self.deadlines_key();
        let _: i64 = timed("unwatch", &self.conn, |mut c| {
            let key = key.clone();
            async move { c.zrem(key, watch).await }
        })
        .await?;
        Ok(())
    }

    async fn created_before(&self, before_ms: i64, max: usize) -> Result<Vec<RunId>, PortError> {
        let key = self.runs_key();
        let ids: Vec<String> = timed("created before", &self.conn, |mut c| {
            let key = key.clone();
            async move {
                c.zrangebyscore_limit(key, "-inf", before_ms, 0, max as isize)
                    .await
            }
        })
        .await?;
        Ok(ids.into_iter().map(RunId::new).collect())
    }

    async fn remove(&self, run: &RunId) -> Result<(), PortError> {
        let (run_key, runs_key) = (self.run_key(run), self.runs_key());
        let (deltas_key, mirror_key) = (self.deltas_key(run), self.mirror_runs_key());
        timed("remove", &self.conn, |mut c| {
            let (run_key, runs_key) = (run_key.clone(), runs_key.clone());
            let (deltas_key, mirror_key) = (&deltas_key, &mirror_key);
            async move {
                redis::pipe()
                    .atomic()
                    .del(&run_key)
                    .ignore()
                    .del(deltas_key)
                    .ignore()
                    .zrem(&runs_key, run.as_str())
                    .ignore()
                    .sadd(mirror_key, run.as_str())
                    .ignore()
                    .query_async::<()>(&mut c)
                    .await
            }
        })
        .await
    }

    async fn exists(&self, run: &RunId) -> Result<bool, PortError> {
        let key = self.run_key(run);
        timed("exists", &self.conn, |mut c| {
            let key = key.clone();
            async move { c.exists(key).await }
        })
        .await
    }

    async fn epoch(&self, candidate: &str) -> Result<String, PortError> {
        let mut inv = self.epoch.prepare_invoke();
        inv.key(format!("{}:epoch", self.ns)).arg(candidate);
        self.invoke("epoch", &inv).await
    }
}
