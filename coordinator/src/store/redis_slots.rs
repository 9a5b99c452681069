//! The teams' job slots in Redis: per team a sorted set of the attempts holding a slot (scored
//! by when the slot lapses) and a list, the team's line, of outbox messages waiting for one
//! (each entry `<slot>\n<raw>`); a set names the teams with a line. Every move of a message
//! (in-flight list → line, line → outbox) is one script, so a message is never in two places
//! or none.

use super::redis::{timed, RedisRunStore};
use async_trait::async_trait;
use redis::Script;
use shared::ids::RunId;
use shared::ports::{JobSlotStore, PortError};
use std::sync::LazyLock;

// Moves messages from the front of the line to the outbox while fewer than the limit hold a
// slot (first freeing lapsed slots). KEYS: slots, line, outbox. `limit` < 0: no limit.
const PROMOTE: &str = r#"
local function promote(limit, now, lapses)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local moved = 0
  while limit < 0 or redis.call('ZCARD', KEYS[1]) < limit do
    local e = redis.call('LPOP', KEYS[2])
    if not e then break end
    local nl = string.find(e, '\n', 1, true)
    redis.call('ZADD', KEYS[1], lapses, string.sub(e, 1, nl - 1))
    redis.call('RPUSH', KEYS[3], string.sub(e, nl + 1))
    moved = moved + 1
  end
  return moved
end
"#;

// The line moves first (those waiting go before newcomers), then each claimed message either
// holds or takes a slot or joins the line. KEYS: slots, line, outbox, the owner's in-flight
// list, the teams with a line. ARGV: limit, now, lapse time of a slot taken now, team, then
// (slot, raw) pairs.
const ADMIT: &str = r#"
local limit = tonumber(ARGV[1])
promote(limit, ARGV[2], ARGV[3])
local out = {}
for i = 5, #ARGV, 2 do
  local slot, raw = ARGV[i], ARGV[i + 1]
  local holds = redis.call('ZSCORE', KEYS[1], slot)
  if holds or (redis.call('LLEN', KEYS[2]) == 0 and redis.call('ZCARD', KEYS[1]) < limit) then
    redis.call('ZADD', KEYS[1], ARGV[3], slot)
    out[#out + 1] = 1
  else
    redis.call('LREM', KEYS[4], 1, raw)
    redis.call('RPUSH', KEYS[2], slot .. '\n' .. raw)
    redis.call('SADD', KEYS[5], ARGV[4])
    out[#out + 1] = 0
  end
end
if redis.call('LLEN', KEYS[2]) == 0 then redis.call('SREM', KEYS[5], ARGV[4]) end
return out
"#;

// KEYS: slots, line, outbox, the teams with a line. ARGV: limit (-1: none), now, lapse time of
// a slot taken now, team, the ended run's prefix (`<run>.`, or empty), then the slots to free.
const RELEASE: &str = r#"
for i = 6, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) end
local prefix = ARGV[5]
if prefix ~= '' then
  for _, s in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    if string.sub(s, 1, #prefix) == prefix then redis.call('ZREM', KEYS[1], s) end
  end
  local line = redis.call('LRANGE', KEYS[2], 0, -1)
  local keep = {}
  for _, e in ipairs(line) do
    if string.sub(e, 1, #prefix) ~= prefix then keep[#keep + 1] = e end
  end
  if #keep ~= #line then
    redis.call('DEL', KEYS[2])
    for j = 1, #keep, 1000 do
      redis.call('RPUSH', KEYS[2], unpack(keep, j, math.min(j + 999, #keep)))
    end
  end
end
local moved = promote(tonumber(ARGV[1]), ARGV[2], ARGV[3])
if redis.call('LLEN', KEYS[2]) == 0 then redis.call('SREM', KEYS[4], ARGV[4]) end
return moved
"#;

static ADMIT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(&[PROMOTE, ADMIT].concat()));
static RELEASE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&[PROMOTE, RELEASE].concat()));

impl RedisRunStore {
    fn slots_key(&self, team: &str) -> String {
        format!("{}:team:{team}:slots", self.ns)
    }

    fn line_key(&self, team: &str) -> String {
        format!("{}:team:{team}:line", self.ns)
    }

    fn teams_waiting_key(&self) -> String {
        format!("{}:teams-waiting", self.ns)
    }

    async fn release(&self, team: &str, r: Release<'_>) -> Result<usize, PortError> {
        let mut inv = RELEASE_SCRIPT.prepare_invoke();
        inv.key(self.slots_key(team))
            .key(self.line_key(team))
            .key(self.outbox_key())
            .key(self.teams_waiting_key())
            .arg(r.limit.map_or(-1, i64::from))
            .arg(r.now_ms)
            .arg(r.now_ms + r.lease_ms)
            .arg(team)
            .arg(r.run.map(|run| format!("{run}.")).unwrap_or_default());
        for s in r.slots {
            inv.arg(s);
        }
        let moved: i64 = self.invoke("release job slots", &inv).await?;
        Ok(moved.max(0) as usize)
    }
}

/// What a release frees: `slots`, and every slot and waiting job of `run` when it ended.
struct Release<'a> {
    limit: Option<u32>,
    now_ms: i64,
    lease_ms: i64,
    run: Option<&'a RunId>,
    slots: &'a [String],
}

#[async_trait]
impl JobSlotStore for RedisRunStore {
    async fn admit_jobs(
        &self,
        owner: &str,
        team: &str,
        limit: u32,
        now_ms: i64,
        lease_ms: i64,
        items: &[(String, String)],
    ) -> Result<Vec<bool>, PortError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = ADMIT_SCRIPT.prepare_invoke();
        inv.key(self.slots_key(team))
            .key(self.line_key(team))
            .key(self.outbox_key())
            .key(self.inflight_key(owner))
            .key(self.teams_waiting_key())
            .arg(limit)
            .arg(now_ms)
            .arg(now_ms + lease_ms)
            .arg(team);
        for (slot, raw) in items {
            inv.arg(slot).arg(raw);
        }
        let admitted: Vec<i64> = self.invoke("admit jobs", &inv).await?;
        Ok(admitted.into_iter().map(|a| a == 1).collect())
    }

    async fn release_jobs(
        &self,
        team: &str,
        limit: Option<u32>,
        now_ms: i64,
        lease_ms: i64,
        slots: &[String],
    ) -> Result<usize, PortError> {
        let r = Release {
            limit,
            now_ms,
            lease_ms,
            run: None,
            slots,
        };
        self.release(team, r).await
    }

    async fn release_run_jobs(
        &self,
        team: &str,
        limit: Option<u32>,
        now_ms: i64,
        lease_ms: i64,
        run: &RunId,
    ) -> Result<usize, PortError> {
        let r = Release {
            limit,
            now_ms,
            lease_ms,
            run: Some(run),
            slots: &[],
        };
        self.release(team, r).await
    }

    async fn job_slots(&self, team: &str, now_ms: i64) -> Result<(u64, u64), PortError> {
        let mut pipe = redis::pipe();
        pipe.cmd("ZCOUNT")
            .arg(self.slots_key(team))
            .arg(format!("({now_ms}"))
            .arg("+inf")
            .cmd("LLEN")
            .arg(self.line_key(team));
        timed("job slots", &self.conn, |mut c| {
            let pipe = &pipe;
            async move { pipe.query_async(&mut c).await }
        })
        .await
    }

    async fn teams_waiting(&self) -> Result<Vec<String>, PortError> {
        let mut cmd = redis::cmd("SMEMBERS");
        cmd.arg(self.teams_waiting_key());
        let mut teams: Vec<String> = timed("teams waiting", &self.conn, |mut c| {
            let cmd = &cmd;
            async move { cmd.query_async(&mut c).await }
        })
        .await?;
        teams.sort();
        Ok(teams)
    }
}
