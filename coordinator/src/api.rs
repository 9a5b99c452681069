//! The HTTP API. Errors become HTTP in one place (`ApiError`).

use crate::driver::{Coordinator, DriverError};
use crate::submit::{self, SubmitError, SubmitRequest};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use shared::engine::RunState;
use shared::ids::RunId;
use std::sync::Arc;
use tracing::error;

pub fn router(coord: Arc<Coordinator>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/v1/runs", post(create_run).get(list_runs))
        .route("/v1/runs/:id", get(run_status))
        .route("/v1/runs/:id/summary", get(run_summary))
        .route("/v1/runs/:id/result", get(run_result))
        .route("/v1/runs/:id/cancel", post(cancel_run))
        .route("/v1/runs/:id/approvals/:node", post(decide))
        .route("/v1/runs/:id/logs", get(run_logs))
        .route("/v1/runs/:id/artifacts", get(list_artifacts))
        .route("/v1/artifacts/*key", get(get_artifact))
        .with_state(coord)
}

pub struct ApiError(StatusCode, String, Vec<String>);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1, "details": self.2}))).into_response()
    }
}

impl From<DriverError> for ApiError {
    fn from(e: DriverError) -> Self {
        match e {
            DriverError::Submit(SubmitError::Graph(details)) => {
                ApiError(StatusCode::BAD_REQUEST, "invalid graph".into(), details)
            }
            DriverError::Submit(s) => ApiError(StatusCode::BAD_REQUEST, s.to_string(), vec![]),
            DriverError::UnknownRun(r) => ApiError(
                StatusCode::NOT_FOUND,
                format!("run `{r}` not found"),
                vec![],
            ),
            other => {
                error!(error = %other, "request failed");
                ApiError(StatusCode::INTERNAL_SERVER_ERROR, other.to_string(), vec![])
            }
        }
    }
}

type ApiResult<T> = Result<T, ApiError>;

async fn metrics(State(c): State<Arc<Coordinator>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        c.metrics.render(),
    )
}

async fn create_run(
    State(c): State<Arc<Coordinator>>,
    body: axum::body::Bytes,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let req: SubmitRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("malformed submission: {e}"),
            vec![],
        )
    })?;
    let resp = submit::submit(&c, req).await?;
    let status = if resp.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(json!(resp))))
}

async fn list_runs(State(c): State<Arc<Coordinator>>) -> ApiResult<Json<Value>> {
    let mut out = Vec::new();
    for id in c.store.list().await.map_err(DriverError::from)? {
        if let Ok(s) = c.load(&id).await {
            out.push(
                json!({"run_id": s.run_id, "graph": s.graph_name, "status": s.status,
                "created_at": s.created_at, "finished_at": s.finished_at}),
            );
        }
    }
    Ok(Json(Value::Array(out)))
}

/// The status view: run, visits, every job with its state, usage.
pub fn status_view(s: &RunState) -> Value {
    let jobs: Vec<Value> = s
        .jobs
        .iter()
        .map(|(id, j)| {
            let outcome = s.history.iter().find(|o| &o.job_id == id);
            json!({
                "job_id": id, "node": j.node, "visit": j.visit, "attempt": j.attempt,
                "state": j.state, "published_at": j.published_at, "finished_at": j.finished_at,
                "status": outcome.map(|o| o.status), "worker": outcome.map(|o| o.worker.clone()),
                "started_at": outcome.map(|o| o.started_at.clone()),
                "ended_at": outcome.map(|o| o.finished_at.clone()),
                "container_seconds": outcome.map(|o| o.container_seconds),
                "error": outcome.and_then(|o| o.error.clone()),
            })
        })
        .collect();
    let joins: serde_json::Map<String, Value> = s
        .joins
        .iter()
        .map(|(n, j)| (n.to_string(), json!({"fired": j.fired, "arrived": j.arrived.keys().collect::<Vec<_>>(), "expected": j.expected})))
        .collect();
    json!({
        "run_id": s.run_id, "graph": s.graph_name, "status": s.status,
        "awaiting_approval": s.awaiting_approval(),
        "approvals": s.approvals,
        "joins": joins,
        "branches": s.branches.len(),
        "visits": s.visits, "jobs": jobs, "usage": s.usage,
        "repo": {"url": s.repo.url, "base_commit": s.repo.base_commit},
        "meta": s.meta,
        "created_at": s.created_at, "updated_at": s.updated_at, "finished_at": s.finished_at,
    })
}

async fn run_status(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let s = c.load(&RunId::new(id)).await?;
    Ok(Json(status_view(&s)))
}

/// The status without the job list: cheap enough to poll while a large fan-out runs.
async fn run_summary(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let s = c.load(&RunId::new(id)).await?;
    Ok(Json(json!({
        "run_id": s.run_id, "graph": s.graph_name, "status": s.status,
        "awaiting_approval": s.awaiting_approval(),
        "visits": s.visits, "usage": s.usage,
        "jobs_total": s.jobs.len(),
        "jobs_pending": s.pending_jobs().count(),
        "created_at": s.created_at, "updated_at": s.updated_at, "finished_at": s.finished_at,
    })))
}

async fn run_result(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let s = c.load(&RunId::new(id)).await?;
    match s.result {
        Some(r) => Ok(Json(
            json!({"status": s.status, "result": r, "usage": s.usage}),
        )),
        None => Err(ApiError(
            StatusCode::CONFLICT,
            format!("run is {:?}", s.status).to_lowercase(),
            vec![],
        )),
    }
}

async fn cancel_run(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let run = RunId::new(id);
    c.cancel(&run).await?;
    let s = c.load(&run).await?;
    Ok(Json(json!({"run_id": run, "status": s.status})))
}

#[derive(serde::Deserialize)]
struct DecideBody {
    approved: bool,
    #[serde(default)]
    by: String,
    #[serde(default)]
    comment: String,
}

async fn decide(
    State(c): State<Arc<Coordinator>>,
    Path((id, node)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult<Json<Value>> {
    let run = RunId::new(id);
    let d: DecideBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("malformed decision: {e}"),
            vec![],
        )
    })?;
    let state = c.load(&run).await?;
    if !state
        .approvals
        .contains_key(&shared::ids::NodeId::new(node.clone()))
    {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("node `{node}` of run `{run}` is not awaiting approval"),
            vec![],
        ));
    }
    let applied = c.decide(&run, &node, d.approved, &d.by, &d.comment).await?;
    let s = c.load(&run).await?;
    let applied = match applied {
        shared::engine::Applied::Changed => "decided",
        _ => "already decided",
    };
    Ok(Json(
        json!({"run_id": run, "node": node, "applied": applied, "status": s.status}),
    ))
}

async fn run_logs(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let s = c.load(&RunId::new(id)).await?;
    let entries: Vec<Value> = s
        .history
        .iter()
        .map(|o| {
            json!({
                "job_id": o.job_id, "node": o.node, "visit": o.visit, "status": o.status,
                "error": o.error, "worker": o.worker, "started_at": o.started_at,
                "finished_at": o.finished_at, "artifacts": o.artifacts, "usage": o.usage,
            })
        })
        .collect();
    Ok(Json(Value::Array(entries)))
}

async fn list_artifacts(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let run = RunId::new(id);
    c.load(&run).await?;
    let keys = c
        .blobs
        .list(&format!("runs/{run}/"))
        .await
        .map_err(DriverError::from)?;
    Ok(Json(json!(keys)))
}

async fn get_artifact(
    State(c): State<Arc<Coordinator>>,
    Path(key): Path<String>,
) -> ApiResult<Response> {
    if !key.starts_with("runs/") || key.split('/').any(|p| p == "..") {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "only run artifacts can be read".into(),
            vec![],
        ));
    }
    match c.blobs.get(&key).await {
        Ok(bytes) => Ok(bytes.into_response()),
        Err(worker::blobs::BlobError::Store(object_store::Error::NotFound { .. })) => {
            Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("no artifact `{key}`"),
                vec![],
            ))
        }
        Err(e) => Err(DriverError::from(e).into()),
    }
}
