//! Seed 004's tracking, kept by the harness and the engine, never taken from an agent: the
//! events a job's trusted code records (`JobEvent`: tool errors and retries, claims, gate
//! results, verifications), the run's event log derived from its state (`events.rs`), costs
//! per session and model with the seed's metrics (`costs.rs`) and the run's budget
//! (`budget.rs`: a warning at 80%, a pause at 100%, a resume with a raised budget).

pub mod budget;
pub mod costs;
pub mod dashboard;
pub mod events;

pub use budget::{BudgetLevel, RunBudget};
pub use events::{EventType, JobEvent, RunEvent, MAX_JOB_EVENTS};
