//! A typed client of the coordinator's HTTP API (`coordinator::api`): one method per endpoint,
//! answers decoded into the structs below, an API error turned into its message and details.

use crate::submit::SubmitRequest;
use anyhow::{bail, Context};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use shared::engine::RunStatus;

pub use shared::http::{
    ArtifactListing, CancelAnswer, Decided, LogEntry, RunListing, RunOutcome, RunSummary, Submitted,
};

/// Bodies that carry the API version they speak.
pub trait Versioned {
    fn version(&self) -> Option<u32>;
}

macro_rules! versioned {
    ($($t:ty),*) => {$(
        impl Versioned for $t {
            fn version(&self) -> Option<u32> {
                Some(self.v)
            }
        }
    )*};
}
versioned!(
    Submitted,
    RunSummary,
    RunOutcome,
    CancelAnswer,
    Decided,
    ArtifactListing,
    shared::http::RunTree,
    shared::http::QuarantineView,
    shared::http::QuarantineDecided,
    shared::http::Uploaded
);

impl<T> Versioned for Vec<T> {
    fn version(&self) -> Option<u32> {
        None
    }
}

impl Versioned for crate::auth_api::TokenView {
    fn version(&self) -> Option<u32> {
        None
    }
}

impl Versioned for crate::auth_api::TokenCreated {
    fn version(&self) -> Option<u32> {
        None
    }
}

impl Versioned for Value {
    fn version(&self) -> Option<u32> {
        self.get("v").and_then(Value::as_u64).map(|v| v as u32)
    }
}

/// The wire name of a status (`running`, `succeeded`, ...).
pub fn status_name(s: RunStatus) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{s:?}").to_lowercase())
}

/// The API's error body as one message: `<http status>: <error>` and a line per detail.
pub fn error_message(status: reqwest::StatusCode, body: &Value) -> String {
    let mut msg = format!(
        "{status}: {}",
        body["error"].as_str().unwrap_or("request failed")
    );
    for d in body["details"].as_array().into_iter().flatten() {
        msg.push_str(&format!("\n  {}", d.as_str().unwrap_or("")));
    }
    msg
}

/// Whether a client of `server` verifies certificates: anything but a plain `http://`
/// address (a server named without a scheme fails on its own, roots or not).
pub fn needs_tls_roots(server: &str) -> bool {
    let scheme = server.trim_start().split("://").next().unwrap_or_default();
    !scheme.eq_ignore_ascii_case("http")
}

pub struct Client {
    server: String,
    http: reqwest::Client,
}

impl Client {
    /// A client of `server`, sending the API token of `FLEET_TOKEN` when it is set.
    pub fn new(server: &str) -> Self {
        let mut headers = reqwest::header::HeaderMap::new();
        let token = std::env::var("FLEET_TOKEN").unwrap_or_default();
        if let Ok(mut value) =
            format!("Bearer {}", token.trim()).parse::<reqwest::header::HeaderValue>()
        {
            if !token.trim().is_empty() {
                value.set_sensitive(true);
                headers.insert(reqwest::header::AUTHORIZATION, value);
            }
        }
        Self {
            server: server.trim_end_matches('/').to_string(),
            // Every call to the API is bounded (the server answers at once or streams nothing).
            http: reqwest::Client::builder()
                .connect_timeout(std::time::Duration::from_secs(10))
                .timeout(std::time::Duration::from_secs(120))
                .default_headers(headers)
                // Reading the system's root certificates is a third of a short command's
                // time (~10 ms): only a server reached over TLS needs them.
                .tls_built_in_root_certs(needs_tls_roots(server))
                .build()
                .unwrap_or_default(),
        }
    }

    pub async fn create_token(
        &self,
        role: shared::auth::Role,
        name: &str,
        team: Option<&str>,
    ) -> anyhow::Result<crate::auth_api::TokenCreated> {
        let mut body = json!({"role": role, "name": name});
        if let Some(team) = team {
            body["team"] = json!(team);
        }
        self.post("/v1/tokens", &body).await
    }

    pub async fn tokens(&self) -> anyhow::Result<Vec<crate::auth_api::TokenView>> {
        self.get("/v1/tokens").await
    }

    pub async fn revoke_token(&self, id: &str) -> anyhow::Result<crate::auth_api::TokenView> {
        self.post(&format!("/v1/tokens/{id}/revoke"), &json!({}))
            .await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server)
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach the coordinator at {}", self.server))?;
        self.send_checked(resp).await
    }

    /// The response, or its API error as the error.
    async fn send_checked(&self, resp: reqwest::Response) -> anyhow::Result<reqwest::Response> {
        if !resp.status().is_success() {
            let status = resp.status();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            bail!("{}", error_message(status, &body));
        }
        Ok(resp)
    }

    async fn decode<T: DeserializeOwned + Versioned>(
        &self,
        path: &str,
        resp: reqwest::Response,
    ) -> anyhow::Result<T> {
        let bytes = resp.bytes().await?;
        let body: T = serde_json::from_slice(&bytes)
            .with_context(|| format!("unexpected answer from {}{path}", self.server))?;
        if let Some(v) = body.version() {
            shared::http::check_version(v)
                .map_err(|e| anyhow::anyhow!("{}{path}: {e}", self.server))?;
        }
        Ok(body)
    }

    pub async fn get<T: DeserializeOwned + Versioned>(&self, path: &str) -> anyhow::Result<T> {
        let resp = self.send(self.http.get(self.url(path))).await?;
        self.decode(path, resp).await
    }

    pub async fn post<T: DeserializeOwned + Versioned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> anyhow::Result<T> {
        let resp = self.send(self.http.post(self.url(path)).json(body)).await?;
        self.decode(path, resp).await
    }

    /// A route's body as text (`/v1/batches/:id/junit`, `/v1/batches/:id/html`).
    pub async fn text(&self, path: &str) -> anyhow::Result<String> {
        let resp = self.send(self.http.get(self.url(path))).await?;
        Ok(resp.text().await?)
    }

    /// The pack the caller's team uploaded `commit` in; `None` when it did not.
    pub async fn uploaded(&self, commit: &str) -> anyhow::Result<Option<shared::http::Uploaded>> {
        let path = format!("/v1/uploads/commits/{commit}");
        let resp = self
            .http
            .get(self.url(&path))
            .send()
            .await
            .with_context(|| format!("cannot reach the coordinator at {}", self.server))?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let resp = self.send_checked(resp).await?;
        self.decode(&path, resp).await.map(Some)
    }

    /// Uploads a pack holding `commit` (and its history).
    pub async fn upload(
        &self,
        commit: &str,
        pack: Vec<u8>,
    ) -> anyhow::Result<shared::http::Uploaded> {
        let path = format!("/v1/uploads?commit={commit}");
        let req = self
            .http
            .post(self.url(&path))
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(pack);
        let resp = self.send(req).await?;
        self.decode(&path, resp).await
    }

    pub async fn submit(&self, req: &SubmitRequest) -> anyhow::Result<Submitted> {
        self.post("/v1/runs", req).await
    }

    /// The full status view (printed as it comes by `fleet status`).
    pub async fn status(&self, run: &str) -> anyhow::Result<Value> {
        self.get(&format!("/v1/runs/{run}")).await
    }

    /// The run and every child run below it.
    pub async fn tree(&self, run: &str) -> anyhow::Result<shared::http::RunTree> {
        self.get(&format!("/v1/runs/{run}/tree")).await
    }

    pub async fn summary(&self, run: &str) -> anyhow::Result<RunSummary> {
        self.get(&format!("/v1/runs/{run}/summary")).await
    }

    pub async fn result(&self, run: &str) -> anyhow::Result<RunOutcome> {
        self.get(&format!("/v1/runs/{run}/result")).await
    }

    pub async fn cancel(&self, run: &str) -> anyhow::Result<CancelAnswer> {
        self.post(&format!("/v1/runs/{run}/cancel"), &json!({}))
            .await
    }

    pub async fn decide(
        &self,
        run: &str,
        node: &str,
        approved: bool,
        by: &str,
        comment: &str,
        edits: Option<serde_json::Value>,
    ) -> anyhow::Result<Decided> {
        let mut body = json!({"approved": approved, "by": by, "comment": comment});
        if let Some(edits) = edits {
            body["edits"] = edits;
        }
        self.post(&format!("/v1/runs/{run}/approvals/{node}"), &body)
            .await
    }

    pub async fn quarantine(&self, run: &str) -> anyhow::Result<shared::http::QuarantineView> {
        self.get(&format!("/v1/runs/{run}/quarantine")).await
    }

    pub async fn decide_quarantine(
        &self,
        run: &str,
        item: &str,
        approved: bool,
        by: &str,
        comment: &str,
    ) -> anyhow::Result<shared::http::QuarantineDecided> {
        self.post(
            &format!("/v1/runs/{run}/quarantine/{item}"),
            &json!({"approved": approved, "by": by, "comment": comment}),
        )
        .await
    }

    pub async fn logs(&self, run: &str) -> anyhow::Result<Vec<LogEntry>> {
        self.get(&format!("/v1/runs/{run}/logs")).await
    }

    pub async fn artifacts(&self, run: &str) -> anyhow::Result<ArtifactListing> {
        self.get(&format!("/v1/runs/{run}/artifacts")).await
    }

    /// One artifact of `run`, as stored (the server refuses keys of other runs).
    pub async fn artifact(&self, run: &str, key: &str) -> anyhow::Result<Vec<u8>> {
        let resp = self
            .send(
                self.http
                    .get(self.url(&format!("/v1/runs/{run}/artifacts/{key}"))),
            )
            .await?;
        Ok(resp.bytes().await?.to_vec())
    }

    pub async fn runs(&self) -> anyhow::Result<Vec<RunListing>> {
        self.get("/v1/runs").await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_http_server_is_reached_without_root_certificates() {
        for plain in ["http://127.0.0.1:8080", "HTTP://fleet.local", " http://x/"] {
            assert!(!needs_tls_roots(plain), "{plain}");
        }
        for tls in [
            "https://fleet.example.com",
            "HTTPS://fleet.example.com",
            "httpx://odd",
            "fleet.example.com",
            "",
        ] {
            assert!(needs_tls_roots(tls), "{tls}");
        }
    }

    #[test]
    fn the_apis_answers_decode() {
        let s: RunSummary = serde_json::from_value(json!({
            "run_id": "r1", "graph": "factory", "status": "running",
            "awaiting_approval": [], "visits": {"se": 2, "tr": 1},
            "usage": {"llm_calls": 1, "input_tokens": 2, "output_tokens": 3, "cost_usd": 0.5},
            "jobs_total": 3, "jobs_pending": 1,
            "created_at": "2026-11-22T10:00:00.123Z", "updated_at": "", "finished_at": null,
        }))
        .unwrap();
        assert_eq!(s.status, RunStatus::Running);
        assert_eq!(s.visits["se"], 2);
        assert_eq!((s.jobs_total, s.jobs_pending), (3, 1));

        let r: RunOutcome = serde_json::from_value(json!({
            "status": "failed", "result": {"verdict": "FAIL", "ended_stage": "po"},
            "usage": {"llm_calls": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0},
        }))
        .unwrap();
        assert_eq!(r.verdict(), "FAIL");
        assert_eq!(r.ended_stage(), Some("po"));
        let generic: RunOutcome =
            serde_json::from_value(json!({"status": "succeeded", "result": {"x": 1}})).unwrap();
        assert_eq!(generic.verdict(), "SUCCEEDED");
        assert_eq!(generic.ended_stage(), None);

        let c: CancelAnswer =
            serde_json::from_value(json!({"run_id": "r1", "status": "cancelled"})).unwrap();
        assert_eq!(c.status, RunStatus::Cancelled);
        let l: Vec<LogEntry> = serde_json::from_value(json!([{
            "job_id": "r1.se.1", "node": "se", "visit": 1, "status": "ok", "error": null,
            "worker": "w1", "started_at": "2026-11-22T10:00:00.123Z",
            "finished_at": "2026-11-22T10:00:01.500Z",
            "artifacts": {"prompt": "runs/r1/attempt_1/se/prompt.md"},
            "usage": {"llm_calls": 1, "input_tokens": 2, "output_tokens": 3, "cost_usd": 0.0},
        }]))
        .unwrap();
        assert_eq!(l[0].artifacts["prompt"], "runs/r1/attempt_1/se/prompt.md");
        assert_eq!(status_name(RunStatus::Succeeded), "succeeded");
    }

    #[test]
    fn an_api_error_reads_as_its_message_and_details() {
        let m = error_message(
            reqwest::StatusCode::BAD_REQUEST,
            &json!({"error": "invalid graph", "details": ["g.yaml: node `a`: boom", "two"]}),
        );
        assert_eq!(
            m,
            "400 Bad Request: invalid graph\n  g.yaml: node `a`: boom\n  two"
        );
        assert_eq!(
            error_message(reqwest::StatusCode::BAD_GATEWAY, &Value::Null),
            "502 Bad Gateway: request failed"
        );
    }
}
