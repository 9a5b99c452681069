//! A webhook receiver on 127.0.0.1 for the tests of signed deliveries: it records every POST
//! (headers, body, the status it answered) and answers 500 to the first, 200 after.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use std::sync::{Arc, Mutex};

/// What the fake webhook received: headers, body and the status it answered.
pub type Received = Arc<Mutex<Vec<(HeaderMap, Vec<u8>, u16)>>>;

/// Serves `path` on 127.0.0.1; its URL.
pub async fn fake_webhook(received: Received, path: &str) -> anyhow::Result<String> {
    async fn hook(
        State(r): State<Received>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> StatusCode {
        let mut r = r.lock().unwrap();
        let status = if r.is_empty() { 500 } else { 200 };
        r.push((headers, body.to_vec(), status));
        StatusCode::from_u16(status).unwrap()
    }
    let app = axum::Router::new()
        .route(path, axum::routing::post(hook))
        .with_state(received);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}{path}"))
}

/// A header's value as text (empty when absent).
pub fn header<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}
