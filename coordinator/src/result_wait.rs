//! A run's result, and waiting for it: `GET /v1/runs/{id}/result?wait_seconds=N` answers as
//! soon as the run finishes, or after N seconds (at most [`MAX_WAIT`]) with the 409 an
//! unfinished run gets without waiting. A client learns of the end without polling.
//!
//! The waiter is woken by this coordinator's commits of the run (`Coordinator::run_changed`,
//! rung after each commit is stored and mirrored). A run another coordinator drives is seen
//! at the next recheck ([`RECHECK`]): the wait is never longer than that past the run's end.

use crate::api::{at, ApiError, Route, Verb};
use crate::driver::Coordinator;
use crate::openapi::{NoSuchRun, RunPath};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use shared::engine::RunState;
use shared::http;
use shared::ids::RunId;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

/// The longest a client may ask to wait.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// How often a waiter looks at the store itself, for runs committed by another coordinator
/// (and notices this one dropped, its channel being full).
pub const RECHECK: Duration = Duration::from_millis(250);

pub fn routes() -> Vec<Route> {
    vec![at(Verb::Get, "/v1/runs/:id/result", run_result)]
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct WaitQuery {
    /// Seconds to wait for an unfinished run to finish before answering 409 (0 to 60, a
    /// fraction allowed; 0, the default, answers at once).
    wait_seconds: Option<String>,
}

/// The wait a query asks for: a number of seconds from 0 to [`MAX_WAIT`].
pub fn wait_asked(raw: Option<&str>) -> Result<Duration, String> {
    let Some(raw) = raw else {
        return Ok(Duration::ZERO);
    };
    let secs: f64 = raw
        .trim()
        .parse()
        .map_err(|_| format!("wait_seconds must be a number of seconds, not `{raw}`"))?;
    if !secs.is_finite() || secs < 0.0 || secs > MAX_WAIT.as_secs_f64() {
        return Err(format!(
            "wait_seconds must be from 0 to {}, not {raw}",
            MAX_WAIT.as_secs()
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The result of a finished run; with `wait_seconds`, of a run once it finishes.
#[utoipa::path(
    get, path = "/v1/runs/{id}/result",
    params(RunPath, WaitQuery),
    responses(
        (status = 200, body = http::RunOutcome),
        (status = 400, body = http::ErrorBody, description = "`wait_seconds` out of range"),
        NoSuchRun,
        (status = 409, body = http::ErrorBody, description = "the run has not finished (within `wait_seconds`)"),
    )
)]
pub(crate) async fn run_result(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
) -> Result<Json<http::RunOutcome>, ApiError> {
    let wait = wait_asked(q.wait_seconds.as_deref())
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e, vec![]))?;
    let run = RunId::new(id);
    let deadline = tokio::time::Instant::now() + wait;
    // Subscribed before the first look, so a commit between the look and the wait is heard.
    let mut changes = c.run_changed.subscribe();
    loop {
        // A look, not a copy: the waiter looks at every commit of what may be a big run.
        let (outcome, status) = c.peek(&run, |s| (outcome_of(s), s.status)).await?;
        if let Some(outcome) = outcome {
            return Ok(Json(outcome));
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("run is {status:?}").to_lowercase(),
                vec![],
            ));
        }
        let recheck = (deadline - now).min(RECHECK);
        tokio::select! {
            _ = change_of(&mut changes, &run) => {}
            _ = tokio::time::sleep(recheck) => {}
        }
    }
}

fn outcome_of(s: &RunState) -> Option<http::RunOutcome> {
    s.result.as_ref().map(|result| http::RunOutcome {
        v: http::API_VERSION,
        status: s.status,
        result: result.clone(),
        usage: s.usage,
    })
}

/// Returns when `run` is committed here (or notices were dropped: look again); never when the
/// channel is closed (the coordinator is going away: the recheck answers).
async fn change_of(changes: &mut broadcast::Receiver<RunId>, run: &RunId) {
    loop {
        match changes.recv().await {
            Ok(changed) if &changed == run => return,
            Ok(_) => continue,
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_is_a_number_of_seconds_within_the_bound() {
        assert_eq!(wait_asked(None), Ok(Duration::ZERO));
        assert_eq!(wait_asked(Some("0")), Ok(Duration::ZERO));
        assert_eq!(wait_asked(Some("2.5")), Ok(Duration::from_millis(2500)));
        assert_eq!(wait_asked(Some("60")), Ok(MAX_WAIT));
        for bad in ["61", "-1", "nan", "inf", "", "soon", "1e9"] {
            let e = wait_asked(Some(bad)).unwrap_err();
            assert!(e.contains("wait_seconds"), "{bad}: {e}");
        }
    }
}
