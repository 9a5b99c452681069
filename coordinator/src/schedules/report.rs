//! The report files of a finished firing, under `schedules/<name>/<batch>/`: `report.json`,
//! `junit.xml`, `report.html`, `comparison.json` (with the earlier finished firing's batch,
//! when there is one) and `morning.json`, the exact bytes every delivery attempt sends. Each
//! is a function of the finished batches and the committed firing, so coordinators racing to
//! write them write the same bytes.

use super::ScheduleError;
use crate::batches::state_key;
use crate::driver::{Coordinator, DriverError};
use shared::batch::{html_report, junit_xml, BatchState};
use shared::ids::BatchId;
use shared::schedule::webhook::report_folder;
use shared::schedule::{morning_report, Firing};
use tracing::{info, warn};

/// The key of the body deliveries send.
pub(crate) fn body_key(name: &str, batch: &BatchId) -> String {
    format!("{}morning.json", report_folder(name, batch))
}

/// A batch from the run store, or from its mirror when the store lost it; None when neither
/// has it.
pub(crate) async fn load_batch(
    coord: &Coordinator,
    id: &BatchId,
) -> Result<Option<BatchState>, ScheduleError> {
    if let Some((state, _)) = coord.store.load_batch(id).await? {
        return Ok(Some(state));
    }
    match coord.blobs.get_json::<BatchState>(&state_key(id)).await {
        Ok(state) => Ok(Some(state)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(DriverError::from(e).into()),
    }
}

/// Writes the report files of `firing` (of schedule `name`; its batch finished).
pub(crate) async fn write(
    coord: &Coordinator,
    name: &str,
    firing: &Firing,
) -> Result<(), ScheduleError> {
    let id = &firing.batch_id;
    let batch = load_batch(coord, id)
        .await?
        .ok_or_else(|| DriverError::UnknownBatch(id.clone()))?;
    let previous = match &firing.previous {
        Some(p) => {
            let found = load_batch(coord, p).await?;
            if found.is_none() {
                warn!(schedule = %name, batch = %id, previous = %p, "the earlier firing's batch is gone; reported without a comparison");
            }
            found
        }
        None => None,
    };
    let report = morning_report(name, firing, &batch, previous.as_ref());
    let folder = report_folder(name, id);
    let json = |v: &serde_json::Value| serde_json::to_vec_pretty(v).unwrap_or_default();
    let mut files = vec![
        ("report.json", json(&report.report)),
        ("junit.xml", junit_xml(&batch).into_bytes()),
        ("report.html", html_report(&batch).into_bytes()),
    ];
    if let Some(c) = &report.comparison {
        files.push((
            "comparison.json",
            serde_json::to_vec_pretty(c).unwrap_or_default(),
        ));
    }
    // Last: a body in storage means the rest is there.
    files.push((
        "morning.json",
        serde_json::to_vec(&report.body).unwrap_or_default(),
    ));
    for (file, bytes) in files {
        coord
            .blobs
            .put(&format!("{folder}{file}"), bytes)
            .await
            .map_err(DriverError::from)?;
    }
    let counts = batch.counts();
    let previous = firing.previous.as_ref().map_or("", |p| p.as_str());
    info!(schedule = %name, batch = %id, previous, passed = counts.passed, failed = counts.failed, errored = counts.errored, folder = %folder, "schedule report written");
    Ok(())
}
