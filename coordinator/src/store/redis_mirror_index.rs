//! The Redis store's `MirrorIndex`: a set of the runs the mirror holds (noted by reconciles and
//! by retention's removals) and the identity the store was reconciled as: its epoch and the
//! `run_id` of the Redis server process, read inside each script, so a server restarted (from
//! an older copy, or a replica promoted) is reconciled again before any id is vouched for.

use super::redis::{timed, RedisRunStore};
use async_trait::async_trait;
use redis::{AsyncCommands, Script};
use shared::ids::RunId;
use shared::ports::{MirrorIndex, PortError};
use std::sync::LazyLock;

// The store's identity: `<epoch>|<server run_id>`, or false before the epoch is set. KEYS: epoch.
const TOKEN: &str = r#"
local function token()
  local epoch = redis.call('GET', KEYS[1])
  if not epoch then return false end
  local server = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  return epoch .. '|' .. (server or '')
end
"#;

static TOKEN_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&[TOKEN, "return token()"].concat()));

// KEYS: epoch, the reconciled mark. ARGV: the token a reconcile started from.
static MARK_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            TOKEN,
            "if token() ~= ARGV[1] then return 0 end
             redis.call('SET', KEYS[2], ARGV[1])
             return 1",
        ]
        .concat(),
    )
});

// KEYS: epoch, the reconciled mark, the mirror's runs. ARGV: a run id, or empty for none.
static MAY_HOLD_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            TOKEN,
            "local t = token()
             if not t or redis.call('GET', KEYS[2]) ~= t then return 1 end
             if ARGV[1] == '' then return 0 end
             return redis.call('SISMEMBER', KEYS[3], ARGV[1])",
        ]
        .concat(),
    )
});

impl RedisRunStore {
    pub(super) fn mirror_runs_key(&self) -> String {
        format!("{}:mirror-runs", self.ns)
    }

    fn epoch_key(&self) -> String {
        format!("{}:epoch", self.ns)
    }

    fn reconciled_key(&self) -> String {
        format!("{}:mirror-reconciled", self.ns)
    }

    async fn may_hold(&self, run: &str) -> Result<bool, PortError> {
        let mut inv = MAY_HOLD_SCRIPT.prepare_invoke();
        inv.key(self.epoch_key())
            .key(self.reconciled_key())
            .key(self.mirror_runs_key())
            .arg(run);
        let held: i64 = self.invoke("mirror may hold", &inv).await?;
        Ok(held == 1)
    }
}

#[async_trait]
impl MirrorIndex for RedisRunStore {
    async fn index_token(&self) -> Result<Option<String>, PortError> {
        let mut inv = TOKEN_SCRIPT.prepare_invoke();
        inv.key(self.epoch_key());
        self.invoke("index token", &inv).await
    }

    async fn note_mirror_runs(&self, runs: &[RunId]) -> Result<(), PortError> {
        if runs.is_empty() {
            return Ok(());
        }
        let key = self.mirror_runs_key();
        let ids: Vec<&str> = runs.iter().map(RunId::as_str).collect();
        timed("note mirror runs", &self.conn, |mut c| {
            let (key, ids) = (key.clone(), ids.clone());
            async move { c.sadd::<_, _, ()>(key, ids).await }
        })
        .await
    }

    async fn mark_reconciled(&self, token: &str) -> Result<bool, PortError> {
        let mut inv = MARK_SCRIPT.prepare_invoke();
        inv.key(self.epoch_key())
            .key(self.reconciled_key())
            .arg(token);
        let marked: i64 = self.invoke("mark reconciled", &inv).await?;
        Ok(marked == 1)
    }

    async fn reconciled(&self) -> Result<bool, PortError> {
        Ok(!self.may_hold("").await?)
    }

    async fn mirror_may_hold(&self, run: &RunId) -> Result<bool, PortError> {
        self.may_hold(run.as_str()).await
    }
}
