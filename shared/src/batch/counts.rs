//! The states of a batch item, and how many items of a batch are in each (kept by the items'
//! transitions).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    Queued,
    Running,
    Passed,
    Failed,
    Errored,
    Cancelled,
    /// The run's verdict would have depended on flaky tests: no verdict.
    Flaky,
    /// The run passed, but the harness suspects special-casing (lines of the code under test
    /// that branch on the tests' or the examples' literals): held for a person, not a pass.
    Held,
}

impl ItemState {
    /// Whether the item is done for good: passed, failed, errored or cancelled.
    pub fn is_settled(self) -> bool {
        !matches!(self, ItemState::Queued | ItemState::Running)
    }
}

/// How many items are in each state.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct BatchCounts {
    pub total: usize,
    pub queued: usize,
    pub running: usize,
    pub passed: usize,
    pub failed: usize,
    pub errored: usize,
    pub cancelled: usize,
    #[serde(default)]
    pub flaky: usize,
    #[serde(default)]
    pub held: usize,
}

impl BatchCounts {
    /// Items settled: passed, failed, flaky, held, errored or cancelled.
    pub fn done(&self) -> usize {
        self.passed + self.failed + self.flaky + self.held + self.errored + self.cancelled
    }

    pub(super) fn of_mut(&mut self, state: ItemState) -> &mut usize {
        match state {
            ItemState::Queued => &mut self.queued,
            ItemState::Running => &mut self.running,
            ItemState::Passed => &mut self.passed,
            ItemState::Failed => &mut self.failed,
            ItemState::Errored => &mut self.errored,
            ItemState::Cancelled => &mut self.cancelled,
            ItemState::Flaky => &mut self.flaky,
            ItemState::Held => &mut self.held,
        }
    }
}
