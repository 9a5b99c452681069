//! Redis run store. Each run is a hash {state, version}; a transition is a Lua script that
//! checks the version, writes the new state and appends the outbox messages in one atomic step.
//! The outbox is a list; a relay claims messages into its own in-flight list (LMOVE), publishes
//! them with confirms, then forgets them. In-flight lists of relays that stopped heartbeating are
//! moved back. The connection manager reconnects on its own.

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};
use shared::engine::RunState;
use shared::ids::RunId;
use shared::ports::{CasOutcome, OutboxMessage, PortError, RunStore};

const CREATE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'version', 1)
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
for i = 4, #ARGV do redis.call('RPUSH', KEYS[3], ARGV[i]) end
return 1
"#;

const COMMIT: &str = r#"
local v = redis.call('HGET', KEYS[1], 'version')
if v ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'version', tonumber(v) + 1)
for i = 3, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
return 1
"#;

const CLAIM: &str = r#"
redis.call('SET', KEYS[3], 1, 'EX', 10)
local out = {}
for i = 1, tonumber(ARGV[1]) do
  local m = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
  if not m then break end
  out[#out + 1] = m
end
return out
"#;

const DUE: &str = r#"
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for i = 1, #due do redis.call('ZREM', KEYS[1], due[i]) end
return due
"#;

const DONE: &str = r#"
for i = 1, #ARGV do redis.call('LREM', KEYS[1], 1, ARGV[i]) end
return #ARGV
"#;

pub struct RedisRunStore {
    conn: ConnectionManager,
    ns: String,
    create: Script,
    commit: Script,
    claim: Script,
    done: Script,
    due: Script,
}

fn err(e: redis::RedisError) -> PortError {
    PortError::Connection(e.to_string())
}

fn encode<T: serde::Serialize>(v: &T) -> Result<String, PortError> {
    serde_json::to_string(v).map_err(|e| PortError::Encoding(e.to_string()))
}

impl RedisRunStore {
    pub async fn connect(url: &str, namespace: &str) -> Result<Self, PortError> {
        let client = redis::Client::open(url).map_err(err)?;
        let conn = ConnectionManager::new(client).await.map_err(err)?;
        Ok(Self {
            conn,
            ns: namespace.to_string(),
            create: Script::new(CREATE),
            commit: Script::new(COMMIT),
            claim: Script::new(CLAIM),
            done: Script::new(DONE),
            due: Script::new(DUE),
        })
    }

    fn run_key(&self, run: &RunId) -> String {
        format!("{}:run:{run}", self.ns)
    }
    fn runs_key(&self) -> String {
        format!("{}:runs", self.ns)
    }
    fn outbox_key(&self) -> String {
        format!("{}:outbox", self.ns)
    }
    fn inflight_key(&self, owner: &str) -> String {
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
    async fn create(&self, state: &RunState, outbox: &[OutboxMessage]) -> Result<bool, PortError> {
        let mut inv = self.create.prepare_invoke();
        inv.key(self.run_key(&state.run_id))
            .key(self.runs_key())
            .key(self.outbox_key())
            .arg(encode(state)?)
            .arg(chrono::Utc::now().timestamp_millis())
            .arg(state.run_id.as_str());
        for m in outbox {
            inv.arg(encode(m)?);
        }
        let created: i64 = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(err)?;
        Ok(created == 1)
    }

    async fn load(&self, run: &RunId) -> Result<Option<(RunState, u64)>, PortError> {
        let (state, version): (Option<String>, Option<u64>) = redis::cmd("HMGET")
            .arg(self.run_key(run))
            .arg("state")
            .arg("version")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(err)?;
        match (state, version) {
            (Some(s), Some(v)) => {
                let state =
                    serde_json::from_str(&s).map_err(|e| PortError::Encoding(e.to_string()))?;
                Ok(Some((state, v)))
            }
            _ => Ok(None),
        }
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
            .arg(version.to_string())
            .arg(encode(state)?);
        for m in outbox {
            inv.arg(encode(m)?);
        }
        let ok: i64 = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(err)?;
        Ok(if ok == 1 {
            CasOutcome::Committed
        } else {
            CasOutcome::Conflict
        })
    }

    async fn list(&self) -> Result<Vec<RunId>, PortError> {
        let ids: Vec<String> = self
            .conn
            .clone()
            .zrevrange(self.runs_key(), 0, 999)
            .await
            .map_err(err)?;
        Ok(ids.into_iter().map(RunId::new).collect())
    }

    async fn outbox_claim(&self, owner: &str, max: usize) -> Result<Vec<String>, PortError> {
        let mut inv = self.claim.prepare_invoke();
        inv.key(self.outbox_key())
            .key(self.inflight_key(owner))
            .key(self.owner_key(owner))
            .arg(max);
        inv.invoke_async(&mut self.conn.clone()).await.map_err(err)
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
        let _: i64 = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(err)?;
        Ok(())
    }

    async fn watch(&self, watch: &str, deadline: i64) -> Result<(), PortError> {
        let _: i64 = self
            .conn
            .clone()
            .zadd(self.deadlines_key(), watch, deadline)
            .await
            .map_err(err)?;
        Ok(())
    }

    async fn due(&self, now: i64, max: usize) -> Result<Vec<String>, PortError> {
        let mut inv = self.due.prepare_invoke();
        inv.key(self.deadlines_key()).arg(now).arg(max);
        inv.invoke_async(&mut self.conn.clone()).await.map_err(err)
    }

    async fn outbox_recover(&self, owner: &str) -> Result<usize, PortError> {
        let mut conn = self.conn.clone();
        let pattern = self.inflight_key("*");
        let keys: Vec<String> = {
            let mut iter: redis::AsyncIter<String> =
                conn.scan_match(&pattern).await.map_err(err)?;
            let mut keys = Vec::new();
            while let Some(k) = futures::StreamExt::next(&mut iter).await {
                keys.push(k);
            }
            keys
        };
        let prefix = self.inflight_key("");
        let mut moved = 0;
        for key in keys {
            let other = key.trim_start_matches(&prefix).to_string();
            let alive: bool = conn.exists(self.owner_key(&other)).await.map_err(err)?;
            if other == owner || alive {
                continue;
            }
            loop {
                let m: Option<String> = redis::cmd("LMOVE")
                    .arg(&key)
                    .arg(self.outbox_key())
                    .arg("LEFT")
                    .arg("RIGHT")
                    .query_async(&mut conn)
                    .await
                    .map_err(err)?;
                if m.is_none() {
                    break;
                }
                moved += 1;
            }
        }
        Ok(moved)
    }
}
