//! What one LLM call does under the fleet's quotas: before it goes, the ledger admits it (or
//! holds it while a rate is full or its provider backs off, or refuses it once a team's budget
//! is spent: `budget_exhausted`); after a reply, its spend is recorded (the tokens the provider
//! reported, priced by the worker); a 429 backs the whole fleet off that provider.

use super::{Admission, Call, Ledger, LedgerError, Rates};
use shared::quota::{day_of, usd_micros, Rate, Spent, TeamLimits};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How long a team's limits are taken from a worker's cache before they are read again.
const LIMITS_TTL: Duration = Duration::from_secs(2);
/// The longest a held call sleeps before it asks the ledger again.
const MAX_HOLD: Duration = Duration::from_secs(2);

/// The job an LLM call is made for: its run and the run's team.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobScope {
    pub team: Option<String>,
    pub run: String,
}

/// A worker's way to the fleet's ledger, and the fleet's call rate per provider
/// (`FLEET_LLM_RATE`, shared by every worker through the ledger).
#[derive(Clone)]
pub struct FleetGate {
    ledger: Arc<dyn Ledger>,
    fleet_rate: Option<Rate>,
    limits: Arc<Mutex<HashMap<String, (Instant, TeamLimits)>>>,
}

impl std::fmt::Debug for FleetGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FleetGate(fleet rate {:?})", self.fleet_rate)
    }
}

/// Why a call may not go.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A team's budget is spent (the seed's stop at 100%).
    #[error("budget_exhausted: the team's {0} limit is spent")]
    Exhausted(&'static str),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl FleetGate {
    pub fn new(ledger: Arc<dyn Ledger>, fleet_rate: Option<Rate>) -> Self {
        Self {
            ledger,
            fleet_rate,
            limits: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    pub fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.ledger
    }

    async fn limits_of(&self, team: Option<&str>) -> Result<TeamLimits, LedgerError> {
        let Some(team) = team else {
            return Ok(TeamLimits::default());
        };
        if let Some((at, l)) = self.limits.lock().expect("limits").get(team) {
            if at.elapsed() < LIMITS_TTL {
                return Ok(l.clone());
            }
        }
        let fresh = self.ledger.limits(team).await?;
        self.limits
            .lock()
            .expect("limits")
            .insert(team.to_string(), (Instant::now(), fresh.clone()));
        Ok(fresh)
    }

    /// Waits until the call may go; refused when its team's budget is spent.
    pub async fn admit(&self, scope: &JobScope, provider: &str) -> Result<(), Refusal> {
        loop {
            let limits = self.limits_of(scope.team.as_deref()).await?;
            let day = day_of(chrono::Utc::now());
            let call = Call {
                team: scope.team.as_deref(),
                run: &scope.run,
                provider,
                day: &day,
            };
            let rates = Rates {
                team: limits.llm_rate.get(provider).copied(),
                fleet: self.fleet_rate,
            };
            match self.ledger.admit(&call, &limits.bounds(), &rates).await? {
                Admission::Go => return Ok(()),
                Admission::Exhausted(scope_hit) => {
                    info!(run = %scope.run, team = scope.team.as_deref().unwrap_or("-"),
                        limit = scope_hit.as_str(), "llm call refused: budget exhausted");
                    return Err(Refusal::Exhausted(scope_hit.as_str()));
                }
                Admission::Wait(wait) => tokio::time::sleep(wait.min(MAX_HOLD)).await,
            }
        }
    }

    /// What the team's daily dollar limit has left today (`None` without a team or a limit):
    /// a call's `max_tokens` is clamped to it, as to the run's budget.
    pub async fn usd_left(&self, scope: &JobScope) -> Result<Option<f64>, LedgerError> {
        let Some(team) = scope.team.as_deref() else {
            return Ok(None);
        };
        let Some(daily) = self.limits_of(Some(team)).await?.daily_usd else {
            return Ok(None);
        };
        let (used, _) = self.ledger.used(team, &day_of(chrono::Utc::now())).await?;
        Ok(Some((daily - used.usd_micros as f64 / 1e6).max(0.0)))
    }

    /// Records a reply's spend; a failure to record is logged (the call was made).
    pub async fn record(&self, scope: &JobScope, provider: &str, tokens: u64, usd: f64) {
        let limits = match self.limits_of(scope.team.as_deref()).await {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, run = %scope.run, "llm spend not recorded");
                return;
            }
        };
        let now = chrono::Utc::now();
        let day = day_of(now);
        let call = Call {
            team: scope.team.as_deref(),
            run: &scope.run,
            provider,
            day: &day,
        };
        let spent = Spent {
            usd_micros: usd_micros(usd),
            tokens,
        };
        let at = shared::time::rfc3339(&now);
        match self
            .ledger
            .record(&call, spent, &limits.bounds(), self.fleet_rate, &at)
            .await
        {
            Ok(notices) => {
                for n in notices {
                    info!(team = %n.team, run = %n.run, limit = n.scope.as_str(),
                        percent = n.percent, "team budget mark crossed");
                }
            }
            Err(e) => warn!(error = %e, run = %scope.run, "llm spend not recorded"),
        }
    }

    /// The provider answered 429: the fleet holds its calls to it for `wait`.
    pub async fn throttled(&self, provider: &str, wait: Duration) {
        if let Err(e) = self.ledger.throttled(provider, wait, self.fleet_rate).await {
            warn!(error = %e, provider, "fleet back-off not recorded");
        }
    }
}
