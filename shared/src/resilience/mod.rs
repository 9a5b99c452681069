//! Seed 004's tool resilience, as pure rules: tool profiles per project type
//! (`profiles.rs`), the classification of a failed tool call by the seed's signal table
//! (`classify.rs`) and the retry strategy per class with the executor's next step
//! (`strategy.rs`). The worker's tool box applies them around every call and records the
//! seed's `tool_use`, `tool_error` and `tool_retry` events.

mod classify;
mod profiles;
mod strategy;
#[cfg(test)]
mod tests;

pub use classify::{classify, selector_hint, usage_hint, ClassifiedError, ToolErrorType};
pub use profiles::{detect_project_type, profile, ToolProfile, PROFILE_NAMES};
pub use strategy::{next_step, strategy, ExecutionOutcome, Next, RetryConfig};
