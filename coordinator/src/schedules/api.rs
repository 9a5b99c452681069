//! The schedule routes of the HTTP API (added to `crate::api::routes` by [`and_schedule_routes`],
//! documented in the OpenAPI document like the others). No answer carries a webhook's secret
//! or the path of its URL.

use super::report::body_key;
use super::ScheduleRequest;
use super::{add_schedule, load, remove_schedule, run_now, Fired, ScheduleAdded, ScheduleError};
use crate::api::{at, ApiError, Route, Verb};
use crate::driver::{Coordinator, DriverError};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use shared::batch::BatchSpec;
use shared::http::ErrorBody;
use shared::ids::BatchId;
use shared::schedule::{shown_url, DeliveryState, Firing, FiringStage, ScheduleDef, Webhook};
use std::sync::Arc;

/// `routes` and the schedule routes.
pub fn and_schedule_routes(mut routes: Vec<Route>) -> Vec<Route> {
    use Verb::{Get, Post};
    routes.extend([
        at(Post, "/v1/schedules", create_schedule),
        at(Get, "/v1/schedules", list_schedules),
        at(Get, "/v1/schedules/:name", show_schedule),
        at(Post, "/v1/schedules/:name/run", run_schedule),
        at(Post, "/v1/schedules/:name/remove", delete_schedule),
        at(Get, "/v1/schedules/:name/reports/:batch", schedule_report),
    ]);
    routes
}

/// Schedule errors as HTTP (those of the layers below as `ApiError` makes them).
impl IntoResponse for ScheduleError {
    fn into_response(self) -> Response {
        use shared::schedule::ScheduleError as Invalid;
        let (status, error, details) = match self {
            ScheduleError::Invalid(Invalid::Graph(details)) => (
                StatusCode::BAD_REQUEST,
                "invalid graph".to_string(),
                details,
            ),
            e @ ScheduleError::Invalid(_) => (StatusCode::BAD_REQUEST, e.to_string(), vec![]),
            e @ (ScheduleError::Exists(_)
            | ScheduleError::TooMany
            | ScheduleError::TeamTooMany(..)
            | ScheduleError::Busy(_)) => (StatusCode::CONFLICT, e.to_string(), vec![]),
            e @ (ScheduleError::Unknown(_) | ScheduleError::NoReport(..)) => {
                (StatusCode::NOT_FOUND, e.to_string(), vec![])
            }
            ScheduleError::Driver(e) => return ApiError::from(e).into_response(),
        };
        (status, Json(ErrorBody { error, details })).into_response()
    }
}

/// A webhook as answered: where it goes (scheme and host), and that a secret is set.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct WebhookView {
    /// The scheme and authority, `/…` when a path follows (it may hold a token).
    pub url: String,
    pub secret_set: bool,
}

impl WebhookView {
    fn of(hook: &Option<Webhook>) -> Option<Self> {
        hook.as_ref().map(|h| WebhookView {
            url: shown_url(&h.url),
            secret_set: !h.secret.is_empty(),
        })
    }
}

/// One line of `GET /v1/schedules`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ScheduleListing {
    pub name: String,
    pub cron: String,
    pub graph: String,
    pub next_fire_at: Option<DateTime<Utc>>,
    pub webhook: Option<WebhookView>,
    /// Firings kept in the state (the newest 100 settled ones, and every unsettled one).
    pub firings: usize,
    #[schema(value_type = Option<String>)]
    pub last_batch_id: Option<BatchId>,
    pub last_delivery: Option<DeliveryState>,
}

/// A schedule: what it fires, when, and every firing with its delivery log
/// (`GET /v1/schedules/:name`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ScheduleView {
    pub name: String,
    pub cron: String,
    /// The graph's name and the sha256 of its bundle.
    pub graph: String,
    pub graph_hash: String,
    pub dataset_sha256: String,
    /// Items of the dataset.
    pub items: usize,
    #[schema(value_type = Object)]
    pub spec: BatchSpec,
    pub webhook: Option<WebhookView>,
    pub created_at: DateTime<Utc>,
    /// The latest tick claimed.
    pub last_tick: DateTime<Utc>,
    pub next_fire_at: Option<DateTime<Utc>>,
    /// Oldest first.
    pub firings: Vec<Firing>,
}

/// Answer of `POST /v1/schedules/:name/remove`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Removed {
    pub name: String,
    pub removed: bool,
}

fn items(def: &ScheduleDef) -> usize {
    shared::batch::parse_dataset(&def.dataset).map_or(0, |i| i.len())
}

/// Adds a schedule: a name, a cron expression, the batch it fires and an optional webhook.
#[utoipa::path(
    post, path = "/v1/schedules",
    request_body = ScheduleRequest,
    responses(
        (status = 201, body = ScheduleAdded, description = "the schedule was added"),
        (status = 400, body = shared::http::ErrorBody, description = "malformed, or a bad name, cron expression, graph, dataset, spec or webhook"),
        (status = 409, body = shared::http::ErrorBody, description = "a schedule has that name"),
    )
)]
pub async fn create_schedule(
    State(c): State<Arc<Coordinator>>,
    axum::Extension(p): axum::Extension<shared::auth::Principal>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<ScheduleAdded>), ScheduleError> {
    let mut req: ScheduleRequest = serde_json::from_slice(&body).map_err(|e| {
        let why = format!("malformed schedule: {e}");
        DriverError::from(crate::submit::SubmitError::Input(why))
    })?;
    req.team = p.team;
    let added = add_schedule(&c, req).await?;
    Ok((StatusCode::CREATED, Json(added)))
}

#[utoipa::path(get, path = "/v1/schedules", responses((status = 200, body = Vec<ScheduleListing>)))]
pub async fn list_schedules(
    State(c): State<Arc<Coordinator>>,
    axum::Extension(p): axum::Extension<shared::auth::Principal>,
) -> Result<Json<Vec<ScheduleListing>>, ScheduleError> {
    let mut out = Vec::new();
    for name in c.store.list_schedules().await.map_err(DriverError::from)? {
        let (Ok(l), Some((state, _))) = (
            load(&c, &name).await,
            c.store
                .schedule_state(&name)
                .await
                .map_err(DriverError::from)?,
        ) else {
            continue;
        };
        if !p.sees(l.def.team.as_deref()) {
            continue;
        }
        let last = state.firings.last();
        out.push(ScheduleListing {
            cron: l.def.cron.clone(),
            graph: l.def.graph.graph.name.clone(),
            next_fire_at: l.cron.next_after(state.last_tick.max(c.clock.now())),
            webhook: WebhookView::of(&l.def.webhook),
            firings: state.firings.len(),
            last_batch_id: last.map(|f| f.batch_id.clone()),
            last_delivery: last.and_then(|f| f.delivery.as_ref()).map(|d| d.state),
            name: shared::schedule::shown_name(&name).to_string(),
        });
    }
    Ok(Json(out))
}

#[utoipa::path(
    get, path = "/v1/schedules/{name}",
    params(("name" = String, Path, description = "the schedule's name")),
    responses((status = 200, body = ScheduleView), (status = 404, body = shared::http::ErrorBody))
)]
pub async fn show_schedule(
    State(c): State<Arc<Coordinator>>,
    axum::Extension(p): axum::Extension<shared::auth::Principal>,
    Path(name): Path<String>,
) -> Result<Json<ScheduleView>, ScheduleError> {
    let name = shared::schedule::stored_name(p.team.as_deref(), &name);
    let l = load(&c, &name).await?;
    let (state, _) = c
        .store
        .schedule_state(&name)
        .await
        .map_err(DriverError::from)?
        .ok_or_else(|| ScheduleError::Unknown(name.clone()))?;
    let def = &l.def;
    Ok(Json(ScheduleView {
        name: shared::schedule::shown_name(&def.name).to_string(),
        cron: def.cron.clone(),
        graph: def.graph.graph.name.clone(),
        graph_hash: def.graph.hash(),
        dataset_sha256: def.dataset_sha256.clone(),
        items: items(def),
        spec: def.spec.clone(),
        webhook: WebhookView::of(&def.webhook),
        created_at: def.created_at,
        next_fire_at: l.cron.next_after(state.last_tick.max(c.clock.now())),
        last_tick: state.last_tick,
        firings: state.firings,
    }))
}

/// Fires the schedule now, as a batch with an id of its own; the schedule's ticks go on as
/// before.
#[utoipa::path(
    post, path = "/v1/schedules/{name}/run",
    params(("name" = String, Path, description = "the schedule's name")),
    responses(
        (status = 201, body = Fired, description = "the batch fired"),
        (status = 404, body = shared::http::ErrorBody),
    )
)]
pub async fn run_schedule(
    State(c): State<Arc<Coordinator>>,
    axum::Extension(p): axum::Extension<shared::auth::Principal>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<Fired>), ScheduleError> {
    let fired = run_now(&c, &shared::schedule::stored_name(p.team.as_deref(), &name)).await?;
    Ok((StatusCode::CREATED, Json(fired)))
}

/// Removes the schedule: no more firings; batches it fired go on, unreported.
#[utoipa::path(
    post, path = "/v1/schedules/{name}/remove",
    params(("name" = String, Path, description = "the schedule's name")),
    responses((status = 200, body = Removed), (status = 404, body = shared::http::ErrorBody))
)]
pub async fn delete_schedule(
    State(c): State<Arc<Coordinator>>,
    axum::Extension(p): axum::Extension<shared::auth::Principal>,
    Path(name): Path<String>,
) -> Result<Json<Removed>, ScheduleError> {
    remove_schedule(&c, &shared::schedule::stored_name(p.team.as_deref(), &name)).await?;
    Ok(Json(Removed {
        name,
        removed: true,
    }))
}

/// A reported firing's morning report: the body its webhook deliveries send (the batch's
/// report and the comparison with the earlier finished firing).
#[utoipa::path(
    get, path = "/v1/schedules/{name}/reports/{batch}",
    params(
        ("name" = String, Path, description = "the schedule's name"),
        ("batch" = String, Path, description = "the firing's batch id"),
    ),
    responses(
        (status = 200, body = Object),
        (status = 404, body = shared::http::ErrorBody, description = "no such schedule, firing or report yet"),
    )
)]
pub async fn schedule_report(
    State(c): State<Arc<Coordinator>>,
    axum::Extension(p): axum::Extension<shared::auth::Principal>,
    Path((name, batch)): Path<(String, String)>,
) -> Result<Json<Value>, ScheduleError> {
    let name = shared::schedule::stored_name(p.team.as_deref(), &name);
    let (state, _) = c
        .store
        .schedule_state(&name)
        .await
        .map_err(DriverError::from)?
        .ok_or_else(|| ScheduleError::Unknown(name.clone()))?;
    let batch = BatchId::new(batch);
    let reported = state
        .firing(&batch)
        .is_some_and(|f| f.stage == FiringStage::Reported);
    if !reported {
        return Err(ScheduleError::NoReport(name, batch));
    }
    let body = c
        .blobs
        .get_json(&body_key(&name, &batch))
        .await
        .map_err(DriverError::from)?;
    Ok(Json(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::schedule::ScheduleError as Invalid;

    async fn answer(e: ScheduleError) -> (u16, Value) {
        let resp = e.into_response();
        let status = resp.status().as_u16();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn errors_become_their_statuses_with_the_message() {
        let (s, body) = answer(Invalid::Graph(vec!["g.yaml: start: unknown".into()]).into()).await;
        assert_eq!(s, 400);
        assert_eq!(body["error"], "invalid graph");
        assert_eq!(body["details"][0], "g.yaml: start: unknown");
        let bad_cron = Invalid::Cron("* *".into(), "it has 2 fields".into());
        let (s, body) = answer(bad_cron.into()).await;
        assert_eq!(
            (s, body["error"].as_str()),
            (400, Some("cron expression \"* *\": it has 2 fields"))
        );
        assert_eq!(answer(ScheduleError::Exists("n".into())).await.0, 409);
        assert_eq!(answer(ScheduleError::TooMany).await.0, 409);
        assert_eq!(answer(ScheduleError::Busy("n".into())).await.0, 409);
        let (s, body) = answer(ScheduleError::Unknown("n".into())).await;
        assert_eq!(
            (s, body["error"].as_str()),
            (404, Some("schedule `n` not found"))
        );
        assert_eq!(
            answer(ScheduleError::NoReport("n".into(), BatchId::new("b")))
                .await
                .0,
            404
        );
        let lost = shared::ports::PortError::Connection("refused".into());
        assert_eq!(answer(lost.into()).await.0, 503);
    }

    #[test]
    fn a_webhook_is_shown_without_its_secret_or_its_path() {
        let hook = Some(Webhook {
            url: "https://hooks.example.com/services/T0/B0/XYZ".into(),
            secret: "a secret of some length".into(),
        });
        let view = serde_json::to_string(&WebhookView::of(&hook)).unwrap();
        assert_eq!(
            view,
            r#"{"url":"https://hooks.example.com/…","secret_set":true}"#
        );
        assert_eq!(WebhookView::of(&None), None);
    }
}
