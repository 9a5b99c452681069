//! A run in the run store as a snapshot and the deltas committed after it: a commit appends
//! its events (the delta the mirror writes too), so it costs what changed, not the whole run;
//! a snapshot is written when the deltas outgrow the last one, when the run ends and when the
//! writer does not know the weight of what is stored. A load replays the deltas on the
//! snapshot; each must follow the commit before it, or the load fails loudly.

use super::mirror::Delta;
use super::{Coordinator, DriverError};
use shared::engine::{self, RunState};
use shared::ids::RunId;
use shared::ports::{CasOutcome, OutboxMessage, PortError};

/// How much a run weighs in the store: its snapshot and the deltas after it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Weight {
    pub snapshot_bytes: usize,
    pub delta_bytes: usize,
}

impl Weight {
    /// Does a delta of `len` bytes go on the log (else: a snapshot)?
    fn takes(&self, len: usize) -> bool {
        self.snapshot_bytes > 0 && self.delta_bytes + len < self.snapshot_bytes
    }

    fn after_delta(self, len: usize) -> Self {
        Weight {
            delta_bytes: self.delta_bytes + len,
            ..self
        }
    }

    /// After a snapshot: it weighs about what the snapshot and deltas before it did (the
    /// next load from the store measures it).
    fn after_snapshot(self) -> Self {
        Weight {
            snapshot_bytes: (self.snapshot_bytes + self.delta_bytes).max(1),
            delta_bytes: 0,
        }
    }
}

/// One commit's delta, as stored and mirrored.
pub(super) fn encode_delta(prev: &str, state: &RunState, events: &[&engine::Event]) -> String {
    let delta = serde_json::json!({"prev": prev, "id": state.commit, "events": events});
    serde_json::to_string(&delta).expect("serializable events")
}

fn broken(run: &RunId, why: String) -> DriverError {
    DriverError::Store(PortError::Encoding(format!("run `{run}`: {why}")))
}

impl Coordinator {
    /// The run as stored, its deltas replayed on its snapshot, with its version and weight.
    pub(super) async fn stored(
        &self,
        run: &RunId,
    ) -> Result<Option<(RunState, u64, Weight)>, DriverError> {
        let Some(stored) = self.store.load(run).await? else {
            return Ok(None);
        };
        self.metrics.store_loads.inc();
        let weight = Weight {
            snapshot_bytes: stored.snapshot_bytes,
            delta_bytes: stored.delta_bytes(),
        };
        let mut state = stored.snapshot;
        if !stored.deltas.is_empty() {
            let bundle = self.bundle(&state.graph_ref).await?;
            for raw in &stored.deltas {
                let delta: Delta = serde_json::from_str(raw)
                    .map_err(|e| broken(run, format!("a stored delta does not read: {e}")))?;
                if delta.prev != state.commit {
                    return Err(broken(
                        run,
                        format!(
                            "a stored delta follows commit `{}`, not `{}`",
                            delta.prev, state.commit
                        ),
                    ));
                }
                for event in &delta.events {
                    engine::apply_in_place(
                        &bundle,
                        &mut state,
                        event,
                        &shared::builtins::assembler,
                    )?;
                }
                state.commit = delta.id;
            }
        }
        Ok(Some((state, stored.version, weight)))
    }

    /// Writes a commit on `weight`: its delta appended, or the whole state as a snapshot.
    pub(super) async fn write_commit(
        &self,
        state: &RunState,
        version: u64,
        weight: Weight,
        delta: &str,
        outbox: &[OutboxMessage],
    ) -> Result<(CasOutcome, Weight), DriverError> {
        if weight.takes(delta.len()) && !state.status.is_terminal() {
            let run = &state.run_id;
            let outcome = (self.store)
                .append(run, version, &state.commit, delta, outbox)
                .await?;
            return Ok((outcome, weight.after_delta(delta.len())));
        }
        let outcome = self.store.commit(state, version, outbox).await?;
        Ok((outcome, weight.after_snapshot()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_go_on_the_log_until_they_outgrow_the_snapshot() {
        let w = Weight {
            snapshot_bytes: 100,
            delta_bytes: 0,
        };
        assert!(w.takes(60));
        let w = w.after_delta(60);
        assert!(w.takes(30));
        assert!(!w.takes(40), "60 + 40 is the snapshot's size");
        let w = w.after_snapshot();
        assert_eq!(
            w,
            Weight {
                snapshot_bytes: 160,
                delta_bytes: 0
            }
        );
    }

    #[test]
    fn an_unknown_weight_takes_no_delta() {
        assert!(!Weight::default().takes(1));
    }
}
