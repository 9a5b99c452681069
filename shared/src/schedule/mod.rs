//! Schedules: a batch (graph, dataset, agent, options, spec) fired on a cron expression, its
//! report written when the fired batch finishes and sent to a webhook. Pure: the coordinator
//! stores a [`ScheduleDef`] (what was added, never changed) and a [`ScheduleState`] (firings,
//! deliveries; written by compare-and-set) and drives them.
//!
//! - [`cron`]: the expression (5 fields, or 6 with seconds first; UTC), the next firing, the
//!   tick due now (at most one, however many were missed);
//! - [`def`]: names, the webhook, the definition and its checks;
//! - [`state`]: firings (claimed once per tick, their batch ids fixed by name and time) and
//!   deliveries (attempts claimed one at a time, retried with backoff);
//! - [`webhook`]: the signature (HMAC-SHA256 of the body, hex), the retry policy, the body.

pub mod cron;
pub mod def;
pub mod state;
pub mod webhook;

#[cfg(test)]
mod tests;

pub use cron::{CronSchedule, Due};
pub use def::{check_name, shown_name, shown_url, stored_name, ScheduleDef, Webhook};
pub use state::{
    Delivery, DeliveryAttempt, DeliveryState, Firing, FiringKind, FiringStage, ScheduleState,
};
pub use webhook::{delivery_id, morning_report, sign, verify, MorningReport, RetryPolicy};

use thiserror::Error;

/// At most this many schedules per namespace (every coordinator looks at each one per tick).
pub const MAX_SCHEDULES: usize = 1000;

/// Why a schedule was refused; every message names what is wrong.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ScheduleError {
    #[error("schedule name {0:?}: {1}")]
    Name(String, String),
    #[error("cron expression {0:?}: {1}")]
    Cron(String, String),
    #[error("webhook: {0}")]
    Webhook(String),
    #[error("invalid graph")]
    Graph(Vec<String>),
    #[error("dataset: {0}")]
    Dataset(String),
    #[error("{0}")]
    Spec(String),
}
