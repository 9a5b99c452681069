//! Batches: a dataset (JSON Lines, [`dataset`]) expanded into one run per item and trial, at
//! most `max_running` at once and the batch's fair share of the fleet's batch slots
//! ([`share`]), each run's verdict recorded, infrastructure errors retried and
//! never counted as verdicts ([`state`]), and reports ([`report`]: JSON with the pass rate's
//! interval and pass@k, JUnit XML; [`html`]: one self-contained page for people). Pure: the
//! coordinator stores a batch's header and items apart and drives it a [`BatchSlice`] at a time.

pub mod compare;
pub mod counts;
pub mod dataset;
pub mod flaky;
pub mod html;
pub mod outcome;
pub mod progress;
pub mod report;
pub mod share;
pub mod slice;
pub mod state;

#[cfg(test)]
mod tests;

pub use compare::{compare, Comparison};
pub use counts::BatchCounts;
pub use dataset::{parse_dataset, DatasetError, DatasetItem};
pub use html::{html_escape, html_report};
pub use outcome::{outcome_of, ItemOutcome, INFRA_REASONS};
pub use progress::{progress, Progress};
pub use report::{json_report, junit_xml};
pub use share::{fair_shares, starts, Demand};
pub use slice::BatchSlice;
pub use state::{batch_id, BatchHeader, BatchItem, BatchSpec, BatchState, ItemState};

/// A dataset has at most this many items.
pub const MAX_BATCH_ITEMS: usize = 100_000;

/// At most this many runs per batch (items × trials): a store keeps each item apart, and a
/// pass of the driver reads only the header and the items it touches ([`BatchSlice`]).
pub const MAX_BATCH_RUNS: usize = 200_000;
