//! The process's own health: `/healthz` (`ok`, or degraded naming the servers that are away)
//! and `/metrics`, with `fleet_dependency_up` per server read when they are asked.

use crate::driver::Coordinator;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use std::sync::Arc;

/// The servers the coordinator needs and whether each answered its last call: Redis (the run
/// store), RabbitMQ (the broker) and S3 (the object store), each when it is a server.
pub fn dependencies(c: &Coordinator) -> Vec<(&'static str, bool)> {
    [
        c.store.dependency(),
        c.broker.dependency(),
        c.blobs.dependency(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// `ok`, or `degraded: <server>, … unreachable` while a server the coordinator needs is away
/// (200 either way: the process itself is alive, and restarting it would not bring the server
/// back).
#[utoipa::path(
    get, path = "/healthz",
    responses((status = 200, body = String, description = "`ok`, or `degraded: redis, rabbitmq, s3 unreachable`"))
)]
pub(crate) async fn healthz(State(c): State<Arc<Coordinator>>) -> String {
    let down: Vec<&str> = dependencies(&c)
        .into_iter()
        .filter(|(_, up)| !up)
        .map(|(name, _)| name)
        .collect();
    if down.is_empty() {
        "ok".into()
    } else {
        format!("degraded: {} unreachable", down.join(", "))
    }
}

/// Prometheus metrics, in the text exposition format.
#[utoipa::path(
    get, path = "/metrics",
    responses((status = 200, body = String, content_type = "text/plain"))
)]
pub(crate) async fn metrics(State(c): State<Arc<Coordinator>>) -> impl IntoResponse {
    for (name, up) in dependencies(&c) {
        c.metrics
            .dependency_up
            .with_label_values(&[name])
            .set(i64::from(up));
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        c.metrics.render(),
    )
}
