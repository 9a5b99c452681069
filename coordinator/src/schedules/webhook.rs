//! One delivery attempt: the stored body POSTed to the schedule's webhook with its signature,
//! delivery id and timestamp (see `shared::schedule::webhook`). Redirects are not followed (a
//! POST must not turn into a GET elsewhere); errors never carry the URL (its path may hold a
//! token).

use shared::schedule::webhook::{
    sign, DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};
use shared::schedule::Webhook;
use std::time::Duration;

/// The header naming the attempt (1-based).
pub(crate) const ATTEMPT_HEADER: &str = "x-fleet-attempt";

/// The client of every delivery: bounded connect and total times, no redirects.
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(20))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("fleet-coordinator/", env!("CARGO_PKG_VERSION")))
        .build()
        .unwrap_or_default()
}

/// What a delivery attempt sends.
pub(crate) struct Post<'a> {
    pub hook: &'a Webhook,
    pub body: Vec<u8>,
    pub delivery: &'a str,
    pub timestamp: i64,
    pub attempt: u32,
    /// The `X-Fleet-Event` header (`schedule.report`, `run.<event type>`).
    pub event: &'a str,
}

/// POSTs once: `Ok(status)` when the webhook answered (any status), `Err(why)` when it could
/// not be reached.
pub(crate) async fn post(http: &reqwest::Client, p: Post<'_>) -> Result<u16, String> {
    let signature = format!("sha256={}", sign(p.hook.secret.as_bytes(), &p.body));
    let resp = http
        .post(&p.hook.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(SIGNATURE_HEADER, signature)
        .header(DELIVERY_HEADER, p.delivery)
        .header(TIMESTAMP_HEADER, p.timestamp.to_string())
        .header(EVENT_HEADER, p.event)
        .header(ATTEMPT_HEADER, p.attempt.to_string())
        .body(p.body)
        .send()
        .await
        .map_err(describe)?;
    Ok(resp.status().as_u16())
}

/// The error and its causes, without the URL.
fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
