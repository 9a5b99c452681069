//! Run-store adapters (runs, batches, schedules, API tokens, the teams' job slots): Redis for
//! the fleet, memory for the embedded mode, and the contract both keep (`conformance`,
//! compiled for tests and with the `conformance` feature).

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod memory;
pub mod redis;
mod redis_batches;
mod redis_mirror_index;
mod redis_schedules;
mod redis_slots;
mod redis_tokens;
