//! The seed's retry strategies per error class and the resilient executor's next step after a
//! failed attempt: retry after a wait, or stop with the seed's outcome (fatal, a hint for the
//! agent, or retries exhausted).

use super::classify::ToolErrorType;
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    pub max_attempts: u32,
    pub backoff_seconds: Vec<u64>,
}

impl RetryConfig {
    fn once() -> RetryConfig {
        RetryConfig {
            max_attempts: 1,
            backoff_seconds: vec![1, 3, 10],
        }
    }
}

/// The seed's `RETRY_STRATEGIES`.
pub fn strategy(error_type: ToolErrorType) -> RetryConfig {
    match error_type {
        ToolErrorType::Transient => RetryConfig {
            max_attempts: 3,
            backoff_seconds: vec![1, 3, 10],
        },
        ToolErrorType::Timing => RetryConfig {
            max_attempts: 3,
            backoff_seconds: vec![2, 5, 10],
        },
        _ => RetryConfig::once(),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionOutcome {
    Success,
    RetryExhausted,
    Fatal,
    NeedsHint,
    /// A retriable failure of a call that may already have taken effect (an edit, a command,
    /// a browser session that clicked): not run again, the agent decides.
    NotReplayable,
}

impl ExecutionOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionOutcome::Success => "success",
            ExecutionOutcome::RetryExhausted => "retry_exhausted",
            ExecutionOutcome::Fatal => "fatal",
            ExecutionOutcome::NeedsHint => "needs_hint",
            ExecutionOutcome::NotReplayable => "not_replayable",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    Retry { wait: Duration },
    Stop(ExecutionOutcome),
}

/// After failed attempt number `attempt` (from 1) of class `error_type`: the seed's executor
/// (fatal classes stop, hint classes go back to the agent, the rest retry within their
/// strategy's attempts, waiting the strategy's backoff). `config` overrides the class's
/// strategy for the retriable classes, as the seed's `config` argument does; `replayable`
/// says whether running the call again is safe.
pub fn next_step(
    error_type: ToolErrorType,
    attempt: u32,
    config: Option<&RetryConfig>,
    replayable: bool,
) -> Next {
    match error_type {
        ToolErrorType::NotInstalled | ToolErrorType::Permission => {
            return Next::Stop(ExecutionOutcome::Fatal)
        }
        ToolErrorType::Selector | ToolErrorType::InvalidInput | ToolErrorType::Capability => {
            return Next::Stop(ExecutionOutcome::NeedsHint)
        }
        ToolErrorType::Transient | ToolErrorType::Timing => {}
    }
    let default = strategy(error_type);
    let strategy = config.unwrap_or(&default);
    if attempt >= strategy.max_attempts {
        return Next::Stop(ExecutionOutcome::RetryExhausted);
    }
    if !replayable {
        return Next::Stop(ExecutionOutcome::NotReplayable);
    }
    let index = (attempt.saturating_sub(1) as usize).min(strategy.backoff_seconds.len().max(1) - 1);
    let wait = strategy.backoff_seconds.get(index).copied().unwrap_or(1);
    Next::Retry {
        wait: Duration::from_secs(wait),
    }
}
