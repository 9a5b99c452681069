//! The run's budget in the engine: after each result the run's spending is held against its
//! limit (a warning at 80%, a pause at 100%: jobs the run would start are held in its state,
//! jobs in flight finish); a person setting a higher limit resumes it, publishing what was
//! held. Each mark is an event of the run's log and, when the run has a webhook, a notice.

use super::events::{Effect, RunNotice};
use super::step::Engine;
use crate::tracking::budget::BudgetMarkKind;
use crate::tracking::{EventType, RunBudget, RunEvent};
use serde_json::{json, Value};

impl Engine<'_> {
    /// Records the budget marks the run's spending crossed.
    pub(super) fn observe_budget(&mut self) {
        let spent = self.state.usage.cost_usd;
        let Some(budget) = self.state.budget.as_mut() else {
            return;
        };
        let crossed = budget.observe(spent, self.at);
        let limit = budget.limit_usd;
        for mark in crossed {
            let kind = match mark {
                BudgetMarkKind::Exhausted => EventType::BudgetExhausted,
                _ => EventType::BudgetWarning,
            };
            self.notify(
                kind,
                "budget",
                json!({"spent_usd": spent, "limit_usd": limit}),
            );
        }
    }

    /// A person sets the run's limit (checked before: `budget_refusal`); a paused run resumes.
    pub(super) fn set_budget(&mut self, limit_usd: f64, by: &str) {
        let spent = self.state.usage.cost_usd;
        let at = self.at;
        let budget = self.state.budget.get_or_insert(RunBudget {
            limit_usd,
            paused: false,
            marks: Vec::new(),
        });
        // Checked before the event was applied (`budget_refusal`): a refusal changes nothing.
        if budget.raise(limit_usd, spent, by, at).is_err() {
            return;
        }
        self.notify(
            EventType::Resumed,
            "budget",
            json!({"spent_usd": spent, "limit_usd": limit_usd, "by": by}),
        );
        if self.state.budget.as_ref().is_some_and(|b| b.paused) {
            return;
        }
        for mut spec in std::mem::take(&mut self.state.held) {
            if let Some(r) = self.state.jobs.get_mut(&spec.job_id) {
                r.published_at = at;
            }
            // What the budget has left is read again: the spec was made before the raise.
            if spec.llm_usd_left.is_some() {
                spec.llm_usd_left = Some((limit_usd - spent).max(0.0));
            }
            self.fx.push(Effect::Publish(Box::new(spec)));
        }
    }
}

/// Why a new limit is refused (none: it may be set): the run ended, or the limit is not
/// positive dollars above what the run spent.
pub fn budget_refusal(state: &super::RunState, limit_usd: f64) -> Option<String> {
    if state.status.is_terminal() {
        return Some("the run has ended".into());
    }
    let spent = state.usage.cost_usd;
    crate::tracking::budget::check_limit(limit_usd)
        .and_then(|l| {
            if l > spent {
                Ok(())
            } else {
                Err(crate::tracking::budget::BudgetError::NotAboveSpent { new: l, spent })
            }
        })
        .err()
        .map(|e| e.to_string())
}

impl Engine<'_> {
    /// A notice for the run's webhook, when it has one.
    pub(super) fn notify(&mut self, event_type: EventType, node: &str, data: Value) {
        let Some(url) = self.state.webhook.clone() else {
            return;
        };
        let event = RunEvent {
            timestamp: self.at,
            session_id: String::new(),
            agent_type: node.to_string(),
            event_type,
            data,
        };
        let body = serde_json::to_string(&event).unwrap_or_default();
        let delivery = format!(
            "{}-{}",
            self.state.run_id,
            &crate::hashing::sha256_hex(body.as_bytes())[..16]
        );
        self.fx.push(Effect::Notify(Box::new(RunNotice {
            run_id: self.state.run_id.clone(),
            team: self.state.team.clone(),
            url,
            delivery,
            event,
        })));
    }
}
