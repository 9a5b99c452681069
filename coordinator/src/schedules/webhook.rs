//! One delivery attempt: the stored body POSTed to the schedule's webhook with its signature,
//! delivery id and timestamp (see `shared::schedule::webhook`). Redirects are not followed (a
//! POST must not turn into a GET elsewhere), no proxy is used, and only addresses the fleet's
//! policy allows are connected to (`crate::webhook_guard`); what a failed attempt records is a
//! coarse outcome (`timed out`, `could not connect`, `address not allowed`, `failed`), never
//! the error's text, which would tell a member what listens inside the fleet's network.

use crate::webhook_guard::{AddressPolicy, GuardedResolver, NOT_ALLOWED};
use shared::schedule::webhook::{
    sign, DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};
use shared::schedule::Webhook;
use std::sync::Arc;
use std::time::Duration;

/// The header naming the attempt (1-based).
pub(crate) const ATTEMPT_HEADER: &str = "x-fleet-attempt";

/// The client of every delivery and the address policy it keeps.
#[derive(Clone)]
pub(crate) struct WebhookClient {
    http: reqwest::Client,
    pub policy: Arc<AddressPolicy>,
}

/// The client of every delivery: bounded connect and total times, no redirects, no proxy,
/// the policy's resolver (`FLEET_WEBHOOK_ALLOW`; a malformed one allows nothing internal).
pub(crate) fn client() -> WebhookClient {
    let policy = AddressPolicy::from_env().unwrap_or_else(|e| {
        tracing::error!(error = %e, "webhooks reach no internal address");
        AddressPolicy::default()
    });
    client_with(Arc::new(policy))
}

pub(crate) fn client_with(policy: Arc<AddressPolicy>) -> WebhookClient {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(20))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver {
            policy: policy.clone(),
        }))
        .user_agent(concat!("fleet-coordinator/", env!("CARGO_PKG_VERSION")))
        .build()
        .unwrap_or_default();
    WebhookClient { http, policy }
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

/// POSTs once: `Ok(status)` when the webhook answered (any status), `Err(outcome)` when it
/// could not be reached (a coarse outcome).
pub(crate) async fn post(client: &WebhookClient, p: Post<'_>) -> Result<u16, String> {
    // A host written as an address is connected to without the resolver: checked here.
    let literal = reqwest::Url::parse(&p.hook.url)
        .ok()
        .and_then(|u| u.host_str().map(|h| h.trim_matches(['[', ']']).to_string()))
        .and_then(|h| h.parse::<std::net::IpAddr>().ok());
    if literal.is_some_and(|ip| !client.policy.allows(ip)) {
        return Err(NOT_ALLOWED.into());
    }
    let signature = format!("sha256={}", sign(p.hook.secret.as_bytes(), &p.body));
    let resp = client
        .http
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

/// The coarse outcome of a failed attempt (its detail logged here, never recorded).
fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    tracing::debug!(error = %text, "webhook attempt failed");
    if text.contains(NOT_ALLOWED) {
        NOT_ALLOWED.into()
    } else if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "could not connect".into()
    } else {
        "failed".into()
    }
}
