//! The ledger in one process (the embedded mode, and the gate's unit tests): the same rules
//! as the Redis scripts (`shared::quota`), under one lock.

use super::{Admission, Call, Delivery, Ledger, LedgerError, Rates};
use async_trait::async_trait;
use shared::quota::{crossed, exhausted, Bounds, QuotaNotice, QuotaScope, Rate, Spent, TeamLimits};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Default)]
struct Books {
    limits: HashMap<String, TeamLimits>,
    days: HashMap<(String, String), (Spent, u64)>,
    runs: HashMap<String, Spent>,
    /// Calls admitted per rate key (team and provider, or the fleet and provider).
    windows: HashMap<String, VecDeque<Instant>>,
    backoff: HashMap<String, Instant>,
    effective: HashMap<String, u32>,
    under_way: HashMap<String, BTreeSet<String>>,
    webhooks: HashMap<String, String>,
    events: HashMap<String, VecDeque<QuotaNotice>>,
    pending: BTreeMap<u64, QuotaNotice>,
    next_notice: u64,
    deliveries: HashMap<String, VecDeque<Delivery>>,
}

#[derive(Default)]
pub struct MemoryLedger {
    books: Mutex<Books>,
}

impl MemoryLedger {
    pub fn new() -> Self {
        Self::default()
    }
}

/// How long until `window` has room for one more call under `rate` (zero: now).
fn wait_in(window: &mut VecDeque<Instant>, calls: u32, per: Duration, now: Instant) -> Duration {
    while window
        .front()
        .is_some_and(|t| now.duration_since(*t) >= per)
    {
        window.pop_front();
    }
    if window.len() < calls as usize {
        return Duration::ZERO;
    }
    window
        .front()
        .map_or(Duration::ZERO, |t| per - now.duration_since(*t))
}

fn push_front<T>(list: &mut VecDeque<T>, item: T, cap: usize) {
    list.push_front(item);
    list.truncate(cap);
}

#[async_trait]
impl Ledger for MemoryLedger {
    async fn limits(&self, team: &str) -> Result<TeamLimits, LedgerError> {
        let b = self.books.lock().expect("books");
        Ok(b.limits.get(team).cloned().unwrap_or_default())
    }

    async fn set_limits(&self, team: &str, limits: &TeamLimits) -> Result<(), LedgerError> {
        let mut b = self.books.lock().expect("books");
        b.limits.insert(team.to_string(), limits.clone());
        Ok(())
    }

    async fn admit(
        &self,
        call: &Call<'_>,
        bounds: &Bounds,
        rates: &Rates,
    ) -> Result<Admission, LedgerError> {
        let mut b = self.books.lock().expect("books");
        let team = call.team.unwrap_or("~open");
        let day = b
            .days
            .get(&(team.to_string(), call.day.to_string()))
            .map(|d| d.0)
            .unwrap_or_default();
        let run = b.runs.get(call.run).copied().unwrap_or_default();
        if call.team.is_some() {
            if let Some(scope) = exhausted(bounds, day, run) {
                return Ok(Admission::Exhausted(scope));
            }
        }
        let now = Instant::now();
        if let Some(until) = b.backoff.get(call.provider) {
            if *until > now {
                return Ok(Admission::Wait(*until - now));
            }
        }
        let fleet = rates.fleet.map(|r| Rate {
            calls: b
                .effective
                .get(call.provider)
                .map_or(r.calls, |e| (*e).min(r.calls)),
            ..r
        });
        let keys = [
            (format!("{team}:{}", call.provider), rates.team),
            (format!("~fleet:{}", call.provider), fleet),
        ];
        let mut wait = Duration::ZERO;
        for (key, rate) in &keys {
            if let Some(r) = rate {
                let window = b.windows.entry(key.clone()).or_default();
                let per = Duration::from_secs(u64::from(r.per_seconds));
                wait = wait.max(wait_in(window, r.calls, per, now));
            }
        }
        if !wait.is_zero() {
            return Ok(Admission::Wait(wait));
        }
        for (key, rate) in keys {
            if rate.is_some() {
                b.windows.entry(key).or_default().push_back(now);
            }
        }
        Ok(Admission::Go)
    }

    async fn record(
        &self,
        call: &Call<'_>,
        spent: Spent,
        bounds: &Bounds,
        fleet_rate: Option<Rate>,
        at: &str,
    ) -> Result<Vec<QuotaNotice>, LedgerError> {
        let mut b = self.books.lock().expect("books");
        let team = call.team.unwrap_or("~open").to_string();
        let day = b
            .days
            .entry((team.clone(), call.day.to_string()))
            .or_default();
        let old_day = day.0;
        day.0.usd_micros = day.0.usd_micros.saturating_add(spent.usd_micros);
        day.0.tokens = day.0.tokens.saturating_add(spent.tokens);
        day.1 += 1;
        let new_day = day.0;
        let run = b.runs.entry(call.run.to_string()).or_default();
        let old_run = *run;
        run.usd_micros = run.usd_micros.saturating_add(spent.usd_micros);
        run.tokens = run.tokens.saturating_add(spent.tokens);
        let new_run = *run;
        if let (Some(r), Some(e)) = (fleet_rate, b.effective.get(call.provider).copied()) {
            if e + 1 >= r.calls {
                b.effective.remove(call.provider);
            } else {
                b.effective.insert(call.provider.to_string(), e + 1);
            }
        }
        let mut notices = Vec::new();
        if call.team.is_none() {
            return Ok(notices);
        }
        for (scope, limit, old, new) in [
            (
                QuotaScope::DailyUsd,
                bounds.daily.usd_micros,
                old_day.usd_micros,
                new_day.usd_micros,
            ),
            (
                QuotaScope::DailyTokens,
                bounds.daily.tokens,
                old_day.tokens,
                new_day.tokens,
            ),
            (
                QuotaScope::RunUsd,
                bounds.run.usd_micros,
                old_run.usd_micros,
                new_run.usd_micros,
            ),
            (
                QuotaScope::RunTokens,
                bounds.run.tokens,
                old_run.tokens,
                new_run.tokens,
            ),
        ] {
            for percent in crossed(limit, old, new) {
                notices.push(QuotaNotice {
                    event: QuotaNotice::event_of(percent).into(),
                    team: team.clone(),
                    run: call.run.to_string(),
                    scope,
                    percent,
                    used: new,
                    limit,
                    at: at.to_string(),
                });
            }
        }
        for n in &notices {
            push_front(b.events.entry(team.clone()).or_default(), n.clone(), 500);
            b.next_notice += 1;
            let id = b.next_notice;
            b.pending.insert(id, n.clone());
        }
        Ok(notices)
    }

    async fn throttled(
        &self,
        provider: &str,
        wait: Duration,
        fleet_rate: Option<Rate>,
    ) -> Result<(), LedgerError> {
        let mut b = self.books.lock().expect("books");
        let until = Instant::now() + wait;
        let entry = b.backoff.entry(provider.to_string()).or_insert(until);
        *entry = (*entry).max(until);
        if let Some(r) = fleet_rate {
            let now = b.effective.get(provider).copied().unwrap_or(r.calls);
            b.effective.insert(provider.to_string(), (now / 2).max(1));
        }
        Ok(())
    }

    async fn used(&self, team: &str, day: &str) -> Result<(Spent, u64), LedgerError> {
        let b = self.books.lock().expect("books");
        Ok(b.days
            .get(&(team.to_string(), day.to_string()))
            .copied()
            .unwrap_or_default())
    }

    async fn admit_run(
        &self,
        team: &str,
        run: &str,
        max: Option<u32>,
    ) -> Result<bool, LedgerError> {
        let mut b = self.books.lock().expect("books");
        let set = b.under_way.entry(team.to_string()).or_default();
        if set.contains(run) {
            return Ok(true);
        }
        if max.is_some_and(|m| set.len() >= m as usize) {
            return Ok(false);
        }
        set.insert(run.to_string());
        Ok(true)
    }

    async fn run_ended(&self, team: &str, run: &str) -> Result<(), LedgerError> {
        let mut b = self.books.lock().expect("books");
        if let Some(set) = b.under_way.get_mut(team) {
            set.remove(run);
        }
        Ok(())
    }

    async fn runs_under_way(&self, team: &str) -> Result<Vec<String>, LedgerError> {
        let b = self.books.lock().expect("books");
        Ok(b.under_way
            .get(team)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default())
    }

    async fn set_webhook(&self, team: &str, url: Option<&str>) -> Result<(), LedgerError> {
        let mut b = self.books.lock().expect("books");
        match url {
            Some(u) => b.webhooks.insert(team.to_string(), u.to_string()),
            None => b.webhooks.remove(team),
        };
        Ok(())
    }

    async fn webhook(&self, team: &str) -> Result<Option<String>, LedgerError> {
        Ok(self
            .books
            .lock()
            .expect("books")
            .webhooks
            .get(team)
            .cloned())
    }

    async fn events(&self, team: &str, limit: usize) -> Result<Vec<QuotaNotice>, LedgerError> {
        let b = self.books.lock().expect("books");
        Ok(b.events
            .get(team)
            .map(|e| e.iter().take(limit).cloned().collect())
            .unwrap_or_default())
    }

    async fn take_notices(
        &self,
        _consumer: &str,
    ) -> Result<Vec<(String, QuotaNotice)>, LedgerError> {
        let b = self.books.lock().expect("books");
        Ok(b.pending
            .iter()
            .take(10)
            .map(|(id, n)| (id.to_string(), n.clone()))
            .collect())
    }

    async fn notice_done(&self, id: &str) -> Result<(), LedgerError> {
        let mut b = self.books.lock().expect("books");
        if let Ok(id) = id.parse::<u64>() {
            b.pending.remove(&id);
        }
        Ok(())
    }

    async fn log_delivery(&self, team: &str, entry: &Delivery) -> Result<(), LedgerError> {
        let mut b = self.books.lock().expect("books");
        push_front(
            b.deliveries.entry(team.to_string()).or_default(),
            entry.clone(),
            200,
        );
        Ok(())
    }

    async fn deliveries(&self, team: &str, limit: usize) -> Result<Vec<Delivery>, LedgerError> {
        let b = self.books.lock().expect("books");
        Ok(b.deliveries
            .get(team)
            .map(|d| d.iter().take(limit).cloned().collect())
            .unwrap_or_default())
    }
}
