//! Batches: a dataset (JSON Lines, [`dataset`]) expanded into one run per item and trial, at
//! most `max_running` at once and the batch's fair share of the fleet's batch slots
//! ([`share`]), each run's verdict recorded, infrastructure errors retried and
//! never counted as verdicts ([`state`]), and reports ([`report`]: JSON with the pass rate's
//! interval and pass@k, JUnit XML; [`html`]: one self-contained page for people). Pure: the
//! coordinator stores a [`BatchState`] and drives it.

pub mod compare;
pub mod dataset;
pub mod flaky;
pub mod html;
pub mod progress;
pub mod report;
pub mod share;
pub mod state;

#[cfg(test)]
mod tests;

pub use compare::{compare, Comparison};
pub use dataset::{parse_dataset, DatasetError, DatasetItem};
pub use html::{html_escape, html_report};
pub use progress::{progress, Progress};
pub use report::{json_report, junit_xml};
pub use share::{fair_shares, starts, Demand};
pub use state::{
    batch_id, outcome_of, BatchCounts, BatchItem, BatchSpec, BatchState, ItemOutcome, ItemState,
};

/// A dataset has at most this many items.
pub const MAX_BATCH_ITEMS: usize = 10_000;

/// At most this many runs per batch (items × trials): one batch's state stays one value of a
/// few megabytes.
pub const MAX_BATCH_RUNS: usize = 20_000;
