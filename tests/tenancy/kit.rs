//! What the tenancy attacks share: one HTTP call with a team's token.

use fleet_tests::stack::Stack;
use serde_json::Value;

/// `GET path` (or `POST` of `body`) with `token`: the status and the body (JSON, or its text).
pub(crate) async fn call(
    stack: &Stack,
    token: &str,
    path: &str,
    body: Option<&Value>,
) -> anyhow::Result<(u16, Value)> {
    let http = reqwest::Client::new();
    let url = format!("{}{path}", stack.server);
    let req = match body {
        Some(b) => http.post(url).json(b),
        None => http.get(url),
    };
    let resp = req.bearer_auth(token).send().await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}
