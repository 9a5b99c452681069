//! Every API answer timed under its route's template, method and status class
//! (`fleet_api_request_seconds`): the labels come from the route table, never from a path's
//! values, so they stay bounded.

use crate::api::Verb;
use crate::driver::Coordinator;
use axum::extract::State;
use axum::response::Response;
use std::sync::Arc;

/// What a route's answers are timed under (`fleet_api_request_seconds`).
#[derive(Clone)]
pub(crate) struct Timed {
    pub(crate) coord: Arc<Coordinator>,
    pub(crate) path: &'static str,
    pub(crate) verb: Verb,
}

/// Times a request from its route's point of view, the token guard included.
pub(crate) async fn timed_request(
    State(t): State<Timed>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    let class = match resp.status().as_u16() / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    };
    t.coord
        .metrics
        .api_seconds
        .with_label_values(&[t.path, t.verb.as_str(), class])
        .observe(started.elapsed().as_secs_f64());
    resp
}
