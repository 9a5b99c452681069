//! Every coordinator drives every unfinished batch: each tick it reads the runs of the batch's
//! running items (a finished run settles its item: a verdict, or an infrastructure error that
//! queues the item again as a new attempt), then, once every batch has settled, starts queued
//! items up to `max_running` and the batch's fair share of the fleet's free batch slots
//! (`shared::batch::share`), writing each batch by compare-and-set. Starting is idempotent (the run id is the batch's
//! choice), so a tick that loses the race to another coordinator changes nothing twice.

use super::{item_request, request_key, state_key, BatchRequest};
use crate::driver::{Coordinator, DriverError};
use futures::stream::{self, StreamExt};
use shared::batch::DatasetItem;
use shared::batch::{outcome_of, starts, BatchHeader, BatchSlice, Demand, ItemOutcome, ItemState};
use shared::engine::RunStatus;
use shared::ids::BatchId;
use shared::ids::RunId;
use shared::ports::CasOutcome;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often a coordinator looks at the unfinished batches when no run of its own finished
/// (a run finishing here wakes it at once: `Coordinator::batch_wake`).
const TICK: Duration = Duration::from_millis(500);

/// A running batch's state is mirrored to object storage at most this often per 10,000 items
/// (always when it finishes); the run store holds every commit.
const MIRROR_EVERY: Duration = Duration::from_secs(2);

/// Queued items a cancelled batch cancels per pass, and its passes per tick (so a tick
/// cancels up to 100,000).
const CANCEL_CHUNK: usize = 5000;
const CANCEL_PASSES: usize = 20;

/// When this coordinator last mirrored each batch's state.
type Mirrored = HashMap<BatchId, std::time::Instant>;

/// Whether this coordinator should mirror the batch's state now (and notes that it does): a
/// larger batch, which costs more to write, is mirrored less often.
fn mirror_due(last: &mut Mirrored, header: &BatchHeader) -> bool {
    let now = std::time::Instant::now();
    let id = &header.batch_id;
    if header.is_finished() {
        last.remove(id);
        return true;
    }
    let every = MIRROR_EVERY * (1 + header.counts.total / 10_000) as u32;
    match last.get(id) {
        Some(at) if now.duration_since(*at) < every => false,
        _ => {
            last.insert(id.clone(), now);
            true
        }
    }
}

/// Writes the whole batch to object storage (read back when the run store lost it).
async fn mirror(coord: &Coordinator, id: &BatchId) {
    let whole = match coord.store.load_batch(id).await {
        Ok(Some((state, _))) => state,
        Ok(None) => return,
        Err(e) => {
            warn!(batch = %id, error = %e, "cannot read the batch to mirror it");
            return;
        }
    };
    if let Err(e) = coord.blobs.put_json(&state_key(id), &whole).await {
        warn!(batch = %id, error = %e, "cannot mirror the batch's state");
    }
}

/// Runs read, or created, at once by one batch's tick.
const AT_ONCE: usize = 16;

/// Compare-and-set attempts of one batch per tick.
const CAS_TRIES: usize = 5;

/// A batch's request with its dataset parsed once, items by id.
pub(super) struct Loaded {
    req: BatchRequest,
    items: HashMap<String, DatasetItem>,
}

impl Loaded {
    fn new(mut req: BatchRequest) -> Result<Self, DriverError> {
        let items = shared::batch::parse_dataset(&req.dataset)
            .map_err(|e| crate::submit::SubmitError::Input(e.to_string()))?;
        // Runs are made from the parsed items; the text is not kept twice.
        req.dataset = String::new();
        Ok(Loaded {
            req,
            items: items.into_iter().map(|i| (i.id.clone(), i)).collect(),
        })
    }
}

/// The batch's request from object storage, its dataset parsed.
async fn load(coord: &Coordinator, id: &BatchId) -> Result<Loaded, DriverError> {
    let req = coord
        .blobs
        .get_json::<BatchRequest>(&request_key(id))
        .await?;
    Loaded::new(req)
}

pub async fn drive(coord: Arc<Coordinator>, shutdown: CancellationToken) {
    let mut requests: HashMap<BatchId, Arc<Loaded>> = HashMap::new();
    let mut mirrored = Mirrored::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(TICK) => {}
            // A run finished on this coordinator: its slot may be free now.
            _ = coord.batch_wake.notified() => {}
        }
        let active = match coord.store.active_batches().await {
            Ok(a) => a,
            Err(e) => {
                warn!(error = %e, "cannot list the unfinished batches");
                continue;
            }
        };
        requests.retain(|id, _| active.contains(id));
        mirrored.retain(|id, _| active.contains(id));
        // First every batch settles its ended runs, so the slots they held are seen free...
        let mut settled = Vec::with_capacity(active.len());
        for id in active {
            let loaded = match requests.get(&id) {
                Some(l) => l.clone(),
                None => match load(&coord, &id).await {
                    Ok(l) => {
                        let l = Arc::new(l);
                        requests.insert(id.clone(), l.clone());
                        l
                    }
                    Err(e) => {
                        warn!(batch = %id, error = %e, "cannot read the batch's request");
                        continue;
                    }
                },
            };
            match settle_passes(&coord, &id, &loaded, &mut mirrored).await {
                Ok(Some(state)) => settled.push((state, loaded)),
                Ok(None) => {}
                Err(e) => warn!(batch = %id, error = %e, "batch tick failed; retrying next tick"),
            }
        }
        // ...then each starts what its fair share lets it into the free slots, oldest first
        // on ties.
        settled.sort_by(|(a, _), (b, _)| {
            (a.created_at, &a.batch_id).cmp(&(b.created_at, &b.batch_id))
        });
        let starts = starts_now(coord.batch_slots, &settled);
        for ((state, loaded), n) in settled.into_iter().zip(starts) {
            if n == 0 {
                continue;
            }
            if let Err(e) = tick(
                &coord,
                &state.batch_id,
                &loaded,
                Step::Start(n),
                &mut mirrored,
            )
            .await
            {
                warn!(batch = %state.batch_id, error = %e, "batch tick failed; retrying next tick");
            }
        }
    }
}

/// The batch's settle pass, repeated while a cancelled batch has queued items left to cancel
/// (at most [`CANCEL_PASSES`] times).
async fn settle_passes(
    coord: &Coordinator,
    id: &BatchId,
    loaded: &Loaded,
    mirrored: &mut Mirrored,
) -> Result<Option<BatchHeader>, DriverError> {
    let mut header = tick(coord, id, loaded, Step::Settle, mirrored).await?;
    for _ in 1..CANCEL_PASSES {
        match &header {
            Some(h) if h.cancelled && h.counts.queued > 0 => {
                header = tick(coord, id, loaded, Step::Settle, mirrored).await?;
            }
            _ => break,
        }
    }
    Ok(header)
}

/// How many runs each batch may start now: its fair share of the fleet's batch slots, into
/// free slots only (`shared::batch::share`).
fn starts_now(slots: usize, batches: &[(BatchHeader, Arc<Loaded>)]) -> Vec<usize> {
    let demands: Vec<Demand> = batches
        .iter()
        .map(|(state, _)| {
            let c = state.counts;
            Demand {
                weight: state.spec.weight,
                running: c.running,
                queued: if state.cancelled { 0 } else { c.queued },
                cap: state.spec.max_running as usize,
            }
        })
        .collect();
    starts(slots, &demands)
}

/// What one pass over a batch does.
#[derive(Clone, Copy)]
enum Step {
    /// Settle the items whose runs ended.
    Settle,
    /// Start at most this many queued items (the batch settled just before).
    Start(usize),
}

/// One step of one batch: a slice read (the running items, and the queued ones the step
/// needs), moved, and committed by compare-and-set (retried on a conflict). The batch's header
/// as it stands after (none when it is gone).
async fn tick(
    coord: &Coordinator,
    id: &BatchId,
    loaded: &Loaded,
    step: Step,
    mirrored: &mut Mirrored,
) -> Result<Option<BatchHeader>, DriverError> {
    for _ in 0..CAS_TRIES {
        let queued = match step {
            Step::Settle => 0,
            Step::Start(n) => n,
        };
        let Some((mut slice, mut version)) = coord.store.batch_slice(id, queued).await? else {
            return Ok(None);
        };
        if matches!(step, Step::Settle)
            && slice.header().cancelled
            && slice.header().counts.queued > 0
        {
            // A cancelled batch cancels its queued items a chunk per pass.
            match coord.store.batch_slice(id, CANCEL_CHUNK).await? {
                Some(read) => (slice, version) = read,
                None => return Ok(None),
            }
        }
        let was_finished = slice.header().is_finished();
        match step {
            Step::Settle => settle(coord, &mut slice).await?,
            Step::Start(max_new) => start(coord, &mut slice, loaded, max_new).await?,
        }
        if !slice.is_changed() {
            return Ok(Some(slice.header().clone()));
        }
        match coord.store.commit_batch(&slice, version).await? {
            CasOutcome::Committed => {
                let header = slice.header();
                if mirror_due(mirrored, header) {
                    mirror(coord, id).await;
                }
                if header.is_finished() && !was_finished {
                    let c = header.counts;
                    info!(batch = %id, passed = c.passed, failed = c.failed, errored = c.errored, cancelled = c.cancelled, "batch finished");
                    // The commit that finished it is made once: its team hears of it once
                    // (unless this coordinator dies before delivering).
                    if let Some(team) = header.team.clone() {
                        let post = coord.team_post();
                        let delivery = format!("batch-{id}");
                        let body = serde_json::json!({
                            "v": 1, "delivery": delivery, "event": "team.batch_finished",
                            "batch_id": id, "graph": header.graph, "counts": c,
                            "cost_usd": header.cost_usd, "tokens": header.tokens,
                            "cancelled": header.cancelled,
                        });
                        tokio::spawn(async move {
                            post.deliver(&team, "team.batch_finished", &delivery, body)
                                .await;
                        });
                    }
                }
                return Ok(Some(header.clone()));
            }
            CasOutcome::Conflict => continue,
        }
    }
    // Others keep winning the race; this coordinator sits this tick out.
    Ok(None)
}

/// Settles the items whose runs ended, asks a cancelled batch's runs to stop and cancels the
/// queued items the slice holds.
async fn settle(coord: &Coordinator, slice: &mut BatchSlice) -> Result<(), DriverError> {
    // The running items' runs, read a few at a time (each read is a round trip to the store).
    let running: Vec<(usize, RunId)> = slice
        .in_state(ItemState::Running)
        .into_iter()
        .filter_map(|(i, item)| item.run_id.clone().map(|run| (i, run)))
        .collect();
    let reads: Vec<_> = running.iter().map(|(_, run)| coord.load(run)).collect();
    let reads: Vec<_> = stream::iter(reads).buffered(AT_ONCE).collect().await;
    for ((i, run), read) in running.into_iter().zip(reads) {
        let run_state = match read {
            Ok(s) => s,
            Err(DriverError::UnknownRun(_)) => {
                let outcome = infra_outcome(format!("run `{run}` is gone from the run store"));
                slice.finished(i, &outcome, coord.clock.now());
                continue;
            }
            Err(e) => return Err(e),
        };
        if run_state.status.is_terminal() {
            slice.finished(i, &outcome_of(&run_state), coord.clock.now());
        } else if slice.header().cancelled {
            // Stops the run; its end settles the item on a later tick.
            coord.cancel(&run).await?;
        }
    }
    if slice.header().cancelled {
        slice.cancel(coord.clock.now());
    }
    Ok(())
}

/// Starts at most `max_new` of the slice's queued items, their runs created a few at a time,
/// then recorded in order.
async fn start(
    coord: &Coordinator,
    slice: &mut BatchSlice,
    loaded: &Loaded,
    max_new: usize,
) -> Result<(), DriverError> {
    let starting: Vec<(usize, RunId, &DatasetItem)> = slice
        .to_start(max_new)
        .into_iter()
        .filter_map(|i| {
            let item = slice.item(i)?;
            let data = loaded.items.get(&item.item_id)?;
            Some((i, slice.header().run_id_for(item), data))
        })
        .collect();
    let starts: Vec<_> = starting
        .iter()
        .map(|(_, run_id, data)| {
            let request = item_request(&loaded.req, data);
            let run_id = run_id.to_string();
            async move {
                match request {
                    Ok(r) => crate::submit::submit_as(coord, r, Some(run_id)).await,
                    Err(why) => Err(crate::submit::SubmitError::Input(why).into()),
                }
            }
        })
        .collect();
    let starts: Vec<_> = stream::iter(starts).buffered(AT_ONCE).collect().await;
    for ((i, _, _), started) in starting.into_iter().zip(starts) {
        match started {
            Ok(s) => {
                slice.started(i, s.run_id, coord.clock.now());
            }
            // The item cannot become a run (its repository is missing, its input breaks the
            // graph's schema): an error of the item, not a verdict.
            Err(DriverError::Submit(e)) => {
                let outcome = infra_outcome(format!("the item's run could not start: {e}"));
                slice.finished(i, &outcome, coord.clock.now());
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// An infrastructure error of an item (its run could not start, or is gone): retried as a
/// new attempt while retries are left, never a verdict.
fn infra_outcome(error: String) -> ItemOutcome {
    ItemOutcome {
        status: RunStatus::Failed,
        verdict: None,
        ended_stage: None,
        error: Some(error),
        infra_error: true,
        cost_usd: 0.0,
        tokens: 0,
        flaky_tests: Vec::new(),
        suspected_special_case: Vec::new(),
        steps: 0,
        cache_hits: 0,
    }
}
