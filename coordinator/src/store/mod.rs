//! Run-store adapters: Redis for the fleet, memory for the embedded mode.

pub mod memory;
pub mod redis;
