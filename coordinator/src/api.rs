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
use shared::http;
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
        .route("/v1/runs/:id/artifacts/*key", get(get_run_artifact))
        .route("/v1/artifacts/*key", get(get_artifact))
        .with_state(coord)
}

pub struct ApiError(StatusCode, String, Vec<String>);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = shared::http::ErrorBody {
            error: self.1,
            details: self.2,
        };
        (self.0, Json(body)).into_response()
    }
}

impl From<DriverError> for ApiError {
    fn from(e: DriverError) -> Self {
        match e {
            DriverError::Submit(SubmitError::Graph(details)) => {
                ApiError(StatusCode::BAD_REQUEST, "invalid graph".into(), details)
            }
            DriverError::Submit(s @ SubmitError::Conflict(_)) => {
                ApiError(StatusCode::CONFLICT, s.to_string(), vec![])
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
) -> ApiResult<(StatusCode, Json<http::Submitted>)> {
    let malformed = |e: String| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("malformed submission: {e}"),
            vec![],
        )
    };
    let mut body: Value = serde_json::from_slice(&body).map_err(|e| malformed(e.to_string()))?;
    // `run_id`: an id the submitter chooses instead of the derived one.
    let requested = match body.as_object_mut().and_then(|o| o.remove("run_id")) {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id),
        Some(other) => return Err(malformed(format!("run_id must be a string, not {other}"))),
    };
    let req: SubmitRequest = serde_json::from_value(body).map_err(|e| malformed(e.to_string()))?;
    let resp = submit::submit_as(&c, req, requested).await?;
    let status = if resp.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let body = http::Submitted {
        v: http::API_VERSION,
        run_id: resp.run_id.to_string(),
        created: resp.created,
    };
    Ok((status, Json(body)))
}

async fn list_runs(State(c): State<Arc<Coordinator>>) -> ApiResult<Json<Vec<http::RunListing>>> {
    let mut out = Vec::new();
    for id in c.store.list().await.map_err(DriverError::from)? {
        if let Ok(s) = c.load(&id).await {
            out.push(http::RunListing::of(&s));
        }
    }
    Ok(Json(out))
}

/// The status view: run, visits, every job with its state, usage.
pub fn status_view(s: &RunState) -> http::StatusView {
    http::StatusView::of(s)
}

async fn run_status(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> ApiResult<Json<http::StatusView>> {
    let s = c.load(&RunId::new(id)).await?;
    Ok(Json(status_view(&s)))
}

/// The status without the job list: cheap enough to poll while a large fan-out runs.
async fn run_summary(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> ApiResult<Json<http::RunSummary>> {
    let s = c.load(&RunId::new(id)).await?;
    Ok(Json(http::RunSummary::of(&s)))
}

async fn run_result(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> ApiResult<Json<http::RunOutcome>> {
    let s = c.load(&RunId::new(id)).await?;
    match s.result {
        Some(result) => Ok(Json(http::RunOutcome {
            v: http::API_VERSION,
            status: s.status,
            result,
            usage: s.usage,
        })),
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
) -> ApiResult<Json<http::CancelAnswer>> {
    let run = RunId::new(id);
    let applied = match c.cancel(&run).await? {
        shared::engine::Applied::Changed => http::CancelEffect::Cancelled,
        _ => http::CancelEffect::AlreadyFinished,
    };
    let s = c.load(&run).await?;
    Ok(Json(http::CancelAnswer {
        v: http::API_VERSION,
        run_id: run,
        status: s.status,
        applied: Some(applied),
    }))
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
) -> ApiResult<Json<http::Decided>> {
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
    Ok(Json(http::Decided {
        v: http::API_VERSION,
        run_id: run,
        node: shared::ids::NodeId::new(node),
        applied: applied.to_string(),
        status: s.status,
    }))
}

async fn run_logs(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<http::LogEntry>>> {
    let s = c.load(&RunId::new(id)).await?;
    Ok(Json(http::LogEntry::all(&s)))
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

/// Why an artifact key is refused before anything is read: it must be a plain relative object
/// key (no empty, `.` or `..` segment, no leading `/`, no backslash or control character).
fn key_problem(key: &str) -> Option<&'static str> {
    if key.is_empty() || key.len() > 1024 {
        Some("an artifact key has 1 to 1024 bytes")
    } else if key.starts_with('/') {
        Some("an artifact key is relative, not an absolute path")
    } else if key.chars().any(|c| c == '\\' || c.is_control()) {
        Some("an artifact key has no backslash or control character")
    } else if key
        .split('/')
        .any(|p| p.is_empty() || p == "." || p == "..")
    {
        Some("an artifact key has no empty, `.` or `..` segment")
    } else {
        None
    }
}

fn bad_key(key: &str, why: &str) -> ApiError {
    ApiError(
        StatusCode::BAD_REQUEST,
        format!("invalid artifact key `{key}`: {why}"),
        vec![],
    )
}

/// Whether `key` is one of the run's artifacts: under `runs/<run>/`, or named by one of its
/// jobs' outcomes.
fn belongs_to(state: &RunState, key: &str) -> bool {
    key.starts_with(&format!("runs/{}/", state.run_id))
        || state
            .history
            .iter()
            .any(|o| o.artifacts.values().any(|k| k == key))
}

async fn read_artifact(c: &Coordinator, run: &RunId, key: &str) -> ApiResult<Response> {
    match c.blobs.get(key).await {
        Ok(bytes) => Ok(bytes.into_response()),
        Err(e) if e.is_not_found() => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("run `{run}` has no artifact `{key}`"),
            vec![],
        )),
        Err(e) => Err(DriverError::from(e).into()),
    }
}

/// One artifact of one run: the run must exist and the key must be its own (a key of another
/// run is not served, whatever it names). A key that is neither under `runs/` nor named by
/// one of the run's jobs is taken below the run's folder (`run_summary.json` is
/// `runs/<run>/run_summary.json`).
async fn get_run_artifact(
    State(c): State<Arc<Coordinator>>,
    Path((id, key)): Path<(String, String)>,
) -> ApiResult<Response> {
    if let Some(why) = key_problem(&key) {
        return Err(bad_key(&key, why));
    }
    let run = RunId::new(id);
    if !shared::factory::valid_run_id(run.as_str()) {
        return Err(DriverError::UnknownRun(run).into());
    }
    let state = c.load(&run).await?;
    let key = if key.starts_with("runs/") || belongs_to(&state, &key) {
        key
    } else {
        format!("runs/{run}/{key}")
    };
    if !belongs_to(&state, &key) {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("artifact `{key}` does not belong to run `{run}`"),
            vec![],
        ));
    }
    read_artifact(&c, &run, &key).await
}

/// An artifact by its full key, `runs/<run>/...`: the run it names must exist.
async fn get_artifact(
    State(c): State<Arc<Coordinator>>,
    Path(key): Path<String>,
) -> ApiResult<Response> {
    if let Some(why) = key_problem(&key) {
        return Err(bad_key(&key, why));
    }
    let Some(run) = key
        .strip_prefix("runs/")
        .and_then(|rest| rest.split_once('/'))
        .map(|(run, _)| RunId::new(run))
    else {
        return Err(bad_key(
            &key,
            "only run artifacts (`runs/<run>/...`) can be read",
        ));
    };
    if !shared::factory::valid_run_id(run.as_str()) {
        return Err(DriverError::UnknownRun(run).into());
    }
    c.load(&run).await?;
    read_artifact(&c, &run, &key).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_keys_are_plain_relative_keys() {
        for good in [
            "runs/r1/run_summary.json",
            "runs/r1/attempt_1/se/prompt.md",
            "a",
        ] {
            assert_eq!(key_problem(good), None, "{good}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "runs/r1/../r2/state.json",
            "runs/r1/./x",
            "runs//x",
            "runs/r1/",
            "..",
            "runs\\r1",
            "runs/r1/\u{0}x",
        ] {
            assert!(key_problem(bad).is_some(), "{bad:?}");
        }
        assert!(key_problem(&"x".repeat(1025)).is_some());
    }

    #[test]
    fn a_run_owns_its_folder_and_the_keys_its_jobs_name() {
        let bundle = shared::graph::GraphBundle {
            source: "g.yaml".into(),
            graph: serde_yaml::from_str("name: g\nstart: c\nnodes:\n  c: {kind: command}\n")
                .unwrap(),
            files: Default::default(),
        };
        let mut state = RunState::new(
            shared::engine::NewRun {
                run_id: RunId::new("r1"),
                graph_ref: "graphs/g.json".into(),
                input: json!({}),
                meta: json!({}),
                repo: shared::messages::RepoSnapshot {
                    url: "/repo".into(),
                    base_commit: "c".into(),
                    packs: vec![],
                },
                agent: Default::default(),
            },
            &bundle,
            "2024-01-01T00:00:00Z",
        );
        assert!(belongs_to(&state, "runs/r1/run_summary.json"));
        assert!(!belongs_to(&state, "runs/r10/run_summary.json"));
        assert!(!belongs_to(&state, "runs/r2/run_summary.json"));
        assert!(!belongs_to(&state, "blobs/abc"));
        let mut outcome: shared::engine::Outcome = serde_json::from_value(json!({
            "job_id": "r1.c.1", "node": "c", "visit": 1, "ok": true, "status": "ok",
            "output": {}, "error": null, "commit": null, "artifacts": {},
            "usage": shared::messages::Usage::default(),
            "worker": "w", "started_at": "", "finished_at": "",
        }))
        .unwrap_or_else(|e| panic!("an outcome: {e}"));
        outcome.artifacts.insert("x".into(), "blobs/abc".into());
        state.history.push(outcome);
        assert!(belongs_to(&state, "blobs/abc"));
    }
}
