//! Fleet-wide quotas: the ledger port every worker's LLM calls and every coordinator's
//! submissions go through, so a team's limits hold over the whole fleet, not per process.
//! `redis_ledger.rs` keeps the counters in Redis (one script per decision, so racing workers
//! cannot both take the last call); `memory.rs` keeps them in the process (embedded mode).
//! `gate.rs` is what an LLM call does with it: admitted (or waits, or is refused at 100%), its
//! spend recorded, a provider's 429 backing the whole fleet off.

mod gate;
pub mod memory;
pub mod redis_ledger;

pub use gate::{FleetGate, JobScope, Refusal};

use async_trait::async_trait;
use serde_json::Value;
use shared::quota::{Bounds, QuotaNotice, QuotaScope, Rate, Spent, TeamLimits};
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum LedgerError {
    #[error("quota ledger: {0}")]
    Backend(String),
    #[error("quota ledger: stored {what} is unreadable: {why}")]
    Corrupt { what: String, why: String },
}

/// One LLM call as the ledger sees it.
#[derive(Clone, Debug)]
pub struct Call<'a> {
    /// `None`: a run of the open API, under no team's limits (the fleet's rate still holds).
    pub team: Option<&'a str>,
    pub run: &'a str,
    pub provider: &'a str,
    /// The day (UTC) it counts on (`shared::quota::day_of`).
    pub day: &'a str,
}

/// The call-rate limits over a call: its team's for the provider, and the fleet's.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rates {
    pub team: Option<Rate>,
    pub fleet: Option<Rate>,
}

/// What the ledger says of a call about to go.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// Counted against the rates; it may go.
    Go,
    /// A rate or the provider's back-off holds it; ask again after this.
    Wait(Duration),
    /// A limit is spent: the call is refused.
    Exhausted(QuotaScope),
}

/// A delivery attempt of a team notice, as the delivery log keeps it.
pub type Delivery = Value;

#[async_trait]
pub trait Ledger: Send + Sync {
    /// The limits that hold for the team: what its admin set, capped by the operator's ceiling.
    async fn limits(&self, team: &str) -> Result<TeamLimits, LedgerError>;
    /// The operator's ceiling over the team's limits (none by default).
    fn ceiling(&self, _team: &str) -> TeamLimits {
        TeamLimits::default()
    }
    async fn set_limits(&self, team: &str, limits: &TeamLimits) -> Result<(), LedgerError>;
    /// Admits one call: refused when a budget is spent, held while a rate is full or the
    /// provider backs off, else counted against the rates.
    async fn admit(
        &self,
        call: &Call<'_>,
        bounds: &Bounds,
        rates: &Rates,
    ) -> Result<Admission, LedgerError>;
    /// Adds a call's spend to its team's day and its run; the notices of the marks it crossed
    /// (each sent once, by the one spend that crossed it). A success also lets an adaptive rate
    /// cut by 429s grow back towards `fleet_rate`.
    async fn record(
        &self,
        call: &Call<'_>,
        spent: Spent,
        bounds: &Bounds,
        fleet_rate: Option<Rate>,
        at: &str,
    ) -> Result<Vec<QuotaNotice>, LedgerError>;
    /// A provider answered 429: every worker holds its calls to it for `wait`, and the fleet's
    /// rate to it is halved (it grows back by one per successful call).
    async fn throttled(
        &self,
        provider: &str,
        wait: Duration,
        fleet_rate: Option<Rate>,
    ) -> Result<(), LedgerError>;
    /// The team's spend on `day`, and its calls.
    async fn used(&self, team: &str, day: &str) -> Result<(Spent, u64), LedgerError>;
    /// Counts a run of the team as under way, unless `max` are already: false then.
    async fn admit_run(&self, team: &str, run: &str, max: Option<u32>)
        -> Result<bool, LedgerError>;
    async fn run_ended(&self, team: &str, run: &str) -> Result<(), LedgerError>;
    async fn runs_under_way(&self, team: &str) -> Result<Vec<String>, LedgerError>;
    async fn set_webhook(&self, team: &str, url: Option<&str>) -> Result<(), LedgerError>;
    async fn webhook(&self, team: &str) -> Result<Option<String>, LedgerError>;
    /// The team's latest notices, newest first.
    async fn events(&self, team: &str, limit: usize) -> Result<Vec<QuotaNotice>, LedgerError>;
    /// Notices not yet delivered, handed to `consumer` (one coordinator each); those another
    /// consumer took and did not finish within a minute are handed on.
    async fn take_notices(&self, consumer: &str)
        -> Result<Vec<(String, QuotaNotice)>, LedgerError>;
    async fn notice_done(&self, id: &str) -> Result<(), LedgerError>;
    async fn log_delivery(&self, team: &str, entry: &Delivery) -> Result<(), LedgerError>;
    /// The team's delivery log, newest first.
    async fn deliveries(&self, team: &str, limit: usize) -> Result<Vec<Delivery>, LedgerError>;
}

/// A notice as the ledgers store it: JSON (the Redis script writes the same shape).
pub(crate) fn parse_notice(text: &str) -> Result<QuotaNotice, LedgerError> {
    serde_json::from_str(text).map_err(|e| LedgerError::Corrupt {
        what: "notice".into(),
        why: e.to_string(),
    })
}

#[cfg(test)]
mod tests;
