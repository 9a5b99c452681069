//! A run's budget in dollars (seed 004's `check_budget`): crossing 80% records a warning once
//! per limit, reaching 100% pauses the run (jobs it would start are held, jobs in flight
//! finish), and a person raises the limit to resume it. Kept in the run state, so a paused
//! run is intact: nothing is lost, nothing is redone.

use super::events::{EventType, RunEvent};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The share of the limit at which the warning is recorded.
pub const WARN_AT: f64 = 0.8;

/// Where spending stands against the limit.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BudgetLevel {
    Ok,
    Warning,
    Exhausted,
}

/// What happened to the budget, in order.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct BudgetMark {
    pub at: DateTime<Utc>,
    pub level: BudgetMarkKind,
    /// Dollars spent when it happened.
    pub spent_usd: f64,
    /// The limit then (after the raise, for a raise).
    pub limit_usd: f64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub by: String,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BudgetMarkKind {
    Warning,
    Exhausted,
    Raised,
}

/// The run's limit and its marks.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct RunBudget {
    pub limit_usd: f64,
    /// The run is paused on its budget: jobs it would start are held until a raise.
    #[serde(default)]
    pub paused: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub marks: Vec<BudgetMark>,
}

/// Why a budget or a raise is refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BudgetError {
    #[error("a budget is a positive, finite number of dollars (got {0})")]
    NotPositive(f64),
    #[error("the new budget (${new:.4}) must be above what the run spent (${spent:.4})")]
    NotAboveSpent { new: f64, spent: f64 },
}

/// Checks a limit given by a person.
pub fn check_limit(usd: f64) -> Result<f64, BudgetError> {
    if usd.is_finite() && usd > 0.0 {
        Ok(usd)
    } else {
        Err(BudgetError::NotPositive(usd))
    }
}

impl RunBudget {
    pub fn new(limit_usd: f64) -> Result<RunBudget, BudgetError> {
        Ok(RunBudget {
            limit_usd: check_limit(limit_usd)?,
            paused: false,
            marks: Vec::new(),
        })
    }

    pub fn level(&self, spent: f64) -> BudgetLevel {
        if spent >= self.limit_usd {
            BudgetLevel::Exhausted
        } else if spent >= self.limit_usd * WARN_AT {
            BudgetLevel::Warning
        } else {
            BudgetLevel::Ok
        }
    }

    /// Whether a warning was recorded since the limit was last set.
    fn warned(&self) -> bool {
        self.marks
            .iter()
            .rev()
            .take_while(|m| m.level != BudgetMarkKind::Raised)
            .any(|m| m.level == BudgetMarkKind::Warning)
    }

    /// After the run's spending grew to `spent`: the marks it crosses for the first time
    /// under this limit (a warning, then the pause), recorded and returned.
    pub fn observe(&mut self, spent: f64, at: DateTime<Utc>) -> Vec<BudgetMarkKind> {
        let mut crossed = Vec::new();
        let level = self.level(spent);
        if level != BudgetLevel::Ok && !self.warned() {
            crossed.push(BudgetMarkKind::Warning);
        }
        if level == BudgetLevel::Exhausted && !self.paused {
            self.paused = true;
            crossed.push(BudgetMarkKind::Exhausted);
        }
        for &level in &crossed {
            self.marks.push(BudgetMark {
                at,
                level,
                spent_usd: spent,
                limit_usd: self.limit_usd,
                by: String::new(),
            });
        }
        crossed
    }

    /// A person sets a new limit above what was spent: the pause ends, and the warning can be
    /// recorded again under the new limit.
    pub fn raise(
        &mut self,
        new_limit: f64,
        spent: f64,
        by: &str,
        at: DateTime<Utc>,
    ) -> Result<(), BudgetError> {
        let new = check_limit(new_limit)?;
        if new <= spent {
            return Err(BudgetError::NotAboveSpent { new, spent });
        }
        self.limit_usd = new;
        self.paused = false;
        self.marks.push(BudgetMark {
            at,
            level: BudgetMarkKind::Raised,
            spent_usd: spent,
            limit_usd: new,
            by: by.to_string(),
        });
        // Already past 80% of the new limit: warned again at once.
        self.observe(spent, at);
        Ok(())
    }

    /// The marks as lines of the run's event log.
    pub fn events(&self) -> Vec<RunEvent> {
        self.marks
            .iter()
            .map(|m| RunEvent {
                timestamp: m.at,
                session_id: String::new(),
                agent_type: "budget".into(),
                event_type: match m.level {
                    BudgetMarkKind::Warning => EventType::BudgetWarning,
                    BudgetMarkKind::Exhausted => EventType::BudgetExhausted,
                    BudgetMarkKind::Raised => EventType::Resumed,
                },
                data: json!({"spent_usd": m.spent_usd, "limit_usd": m.limit_usd, "by": m.by}),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap()
    }

    #[test]
    fn the_warning_comes_once_at_80_percent_and_the_pause_at_100() {
        let mut b = RunBudget::new(1.0).unwrap();
        assert!(b.observe(0.5, t(1)).is_empty());
        assert_eq!(b.observe(0.8, t(2)), vec![BudgetMarkKind::Warning]);
        assert!(b.observe(0.9, t(3)).is_empty(), "warned once");
        assert!(!b.paused);
        assert_eq!(b.observe(1.0, t(4)), vec![BudgetMarkKind::Exhausted]);
        assert!(b.paused);
        assert!(b.observe(1.2, t(5)).is_empty(), "paused once");
    }

    #[test]
    fn one_jump_past_the_limit_records_both_marks() {
        let mut b = RunBudget::new(1.0).unwrap();
        assert_eq!(
            b.observe(3.0, t(1)),
            vec![BudgetMarkKind::Warning, BudgetMarkKind::Exhausted]
        );
        assert_eq!(b.level(3.0), BudgetLevel::Exhausted);
    }

    #[test]
    fn a_raise_must_exceed_what_was_spent_and_ends_the_pause() {
        let mut b = RunBudget::new(1.0).unwrap();
        b.observe(1.1, t(1));
        assert_eq!(
            b.raise(1.1, 1.1, "ana", t(2)),
            Err(BudgetError::NotAboveSpent {
                new: 1.1,
                spent: 1.1
            })
        );
        assert!(b.paused, "a refused raise changes nothing");
        assert!(matches!(
            b.raise(f64::NAN, 1.1, "ana", t(2)),
            Err(BudgetError::NotPositive(_))
        ));
        b.raise(2.0, 1.1, "ana", t(3)).unwrap();
        assert!(!b.paused);
        assert_eq!(b.limit_usd, 2.0);
        // 1.1 of 2.0 is under 80%: the warning is armed again for the new limit.
        assert_eq!(b.observe(1.7, t(4)), vec![BudgetMarkKind::Warning]);
        let kinds: Vec<EventType> = b.events().iter().map(|e| e.event_type).collect();
        assert_eq!(
            kinds,
            [
                EventType::BudgetWarning,
                EventType::BudgetExhausted,
                EventType::Resumed,
                EventType::BudgetWarning
            ]
        );
    }

    #[test]
    fn limits_that_are_not_positive_dollars_are_refused() {
        for bad in [0.0, -1.0, f64::INFINITY, f64::NAN] {
            assert!(RunBudget::new(bad).is_err(), "{bad}");
        }
    }
}
