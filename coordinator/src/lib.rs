//! The coordinator: turns runs of graphs into jobs. An HTTP API, the driver that feeds events to
//! the pure engine and carries out its effects, and the run-store adapters (Redis, memory).
//! Also home of the `fleet` CLI, including the embedded single-process mode.

mod agent_checks;
pub mod api;
mod api_timing;
pub mod auth_api;
pub mod batches;
mod browser_guard;
pub mod cli;
pub mod decisions_api;
pub mod driver;
pub mod embedded;
pub mod health;
pub mod metrics;
pub mod openapi;
pub mod repo_roots;
pub mod result_wait;
pub mod schedules;
mod snapshot;
pub mod store;
pub mod submit;
pub mod team_api;
pub mod tracking_api;
pub mod tree_api;
pub mod uploads;
pub mod web;
pub mod webhook_guard;
