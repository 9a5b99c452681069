//! Driver tests on an in-process cluster (`cluster.rs`: real coordinators over the memory run
//! store, the memory broker and in-memory object storage, with a test worker that answers as
//! each test says). Graphs of `harness` `noop`, `join`, `fanout`, `approval` and `exit` nodes
//! only, so no job needs a container.
//!
//! - `runs.rs`: runs to their end: a chain, a fan-out and its join, a failure routed by the
//!   graph, approvals approved and rejected;
//! - `delivery.rs`: what at-least-once delivery and restarts bring: a duplicate result, a
//!   result of a superseded attempt, the watchdog's re-issue, cancel with late results, and a
//!   second coordinator finishing a run the first left mid-way;
//! - `stored.rs`: a run stored as a snapshot and deltas, replayed; forged deltas refused;
//! - `stalls.rs`: a run that waits for nothing ended `run_stalled` after the stall grace;
//! - `mirrored.rs`: a finished run's deltas removed from its mirror, by key or by a listing.

mod cluster;
mod delivery;
mod mirrored;
mod runs;
mod stalls;
mod stored;
