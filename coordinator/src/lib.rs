//! The coordinator: turns runs of graphs into jobs. An HTTP API, the driver that feeds events to
//! the pure engine and carries out its effects, and the run-store adapters (Redis, memory).
//! Also home of the `fleet` CLI, including the embedded single-process mode.

pub mod api;
pub mod auth_api;
pub mod batches;
pub mod cli;
pub mod decisions_api;
pub mod driver;
pub mod embedded;
pub mod metrics;
pub mod openapi;
pub mod repo_roots;
pub mod schedules;
pub mod store;
pub mod submit;
pub mod tracking_api;
pub mod tree_api;
