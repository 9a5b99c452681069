//! A team's fleet-wide quotas as pure rules: its limits (runs at once, dollars and tokens per day
//! and per run, LLM calls per window per provider), the day a spend counts on, whether a spend
//! is past a limit, and the marks a spend crosses (seed 004's budget rule made fleet-wide: a
//! warning at 80%, a stop at 100%). The counters live in Redis (`worker::quota`); the same rules
//! decide there, in its scripts, and here for the memory ledger and the API's views.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// The providers an LLM call goes to.
pub const PROVIDERS: [&str; 2] = ["anthropic", "openai"];

/// Percentages of a limit at which a notice is sent: a warning, then the stop.
pub const MARKS: [u32; 2] = [80, 100];

/// At most `calls` calls in any window of `per_seconds` (a sliding window).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    pub calls: u32,
    pub per_seconds: u32,
}

impl Rate {
    /// `N/S`: at most N calls per S seconds (`N` alone: per 60 s).
    pub fn parse(spec: &str) -> Result<Rate, String> {
        let bad = || format!("bad rate `{spec}`: write N/S, at most N calls per S seconds");
        let (calls, seconds) = match spec.trim().split_once('/') {
            Some((n, s)) => (n.trim(), s.trim()),
            None => (spec.trim(), "60"),
        };
        let rate = Rate {
            calls: calls.parse().map_err(|_| bad())?,
            per_seconds: seconds.parse().map_err(|_| bad())?,
        };
        rate.check().map_err(|_| bad())?;
        Ok(rate)
    }

    pub fn check(&self) -> Result<(), String> {
        if self.calls == 0 || self.per_seconds == 0 || self.per_seconds > 86_400 {
            return Err(format!(
                "a rate is 1 or more calls per 1 to 86400 seconds, not {}/{}",
                self.calls, self.per_seconds
            ));
        }
        Ok(())
    }
}

/// The highest `concurrent_jobs` a team may be given.
pub const MAX_CONCURRENT_JOBS: u32 = 100_000;

/// A team's limits; an absent one does not limit.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TeamLimits {
    /// Runs of the team under way at once; a submission past it is refused (429).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_runs: Option<u32>,
    /// Jobs of the team in flight at once (queued or running), over all its runs: past it, a
    /// job waits in the team's line and is published when one of the team's jobs ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_jobs: Option<u32>,
    /// Dollars of LLM calls per day (UTC), over every run of the team.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily_usd: Option<f64>,
    /// Tokens (input and output) per day (UTC), over every run of the team.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily_tokens: Option<u64>,
    /// Dollars of LLM calls of one run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_usd: Option<f64>,
    /// Tokens of one run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_tokens: Option<u64>,
    /// LLM calls per window, per provider (`anthropic`, `openai`), over the team's agents.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub llm_rate: BTreeMap<String, Rate>,
    /// Schedules the team may keep (the fleet's own cap holds as well).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedules: Option<u32>,
    /// The highest weight a batch of the team may ask for (its share of the batch slots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_weight: Option<u32>,
    /// The models the team's runs may call (none: any model with a price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
}

impl TeamLimits {
    pub fn check(&self) -> Result<(), String> {
        for (name, usd) in [("daily_usd", self.daily_usd), ("run_usd", self.run_usd)] {
            if usd.is_some_and(|u| !(u.is_finite() && u > 0.0 && u <= 1e9)) {
                return Err(format!("{name} must be above 0 and at most 1e9 dollars"));
            }
        }
        for (name, n) in [
            ("daily_tokens", self.daily_tokens),
            ("run_tokens", self.run_tokens),
        ] {
            if n.is_some_and(|n| n == 0 || n > 1 << 50) {
                return Err(format!("{name} must be above 0 and at most 2^50"));
            }
        }
        if self.concurrent_runs == Some(0) {
            return Err("concurrent_runs must be above 0".into());
        }
        if self
            .concurrent_jobs
            .is_some_and(|n| n == 0 || n > MAX_CONCURRENT_JOBS)
        {
            return Err(format!(
                "concurrent_jobs must be above 0 and at most {MAX_CONCURRENT_JOBS}"
            ));
        }
        for (provider, rate) in &self.llm_rate {
            if !PROVIDERS.contains(&provider.as_str()) {
                return Err(format!(
                    "llm_rate: unknown provider `{provider}` (anthropic or openai)"
                ));
            }
            rate.check()
                .map_err(|e| format!("llm_rate.{provider}: {e}"))?;
        }
        if self.schedules == Some(0) {
            return Err("schedules must be above 0".into());
        }
        let max_weight = crate::batch::state::MAX_WEIGHT;
        if self
            .batch_weight
            .is_some_and(|w| !(1..=max_weight).contains(&w))
        {
            return Err(format!("batch_weight must be between 1 and {max_weight}"));
        }
        if let Some(models) = &self.models {
            if models.len() > 1000 || models.iter().any(|m| m.is_empty() || m.len() > 200) {
                return Err("models: at most 1000 names of 1 to 200 characters".into());
            }
        }
        Ok(())
    }

    /// The limits in the counters' units, `None` where there is none.
    pub fn bounds(&self) -> Bounds {
        Bounds {
            daily: Spent {
                usd_micros: self.daily_usd.map_or(u64::MAX, usd_micros),
                tokens: self.daily_tokens.unwrap_or(u64::MAX),
            },
            run: Spent {
                usd_micros: self.run_usd.map_or(u64::MAX, usd_micros),
                tokens: self.run_tokens.unwrap_or(u64::MAX),
            },
        }
    }
}

/// Dollars as whole millionths (what the counters add up: exact, unlike floats).
pub fn usd_micros(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        (usd * 1e6).round().min(u64::MAX as f64) as u64
    } else {
        0
    }
}

/// The day (UTC) a spend at `now` counts on: `2026-11-23`.
pub fn day_of(now: DateTime<Utc>) -> String {
    now.format("%Y-%m-%d").to_string()
}

/// What was spent: dollars in millionths and tokens.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Spent {
    pub usd_micros: u64,
    pub tokens: u64,
}

/// Limits in the counters' units; `u64::MAX` where there is none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub daily: Spent,
    pub run: Spent,
}

/// Which limit.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum QuotaScope {
    DailyUsd,
    DailyTokens,
    RunUsd,
    RunTokens,
}

impl QuotaScope {
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaScope::DailyUsd => "daily_usd",
            QuotaScope::DailyTokens => "daily_tokens",
            QuotaScope::RunUsd => "run_usd",
            QuotaScope::RunTokens => "run_tokens",
        }
    }

    pub fn parse(text: &str) -> Option<QuotaScope> {
        [
            QuotaScope::DailyUsd,
            QuotaScope::DailyTokens,
            QuotaScope::RunUsd,
            QuotaScope::RunTokens,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// The first limit `day` or `run` has reached (a call is refused at 100%).
pub fn exhausted(bounds: &Bounds, day: Spent, run: Spent) -> Option<QuotaScope> {
    [
        (
            QuotaScope::DailyUsd,
            day.usd_micros,
            bounds.daily.usd_micros,
        ),
        (QuotaScope::DailyTokens, day.tokens, bounds.daily.tokens),
        (QuotaScope::RunUsd, run.usd_micros, bounds.run.usd_micros),
        (QuotaScope::RunTokens, run.tokens, bounds.run.tokens),
    ]
    .into_iter()
    .find(|(_, used, limit)| *limit != u64::MAX && used >= limit)
    .map(|(scope, _, _)| scope)
}

/// The marks (80, 100) a counter crossed going from `old` to `new` under `limit`: each once,
/// by the one spend that crossed it.
pub fn crossed(limit: u64, old: u64, new: u64) -> Vec<u32> {
    if limit == u64::MAX {
        return Vec::new();
    }
    let at = |pct: u32| (limit as u128 * pct as u128).div_ceil(100);
    MARKS
        .into_iter()
        .filter(|pct| (old as u128) < at(*pct) && (new as u128) >= at(*pct))
        .collect()
}

/// A notice of a mark crossed: the team's event and webhook.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct QuotaNotice {
    /// `budget_warning` (80%) or `budget_exhausted` (100%).
    pub event: String,
    pub team: String,
    /// The run whose call crossed it.
    pub run: String,
    pub scope: QuotaScope,
    pub percent: u32,
    /// In the counter's units: micro-dollars or tokens.
    pub used: u64,
    pub limit: u64,
    pub at: String,
}

impl QuotaNotice {
    pub fn event_of(percent: u32) -> &'static str {
        if percent >= 100 {
            "budget_exhausted"
        } else {
            "budget_warning"
        }
    }
}

/// A team's quotas and what it used today, for `GET /v1/team` and `fleet team`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct TeamView {
    pub team: String,
    pub limits: TeamLimits,
    pub day: String,
    pub used_today: Spent,
    pub llm_calls_today: u64,
    pub runs_under_way: u64,
    /// Jobs holding one of the team's slots (queued or running), counted while it has a
    /// `concurrent_jobs` limit or jobs still hold slots from one.
    #[serde(default)]
    pub jobs_in_flight: u64,
    /// Jobs waiting in the team's line for a slot.
    #[serde(default)]
    pub jobs_waiting: u64,
    /// The team's webhook for its notices (budget marks; the runs that name none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
}

impl crate::messages::JobEnvelope {
    /// The slot this attempt holds against its team's `concurrent_jobs`.
    pub fn slot(&self) -> String {
        slot_of(&self.job_id, self.attempt)
    }
}

/// The slot an attempt of a job holds against its team's `concurrent_jobs`: `<job>.a<attempt>`
/// (a job id starts with its run's id and a dot, so a run's slots share that prefix).
pub fn slot_of(job: &crate::ids::JobId, attempt: crate::ids::Attempt) -> String {
    format!("{job}.a{attempt}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_limits_are_checked() {
        assert_eq!(
            Rate::parse("3/4").unwrap(),
            Rate {
                calls: 3,
                per_seconds: 4
            }
        );
        assert_eq!(Rate::parse("60").unwrap().per_seconds, 60);
        for bad in ["0/1", "1/0", "x", "1/99999", "-1/2"] {
            assert!(Rate::parse(bad).is_err(), "{bad}");
        }
        let mut l = TeamLimits {
            daily_usd: Some(1.5),
            ..TeamLimits::default()
        };
        assert!(l.check().is_ok());
        l.daily_usd = Some(f64::NAN);
        assert!(l.check().is_err());
        l.daily_usd = None;
        l.llm_rate
            .insert("gemini".into(), Rate::parse("1").unwrap());
        assert!(l.check().unwrap_err().contains("unknown provider"));
        let bad: Result<TeamLimits, _> = serde_json::from_str(r#"{"daily_usd": 1, "x": 2}"#);
        assert!(bad.is_err(), "unknown fields are refused");
    }

    #[test]
    fn a_spend_is_stopped_at_its_limit_and_marks_are_crossed_once() {
        let limits = TeamLimits {
            daily_usd: Some(1.0),
            run_tokens: Some(100),
            ..TeamLimits::default()
        };
        let b = limits.bounds();
        let spent = |usd: f64, tokens| Spent {
            usd_micros: usd_micros(usd),
            tokens,
        };
        assert_eq!(exhausted(&b, spent(0.99, 10_000), spent(0.0, 99)), None);
        assert_eq!(
            exhausted(&b, spent(1.0, 0), spent(0.0, 0)),
            Some(QuotaScope::DailyUsd)
        );
        assert_eq!(
            exhausted(&b, spent(0.1, 0), spent(0.0, 100)),
            Some(QuotaScope::RunTokens)
        );
        let limit = usd_micros(1.0);
        assert_eq!(crossed(limit, 0, usd_micros(0.5)), Vec::<u32>::new());
        assert_eq!(crossed(limit, usd_micros(0.5), usd_micros(0.8)), vec![80]);
        assert_eq!(
            crossed(limit, usd_micros(0.8), usd_micros(0.9)),
            Vec::<u32>::new()
        );
        assert_eq!(crossed(limit, 0, usd_micros(2.0)), vec![80, 100]);
        assert_eq!(crossed(u64::MAX, 0, u64::MAX - 1), Vec::<u32>::new());
        assert_eq!(usd_micros(-1.0), 0);
        assert_eq!(usd_micros(f64::NAN), 0);
    }
}
