//! Repositories uploaded with their submissions. A pack is stored under the SHA-256 of its
//! bytes (`packs/<sha256>.pack`, shared by every team: the same bytes are stored once) after
//! the server checked it (`worker::git::inspect_pack`: a valid pack holding the commit and its
//! history, its files within four times the upload limit) and computed the commit's tree hash.
//! What a team uploaded is recorded per team and commit
//! (`uploads/<team>/commits/<commit>.json`): only that record lets a submission start from the
//! pack, and only the team's own records are ever found, so one team cannot start from or learn
//! of another's upload.

use crate::api::{at, ApiError, Route, Verb};
use crate::driver::{Coordinator, DriverError};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use shared::auth::Principal;
use shared::hashing::sha256_hex;
use shared::http::{self, Uploaded};
use std::sync::Arc;
use tracing::{info, warn};
use worker::git::GitError;

/// How long an upload waits for a slot before it is answered 503.
const UPLOAD_SLOT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

pub(crate) fn routes() -> Vec<Route> {
    vec![
        at(Verb::Post, "/v1/uploads", upload_pack),
        at(Verb::Get, "/v1/uploads/commits/:commit", uploaded_commit),
    ]
}

/// Where a team's record of an uploaded commit lives. The open API's records are apart from
/// every team's (`~` is not allowed in a team's name).
fn record_key(team: Option<&str>, commit: &str) -> String {
    format!("uploads/{}/commits/{commit}.json", team.unwrap_or("~open"))
}

/// The team's record of `commit`, when the team uploaded it: as this coordinator last read
/// or wrote it, else read from the store. Only records found are remembered (an upload through
/// another coordinator is seen at once).
pub(crate) async fn find(
    c: &Coordinator,
    team: Option<&str>,
    commit: &str,
) -> Result<Option<Uploaded>, DriverError> {
    if !http::is_commit_id(commit) {
        return Ok(None);
    }
    match c.known_upload(&record_key(team, commit)) {
        Some(known) => Ok(Some(known)),
        None => read(c, team, commit).await,
    }
}

/// The team's record of `commit` with the pack `pack`: the one remembered when it names that
/// pack, else the store's (another coordinator may have recorded this pack since).
pub(crate) async fn find_pack(
    c: &Coordinator,
    team: Option<&str>,
    commit: &str,
    pack: &str,
) -> Result<Option<Uploaded>, DriverError> {
    if !http::is_commit_id(commit) {
        return Ok(None);
    }
    match c.known_upload(&record_key(team, commit)) {
        Some(known) if known.pack == pack => Ok(Some(known)),
        _ => Ok(read(c, team, commit).await?.filter(|u| u.pack == pack)),
    }
}

/// The store's record, remembered when there is one.
async fn read(
    c: &Coordinator,
    team: Option<&str>,
    commit: &str,
) -> Result<Option<Uploaded>, DriverError> {
    let key = record_key(team, commit);
    match c.blobs.get_json::<Uploaded>(&key).await {
        Ok(u) => {
            c.remember_upload(&key, &u);
            Ok(Some(u))
        }
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct UploadQuery {
    /// The full id of the commit the pack is for (it and its history must be in the pack).
    commit: String,
}

/// A pack of a repository's commits (`git pack-objects` format, as `fleet submit` makes it),
/// up to `FLEET_MAX_UPLOAD_MB`.
#[utoipa::path(post, path = "/v1/uploads", params(UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 201, body = Uploaded, description = "checked; the bytes were stored now"),
        (status = 200, body = Uploaded, description = "checked; the bytes were stored before"),
        (status = 400, body = http::ErrorBody, description = "not a pack holding the commit"),
        (status = 413, body = http::ErrorBody, description = "past the upload limit"),
    ))]
pub(crate) async fn upload_pack(
    State(c): State<Arc<Coordinator>>,
    Extension(p): Extension<Principal>,
    Query(q): Query<UploadQuery>,
    body: Body,
) -> Result<(StatusCode, Json<Uploaded>), ApiError> {
    let refused = |c: &Coordinator, status: StatusCode, why: String| {
        c.metrics.uploads.with_label_values(&["refused"]).inc();
        warn!(team = p.team.as_deref().unwrap_or("-"), error = %why, "upload refused");
        ApiError(status, why, vec![])
    };
    if !http::is_commit_id(&q.commit) {
        return Err(refused(
            &c,
            StatusCode::BAD_REQUEST,
            format!("`{}` is not a full commit id in lowercase hex", q.commit),
        ));
    }
    // A slot before the body is read: what uploads hold in memory is bounded by the slots.
    let slot = tokio::time::timeout(UPLOAD_SLOT_WAIT, c.upload_slots.clone().acquire_owned())
        .await
        .ok()
        .and_then(Result::ok)
        .ok_or_else(|| {
            refused(
                &c,
                StatusCode::SERVICE_UNAVAILABLE,
                "too many uploads are being checked at once (FLEET_UPLOAD_CONCURRENCY); retry later"
                    .into(),
            )
        })?;
    let limit = c.max_upload_bytes;
    let bytes = axum::body::to_bytes(body, usize::try_from(limit).unwrap_or(usize::MAX))
        .await
        .map_err(|_| {
            refused(
                &c,
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the pack is larger than this coordinator takes ({} MiB, FLEET_MAX_UPLOAD_MB)",
                    limit >> 20
                ),
            )
        })?;
    let pack = sha256_hex(&bytes);
    let size = bytes.len() as u64;
    let commit = q.commit.clone();
    let checked = tokio::task::spawn_blocking(move || {
        worker::git::inspect_pack(&bytes, &commit, limit.saturating_mul(4)).map(|u| (u, bytes))
    })
    .await
    .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), vec![]))?;
    let (seen, bytes) = match checked {
        Ok(ok) => ok,
        Err(e @ GitError::Upload(_)) => {
            return Err(refused(&c, StatusCode::BAD_REQUEST, e.to_string()))
        }
        Err(e) => {
            tracing::error!(error = %e, "checking an upload failed");
            return Err(ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("checking the pack failed: {e}"),
                vec![],
            ));
        }
    };
    drop(slot);
    let tree_hash = seen.tree_hash.clone();
    let key = crate::snapshot::pack_key(&pack);
    let stored = !c.blobs.exists(&key).await.map_err(DriverError::from)?;
    if stored {
        c.blobs
            .put(&key, bytes.to_vec())
            .await
            .map_err(DriverError::from)?;
        c.metrics.upload_bytes_stored.inc_by(size);
    }
    let outcome = if stored { "stored" } else { "known" };
    c.metrics.uploads.with_label_values(&[outcome]).inc();
    let answer = Uploaded {
        v: http::API_VERSION,
        commit: seen.commit,
        pack,
        tree_hash,
        bytes: size,
        stored,
    };
    let key = record_key(p.team.as_deref(), &answer.commit);
    c.blobs
        .put_json(&key, &answer)
        .await
        .map_err(DriverError::from)?;
    c.remember_upload(&key, &answer);
    info!(team = p.team.as_deref().unwrap_or("-"), commit = %answer.commit,
        pack = %answer.pack, bytes = size, outcome, "pack uploaded");
    let status = if stored {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(answer)))
}

/// The pack the caller's team uploaded `commit` in; 404 when it did not.
#[utoipa::path(get, path = "/v1/uploads/commits/{commit}",
    params(("commit" = String, Path, description = "a full commit id")),
    responses((status = 200, body = Uploaded), (status = 404, body = http::ErrorBody)))]
pub(crate) async fn uploaded_commit(
    State(c): State<Arc<Coordinator>>,
    Extension(p): Extension<Principal>,
    Path(commit): Path<String>,
) -> Result<Json<Uploaded>, ApiError> {
    find(&c, p.team.as_deref(), &commit)
        .await?
        .map(|mut u| {
            u.stored = false;
            Json(u)
        })
        .ok_or_else(|| {
            ApiError(
                StatusCode::NOT_FOUND,
                format!("commit `{commit}` not found among this team's uploads"),
                vec![],
            )
        })
}
