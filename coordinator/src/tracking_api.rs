//! Seed 004's tracking, served through `crate::api::routes`: the run's event log as JSON
//! lines (`GET /v1/runs/:id/events`, filtered by `type` and `session` as the seed's
//! `get_events`), its costs (`/costs`), the dashboard (`/dashboard`), the webhook delivery
//! log (`/webhooks`) and a new budget (`POST /v1/runs/:id/budget`: a paused run resumes).

use crate::api::{at, ApiError, Route, Verb};
use crate::driver::{Coordinator, DriverError};
use crate::openapi::{NoSuchRun, RunPath};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use shared::engine::{quarantine, Applied, Event, RunState};
use shared::graph::{GraphBundle, HarnessOp, NodeBody};
use shared::http;
use shared::ids::{NodeId, RunId};
use shared::tracking::costs::{cost_report, CostReport};
use shared::tracking::dashboard::{dashboard, Dashboard, NodeKinds};
use shared::tracking::events::run_events;
use shared::tracking::{EventType, RunBudget};
use std::sync::Arc;

pub fn routes() -> Vec<Route> {
    vec![
        at(Verb::Get, "/v1/runs/:id/events", events),
        at(Verb::Get, "/v1/runs/:id/costs", costs),
        at(Verb::Get, "/v1/runs/:id/dashboard", run_dashboard),
        at(Verb::Get, "/v1/runs/:id/webhooks", deliveries),
        at(Verb::Post, "/v1/runs/:id/budget", set_budget),
    ]
}

fn op_of(bundle: &GraphBundle, node: &str) -> Option<HarnessOp> {
    match &bundle.graph.node(&NodeId::new(node))?.body {
        NodeBody::Harness { op } => Some(*op),
        _ => None,
    }
}

fn is_agent(bundle: &GraphBundle, node: &str) -> bool {
    bundle
        .graph
        .node(&NodeId::new(node))
        .is_some_and(|n| n.agent().is_some())
}

/// The seed's `get_events` filters.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventFilter {
    /// Only events of this type (`claim`, `gate_fail`, `budget_warning`...).
    #[serde(rename = "type")]
    event_type: Option<EventType>,
    /// Only events of this session (a job id).
    session: Option<String>,
}

/// The run's events, oldest first, one JSON object per line.
#[utoipa::path(
    get, path = "/v1/runs/{id}/events", operation_id = "run_events",
    params(RunPath, EventFilter),
    responses((status = 200, description = "JSON lines: timestamp, session_id, agent_type, event_type, data", content_type = "application/x-ndjson"), NoSuchRun)
)]
pub(crate) async fn events(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
    Query(f): Query<EventFilter>,
) -> Result<impl IntoResponse, ApiError> {
    let state = c.load(&RunId::new(id)).await?;
    let bundle = c.bundle(&state.graph_ref).await?;
    let mut body = String::new();
    for e in run_events(&state, &|n| is_agent(&bundle, n)) {
        if f.event_type.is_some_and(|t| t != e.event_type)
            || f.session.as_ref().is_some_and(|s| *s != e.session_id)
        {
            continue;
        }
        body.push_str(&serde_json::to_string(&e).expect("an event serializes"));
        body.push('\n');
    }
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body))
}

/// The run's costs: total, per session (job), node and model.
#[utoipa::path(
    get, path = "/v1/runs/{id}/costs",
    params(RunPath),
    responses((status = 200, body = CostReport), NoSuchRun)
)]
pub(crate) async fn costs(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<Json<CostReport>, ApiError> {
    let state = c.load(&RunId::new(id)).await?;
    Ok(Json(cost_report(&state)))
}

/// The dashboard of a run (`fleet status RUN` draws it).
pub async fn dashboard_of(c: &Coordinator, state: &RunState) -> Result<Dashboard, DriverError> {
    let bundle = c.bundle(&state.graph_ref).await?;
    let b = &bundle;
    let op_is = |n: &str, ops: &[HarnessOp]| op_of(b, n).is_some_and(|o| ops.contains(&o));
    let kinds = NodeKinds {
        is_agent: &|n| is_agent(b, n),
        lists_features: &|n| op_is(n, &[HarnessOp::ReviewFeatures, HarnessOp::SettleClaims]),
        runs_gates: &|n| op_is(n, &[HarnessOp::RunGates]),
        settles: &|n| op_is(n, &[HarnessOp::SettleClaims]),
    };
    let pending = quarantine::pending(b, state)
        .into_iter()
        .map(serde_json::Value::from)
        .collect();
    Ok(dashboard(state, &kinds, pending))
}

#[utoipa::path(
    get, path = "/v1/runs/{id}/dashboard",
    params(RunPath),
    responses((status = 200, body = Dashboard), NoSuchRun)
)]
pub(crate) async fn run_dashboard(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<Json<Dashboard>, ApiError> {
    let state = c.load(&RunId::new(id)).await?;
    Ok(Json(dashboard_of(&c, &state).await?))
}

/// Every notice delivery of the run and its attempts.
#[utoipa::path(
    get, path = "/v1/runs/{id}/webhooks", operation_id = "run_webhook_deliveries",
    params(RunPath),
    responses((status = 200, description = "the delivery logs, oldest key first"), NoSuchRun)
)]
pub(crate) async fn deliveries(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<Json<Vec<serde_json::Value>>, ApiError> {
    let run = RunId::new(id);
    c.load(&run).await?;
    let keys = c
        .blobs
        .list(&format!("runs/{run}/webhooks/"))
        .await
        .map_err(DriverError::from)?;
    let mut logs = Vec::new();
    for k in keys {
        logs.push(c.blobs.get_json(&k).await.map_err(DriverError::from)?);
    }
    Ok(Json(logs))
}

/// A new limit for the run's budget.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BudgetBody {
    limit_usd: f64,
    #[serde(default)]
    by: String,
}

#[utoipa::path(
    post, path = "/v1/runs/{id}/budget",
    request_body = BudgetBody,
    params(RunPath),
    responses(
        (status = 200, body = RunBudget),
        (status = 400, body = http::ErrorBody, description = "a malformed body"),
        NoSuchRun,
        (status = 409, body = http::ErrorBody, description = "the run ended, or the limit is not above what it spent"),
    )
)]
pub(crate) async fn set_budget(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<RunBudget>, ApiError> {
    let run = RunId::new(id);
    let b: BudgetBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("malformed budget: {e}"),
            vec![],
        )
    })?;
    c.load(&run).await?;
    let event = Event::Budget {
        limit_usd: b.limit_usd,
        by: b.by,
        at: c.clock.now(),
    };
    match c.apply(&run, &event).await? {
        Applied::Changed => {}
        Applied::Refused(why) => {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("run `{run}`: {why}"),
                vec![],
            ))
        }
        other => {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("run `{run}`: budget not set ({other:?})"),
                vec![],
            ))
        }
    }
    let s = c.load(&run).await?;
    s.budget.map(Json).ok_or_else(|| {
        ApiError(
            StatusCode::CONFLICT,
            format!("run `{run}`: budget not set"),
            vec![],
        )
    })
}
