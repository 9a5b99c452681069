//! A team's quotas over the fleet, through the API: its limits (set by its admins), what it
//! spent today, its runs under way and its jobs in flight and waiting (`GET /v1/team`, drawn by `fleet team`), its notices (the
//! budget marks its spend crossed), its webhook and that webhook's delivery log. A team token
//! sees its own team; the open API names the team with `?team=`. Also the submission's check
//! of the team's runs under way.

use crate::api::{at, ApiError, Route, Verb};
use crate::driver::{Coordinator, DriverError};
use crate::submit::SubmitError;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use shared::auth::Principal;
use shared::ids::RunId;
use shared::quota::{day_of, QuotaNotice, TeamLimits, TeamView};
use std::sync::Arc;
use tracing::info;
use worker::quota::LedgerError;

pub(crate) fn routes() -> Vec<Route> {
    vec![
        at(Verb::Get, "/v1/team", show),
        at(Verb::Post, "/v1/team/limits", set_limits).admin(),
        at(Verb::Post, "/v1/team/webhook", set_webhook).admin(),
        at(Verb::Get, "/v1/team/webhook/secret", webhook_secret).admin(),
        at(Verb::Get, "/v1/team/events", events),
        at(Verb::Get, "/v1/team/deliveries", deliveries),
    ]
}

impl From<LedgerError> for ApiError {
    fn from(e: LedgerError) -> Self {
        match e {
            LedgerError::Backend(_) => {
                tracing::warn!(error = %e, "request failed: the quota ledger is away");
                ApiError::unavailable(&e)
            }
            LedgerError::Corrupt { .. } => {
                tracing::error!(error = %e, "quota ledger failed");
                ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), vec![])
            }
        }
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct TeamQuery {
    /// Only through the open API: the team to look at (a token's team is its own).
    team: Option<String>,
}

/// The team a request is about: the token's own; through the open API, the one it names.
fn team_of(p: &Principal, q: &TeamQuery) -> Result<String, ApiError> {
    match (&p.team, &q.team) {
        (Some(mine), Some(asked)) if mine != asked => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("team `{asked}` not found"),
            vec![],
        )),
        (Some(mine), _) => Ok(mine.clone()),
        (None, Some(asked)) => {
            shared::auth::check_team(asked)
                .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string(), vec![]))?;
            Ok(asked.clone())
        }
        (None, None) => Err(ApiError(
            StatusCode::BAD_REQUEST,
            "name the team (`?team=`): the open API has no team of its own".into(),
            vec![],
        )),
    }
}

/// The team's limits, what it spent today (UTC) and its runs under way.
#[utoipa::path(get, path = "/v1/team", params(TeamQuery),
    responses((status = 200, body = TeamView), (status = 400, body = shared::http::ErrorBody)))]
pub(crate) async fn show(
    State(c): State<Arc<Coordinator>>,
    Extension(p): Extension<Principal>,
    Query(q): Query<TeamQuery>,
) -> Result<Json<TeamView>, ApiError> {
    let team = team_of(&p, &q)?;
    let day = day_of(c.clock.now());
    let (used, calls) = c.ledger.used(&team, &day).await?;
    let now_ms = c.clock.now().timestamp_millis();
    let (jobs_in_flight, jobs_waiting) = c
        .store
        .job_slots(&team, now_ms)
        .await
        .map_err(|e| ApiError::from(DriverError::from(e)))?;
    Ok(Json(TeamView {
        jobs_in_flight,
        jobs_waiting,
        limits: c.ledger.limits(&team).await?,
        runs_under_way: c.ledger.runs_under_way(&team).await?.len() as u64,
        webhook: c.ledger.webhook(&team).await?,
        team,
        day,
        used_today: used,
        llm_calls_today: calls,
    }))
}

/// Replaces the team's limits (admins).
#[utoipa::path(post, path = "/v1/team/limits", params(TeamQuery), request_body = TeamLimits,
    responses((status = 200, body = TeamLimits), (status = 400, body = shared::http::ErrorBody)))]
pub(crate) async fn set_limits(
    State(c): State<Arc<Coordinator>>,
    Extension(p): Extension<Principal>,
    Query(q): Query<TeamQuery>,
    Json(limits): Json<TeamLimits>,
) -> Result<Json<TeamLimits>, ApiError> {
    let team = team_of(&p, &q)?;
    limits
        .check()
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e, vec![]))?;
    // The operator's ceilings are not the team's to raise.
    let above = shared::ceilings::above(&limits, &c.ledger.ceiling(&team));
    if !above.is_empty() {
        return Err(ApiError(StatusCode::FORBIDDEN, above.join("; "), above));
    }
    c.ledger.set_limits(&team, &limits).await?;
    info!(team, limits = ?limits, "team limits set");
    Ok(Json(limits))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebhookBody {
    /// Where the team's notices go (none: no webhook); signed with `FLEET_WEBHOOK_SECRET`.
    url: Option<String>,
}

/// Sets the team's webhook (admins): its budget notices, and the notices of its runs that name
/// no webhook of their own (their end, approvals asked for, quarantines, run budget marks).
#[utoipa::path(post, path = "/v1/team/webhook", params(TeamQuery), request_body = WebhookBody,
    responses((status = 200, body = TeamView), (status = 400, body = shared::http::ErrorBody)))]
pub(crate) async fn set_webhook(
    State(c): State<Arc<Coordinator>>,
    Extension(p): Extension<Principal>,
    Query(q): Query<TeamQuery>,
    Json(body): Json<WebhookBody>,
) -> Result<Json<TeamView>, ApiError> {
    let team = team_of(&p, &q)?;
    if let Some(url) = &body.url {
        let Some(secret) = c.webhook_secret.clone() else {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                "this coordinator has no FLEET_WEBHOOK_SECRET to sign a webhook's notices".into(),
                vec![],
            ));
        };
        let hook = shared::schedule::Webhook {
            url: url.clone(),
            secret,
        };
        hook.check()
            .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("webhook: {e}"), vec![]))?;
        c.http
            .policy
            .check_url(url)
            .await
            .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("webhook: {e}"), vec![]))?;
    }
    c.ledger.set_webhook(&team, body.url.as_deref()).await?;
    show(State(c), Extension(p), Query(q)).await
}

/// The key the team's notices (and its runs') are signed with (admins): its own, derived
/// from the coordinator's `FLEET_WEBHOOK_SECRET`; no other team's key verifies them.
#[utoipa::path(get, path = "/v1/team/webhook/secret", params(TeamQuery),
    responses((status = 200, body = Object), (status = 400, body = shared::http::ErrorBody)))]
pub(crate) async fn webhook_secret(
    State(c): State<Arc<Coordinator>>,
    Extension(p): Extension<Principal>,
    Query(q): Query<TeamQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let team = team_of(&p, &q)?;
    let Some(master) = c.webhook_secret.as_deref() else {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "this coordinator has no FLEET_WEBHOOK_SECRET: it signs no notices".into(),
            vec![],
        ));
    };
    let secret = shared::schedule::webhook::team_secret(master, &team);
    Ok(Json(serde_json::json!({"team": team, "secret": secret})))
}

/// The team's budget notices, newest first (at most 500 are kept).
#[utoipa::path(get, path = "/v1/team/events", operation_id = "team_events", params(TeamQuery),
    responses((status = 200, body = Vec<QuotaNotice>)))]
pub(crate) async fn events(
    State(c): State<Arc<Coordinator>>,
    Extension(p): Extension<Principal>,
    Query(q): Query<TeamQuery>,
) -> Result<Json<Vec<QuotaNotice>>, ApiError> {
    let team = team_of(&p, &q)?;
    Ok(Json(c.ledger.events(&team, 500).await?))
}

/// The delivery log of the team's webhook, newest first: every attempt of every notice.
#[utoipa::path(get, path = "/v1/team/deliveries", operation_id = "team_deliveries", params(TeamQuery),
    responses((status = 200, body = Vec<Object>)))]
pub(crate) async fn deliveries(
    State(c): State<Arc<Coordinator>>,
    Extension(p): Extension<Principal>,
    Query(q): Query<TeamQuery>,
) -> Result<Json<Vec<serde_json::Value>>, ApiError> {
    let team = team_of(&p, &q)?;
    Ok(Json(c.ledger.deliveries(&team, 200).await?))
}

/// Refuses a run of `team` whose agent calls a model outside the team's allow-list.
pub(crate) async fn check_model(
    c: &Coordinator,
    team: &str,
    agent: &shared::agent_config::AgentConfig,
) -> Result<(), DriverError> {
    let Some(model) = crate::agent_checks::model_of(agent) else {
        return Ok(());
    };
    let limits = c
        .ledger
        .limits(team)
        .await
        .map_err(|e| SubmitError::Preflight(e.to_string()))?;
    match shared::ceilings::model_refused(&limits, team, model) {
        Some(why) => Err(SubmitError::Input(why).into()),
        None => Ok(()),
    }
}

/// Counts a new run of `team` as under way, unless the team has its limit of runs under way
/// (runs the ledger still counts but that ended are taken off first).
pub(crate) async fn admit_run(c: &Coordinator, team: &str, run: &RunId) -> Result<(), DriverError> {
    let quota = |e: LedgerError| SubmitError::Preflight(e.to_string());
    let max = c.ledger.limits(team).await.map_err(quota)?.concurrent_runs;
    if c.ledger
        .admit_run(team, run.as_str(), max)
        .await
        .map_err(quota)?
    {
        return Ok(());
    }
    for other in c.ledger.runs_under_way(team).await.map_err(quota)? {
        let ended = match c.load(&RunId::new(other.clone())).await {
            Ok(s) => s.status.is_terminal(),
            Err(DriverError::UnknownRun(_)) => true,
            Err(e) => return Err(e),
        };
        if ended {
            c.ledger.run_ended(team, &other).await.map_err(quota)?;
        }
    }
    if c.ledger
        .admit_run(team, run.as_str(), max)
        .await
        .map_err(quota)?
    {
        return Ok(());
    }
    Err(SubmitError::Quota(format!(
        "team `{team}` has {} runs under way, its limit (concurrent_runs); wait for one to end",
        max.unwrap_or_default()
    ))
    .into())
}
