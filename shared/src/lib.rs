//! The pure heart of the fleet: graph model and static checker, the engine
//! (`apply(graph, state, event) -> (state, effects)`), wire messages, port traits, typed ids and
//! the factory seed's harness rules. Nothing in this crate does I/O.

pub mod agent_config;
pub mod auth;
pub mod batch;
pub mod browser;
pub mod builtins;
pub mod ceilings;
pub mod engine;
pub mod expr;
pub mod factory;
pub mod features;
pub mod graph;
pub mod hashing;
pub mod http;
pub mod hybrid;
pub mod ids;
pub mod images;
pub mod lang;
pub mod limits;
pub mod mechanical;
pub mod messages;
pub mod mutation;
pub mod paths;
pub mod ports;
#[cfg(any(test, feature = "test-support"))]
pub mod proptest_support;
pub mod providers;
pub mod quota;
pub mod resilience;
pub mod schedule;
pub mod schema;
pub mod scope;
pub mod session;
pub mod speccheck;
pub mod special_case;
pub mod step_cache;
pub mod testfail;
pub mod testreport;
pub mod text;
pub mod time;
pub mod tracking;
