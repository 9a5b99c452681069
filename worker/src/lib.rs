//! The worker: consumes jobs, materialises a worktree per job, runs the job in a throwaway
//! container, stores outputs and logs in object storage, reports, then acks.
//!
//! The RabbitMQ and object-store adapters live here and are reused by the coordinator, which
//! embeds a worker for the single-process mode.

pub mod acceptance;
pub mod agent;
pub mod blobs;
pub mod browser;
pub mod claims;
pub mod consumer;
pub mod faults;
pub mod git;
pub mod guarded_acceptance;
pub mod hardened;
pub mod harness;
pub mod memory_queue;
pub mod metrics;
pub mod mutants;
pub mod mutation;
pub mod patch_checks;
pub mod queue;
pub mod quota;
pub mod rabbitmq;
pub mod redis_link;
pub mod render;
pub mod runner;
pub mod safe_fs;
pub mod sandbox;
pub mod skeleton_check;
pub mod tools;
pub mod verify;
