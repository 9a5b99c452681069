//! The HTTP API. Errors become HTTP in one place (`ApiError`). Every route is in `routes()`,
//! with what it needs (`Access`: a GET reads, a POST writes, unless the table says otherwise):
//! the router serves those behind the token guard (`crate::auth_api`), and the OpenAPI
//! document (`crate::openapi`, served at `/v1/openapi.json`) is checked against them.

use crate::batches::api as batches;
use crate::driver::{Coordinator, DriverError};
use crate::openapi::{NoSuchRun, RunPath};
use crate::submit::{self, SubmitError, SubmitRequest};
use crate::{decisions_api, tree_api};
use axum::extract::{Path, State};
use axum::handler::Handler;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::{Json, Router};
use serde_json::Value;
use shared::auth::{Access, Principal};
use shared::engine::RunState;
use shared::http;
use shared::ids::RunId;
use std::sync::Arc;
use tracing::error;

/// The methods the API serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Get,
    Post,
}

impl Verb {
    /// Lowercase, as an OpenAPI path item names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::Post => "post",
        }
    }

    fn filter(self) -> MethodFilter {
        match self {
            Verb::Get => MethodFilter::GET,
            Verb::Post => MethodFilter::POST,
        }
    }
}

/// One route: a method, a path in axum's syntax (`:param`, `*rest`), what a caller's token
/// must allow, and what serves it.
pub struct Route {
    pub verb: Verb,
    pub path: &'static str,
    pub access: Access,
    serve: MethodRouter<Arc<Coordinator>>,
}

impl Route {
    /// Served without a token.
    pub(crate) fn public(mut self) -> Route {
        self.access = Access::Public;
        self
    }

    /// Served to admins' tokens only.
    pub(crate) fn admin(mut self) -> Route {
        self.access = Access::Admin;
        self
    }

    /// The route takes request bodies of up to `bytes` (axum's default is 2 MiB).
    pub(crate) fn body_limit(mut self, bytes: usize) -> Route {
        self.serve = self
            .serve
            .layer(axum::extract::DefaultBodyLimit::max(bytes));
        self
    }
}

pub(crate) fn at<H, T>(verb: Verb, path: &'static str, handler: H) -> Route
where
    H: Handler<T, Arc<Coordinator>>,
    T: 'static,
{
    let serve = on(verb.filter(), handler);
    let access = match verb {
        Verb::Get => Access::Read,
        Verb::Post => Access::Write,
    };
    Route {
        verb,
        path,
        access,
        serve,
    }
}

/// Every route of the API, in one place: `router` serves exactly these.
pub fn routes() -> Vec<Route> {
    use Verb::{Get, Post};
    let mut all = vec![
        at(Get, "/healthz", crate::health::healthz).public(),
        at(Get, "/metrics", crate::health::metrics).public(),
        at(Get, "/v1/openapi.json", openapi).public(),
        at(Post, "/v1/runs", create_run),
        at(Get, "/v1/runs", list_runs),
        at(Get, "/v1/runs/:id", run_status),
        at(Get, "/v1/runs/:id/summary", run_summary),
        at(Post, "/v1/runs/:id/cancel", cancel_run),
        at(Get, "/v1/runs/:id/logs", run_logs),
        at(Get, "/v1/runs/:id/artifacts", list_artifacts),
        at(Get, "/v1/runs/:id/artifacts/*key", get_run_artifact),
        at(Get, "/v1/artifacts/*key", get_artifact),
    ];
    all.extend(crate::result_wait::routes());
    all.extend(batches::routes());
    all.extend(tree_api::routes());
    all.extend(decisions_api::routes());
    all.extend(crate::tracking_api::routes());
    all.extend(crate::auth_api::routes());
    all.extend(crate::uploads::routes());
    all.extend(crate::team_api::routes());
    all.extend(crate::web::routes());
    crate::schedules::api::and_schedule_routes(all)
}

/// Every route behind its guard: the token checked against the route's access, and every
/// run, batch, schedule or artifact the path names checked to be the caller's team's.
pub fn router(coord: Arc<Coordinator>) -> Router {
    routes()
        .into_iter()
        .fold(Router::new(), |r, route| {
            let guard = crate::auth_api::Guard {
                coord: coord.clone(),
                path: route.path,
                access: route.access,
            };
            let timed = crate::api_timing::Timed {
                coord: coord.clone(),
                path: route.path,
                verb: route.verb,
            };
            let serve = route
                .serve
                .route_layer(axum::middleware::from_fn_with_state(
                    guard,
                    crate::auth_api::guard,
                ))
                .route_layer(axum::middleware::from_fn_with_state(
                    timed,
                    crate::api_timing::timed_request,
                ));
            r.route(route.path, serve)
        })
        .with_state(coord)
}

/// What a 503 tells a client to wait before trying again, in seconds.
const RETRY_AFTER_SECONDS: &str = "2";

pub struct ApiError(
    pub(crate) StatusCode,
    pub(crate) String,
    pub(crate) Vec<String>,
);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = shared::http::ErrorBody {
            error: self.1,
            details: self.2,
        };
        if self.0 == StatusCode::SERVICE_UNAVAILABLE {
            // A server the request needs is away: the client may try again shortly.
            return (
                self.0,
                [(header::RETRY_AFTER, RETRY_AFTER_SECONDS)],
                Json(body),
            )
                .into_response();
        }
        if self.0 == StatusCode::PAYLOAD_TOO_LARGE {
            // Refused before its body was read to the end: the rest of it is still on the
            // connection, which a client must not send its next request on.
            return (self.0, [(header::CONNECTION, "close")], Json(body)).into_response();
        }
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
            DriverError::Submit(s @ SubmitError::Quota(_)) => {
                ApiError(StatusCode::TOO_MANY_REQUESTS, s.to_string(), vec![])
            }
            DriverError::Submit(s) => ApiError(StatusCode::BAD_REQUEST, s.to_string(), vec![]),
            DriverError::UnknownRun(r) => ApiError(
                StatusCode::NOT_FOUND,
                format!("run `{r}` not found"),
                vec![],
            ),
            e @ DriverError::UnknownBatch(_) => {
                ApiError(StatusCode::NOT_FOUND, e.to_string(), vec![])
            }
            DriverError::Store(e @ shared::ports::PortError::Connection(_)) => {
                tracing::warn!(error = %e, "request failed: the run store is away");
                ApiError::unavailable(&e)
            }
            other => {
                error!(error = %other, "request failed");
                ApiError(StatusCode::INTERNAL_SERVER_ERROR, other.to_string(), vec![])
            }
        }
    }
}

impl ApiError {
    /// 503 (with `retry-after`): a server the request needs did not answer.
    pub(crate) fn unavailable(why: &dyn std::fmt::Display) -> ApiError {
        ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("a server the fleet needs is away; try again shortly ({why})"),
            vec![],
        )
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// This API's OpenAPI document.
#[utoipa::path(
    get, path = "/v1/openapi.json",
    responses((status = 200, body = Object, description = "the OpenAPI 3.1 document"))
)]
pub(crate) async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(crate::openapi::document())
}

/// Submits a run; `run_id` (optional) is the id the submitter chooses instead of the derived one.
#[utoipa::path(
    post, path = "/v1/runs",
    request_body = SubmitRequest,
    responses(
        (status = 201, body = http::Submitted, description = "the run was created"),
        (status = 200, body = http::Submitted, description = "the same submission was made before"),
        (status = 400, body = http::ErrorBody, description = "malformed, or an invalid graph"),
        (status = 409, body = http::ErrorBody, description = "`run_id` names another run"),
    )
)]
async fn create_run(
    State(c): State<Arc<Coordinator>>,
    axum::Extension(p): axum::Extension<Principal>,
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
    let mut req: SubmitRequest =
        serde_json::from_value(body).map_err(|e| malformed(e.to_string()))?;
    req.team = p.team;
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

#[utoipa::path(get, path = "/v1/runs", responses((status = 200, body = Vec<http::RunListing>)))]
async fn list_runs(
    State(c): State<Arc<Coordinator>>,
    axum::Extension(p): axum::Extension<Principal>,
) -> ApiResult<Json<Vec<http::RunListing>>> {
    let mut out = Vec::new();
    for id in c.store.list().await.map_err(DriverError::from)? {
        match c.load(&id).await {
            Ok(s) if p.sees(s.team.as_deref()) => out.push(http::RunListing::of(&s)),
            _ => {}
        }
    }
    Ok(Json(out))
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct StatusQuery {
    /// Only the jobs of this node (a look at one node of a large run renders none of the
    /// others); every job when absent.
    node: Option<String>,
}

/// The status view: run, visits, every job (or one node's, with `node`) with its state, usage.
#[utoipa::path(
    get, path = "/v1/runs/{id}",
    params(RunPath, StatusQuery),
    responses((status = 200, body = http::StatusView), NoSuchRun)
)]
async fn run_status(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
    axum::extract::Query(q): axum::extract::Query<StatusQuery>,
) -> ApiResult<Json<http::StatusView>> {
    let node = q.node.map(shared::ids::NodeId::new);
    let view = (c.peek(&RunId::new(id), |s| {
        http::StatusView::of_node(s, node.as_ref())
    }))
    .await?;
    Ok(Json(view))
}

/// The status without the job list: cheap enough to poll while a large fan-out runs.
#[utoipa::path(
    get, path = "/v1/runs/{id}/summary",
    params(RunPath),
    responses((status = 200, body = http::RunSummary), NoSuchRun)
)]
async fn run_summary(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> ApiResult<Json<http::RunSummary>> {
    let summary = c.peek(&RunId::new(id), http::RunSummary::of).await?;
    Ok(Json(summary))
}

#[utoipa::path(
    post, path = "/v1/runs/{id}/cancel",
    params(RunPath),
    responses((status = 200, body = http::CancelAnswer), NoSuchRun)
)]
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

/// The run's finished jobs.
#[utoipa::path(
    get, path = "/v1/runs/{id}/logs",
    params(RunPath),
    responses((status = 200, body = Vec<http::LogEntry>), NoSuchRun)
)]
async fn run_logs(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<http::LogEntry>>> {
    let s = c.load(&RunId::new(id)).await?;
    Ok(Json(http::LogEntry::all(&s)))
}

#[utoipa::path(
    get, path = "/v1/runs/{id}/artifacts",
    params(RunPath),
    responses((status = 200, body = http::ArtifactListing), NoSuchRun)
)]
async fn list_artifacts(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> ApiResult<Json<http::ArtifactListing>> {
    let run = RunId::new(id);
    let state = c.load(&run).await?;
    let stored = c
        .blobs
        .list(&format!("runs/{run}/"))
        .await
        .map_err(DriverError::from)?;
    Ok(Json(http::ArtifactListing::of(&state, stored)))
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
#[utoipa::path(
    get, path = "/v1/runs/{id}/artifacts/{key}",
    params(RunPath, ("key" = String, Path, description = "an object key; may contain `/`")),
    responses(
        (status = 200, description = "the artifact's bytes", content(("application/octet-stream"))),
        (status = 400, body = http::ErrorBody, description = "an invalid key"),
        (status = 404, body = http::ErrorBody, description = "no such run or artifact"),
    )
)]
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
#[utoipa::path(
    get, path = "/v1/artifacts/{key}",
    params(("key" = String, Path, description = "an object key; may contain `/`")),
    responses(
        (status = 200, description = "the artifact's bytes", content(("application/octet-stream"))),
        (status = 400, body = http::ErrorBody, description = "an invalid key, or not a run's"),
        (status = 404, body = http::ErrorBody, description = "no such run or artifact"),
    )
)]
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
    use serde_json::json;

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
            graph: serde_yaml::from_str(
                "name: g\nstart: c\nnodes:\n  c: {kind: command, commands: [x]}\n",
            )
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
            "2024-01-01T00:00:00Z".parse().unwrap(),
        );
        assert!(belongs_to(&state, "runs/r1/run_summary.json"));
        assert!(!belongs_to(&state, "runs/r10/run_summary.json"));
        assert!(!belongs_to(&state, "runs/r2/run_summary.json"));
        assert!(!belongs_to(&state, "blobs/abc"));
        let mut outcome: shared::engine::Outcome = serde_json::from_value(json!({
            "job_id": "r1.c.1", "node": "c", "visit": 1, "ok": true, "status": "ok",
            "output": {}, "error": null, "commit": null, "artifacts": {},
            "usage": shared::messages::Usage::default(),
            "worker": "w", "started_at": "2024-01-01T00:00:00.000Z",
            "finished_at": "2024-01-01T00:00:01.000Z",
        }))
        .unwrap_or_else(|e| panic!("an outcome: {e}"));
        outcome.artifacts.insert("x".into(), "blobs/abc".into());
        state.history.push(outcome);
        assert!(belongs_to(&state, "blobs/abc"));
    }
}
