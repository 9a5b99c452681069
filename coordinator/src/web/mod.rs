//! The web dashboard the coordinator serves: one page (`GET /ui`, no data in it; it asks for a
//! token and then reads the API with it, like any client) and the two routes it draws runs
//! from: a run's graph with each node's state (`GET /v1/runs/:id/graph`) and the same view
//! streamed as server-sent events on every change of the run (`GET /v1/runs/:id/watch`): woken
//! by this coordinator's commits of the run, checked every two seconds for commits made by
//! other coordinators, at most one event per 100 ms, closed once the run ended.

use crate::api::{at, ApiError, Route, Verb};
use crate::driver::Coordinator;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse};
use axum::Json;
use futures::Stream;
use shared::graph::GraphBundle;
use shared::http::GraphView;
use shared::ids::RunId;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

/// The page: markup, style and script in one file, no data.
const PAGE: &str = include_str!("dashboard.html");
/// How often a watch looks for commits this coordinator did not make.
const RECHECK: Duration = Duration::from_secs(2);
/// The least time between two events of one watch (changes in between are folded in).
const MIN_GAP: Duration = Duration::from_millis(100);

pub(crate) fn routes() -> Vec<Route> {
    vec![
        at(Verb::Get, "/ui", page).public(),
        at(Verb::Get, "/v1/runs/:id/graph", graph),
        at(Verb::Get, "/v1/runs/:id/watch", watch),
    ]
}

/// The dashboard (public: it holds no data; every read it makes needs the token).
#[utoipa::path(get, path = "/ui", responses((status = 200, body = String, content_type = "text/html")))]
pub(crate) async fn page() -> impl IntoResponse {
    (
        [
            (header::CACHE_CONTROL, "no-store"),
            // Nothing from elsewhere: the page's own script and style only.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:",
            ),
        ],
        Html(PAGE),
    )
}

async fn view_of(c: &Coordinator, run: &RunId) -> Result<(GraphView, Arc<GraphBundle>), ApiError> {
    let (state, version) = c.load_with_version(run).await?;
    let bundle = c.bundle(&state.graph_ref).await?;
    Ok((GraphView::of(&bundle.graph, &state, version), bundle))
}

/// The run's graph, each node's state and its jobs counted.
#[utoipa::path(get, path = "/v1/runs/{id}/graph", params(crate::openapi::RunPath),
    responses((status = 200, body = GraphView), (status = 404, body = shared::http::ErrorBody)))]
pub(crate) async fn graph(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<Json<GraphView>, ApiError> {
    Ok(Json(view_of(&c, &RunId::new(id)).await?.0))
}

/// Where a watch stands between two events.
struct Watch {
    coord: Arc<Coordinator>,
    run: RunId,
    bundle: Arc<GraphBundle>,
    changes: broadcast::Receiver<RunId>,
    /// The version last sent; `None` before the first event.
    sent: Option<u64>,
    ended: bool,
}

impl Watch {
    /// Waits for this run to change (a commit here, or the periodic check), then its view if
    /// its version moved; `None` when the stream is done.
    async fn next(&mut self) -> Option<GraphView> {
        loop {
            if self.ended {
                return None;
            }
            if self.sent.is_some() {
                tokio::time::sleep(MIN_GAP).await;
                let woken = tokio::time::timeout(RECHECK, async {
                    loop {
                        match self.changes.recv().await {
                            Ok(run) if run == self.run => return,
                            Ok(_) => continue,
                            // Missed some: look anyway.
                            Err(broadcast::error::RecvError::Lagged(_)) => return,
                            Err(broadcast::error::RecvError::Closed) => {
                                std::future::pending::<()>().await
                            }
                        }
                    }
                })
                .await;
                let _ = woken;
            }
            let (state, version) = match self.coord.load_with_version(&self.run).await {
                Ok(v) => v,
                // The run is gone (retention) or the store failed: the stream ends.
                Err(_) => return None,
            };
            if self.sent == Some(version) {
                continue;
            }
            self.sent = Some(version);
            self.ended = state.status.is_terminal();
            return Some(GraphView::of(&self.bundle.graph, &state, version));
        }
    }
}

/// The run's graph view as server-sent events (`event: graph`), one now and one per change,
/// until the run ended.
#[utoipa::path(get, path = "/v1/runs/{id}/watch", params(crate::openapi::RunPath),
    responses((status = 200, content_type = "text/event-stream", body = GraphView,
        description = "`event: graph` with a GraphView, now and on every change"),
        (status = 404, body = shared::http::ErrorBody)))]
pub(crate) async fn watch(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let run = RunId::new(id);
    // Subscribed before the first read, so no commit between the two is missed.
    let changes = c.run_changed.subscribe();
    let (_, bundle) = view_of(&c, &run).await?;
    let w = Watch {
        coord: c,
        run,
        bundle,
        changes,
        sent: None,
        ended: false,
    };
    let stream = futures::stream::unfold(w, |mut w| async move {
        let view = w.next().await?;
        let event = Event::default()
            .event("graph")
            .json_data(&view)
            .unwrap_or_else(|_| Event::default().event("error"));
        Some((Ok(event), w))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
