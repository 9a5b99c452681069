//! The operator's ceilings over teams' limits (`FLEET_TEAM_CEILINGS`), as pure rules: per team,
//! and `*` for every team without its own. A team starts at its ceilings; its admin may lower a
//! limit, never raise one above its ceiling, and a limit left out is the ceiling, not "none".

use crate::quota::{Rate, TeamLimits};
use std::collections::BTreeMap;

/// The entry of every team without one of its own.
pub const ANY_TEAM: &str = "*";

/// The operator's ceilings, by team name (or [`ANY_TEAM`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ceilings(BTreeMap<String, TeamLimits>);

impl Ceilings {
    /// `{"*": {...limits}, "team-a": {...limits}}`; empty text: no ceilings.
    pub fn parse(text: &str) -> Result<Ceilings, String> {
        if text.trim().is_empty() {
            return Ok(Ceilings::default());
        }
        let map: BTreeMap<String, TeamLimits> =
            serde_json::from_str(text).map_err(|e| format!("team ceilings: {e}"))?;
        for (team, limits) in &map {
            if team != ANY_TEAM {
                crate::auth::check_team(team).map_err(|e| format!("team ceilings: {e}"))?;
            }
            limits
                .check()
                .map_err(|e| format!("team ceilings of `{team}`: {e}"))?;
        }
        Ok(Ceilings(map))
    }

    /// The ceilings of `team`: its own entry, else the one for every team, else none.
    pub fn of(&self, team: &str) -> TeamLimits {
        self.0
            .get(team)
            .or_else(|| self.0.get(ANY_TEAM))
            .cloned()
            .unwrap_or_default()
    }
}

/// A rate's calls per second, compared without rounding: `a` allows more than `b`.
fn faster(a: &Rate, b: &Rate) -> bool {
    u64::from(a.calls) * u64::from(b.per_seconds) > u64::from(b.calls) * u64::from(a.per_seconds)
}

fn lower<T: PartialOrd + Copy>(set: Option<T>, ceiling: Option<T>) -> Option<T> {
    match (set, ceiling) {
        (Some(s), Some(c)) => Some(if s < c { s } else { c }),
        (s, None) => s,
        (None, c) => c,
    }
}

/// The limits that hold for a team: each the lower of what its admin set and its ceiling
/// (one left out is the ceiling); its models those of both lists.
pub fn capped(set: &TeamLimits, ceiling: &TeamLimits) -> TeamLimits {
    let mut llm_rate = set.llm_rate.clone();
    for (provider, c) in &ceiling.llm_rate {
        match llm_rate.get(provider) {
            Some(s) if !faster(s, c) => {}
            _ => {
                llm_rate.insert(provider.clone(), *c);
            }
        }
    }
    let models = match (&set.models, &ceiling.models) {
        (Some(s), Some(c)) => Some(s.iter().filter(|m| c.contains(m)).cloned().collect()),
        (s, None) => s.clone(),
        (None, c) => c.clone(),
    };
    TeamLimits {
        concurrent_runs: lower(set.concurrent_runs, ceiling.concurrent_runs),
        concurrent_jobs: lower(set.concurrent_jobs, ceiling.concurrent_jobs),
        daily_usd: lower(set.daily_usd, ceiling.daily_usd),
        daily_tokens: lower(set.daily_tokens, ceiling.daily_tokens),
        run_usd: lower(set.run_usd, ceiling.run_usd),
        run_tokens: lower(set.run_tokens, ceiling.run_tokens),
        schedules: lower(set.schedules, ceiling.schedules),
        batch_weight: lower(set.batch_weight, ceiling.batch_weight),
        llm_rate,
        models,
    }
}

/// Why limits a team's admin sets go above its ceiling: each limit named with both values.
pub fn above(set: &TeamLimits, ceiling: &TeamLimits) -> Vec<String> {
    let mut why = Vec::new();
    let mut over = |name: &str, s: Option<f64>, c: Option<f64>| {
        if let (Some(s), Some(c)) = (s, c) {
            if s > c {
                why.push(format!("{name} {s} is above the operator's ceiling of {c}"));
            }
        }
    };
    let f = |n: Option<u64>| n.map(|n| n as f64);
    over(
        "concurrent_runs",
        f(set.concurrent_runs.map(u64::from)),
        f(ceiling.concurrent_runs.map(u64::from)),
    );
    over(
        "concurrent_jobs",
        f(set.concurrent_jobs.map(u64::from)),
        f(ceiling.concurrent_jobs.map(u64::from)),
    );
    over(
        "schedules",
        f(set.schedules.map(u64::from)),
        f(ceiling.schedules.map(u64::from)),
    );
    over(
        "batch_weight",
        f(set.batch_weight.map(u64::from)),
        f(ceiling.batch_weight.map(u64::from)),
    );
    over("daily_usd", set.daily_usd, ceiling.daily_usd);
    over("daily_tokens", f(set.daily_tokens), f(ceiling.daily_tokens));
    over("run_usd", set.run_usd, ceiling.run_usd);
    over("run_tokens", f(set.run_tokens), f(ceiling.run_tokens));
    for (provider, s) in &set.llm_rate {
        if let Some(c) = ceiling.llm_rate.get(provider) {
            if faster(s, c) {
                why.push(format!(
                    "llm_rate.{provider} {}/{} is above the operator's ceiling of {}/{}",
                    s.calls, s.per_seconds, c.calls, c.per_seconds
                ));
            }
        }
    }
    if let (Some(s), Some(c)) = (&set.models, &ceiling.models) {
        for m in s.iter().filter(|m| !c.contains(m)) {
            why.push(format!(
                "model `{m}` is not in the operator's ceiling's models"
            ));
        }
    }
    why
}

/// Why `model` may not be called by a team with `limits` (its allow-list), if so.
pub fn model_refused(limits: &TeamLimits, team: &str, model: &str) -> Option<String> {
    let models = limits.models.as_ref()?;
    (!models.iter().any(|m| m == model)).then(|| {
        format!(
            "model `{model}` is not allowed for team `{team}` (its models: {})",
            models.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(json: &str) -> TeamLimits {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_team_starts_at_its_ceilings_and_cannot_raise_them() {
        let c = Ceilings::parse(
            r#"{"*": {"daily_usd": 5, "concurrent_runs": 2, "models": ["a"],
                      "llm_rate": {"openai": {"calls": 10, "per_seconds": 60}}},
                "big": {"daily_usd": 50}}"#,
        )
        .unwrap();
        let any = c.of("new-team");
        assert_eq!(capped(&TeamLimits::default(), &any), any);
        assert_eq!(c.of("big").daily_usd, Some(50.0));
        let raise = limits(
            r#"{"daily_usd": 6, "concurrent_runs": 1, "models": ["a", "b"],
                "llm_rate": {"openai": {"calls": 2, "per_seconds": 1}}}"#,
        );
        let why = above(&raise, &any);
        assert_eq!(why.len(), 3, "{why:?}");
        assert!(why.iter().all(|w| w.contains("ceiling")), "{why:?}");
        let held = capped(&raise, &any);
        assert_eq!(held.daily_usd, Some(5.0));
        assert_eq!(held.concurrent_runs, Some(1), "a lower limit stays");
        assert_eq!(held.models, Some(vec!["a".to_string()]));
        assert_eq!(held.llm_rate["openai"].calls, 10);
        assert!(above(&limits(r#"{"daily_usd": 1}"#), &any).is_empty());
        assert!(model_refused(&held, "t", "b").unwrap().contains("`b`"));
        assert!(model_refused(&held, "t", "a").is_none());
        assert!(model_refused(&TeamLimits::default(), "t", "b").is_none());
    }

    #[test]
    fn bad_ceilings_are_refused() {
        assert_eq!(Ceilings::parse("").unwrap(), Ceilings::default());
        for bad in [
            "[]",
            r#"{"Team A": {}}"#,
            r#"{"*": {"daily_usd": -1}}"#,
            r#"{"*": {"x": 1}}"#,
        ] {
            assert!(Ceilings::parse(bad).is_err(), "{bad}");
        }
    }
}
