//! Schedules in Redis: each a hash {def, state, uid, version} (the definition written once,
//! the state by a Lua compare-and-set that also checks the schedule's uid, so a write meant
//! for a removed schedule never lands on one added later under its name), their names in a
//! set.

use super::redis::{cas, encode, timed, RedisRunStore};
use async_trait::async_trait;
use redis::{AsyncCommands, Script};
use shared::ports::{CasOutcome, PortError, ScheduleStore};
use shared::schedule::{ScheduleDef, ScheduleState};
use std::sync::LazyLock;

const ADD: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'def', ARGV[1], 'state', ARGV[2], 'uid', ARGV[3], 'version', 1)
redis.call('SADD', KEYS[2], ARGV[4])
return 1
"#;

const COMMIT: &str = r#"
if redis.call('HGET', KEYS[1], 'uid') ~= ARGV[1] then return 0 end
local v = redis.call('HGET', KEYS[1], 'version')
if v ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'version', tonumber(v) + 1)
return 1
"#;

const REMOVE: &str = r#"
local n = redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return n
"#;

// Compiled (hashed) once per process.
static ADD_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ADD));
static COMMIT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(COMMIT));
static REMOVE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(REMOVE));

impl RedisRunStore {
    fn schedule_key(&self, name: &str) -> String {
        format!("{}:schedule:{name}", self.ns)
    }
    fn schedules_key(&self) -> String {
        format!("{}:schedules", self.ns)
    }
}

fn decode<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, PortError> {
    serde_json::from_str(text).map_err(|e| PortError::Encoding(e.to_string()))
}

#[async_trait]
impl ScheduleStore for RedisRunStore {
    async fn add_schedule(
        &self,
        def: &ScheduleDef,
        state: &ScheduleState,
    ) -> Result<bool, PortError> {
        let mut inv = ADD_SCRIPT.prepare_invoke();
        inv.key(self.schedule_key(&def.name))
            .key(self.schedules_key())
            .arg(encode(def)?)
            .arg(encode(state)?)
            .arg(&state.uid)
            .arg(&def.name);
        let added: i64 = self.invoke("add schedule", &inv).await?;
        Ok(added == 1)
    }

    async fn schedule_def(&self, name: &str) -> Result<Option<ScheduleDef>, PortError> {
        let key = self.schedule_key(name);
        let raw: Option<String> = timed("schedule definition", &self.conn, |mut c| {
            let key = key.clone();
            async move { c.hget(key, "def").await }
        })
        .await?;
        raw.as_deref().map(decode).transpose()
    }

    async fn schedule_state(&self, name: &str) -> Result<Option<(ScheduleState, u64)>, PortError> {
        self.load_versioned("schedule state", self.schedule_key(name))
            .await
    }

    async fn commit_schedule(
        &self,
        state: &ScheduleState,
        version: u64,
    ) -> Result<CasOutcome, PortError> {
        let mut inv = COMMIT_SCRIPT.prepare_invoke();
        inv.key(self.schedule_key(&state.name))
            .arg(&state.uid)
            .arg(version.to_string())
            .arg(encode(state)?);
        Ok(cas(self.invoke("commit schedule", &inv).await?))
    }

    async fn remove_schedule(&self, name: &str) -> Result<bool, PortError> {
        let mut inv = REMOVE_SCRIPT.prepare_invoke();
        inv.key(self.schedule_key(name))
            .key(self.schedules_key())
            .arg(name);
        let removed: i64 = self.invoke("remove schedule", &inv).await?;
        Ok(removed == 1)
    }

    async fn list_schedules(&self) -> Result<Vec<String>, PortError> {
        let key = self.schedules_key();
        let mut names: Vec<String> = timed("list schedules", &self.conn, |mut c| {
            let key = key.clone();
            async move { c.smembers(key).await }
        })
        .await?;
        names.sort();
        Ok(names)
    }
}
