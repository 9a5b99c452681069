//! The part of a batch one pass of the driver works on ([`BatchSlice`]): its header, its
//! running items and the first of its queued ones, by index. A pass reads a slice, moves its
//! items, and the store writes back the header and the changed items only, so a pass costs
//! what it touches, not the batch's size.

use super::outcome::ItemOutcome;
use super::state::{BatchHeader, BatchItem, BatchState, ItemState};
use crate::ids::RunId;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug, PartialEq)]
pub struct BatchSlice {
    header: BatchHeader,
    items: BTreeMap<usize, BatchItem>,
    changed: BTreeSet<usize>,
    header_changed: bool,
}

impl BatchSlice {
    /// A slice of the batch with this header: `items` are some of its items, by index.
    pub fn new(header: BatchHeader, items: impl IntoIterator<Item = (usize, BatchItem)>) -> Self {
        BatchSlice {
            header,
            items: items.into_iter().collect(),
            changed: BTreeSet::new(),
            header_changed: false,
        }
    }

    /// The slice a store reads: every running item and the first `queued` queued ones.
    pub fn of(state: &BatchState, queued: usize) -> Self {
        let running = state
            .items
            .iter()
            .enumerate()
            .filter(|(_, i)| i.state == ItemState::Running);
        let first_queued = state
            .items
            .iter()
            .enumerate()
            .filter(|(_, i)| i.state == ItemState::Queued)
            .take(queued);
        let items = running.chain(first_queued).map(|(n, i)| (n, i.clone()));
        Self::new(state.header().clone(), items)
    }

    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    pub fn item(&self, index: usize) -> Option<&BatchItem> {
        self.items.get(&index)
    }

    /// The slice's items in the state, by index.
    pub fn in_state(&self, state: ItemState) -> Vec<(usize, &BatchItem)> {
        self.items
            .iter()
            .filter(|(_, i)| i.state == state)
            .map(|(n, i)| (*n, i))
            .collect()
    }

    /// The slice's queued items to start now, in order, as many as
    /// [`BatchHeader::room`] leaves.
    pub fn to_start(&self, max_new: usize) -> Vec<usize> {
        self.in_state(ItemState::Queued)
            .into_iter()
            .map(|(n, _)| n)
            .take(self.header.room(max_new))
            .collect()
    }

    /// The run of the current attempt of the item at `index` (none when the slice lacks it).
    pub fn run_id_for(&self, index: usize) -> Option<RunId> {
        self.items.get(&index).map(|i| self.header.run_id_for(i))
    }

    /// [`BatchHeader::start_item`] of the item at `index`.
    pub fn started(&mut self, index: usize, run_id: RunId, at: DateTime<Utc>) -> bool {
        self.with_item(index, |h, i| h.start_item(i, run_id, at))
    }

    /// [`BatchHeader::finish_item`] of the item at `index`.
    pub fn finished(&mut self, index: usize, outcome: &ItemOutcome, at: DateTime<Utc>) -> bool {
        self.with_item(index, |h, i| h.finish_item(i, outcome, at))
    }

    /// Cancels the batch ([`BatchHeader::cancel`]) and the slice's queued items.
    pub fn cancel(&mut self, at: DateTime<Utc>) -> bool {
        let cancelled = self.header.cancel();
        self.header_changed |= cancelled;
        let queued: Vec<usize> = self
            .in_state(ItemState::Queued)
            .iter()
            .map(|(n, _)| *n)
            .collect();
        let mut changed = cancelled;
        for n in queued {
            changed |= self.with_item(n, |h, i| h.cancel_item(i, at));
        }
        changed
    }

    /// Whether anything changed since the slice was read.
    pub fn is_changed(&self) -> bool {
        self.header_changed || !self.changed.is_empty()
    }

    /// The items that changed, by index.
    pub fn changed(&self) -> Vec<(usize, &BatchItem)> {
        self.changed
            .iter()
            .filter_map(|n| self.items.get(n).map(|i| (*n, i)))
            .collect()
    }

    /// Writes the slice's header and changed items into the whole batch (what a store that
    /// holds whole batches does on commit).
    pub fn apply_to(&self, state: &mut BatchState) {
        for (n, item) in self.changed() {
            state.set_item(n, item.clone());
        }
        state.set_header(self.header.clone());
    }

    fn with_item(
        &mut self,
        index: usize,
        f: impl FnOnce(&mut BatchHeader, &mut BatchItem) -> bool,
    ) -> bool {
        let Some(item) = self.items.get_mut(&index) else {
            return false;
        };
        let changed = f(&mut self.header, item);
        if changed {
            self.changed.insert(index);
            self.header_changed = true;
        }
        changed
    }
}
