//! Every coordinator drives every unfinished batch: each tick it reads the runs of the batch's
//! running items (a finished run settles its item: a verdict, or an infrastructure error that
//! queues the item again as a new attempt), starts queued items up to `max_running`, and
//! writes the batch by compare-and-set. Starting is idempotent (the run id is the batch's
//! choice), so a tick that loses the race to another coordinator changes nothing twice.

use super::{item_request, request_key, state_key, BatchRequest};
use crate::driver::{Coordinator, DriverError};
use shared::batch::{outcome_of, BatchState, ItemOutcome, ItemState};
use shared::engine::RunStatus;
use shared::ids::BatchId;
use shared::ports::CasOutcome;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often a coordinator looks at the unfinished batches.
const TICK: Duration = Duration::from_millis(500);

/// Compare-and-set attempts of one batch per tick.
const CAS_TRIES: usize = 5;

pub async fn drive(coord: Arc<Coordinator>, shutdown: CancellationToken) {
    let mut requests: HashMap<BatchId, Arc<BatchRequest>> = HashMap::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(TICK) => {}
        }
        let active = match coord.store.active_batches().await {
            Ok(a) => a,
            Err(e) => {
                warn!(error = %e, "cannot list the unfinished batches");
                continue;
            }
        };
        requests.retain(|id, _| active.contains(id));
        for id in active {
            let req = match requests.get(&id) {
                Some(r) => r.clone(),
                None => match coord
                    .blobs
                    .get_json::<BatchRequest>(&request_key(&id))
                    .await
                {
                    Ok(r) => {
                        let r = Arc::new(r);
                        requests.insert(id.clone(), r.clone());
                        r
                    }
                    Err(e) => {
                        warn!(batch = %id, error = %e, "cannot read the batch's request");
                        continue;
                    }
                },
            };
            if let Err(e) = tick(&coord, &id, &req).await {
                warn!(batch = %id, error = %e, "batch tick failed; retrying next tick");
            }
        }
    }
}

/// One step of one batch, committed by compare-and-set (retried on a conflict).
pub(super) async fn tick(
    coord: &Coordinator,
    id: &BatchId,
    req: &BatchRequest,
) -> Result<(), DriverError> {
    for _ in 0..CAS_TRIES {
        let Some((mut state, version)) = coord.store.load_batch(id).await? else {
            return Ok(());
        };
        if !advance(coord, &mut state, req).await? {
            return Ok(());
        }
        match coord.store.commit_batch(&state, version).await? {
            CasOutcome::Committed => {
                if let Err(e) = coord.blobs.put_json(&state_key(id), &state).await {
                    warn!(batch = %id, error = %e, "cannot mirror the batch's state");
                }
                if state.is_finished() {
                    let c = state.counts();
                    info!(batch = %id, passed = c.passed, failed = c.failed, errored = c.errored, cancelled = c.cancelled, "batch finished");
                }
                return Ok(());
            }
            CasOutcome::Conflict => continue,
        }
    }
    Ok(())
}

/// Settles finished runs and starts queued items; whether anything changed.
async fn advance(
    coord: &Coordinator,
    state: &mut BatchState,
    req: &BatchRequest,
) -> Result<bool, DriverError> {
    let mut changed = false;
    let items = shared::batch::parse_dataset(&req.dataset)
        .map_err(|e| crate::submit::SubmitError::Input(e.to_string()))?;
    for i in 0..state.items.len() {
        if state.items[i].state != ItemState::Running {
            continue;
        }
        let Some(run) = state.items[i].run_id.clone() else {
            continue;
        };
        let run_state = match coord.load(&run).await {
            Ok(s) => s,
            Err(DriverError::UnknownRun(_)) => {
                let outcome = lost_run(&run);
                state.finished(i, &outcome, coord.clock.now());
                changed = true;
                continue;
            }
            Err(e) => return Err(e),
        };
        if run_state.status.is_terminal() {
            state.finished(i, &outcome_of(&run_state), coord.clock.now());
            changed = true;
        } else if state.cancelled {
            // Stops the run; its end settles the item on a later tick.
            coord.cancel(&run).await?;
        }
    }
    for i in state.to_start() {
        let run_id = state.run_id_for(i);
        let item_id = state.items[i].item_id.clone();
        let Some(item) = items.iter().find(|it| it.id == item_id) else {
            continue;
        };
        let started = match item_request(req, item) {
            Ok(r) => crate::submit::submit_as(coord, r, Some(run_id.to_string())).await,
            Err(why) => Err(crate::submit::SubmitError::Input(why).into()),
        };
        match started {
            Ok(s) => state.started(i, s.run_id, coord.clock.now()),
            // The item cannot become a run (its repository is missing, its input breaks the
            // graph's schema): an error of the item, not a verdict.
            Err(DriverError::Submit(e)) => {
                let outcome = not_started(&e.to_string());
                state.finished(i, &outcome, coord.clock.now());
            }
            Err(e) => return Err(e),
        }
        changed = true;
    }
    Ok(changed)
}

/// The outcome of an item whose run could not be created.
fn not_started(why: &str) -> ItemOutcome {
    ItemOutcome {
        status: RunStatus::Failed,
        verdict: None,
        ended_stage: None,
        error: Some(format!("the item's run could not start: {why}")),
        infra_error: true,
        cost_usd: 0.0,
        tokens: 0,
    }
}

/// The outcome of an item whose run the store no longer knows (removed past its retention).
fn lost_run(run: &shared::ids::RunId) -> ItemOutcome {
    ItemOutcome {
        status: RunStatus::Failed,
        verdict: None,
        ended_stage: None,
        error: Some(format!("run `{run}` is gone from the run store")),
        infra_error: true,
        cost_usd: 0.0,
        tokens: 0,
    }
}
