//! The routes of people's decisions, served through `crate::api::routes`: an approval node's
//! (`POST /v1/runs/:id/approvals/:node`), and seed 004's quarantine: `GET
//! /v1/runs/:id/quarantine` lists what waits for a person (the graph's `quarantine.pending`,
//! with its `details`) and the decisions so far; `POST /v1/runs/:id/quarantine/:item` records
//! a decision (`Event::Quarantine`), refused with 409 when the item does not wait.

use crate::api::{at, ApiError, Route, Verb};
use crate::driver::Coordinator;
use crate::openapi::{NoSuchRun, RunPath};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use shared::auth::Principal;
use shared::engine::{quarantine, Applied, Event};
use shared::http::{self, QuarantineDecided, QuarantineItem, QuarantineView};
use shared::ids::RunId;
use std::sync::Arc;

pub fn routes() -> Vec<Route> {
    vec![
        at(Verb::Post, "/v1/runs/:id/approvals/:node", decide_approval),
        at(Verb::Get, "/v1/runs/:id/quarantine", list),
        at(Verb::Post, "/v1/runs/:id/quarantine/:item", decide),
    ]
}

/// What waits for a person in the run, and every decision made so far.
#[utoipa::path(
    get, path = "/v1/runs/{id}/quarantine",
    params(RunPath),
    responses((status = 200, body = QuarantineView), NoSuchRun)
)]
pub(crate) async fn list(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<Json<QuarantineView>, ApiError> {
    let run = RunId::new(id);
    let state = c.load(&run).await?;
    let bundle = c.bundle(&state.graph_ref).await?;
    let details = quarantine::details(&bundle, &state);
    let pending = quarantine::pending(&bundle, &state)
        .into_iter()
        .map(|item| QuarantineItem {
            details: details.get(&item).cloned().unwrap_or_default(),
            item,
        })
        .collect();
    Ok(Json(QuarantineView {
        v: http::API_VERSION,
        run_id: run,
        status: state.status,
        pending,
        decisions: state.quarantine.clone(),
    }))
}

/// A decision's body, or 400 naming what is wrong with it.
fn decision_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("malformed decision: {e}"),
            vec![],
        )
    })
}

/// A person's decision on an item in quarantine.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct QuarantineBody {
    approved: bool,
    #[serde(default)]
    by: String,
    #[serde(default)]
    comment: String,
}

#[utoipa::path(
    post, path = "/v1/runs/{id}/quarantine/{item}",
    request_body = QuarantineBody,
    params(RunPath, ("item" = String, Path, description = "the item in quarantine")),
    responses(
        (status = 200, body = QuarantineDecided),
        (status = 400, body = http::ErrorBody, description = "a malformed decision"),
        NoSuchRun,
        (status = 409, body = http::ErrorBody, description = "the item is not in quarantine"),
    )
)]
pub(crate) async fn decide(
    State(c): State<Arc<Coordinator>>,
    Extension(p): Extension<Principal>,
    Path((id, item)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<QuarantineDecided>, ApiError> {
    let run = RunId::new(id);
    let d: QuarantineBody = decision_body(&body)?;
    c.load(&run).await?;
    let event = Event::Quarantine {
        item: item.clone(),
        approved: d.approved,
        by: shared::auth::decided_by(&p, &d.by),
        comment: d.comment,
        at: c.clock.now(),
    };
    match c.apply(&run, &event).await? {
        Applied::Changed => {}
        Applied::Ignored(why) => {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("`{item}` of run `{run}`: {why}"),
                vec![],
            ))
        }
        other => {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("`{item}` of run `{run}`: not decided ({other:?})"),
                vec![],
            ))
        }
    }
    let s = c.load(&run).await?;
    Ok(Json(QuarantineDecided {
        v: http::API_VERSION,
        run_id: run,
        item,
        approved: d.approved,
        status: s.status,
    }))
}

/// `POST /v1/runs/:id/approvals/:node`: the decision on a node awaiting approval.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DecideBody {
    approved: bool,
    #[serde(default)]
    by: String,
    #[serde(default)]
    comment: String,
    /// Edits sent with an approval, for a node that takes them (its `edits:` schema).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    edits: Option<serde_json::Value>,
}

#[utoipa::path(
    post, path = "/v1/runs/{id}/approvals/{node}",
    request_body = DecideBody,
    params(RunPath, ("node" = String, Path, description = "the node awaiting approval")),
    responses(
        (status = 200, body = http::Decided),
        (status = 400, body = http::ErrorBody, description = "a malformed decision"),
        NoSuchRun,
        (status = 409, body = http::ErrorBody, description = "the node is not awaiting approval, or the edits are refused"),
    )
)]
pub(crate) async fn decide_approval(
    State(c): State<Arc<Coordinator>>,
    Extension(p): Extension<Principal>,
    Path((id, node)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<http::Decided>, ApiError> {
    let run = RunId::new(id);
    let d: DecideBody = decision_body(&body)?;
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
    let applied = c
        .decide(
            &run,
            &node,
            d.approved,
            &shared::auth::decided_by(&p, &d.by),
            &d.comment,
            d.edits,
        )
        .await?;
    let s = c.load(&run).await?;
    let applied = match applied {
        shared::engine::Applied::Refused(why) => {
            tracing::info!(run = %run, node = %node, reason = %why, "decision refused");
            return Err(ApiError(StatusCode::CONFLICT, why, vec![]));
        }
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
