//! Who calls the API. Every route but the public ones needs a token (`Authorization: Bearer
//! fleet_…`), looked up by its SHA-256 in the token store: a missing, unknown or revoked token
//! is 401, a role below the route's `Access` is 403. A team's token sees only its team's runs,
//! batches, schedules and artifacts: anything of another team is 404, exactly as if it did not
//! exist. The open API (`--open-api`, for local use) has one admin over every team. Admins
//! create and revoke their team's tokens here; the first is made with `fleet token bootstrap`
//! on a host that reaches Redis.

use crate::api::{at, ApiError, Route, Verb};
use crate::driver::{Coordinator, DriverError};
use axum::extract::{Path, RawPathParams, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use shared::auth::{self, Access, Principal, Role, TokenRecord};
use shared::ids::{BatchId, RunId};
use shared::ports::TokenStore;
use std::sync::Arc;
use tracing::info;

/// What the guard of one route knows: the coordinator, the route's path and what it needs.
#[derive(Clone)]
pub(crate) struct Guard {
    pub coord: Arc<Coordinator>,
    pub path: &'static str,
    pub access: Access,
}

pub(crate) async fn guard(
    State(g): State<Guard>,
    params: RawPathParams,
    mut req: Request,
    next: Next,
) -> Response {
    if g.coord.open_api {
        let hosts = crate::browser_guard::hosts_from_env();
        let refused = crate::browser_guard::refused(req.headers(), req.method(), g.path, hosts);
        if let Some((status, why)) = refused {
            return ApiError(status, why, vec![]).into_response();
        }
    }
    if g.access == Access::Public {
        return next.run(req).await;
    }
    let principal = match principal(&g.coord, req.headers()).await {
        Ok(p) => p,
        Err(e) => return e,
    };
    if !g.access.allows(principal.role) {
        let need = match g.access {
            Access::Admin => "an admin",
            _ => "a member's or an admin",
        };
        return ApiError(
            StatusCode::FORBIDDEN,
            format!("this needs {need} token; yours is a {:?}'s", principal.role).to_lowercase(),
            vec![],
        )
        .into_response();
    }
    let params: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Err(e) = owns(&g.coord, &principal, g.path, &params).await {
        return e.into_response();
    }
    req.extensions_mut().insert(principal);
    next.run(req).await
}

fn unauthorized(why: &str) -> Response {
    let mut resp = ApiError(StatusCode::UNAUTHORIZED, why.to_string(), vec![]).into_response();
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    resp
}

async fn principal(c: &Coordinator, headers: &HeaderMap) -> Result<Principal, Response> {
    if c.open_api {
        return Ok(Principal::open());
    }
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(unauthorized(
            "a token is required (Authorization: Bearer fleet_…; `fleet --token` or FLEET_TOKEN)",
        ));
    };
    let Some(token) = value.to_str().ok().and_then(auth::bearer) else {
        return Err(unauthorized(
            "the Authorization header holds no fleet token",
        ));
    };
    let record = c
        .store
        .token_by_hash(&auth::hash_token(token))
        .await
        .map_err(|e| ApiError::from(DriverError::from(e)).into_response())?;
    match record {
        Some(r) if r.revoked_at.is_none() => Ok(Principal {
            team: Some(r.team),
            role: r.role,
            token_id: Some(r.id),
        }),
        _ => Err(unauthorized("unknown or revoked token")),
    }
}

/// A 404 for what the principal may not see, worded as for what does not exist.
fn hidden(what: &str, id: &str) -> ApiError {
    ApiError(
        StatusCode::NOT_FOUND,
        format!("{what} `{id}` not found"),
        vec![],
    )
}

/// The team of a run, `None` when it has none; `Err` when there is no such run.
async fn run_team(c: &Coordinator, id: &str) -> Result<Option<String>, ApiError> {
    match c.load(&RunId::new(id)).await {
        Ok(s) => Ok(s.team),
        Err(DriverError::UnknownRun(_)) => Err(hidden("run", id)),
        Err(e) => Err(e.into()),
    }
}

async fn batch_team(c: &Coordinator, id: &str) -> Result<Option<String>, ApiError> {
    match c
        .store
        .batch_header(&BatchId::new(id))
        .await
        .map_err(DriverError::from)?
    {
        Some((h, _)) => Ok(h.team),
        None => Err(hidden("batch", id)),
    }
}

async fn schedule_team(c: &Coordinator, name: &str) -> Result<Option<String>, ApiError> {
    match c
        .store
        .schedule_def(name)
        .await
        .map_err(DriverError::from)?
    {
        Some(d) => Ok(d.team),
        None => Err(hidden("schedule", name)),
    }
}

/// Whether every resource the path names is the principal's team's (404 otherwise).
async fn owns(
    c: &Coordinator,
    p: &Principal,
    path: &str,
    params: &[(String, String)],
) -> Result<(), ApiError> {
    if p.team.is_none() {
        return Ok(());
    }
    for (name, value) in params {
        let (what, team) = match (path.split('/').nth(2), name.as_str()) {
            (Some("runs"), "id") => ("run", run_team(c, value).await?),
            (Some("batches"), "id" | "other") | (Some("schedules"), "batch") => {
                ("batch", batch_team(c, value).await?)
            }
            (Some("schedules"), "name") => {
                // A team's schedules are found only among its own names.
                let stored = shared::schedule::stored_name(p.team.as_deref(), value);
                let team = schedule_team(c, &stored)
                    .await
                    .map_err(|_| hidden("schedule", value))?;
                ("schedule", team)
            }
            (Some("artifacts"), "key") => {
                // Only a run's artifacts are served to a team: `runs/<run>/…`.
                let run = value
                    .strip_prefix("runs/")
                    .and_then(|rest| rest.split('/').next())
                    .filter(|r| !r.is_empty())
                    .ok_or_else(|| hidden("artifact", value))?;
                (
                    "artifact",
                    run_team(c, run)
                        .await
                        .map_err(|_| hidden("artifact", value))?,
                )
            }
            _ => continue,
        };
        if !p.sees(team.as_deref()) {
            return Err(hidden(what, value));
        }
    }
    Ok(())
}

/// The routes of tokens (admins only).
pub(crate) fn routes() -> Vec<Route> {
    vec![
        at(Verb::Post, "/v1/tokens", create_token).admin(),
        at(Verb::Get, "/v1/tokens", list_tokens).admin(),
        at(Verb::Post, "/v1/tokens/:id/revoke", revoke_token).admin(),
    ]
}

/// `POST /v1/tokens`: a new token of the caller's team (the open API names the team).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewToken {
    role: Role,
    #[serde(default)]
    name: String,
    /// Only through the open API: a token's team is otherwise its creator's.
    #[serde(default)]
    team: Option<String>,
}

/// A token as listed: never its secret or hash.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenView {
    pub id: String,
    pub team: String,
    pub role: Role,
    pub name: String,
    pub created_at: String,
    pub revoked_at: Option<String>,
}

impl TokenView {
    fn of(r: &TokenRecord) -> TokenView {
        TokenView {
            id: r.id.clone(),
            team: r.team.clone(),
            role: r.role,
            name: r.name.clone(),
            created_at: shared::time::rfc3339(&r.created_at),
            revoked_at: r.revoked_at.as_ref().map(shared::time::rfc3339),
        }
    }
}

/// A token just made: the secret is shown this once.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenCreated {
    pub token: String,
    #[serde(flatten)]
    pub view: TokenView,
}

/// Makes a token of `team` with `role` and stores its hash; the token itself is returned once.
pub async fn make_token(
    store: &dyn TokenStore,
    now: chrono::DateTime<chrono::Utc>,
    team: &str,
    role: Role,
    name: &str,
) -> Result<TokenCreated, ApiError> {
    let bad = |e: auth::AuthError| ApiError(StatusCode::BAD_REQUEST, e.to_string(), vec![]);
    auth::check_team(team).map_err(bad)?;
    auth::check_name(name).map_err(bad)?;
    let mut secret = [0u8; 32];
    let mut id = [0u8; 6];
    getrandom::fill(&mut secret)
        .and_then(|()| getrandom::fill(&mut id))
        .map_err(|e| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("no randomness for a token: {e}"),
                vec![],
            )
        })?;
    let token = auth::token_from(&secret);
    let record = TokenRecord {
        id: format!("tok_{}", hex_of(&id)),
        hash: auth::hash_token(&token),
        team: team.to_string(),
        role,
        name: name.to_string(),
        created_at: now,
        revoked_at: None,
    };
    store.add_token(&record).await.map_err(DriverError::from)?;
    info!(token = %record.id, team, role = ?role, "token created");
    Ok(TokenCreated {
        token,
        view: TokenView::of(&record),
    })
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[utoipa::path(post, path = "/v1/tokens", request_body = NewToken,
    responses((status = 201, body = TokenCreated), (status = 400, body = shared::http::ErrorBody)))]
pub(crate) async fn create_token(
    State(c): State<Arc<Coordinator>>,
    Extension(p): Extension<Principal>,
    Json(req): Json<NewToken>,
) -> Result<(StatusCode, Json<TokenCreated>), ApiError> {
    let team = match (&p.team, &req.team) {
        (Some(mine), Some(asked)) if mine != asked => {
            return Err(ApiError(
                StatusCode::FORBIDDEN,
                "a token is made for its creator's own team".into(),
                vec![],
            ))
        }
        (Some(mine), _) => mine.clone(),
        (None, Some(asked)) => asked.clone(),
        (None, None) => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                "name the token's team".into(),
                vec![],
            ))
        }
    };
    let made = make_token(c.store.as_ref(), c.clock.now(), &team, req.role, &req.name).await?;
    Ok((StatusCode::CREATED, Json(made)))
}

#[utoipa::path(get, path = "/v1/tokens", responses((status = 200, body = Vec<TokenView>)))]
pub(crate) async fn list_tokens(
    State(c): State<Arc<Coordinator>>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Vec<TokenView>>, ApiError> {
    let all = c.store.list_tokens().await.map_err(DriverError::from)?;
    Ok(Json(
        all.iter()
            .filter(|t| p.sees(Some(&t.team)))
            .map(TokenView::of)
            .collect(),
    ))
}

#[utoipa::path(post, path = "/v1/tokens/{id}/revoke",
    params(("id" = String, Path, description = "the token's id")),
    responses((status = 200, body = TokenView), (status = 404, body = shared::http::ErrorBody)))]
pub(crate) async fn revoke_token(
    State(c): State<Arc<Coordinator>>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<TokenView>, ApiError> {
    let all = c.store.list_tokens().await.map_err(DriverError::from)?;
    let Some(found) = all.iter().find(|t| t.id == id && p.sees(Some(&t.team))) else {
        return Err(hidden("token", &id));
    };
    c.store
        .revoke_token(&found.id, c.clock.now())
        .await
        .map_err(DriverError::from)?;
    info!(token = %found.id, team = %found.team, "token revoked");
    let mut view = TokenView::of(found);
    view.revoked_at
        .get_or_insert_with(|| shared::time::rfc3339(&c.clock.now()));
    Ok(Json(view))
}
