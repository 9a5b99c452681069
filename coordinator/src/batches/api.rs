//! The batch routes of the HTTP API ([`routes`], served through `crate::api::routes`,
//! documented in the OpenAPI document like the others).

use super::{request_key, state_key, submit_batch, BatchRequest, BatchSubmitted};
use crate::api::{at, ApiError, Route, Verb};
use crate::driver::{Coordinator, DriverError};
use crate::submit::SubmitError;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use shared::batch::{progress, BatchCounts, BatchHeader, BatchItem, BatchState, Progress};
use shared::ids::BatchId;
use shared::ports::CasOutcome;
use std::sync::Arc;

/// A submitted batch (its dataset inlined) is at most this large: 100,000 items of about 2 KiB
/// each.
pub const MAX_BATCH_BYTES: usize = 256 << 20;

/// The batch routes.
pub fn routes() -> Vec<Route> {
    use Verb::{Get, Post};
    vec![
        at(Post, "/v1/batches", create_batch).body_limit(MAX_BATCH_BYTES),
        at(Get, "/v1/batches", list_batches),
        at(Get, "/v1/batches/:id", batch_status),
        at(Get, "/v1/batches/:id/summary", batch_summary),
        at(Post, "/v1/batches/:id/cancel", cancel_batch),
        at(Get, "/v1/batches/:id/report", batch_report),
        at(Get, "/v1/batches/:id/junit", batch_junit),
        at(Post, "/v1/batches/:id/rerun", rerun_batch),
        at(Get, "/v1/batches/:id/compare/:other", compare_batches),
        at(Get, "/v1/batches/:id/html", batch_html),
    ]
}

/// A batch and its counts (`GET /v1/batches/:id`).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchView {
    #[schema(value_type = Object)]
    pub counts: BatchCounts,
    /// Done, running, queued, the pass rate and cost so far, the ETA at the pace so far.
    pub progress: Progress,
    #[schema(value_type = Object)]
    pub batch: BatchState,
}

impl BatchView {
    fn of(c: &Coordinator, batch: BatchState) -> Json<Self> {
        Json(BatchView {
            counts: batch.counts(),
            progress: progress(batch.header(), c.clock.now()),
            batch,
        })
    }
}

/// A batch's counts and progress without its items (`GET /v1/batches/:id/summary`): read from
/// its header alone, so as cheap for 100,000 items as for one.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchSummary {
    #[schema(value_type = Object)]
    pub counts: BatchCounts,
    pub progress: Progress,
    #[schema(value_type = Object)]
    pub batch: HeaderOnly,
}

/// A batch's header in the place of the whole batch: `items` is always empty.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeaderOnly {
    #[serde(flatten)]
    pub header: BatchHeader,
    pub items: [BatchItem; 0],
}

impl BatchSummary {
    fn of(c: &Coordinator, header: BatchHeader) -> Json<Self> {
        Json(BatchSummary {
            counts: header.counts,
            progress: progress(&header, c.clock.now()),
            batch: HeaderOnly { header, items: [] },
        })
    }
}

/// 201 for a new batch, 200 for one submitted before.
fn created_status(submitted: &BatchSubmitted) -> StatusCode {
    if submitted.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}

/// One line of `GET /v1/batches`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchListing {
    #[schema(value_type = String)]
    pub batch_id: BatchId,
    pub graph: String,
    #[schema(value_type = Object)]
    pub counts: BatchCounts,
    pub finished: bool,
    pub cancelled: bool,
}

async fn load(c: &Coordinator, id: &str) -> Result<(BatchState, u64), ApiError> {
    let id = BatchId::new(id);
    if let Some(found) = c.store.load_batch(&id).await.map_err(DriverError::from)? {
        return Ok(found);
    }
    // A batch the store lost is read back from its mirror (read only).
    match c.blobs.get_json::<BatchState>(&state_key(&id)).await {
        Ok(s) => Ok((s, 0)),
        Err(_) => Err(DriverError::UnknownBatch(id).into()),
    }
}

async fn load_header(c: &Coordinator, id: &str) -> Result<(BatchHeader, u64), ApiError> {
    let id = BatchId::new(id);
    if let Some(found) = c.store.batch_header(&id).await.map_err(DriverError::from)? {
        return Ok(found);
    }
    let (whole, version) = load(c, id.as_str()).await?;
    Ok((whole.header().clone(), version))
}

/// Submits a batch: a graph, a JSONL dataset, the agent and the batch's options.
#[utoipa::path(
    post, path = "/v1/batches",
    request_body = BatchRequest,
    responses(
        (status = 201, body = BatchSubmitted, description = "the batch was created"),
        (status = 200, body = BatchSubmitted, description = "the same batch was submitted before"),
        (status = 400, body = shared::http::ErrorBody, description = "malformed, or an invalid graph or dataset"),
    )
)]
pub async fn create_batch(
    State(c): State<Arc<Coordinator>>,
    axum::Extension(p): axum::Extension<shared::auth::Principal>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<BatchSubmitted>), ApiError> {
    let mut req: BatchRequest = serde_json::from_slice(&body)
        .map_err(|e| DriverError::from(SubmitError::Input(format!("malformed batch: {e}"))))?;
    // The caller's team, whatever the body says.
    req.team = p.team;
    let submitted = submit_batch(&c, req).await?;
    Ok((created_status(&submitted), Json(submitted)))
}

#[utoipa::path(get, path = "/v1/batches", responses((status = 200, body = Vec<BatchListing>)))]
pub async fn list_batches(
    State(c): State<Arc<Coordinator>>,
    axum::Extension(p): axum::Extension<shared::auth::Principal>,
) -> Result<Json<Vec<BatchListing>>, ApiError> {
    let mut out = Vec::new();
    for id in c.store.list_batches().await.map_err(DriverError::from)? {
        if let Some((b, _)) = c.store.batch_header(&id).await.map_err(DriverError::from)? {
            if !p.sees(b.team.as_deref()) {
                continue;
            }
            out.push(BatchListing {
                counts: b.counts,
                finished: b.is_finished(),
                cancelled: b.cancelled,
                graph: b.graph,
                batch_id: b.batch_id,
            });
        }
    }
    Ok(Json(out))
}

#[utoipa::path(
    get, path = "/v1/batches/{id}",
    params(("id" = String, Path, description = "the batch's id")),
    responses((status = 200, body = BatchView), (status = 404, body = shared::http::ErrorBody))
)]
pub async fn batch_status(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<Json<BatchView>, ApiError> {
    let (batch, _) = load(&c, &id).await?;
    Ok(BatchView::of(&c, batch))
}

/// A batch's counts and progress without its items (`items` is empty): cheap enough to poll
/// while a 100,000-item batch runs.
#[utoipa::path(
    get, path = "/v1/batches/{id}/summary",
    params(("id" = String, Path, description = "the batch's id")),
    responses((status = 200, body = BatchSummary), (status = 404, body = shared::http::ErrorBody))
)]
pub async fn batch_summary(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<Json<BatchSummary>, ApiError> {
    let (header, _) = load_header(&c, &id).await?;
    Ok(BatchSummary::of(&c, header))
}

/// Cancels a batch: queued items never start (the coordinators cancel them), running runs are
/// cancelled. Answers the batch's summary.
#[utoipa::path(
    post, path = "/v1/batches/{id}/cancel",
    params(("id" = String, Path, description = "the batch's id")),
    responses((status = 200, body = BatchSummary), (status = 404, body = shared::http::ErrorBody))
)]
pub async fn cancel_batch(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<Json<BatchSummary>, ApiError> {
    let batch_id = BatchId::new(&id);
    loop {
        let read = c
            .store
            .batch_slice(&batch_id, 0)
            .await
            .map_err(DriverError::from)?;
        let Some((mut slice, version)) = read else {
            // Only a batch the store lost may be found elsewhere (its mirror): read only.
            let (header, _) = load_header(&c, &id).await?;
            return Ok(BatchSummary::of(&c, header));
        };
        if !slice.cancel(c.clock.now()) {
            return Ok(BatchSummary::of(&c, slice.header().clone()));
        }
        let outcome = c
            .store
            .commit_batch(&slice, version)
            .await
            .map_err(DriverError::from)?;
        if outcome == CasOutcome::Committed {
            c.batch_wake.notify_one();
            return Ok(BatchSummary::of(&c, slice.header().clone()));
        }
    }
}

/// The batch's report: every item, verdicts, pass rate with its interval, cost, tokens, time.
#[utoipa::path(
    get, path = "/v1/batches/{id}/report",
    params(("id" = String, Path, description = "the batch's id")),
    responses((status = 200, body = Object), (status = 404, body = shared::http::ErrorBody))
)]
pub async fn batch_report(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (batch, _) = load(&c, &id).await?;
    Ok(Json(shared::batch::json_report(&batch)))
}

/// The batch as JUnit XML: one test case per item (and trial), for CI systems.
#[utoipa::path(
    get, path = "/v1/batches/{id}/junit",
    params(("id" = String, Path, description = "the batch's id")),
    responses(
        (status = 200, body = String, content_type = "application/xml"),
        (status = 404, body = shared::http::ErrorBody),
    )
)]
pub async fn batch_junit(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let (batch, _) = load(&c, &id).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/xml")],
        shared::batch::junit_xml(&batch),
    ))
}

/// The batch as one self-contained HTML page for people: summary, charts, failures, every item.
#[utoipa::path(
    get, path = "/v1/batches/{id}/html",
    params(("id" = String, Path, description = "the batch's id")),
    responses(
        (status = 200, body = String, content_type = "text/html; charset=utf-8"),
        (status = 404, body = shared::http::ErrorBody),
    )
)]
pub async fn batch_html(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let (batch, _) = load(&c, &id).await?;
    Ok((
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        shared::batch::html_report(&batch),
    ))
}

/// Which items of a batch a rerun takes.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RerunWhich {
    /// Items with a failing verdict.
    Failed,
    /// Items that ended on an infrastructure error.
    Errored,
    /// Every item that did not pass (failed, errored, cancelled).
    NotPassed,
    /// Every item (a nightly rerun: with the step cache, only what changed runs again).
    All,
}

#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RerunBody {
    pub which: RerunWhich,
}

/// A new batch of the chosen items of this one (same graph, agent, options and spec, labelled
/// `rerun_of=<id>`).
#[utoipa::path(
    post, path = "/v1/batches/{id}/rerun",
    params(("id" = String, Path, description = "the batch's id")),
    request_body = RerunBody,
    responses(
        (status = 201, body = BatchSubmitted, description = "the new batch"),
        (status = 200, body = BatchSubmitted, description = "the same rerun was made before"),
        (status = 400, body = shared::http::ErrorBody, description = "no item to rerun"),
        (status = 404, body = shared::http::ErrorBody),
    )
)]
pub async fn rerun_batch(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
    Json(body): Json<RerunBody>,
) -> Result<(StatusCode, Json<BatchSubmitted>), ApiError> {
    use shared::batch::ItemState;
    let (batch, _) = load(&c, &id).await?;
    let chosen: std::collections::BTreeSet<&str> = batch
        .items
        .iter()
        .filter(|i| match body.which {
            RerunWhich::Failed => i.state == ItemState::Failed,
            RerunWhich::Errored => i.state == ItemState::Errored,
            RerunWhich::NotPassed => i.state.is_settled() && i.state != ItemState::Passed,
            RerunWhich::All => true,
        })
        .map(|i| i.item_id.as_str())
        .collect();
    if chosen.is_empty() {
        let why = format!("batch `{id}` has no item to rerun ({:?})", body.which);
        return Err(DriverError::from(SubmitError::Input(why.to_lowercase())).into());
    }
    let mut req: BatchRequest = c
        .blobs
        .get_json(&request_key(&batch.batch_id))
        .await
        .map_err(DriverError::from)?;
    let items = shared::batch::parse_dataset(&req.dataset)
        .map_err(|e| DriverError::from(SubmitError::Input(e.to_string())))?;
    let mut dataset = String::new();
    for item in items.iter().filter(|i| chosen.contains(i.id.as_str())) {
        let line = serde_json::to_string(item)
            .map_err(|e| DriverError::from(SubmitError::Input(e.to_string())))?;
        dataset.push_str(&line);
        dataset.push('\n');
    }
    req.dataset = dataset;
    req.spec
        .labels
        .insert("rerun_of".into(), batch.batch_id.to_string());
    let submitted = submit_batch(&c, req).await?;
    Ok((created_status(&submitted), Json(submitted)))
}

/// `{other}` against `{id}`: improved, regressed and flipped items, cost deltas.
#[utoipa::path(
    get, path = "/v1/batches/{id}/compare/{other}",
    params(
        ("id" = String, Path, description = "the batch before"),
        ("other" = String, Path, description = "the batch after"),
    ),
    responses((status = 200, body = Object), (status = 404, body = shared::http::ErrorBody))
)]
pub async fn compare_batches(
    State(c): State<Arc<Coordinator>>,
    Path((id, other)): Path<(String, String)>,
) -> Result<Json<shared::batch::Comparison>, ApiError> {
    let (before, _) = load(&c, &id).await?;
    let (after, _) = load(&c, &other).await?;
    Ok(Json(shared::batch::compare(&before, &after)))
}
