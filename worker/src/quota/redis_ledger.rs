//! The ledger in Redis, shared by every worker and coordinator of a namespace. Each decision is
//! one Lua script, so racing workers cannot both take a team's last call or both send a mark's
//! notice: admission (budgets, the provider's back-off, the team's and the fleet's sliding
//! windows, on Redis's own clock), recording (counters added; a mark crossed by this spend is
//! appended to the notices stream and the team's event list in the same script), a 429 (the
//! provider held for everyone, the fleet's rate halved), a run under way (counted against the
//! team's limit). Notices are a stream read by a consumer group: each goes to one coordinator,
//! and one a dead coordinator took is handed on after a minute.

use super::{parse_notice, Admission, Call, Delivery, Ledger, LedgerError, Rates};
use crate::redis_link::RedisLink;
use async_trait::async_trait;
use redis::{AsyncCommands, Script};
use shared::quota::{Bounds, QuotaNotice, QuotaScope, Rate, Spent, TeamLimits};
use std::time::Duration;

/// No call waits longer than this: a connect and an answer, each within the link's own
/// timeout, and a second more.
const CALL_TIMEOUT: Duration = crate::redis_link::RESPONSE_TIMEOUT
    .saturating_add(crate::redis_link::CONNECT_TIMEOUT)
    .saturating_add(Duration::from_secs(1));
const GROUP: &str = "coordinators";
/// A notice a consumer took and did not finish is handed on after this.
const CLAIM_IDLE_MS: u64 = 60_000;

const ADMIT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function over(key, field, limit)
  limit = tonumber(limit)
  if limit < 0 then return false end
  return tonumber(redis.call('HGET', key, field) or '0') >= limit
end
if over(KEYS[1], 'usd_micros', ARGV[1]) then return {1, 'daily_usd'} end
if over(KEYS[1], 'tokens', ARGV[2]) then return {1, 'daily_tokens'} end
if over(KEYS[2], 'usd_micros', ARGV[3]) then return {1, 'run_usd'} end
if over(KEYS[2], 'tokens', ARGV[4]) then return {1, 'run_tokens'} end
local until_ms = tonumber(redis.call('GET', KEYS[5]) or '0')
if until_ms > now then return {2, tostring(until_ms - now)} end
local team_n, team_ms = tonumber(ARGV[5]), tonumber(ARGV[6])
local fleet_n, fleet_ms = tonumber(ARGV[7]), tonumber(ARGV[8])
if fleet_n > 0 then
  local eff = tonumber(redis.call('GET', KEYS[6]) or ARGV[7])
  if eff < fleet_n then fleet_n = eff end
end
local function wait_of(key, n, ms)
  if n <= 0 then return 0 end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - ms)
  if redis.call('ZCARD', key) < n then return 0 end
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return math.max(1, tonumber(oldest[2]) + ms - now)
end
local w = math.max(wait_of(KEYS[3], team_n, team_ms), wait_of(KEYS[4], fleet_n, fleet_ms))
if w > 0 then return {2, tostring(w)} end
if team_n > 0 then
  redis.call('ZADD', KEYS[3], now, ARGV[9])
  redis.call('PEXPIRE', KEYS[3], team_ms)
end
if fleet_n > 0 then
  redis.call('ZADD', KEYS[4], now, ARGV[9])
  redis.call('PEXPIRE', KEYS[4], fleet_ms)
end
return {0, '0'}
"#;

const RECORD: &str = r#"
local d_usd = redis.call('HINCRBY', KEYS[1], 'usd_micros', ARGV[1])
local d_tok = redis.call('HINCRBY', KEYS[1], 'tokens', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'calls', 1)
redis.call('EXPIRE', KEYS[1], 259200)
local r_usd = redis.call('HINCRBY', KEYS[2], 'usd_micros', ARGV[1])
local r_tok = redis.call('HINCRBY', KEYS[2], 'tokens', ARGV[2])
redis.call('EXPIRE', KEYS[2], 2592000)
local n = tonumber(ARGV[10])
if n > 0 then
  local eff = redis.call('GET', KEYS[5])
  if eff then
    eff = tonumber(eff) + 1
    if eff >= n then redis.call('DEL', KEYS[5]) else redis.call('SET', KEYS[5], eff, 'PX', 600000) end
  end
end
local out = {}
if ARGV[11] ~= '1' then return out end
local function cross(scope, new, delta, limit)
  limit = tonumber(limit)
  if limit < 0 then return end
  local old = new - tonumber(delta)
  for _, pct in ipairs({80, 100}) do
    local at = math.ceil(limit * pct / 100)
    if old < at and new >= at then
      local event = 'budget_warning'
      if pct >= 100 then event = 'budget_exhausted' end
      local notice = string.format(
        '{"event":"%s","team":"%s","run":"%s","scope":"%s","percent":%d,"used":%d,"limit":%d,"at":"%s"}',
        event, ARGV[7], ARGV[8], scope, pct, new, limit, ARGV[9])
      redis.call('XADD', KEYS[3], 'MAXLEN', '~', '10000', '*', 'notice', notice)
      redis.call('LPUSH', KEYS[4], notice)
      redis.call('LTRIM', KEYS[4], 0, 499)
      table.insert(out, notice)
    end
  end
end
cross('daily_usd', d_usd, ARGV[1], ARGV[3])
cross('daily_tokens', d_tok, ARGV[2], ARGV[4])
cross('run_usd', r_usd, ARGV[1], ARGV[5])
cross('run_tokens', r_tok, ARGV[2], ARGV[6])
return out
"#;

const THROTTLED: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wait = tonumber(ARGV[1])
local until_ms = now + wait
if until_ms > tonumber(redis.call('GET', KEYS[1]) or '0') then
  redis.call('SET', KEYS[1], until_ms, 'PX', wait + 1000)
end
local n = tonumber(ARGV[2])
if n > 0 then
  local eff = tonumber(redis.call('GET', KEYS[2]) or ARGV[2])
  redis.call('SET', KEYS[2], math.max(1, math.floor(eff / 2)), 'PX', 600000)
end
return 1
"#;

const ADMIT_RUN: &str = r#"
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
local max = tonumber(ARGV[2])
if max >= 0 and redis.call('SCARD', KEYS[1]) >= max then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
return 1
"#;

pub struct RedisLedger {
    conn: RedisLink,
    ns: String,
    admit: Script,
    record: Script,
    throttled: Script,
    admit_run: Script,
    /// The operator's ceilings over every team's limits.
    ceilings: shared::ceilings::Ceilings,
}

fn backend(e: impl std::fmt::Display) -> LedgerError {
    LedgerError::Backend(e.to_string())
}

/// A limit as the scripts read it: `-1` for none.
fn limit_arg(limit: u64) -> String {
    if limit == u64::MAX {
        "-1".into()
    } else {
        limit.to_string()
    }
}

impl RedisLedger {
    pub async fn connect(url: &str, namespace: &str) -> Result<Self, LedgerError> {
        let conn = RedisLink::connect(url).await.map_err(backend)?;
        let ledger = Self {
            conn,
            ns: namespace.to_string(),
            admit: Script::new(ADMIT),
            record: Script::new(RECORD),
            throttled: Script::new(THROTTLED),
            admit_run: Script::new(ADMIT_RUN),
            ceilings: shared::ceilings::Ceilings::default(),
        };
        Ok(ledger)
    }

    /// The ledger with the operator's ceilings: every team's limits are read capped by them.
    pub fn with_ceilings(mut self, ceilings: shared::ceilings::Ceilings) -> Self {
        self.ceilings = ceilings;
        self
    }

    fn key(&self, rest: &str) -> String {
        format!("{}:quota:{rest}", self.ns)
    }

    fn team_of<'a>(call: &Call<'a>) -> &'a str {
        call.team.unwrap_or("~open")
    }

    async fn timed<T>(
        &self,
        f: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, LedgerError> {
        tokio::time::timeout(CALL_TIMEOUT, f)
            .await
            .map_err(|_| backend(format!("redis did not answer within {CALL_TIMEOUT:?}")))?
            .map_err(backend)
    }

    fn rate_args(rate: Option<Rate>) -> (u32, u64) {
        rate.map_or((0, 0), |r| (r.calls, u64::from(r.per_seconds) * 1000))
    }
}

#[async_trait]
impl Ledger for RedisLedger {
    async fn limits(&self, team: &str) -> Result<TeamLimits, LedgerError> {
        let mut c = self.conn.clone();
        let text: Option<String> = self
            .timed(c.get(self.key(&format!("limits:{team}"))))
            .await?;
        let set = match text {
            None => TeamLimits::default(),
            Some(t) => serde_json::from_str(&t).map_err(|e| LedgerError::Corrupt {
                what: format!("limits of team `{team}`"),
                why: e.to_string(),
            })?,
        };
        Ok(shared::ceilings::capped(&set, &self.ceilings.of(team)))
    }

    fn ceiling(&self, team: &str) -> TeamLimits {
        self.ceilings.of(team)
    }

    async fn set_limits(&self, team: &str, limits: &TeamLimits) -> Result<(), LedgerError> {
        let mut c = self.conn.clone();
        let text = serde_json::to_string(limits).map_err(backend)?;
        self.timed(c.set::<_, _, ()>(self.key(&format!("limits:{team}")), text))
            .await
    }

    async fn admit(
        &self,
        call: &Call<'_>,
        bounds: &Bounds,
        rates: &Rates,
    ) -> Result<Admission, LedgerError> {
        let team = Self::team_of(call);
        // A run of the open API is under no team's budget.
        let none = Bounds {
            daily: Spent {
                usd_micros: u64::MAX,
                tokens: u64::MAX,
            },
            run: Spent {
                usd_micros: u64::MAX,
                tokens: u64::MAX,
            },
        };
        let b = if call.team.is_some() { bounds } else { &none };
        let (team_n, team_ms) = Self::rate_args(rates.team);
        let (fleet_n, fleet_ms) = Self::rate_args(rates.fleet);
        let mut nonce = [0u8; 8];
        let _ = getrandom::fill(&mut nonce);
        let member = format!("{}-{:x}", call.run, u64::from_le_bytes(nonce));
        let mut invocation = self.admit.prepare_invoke();
        invocation
            .key(self.key(&format!("day:{team}:{}", call.day)))
            .key(self.key(&format!("run:{}", call.run)))
            .key(self.key(&format!("rate:{team}:{}", call.provider)))
            .key(self.key(&format!("rate:~fleet:{}", call.provider)))
            .key(self.key(&format!("backoff:{}", call.provider)))
            .key(self.key(&format!("effective:{}", call.provider)))
            .arg(limit_arg(b.daily.usd_micros))
            .arg(limit_arg(b.daily.tokens))
            .arg(limit_arg(b.run.usd_micros))
            .arg(limit_arg(b.run.tokens))
            .arg(team_n)
            .arg(team_ms)
            .arg(fleet_n)
            .arg(fleet_ms)
            .arg(member);
        let mut c = self.conn.clone();
        let (code, detail): (i64, String) = self.timed(invocation.invoke_async(&mut c)).await?;
        match code {
            0 => Ok(Admission::Go),
            1 => QuotaScope::parse(&detail)
                .map(Admission::Exhausted)
                .ok_or_else(|| backend(format!("unknown limit `{detail}`"))),
            _ => Ok(Admission::Wait(Duration::from_millis(
                detail.parse().unwrap_or(1000),
            ))),
        }
    }

    async fn record(
        &self,
        call: &Call<'_>,
        spent: Spent,
        bounds: &Bounds,
        fleet_rate: Option<Rate>,
        at: &str,
    ) -> Result<Vec<QuotaNotice>, LedgerError> {
        let team = Self::team_of(call);
        let mut invocation = self.record.prepare_invoke();
        invocation
            .key(self.key(&format!("day:{team}:{}", call.day)))
            .key(self.key(&format!("run:{}", call.run)))
            .key(self.key("notices"))
            .key(self.key(&format!("events:{team}")))
            .key(self.key(&format!("effective:{}", call.provider)))
            .arg(spent.usd_micros)
            .arg(spent.tokens)
            .arg(limit_arg(bounds.daily.usd_micros))
            .arg(limit_arg(bounds.daily.tokens))
            .arg(limit_arg(bounds.run.usd_micros))
            .arg(limit_arg(bounds.run.tokens))
            .arg(team)
            .arg(call.run)
            .arg(at)
            .arg(fleet_rate.map_or(0, |r| r.calls))
            .arg(if call.team.is_some() { "1" } else { "0" });
        let mut c = self.conn.clone();
        let notices: Vec<String> = self.timed(invocation.invoke_async(&mut c)).await?;
        notices.iter().map(|n| parse_notice(n)).collect()
    }

    async fn throttled(
        &self,
        provider: &str,
        wait: Duration,
        fleet_rate: Option<Rate>,
    ) -> Result<(), LedgerError> {
        let mut invocation = self.throttled.prepare_invoke();
        invocation
            .key(self.key(&format!("backoff:{provider}")))
            .key(self.key(&format!("effective:{provider}")))
            .arg(wait.as_millis().max(1) as u64)
            .arg(fleet_rate.map_or(0, |r| r.calls));
        let mut c = self.conn.clone();
        let _: i64 = self.timed(invocation.invoke_async(&mut c)).await?;
        Ok(())
    }

    async fn used(&self, team: &str, day: &str) -> Result<(Spent, u64), LedgerError> {
        let mut c = self.conn.clone();
        let (usd, tokens, calls): (Option<u64>, Option<u64>, Option<u64>) = self
            .timed(
                redis::cmd("HMGET")
                    .arg(self.key(&format!("day:{team}:{day}")))
                    .arg("usd_micros")
                    .arg("tokens")
                    .arg("calls")
                    .query_async(&mut c),
            )
            .await?;
        Ok((
            Spent {
                usd_micros: usd.unwrap_or(0),
                tokens: tokens.unwrap_or(0),
            },
            calls.unwrap_or(0),
        ))
    }

    async fn admit_run(
        &self,
        team: &str,
        run: &str,
        max: Option<u32>,
    ) -> Result<bool, LedgerError> {
        let mut invocation = self.admit_run.prepare_invoke();
        invocation
            .key(self.key(&format!("runs:{team}")))
            .arg(run)
            .arg(max.map_or(-1, i64::from));
        let mut c = self.conn.clone();
        let ok: i64 = self.timed(invocation.invoke_async(&mut c)).await?;
        Ok(ok == 1)
    }

    async fn run_ended(&self, team: &str, run: &str) -> Result<(), LedgerError> {
        let mut c = self.conn.clone();
        self.timed(c.srem::<_, _, ()>(self.key(&format!("runs:{team}")), run))
            .await
    }

    async fn runs_under_way(&self, team: &str) -> Result<Vec<String>, LedgerError> {
        let mut c = self.conn.clone();
        let mut runs: Vec<String> = self
            .timed(c.smembers(self.key(&format!("runs:{team}"))))
            .await?;
        runs.sort();
        Ok(runs)
    }

    async fn set_webhook(&self, team: &str, url: Option<&str>) -> Result<(), LedgerError> {
        let mut c = self.conn.clone();
        let key = self.key(&format!("webhook:{team}"));
        match url {
            Some(u) => self.timed(c.set::<_, _, ()>(key, u)).await,
            None => self.timed(c.del::<_, ()>(key)).await,
        }
    }

    async fn webhook(&self, team: &str) -> Result<Option<String>, LedgerError> {
        let mut c = self.conn.clone();
        self.timed(c.get(self.key(&format!("webhook:{team}"))))
            .await
    }

    async fn events(&self, team: &str, limit: usize) -> Result<Vec<QuotaNotice>, LedgerError> {
        let mut c = self.conn.clone();
        let end = limit.max(1) as isize - 1;
        let texts: Vec<String> = self
            .timed(c.lrange(self.key(&format!("events:{team}")), 0, end))
            .await?;
        texts.iter().map(|t| parse_notice(t)).collect()
    }

    async fn take_notices(
        &self,
        consumer: &str,
    ) -> Result<Vec<(String, QuotaNotice)>, LedgerError> {
        let stream = self.key("notices");
        let mut c = self.conn.clone();
        // The group is made once, from the stream's start (a notice appended before any
        // coordinator read is still delivered).
        let made: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&stream)
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut c)
            .await;
        if let Err(e) = made {
            if e.code() != Some("BUSYGROUP") {
                return Err(backend(e));
            }
        }
        let claimed: redis::streams::StreamAutoClaimReply = self
            .timed(
                redis::cmd("XAUTOCLAIM")
                    .arg(&stream)
                    .arg(GROUP)
                    .arg(consumer)
                    .arg(CLAIM_IDLE_MS)
                    .arg("0-0")
                    .arg("COUNT")
                    .arg(10)
                    .query_async(&mut c),
            )
            .await?;
        let mut ids = claimed.claimed;
        if ids.is_empty() {
            let opts = redis::streams::StreamReadOptions::default()
                .group(GROUP, consumer)
                .count(10);
            let read: redis::streams::StreamReadReply = self
                .timed(c.xread_options(&[&stream], &[">"], &opts))
                .await?;
            ids = read.keys.into_iter().flat_map(|k| k.ids).collect();
        }
        let mut out = Vec::new();
        for entry in ids {
            let text: Option<String> = entry.get("notice");
            match text.map(|t| parse_notice(&t)) {
                Some(Ok(n)) => out.push((entry.id, n)),
                // Unreadable: acknowledged, so it is not handed on forever.
                _ => {
                    let _: () = self.timed(c.xack(&stream, GROUP, &[&entry.id])).await?;
                }
            }
        }
        Ok(out)
    }

    async fn notice_done(&self, id: &str) -> Result<(), LedgerError> {
        let mut c = self.conn.clone();
        self.timed(c.xack::<_, _, _, ()>(self.key("notices"), GROUP, &[id]))
            .await
    }

    async fn log_delivery(&self, team: &str, entry: &Delivery) -> Result<(), LedgerError> {
        let key = self.key(&format!("deliveries:{team}"));
        let mut c = self.conn.clone();
        self.timed(
            redis::pipe()
                .lpush(&key, entry.to_string())
                .ignore()
                .ltrim(&key, 0, 199)
                .ignore()
                .query_async::<()>(&mut c),
        )
        .await
    }

    async fn deliveries(&self, team: &str, limit: usize) -> Result<Vec<Delivery>, LedgerError> {
        let mut c = self.conn.clone();
        let end = limit.max(1) as isize - 1;
        let texts: Vec<String> = self
            .timed(c.lrange(self.key(&format!("deliveries:{team}")), 0, end))
            .await?;
        Ok(texts
            .iter()
            .filter_map(|t| serde_json::from_str(t).ok())
            .collect())
    }
}
