//! What both LLM wire formats share: settings, retries with backoff on 429 and 5xx (529
//! included, `retry-after` honoured), the price table, and the final-answer rules.

use serde_json::Value;
use shared::messages::Usage;
use std::collections::BTreeMap;
use std::time::Duration;
use thiserror::Error;
use tracing::warn;

#[derive(Debug, Error)]
pub enum LlmError {
    #[error("llm http: {0}")]
    Http(#[from] reqwest::Error),
    #[error("llm api returned {status}: {body}")]
    Api { status: u16, body: String },
    #[error("llm response is malformed: {0}")]
    Malformed(String),
    #[error("no api key: set {0}")]
    NoKey(&'static str),
}

/// Per-million-token prices in USD: (input, output).
#[derive(Clone, Debug, Default)]
pub struct PriceTable(pub BTreeMap<String, (f64, f64)>);

impl PriceTable {
    pub fn with_defaults() -> Self {
        let mut t = BTreeMap::new();
        for (model, i, o) in [
            ("claude-opus-4", 15.0, 75.0),
            ("claude-sonnet-4", 3.0, 15.0),
            ("claude-3-5-haiku", 0.8, 4.0),
            ("gpt-4o", 2.5, 10.0),
            ("gpt-4o-mini", 0.15, 0.6),
        ] {
            t.insert(model.to_string(), (i, o));
        }
        Self(t)
    }

    /// Adds entries from JSON `{"model": [input_per_mtok, output_per_mtok]}`.
    pub fn extend_from_json(&mut self, json: &str) -> Result<(), String> {
        let extra: BTreeMap<String, (f64, f64)> =
            serde_json::from_str(json).map_err(|e| format!("bad price table: {e}"))?;
        self.0.extend(extra);
        Ok(())
    }

    /// Cost of a call; the longest model-name prefix in the table wins.
    pub fn cost(&self, model: &str, input_tokens: u64, output_tokens: u64) -> f64 {
        let best = self
            .0
            .iter()
            .filter(|(k, _)| model.starts_with(k.as_str()))
            .max_by_key(|(k, _)| k.len());
        match best {
            Some((_, (i, o))) => (input_tokens as f64 * i + output_tokens as f64 * o) / 1_000_000.0,
            None => {
                warn!(model, "no price for this model; cost counted as 0");
                0.0
            }
        }
    }
}

/// The worker's LLM settings. API keys stay here and never enter a container.
#[derive(Clone, Debug)]
pub struct LlmSettings {
    pub anthropic_base_url: String,
    pub anthropic_api_key: Option<String>,
    pub openai_base_url: String,
    pub openai_api_key: Option<String>,
    pub prices: PriceTable,
    pub max_retries: u32,
    pub request_timeout: Duration,
}

impl Default for LlmSettings {
    fn default() -> Self {
        Self {
            anthropic_base_url: "https://api.anthropic.com".into(),
            anthropic_api_key: None,
            openai_base_url: "https://api.openai.com".into(),
            openai_api_key: None,
            prices: PriceTable::with_defaults(),
            max_retries: 6,
            request_timeout: Duration::from_secs(300),
        }
    }
}

/// Posts `body`, retrying 429, 5xx and transport errors with exponential backoff.
pub async fn post_with_retry(
    http: &reqwest::Client,
    url: &str,
    headers: &[(&str, String)],
    body: &Value,
    settings: &LlmSettings,
    usage: &mut Usage,
) -> Result<Value, LlmError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut req = http.post(url).timeout(settings.request_timeout).json(body);
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let outcome = req.send().await;
        let retry_after = match outcome {
            Ok(resp) if resp.status().is_success() => {
                usage.llm_calls += 1;
                return resp.json::<Value>().await.map_err(LlmError::Http);
            }
            Ok(resp) => {
                let status = resp.status().as_u16();
                let retry_after = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<f64>().ok());
                let body = resp.text().await.unwrap_or_default();
                let retryable = status == 429 || status >= 500;
                if !retryable || attempt > settings.max_retries {
                    return Err(LlmError::Api { status, body });
                }
                warn!(status, attempt, "llm call failed, retrying");
                retry_after
            }
            Err(e) => {
                if attempt > settings.max_retries {
                    return Err(LlmError::Http(e));
                }
                warn!(error = %e, attempt, "llm call failed, retrying");
                None
            }
        };
        let backoff = 0.25 * 2f64.powi(attempt as i32 - 1);
        let wait = retry_after.unwrap_or(backoff).clamp(0.0, 60.0);
        tokio::time::sleep(Duration::from_secs_f64(wait)).await;
    }
}

/// Parses a JSON object out of a text answer (bare, or in a ```json fence).
pub fn json_from_text(text: &str) -> Option<Value> {
    let trimmed = text.trim();
    if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
        return v.is_object().then_some(v);
    }
    let start = trimmed.find('{')?;
    let end = trimmed.rfind('}')?;
    serde_json::from_str::<Value>(&trimmed[start..=end])
        .ok()
        .filter(Value::is_object)
}

pub const SUBMIT: &str = "submit";
pub const SUBMIT_DESCRIPTION: &str =
    "Submit your final answer. Its input must match the required output schema exactly.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_use_the_longest_prefix() {
        let t = PriceTable::with_defaults();
        let mini = t.cost("gpt-4o-mini-2024", 1_000_000, 0);
        assert!((mini - 0.15).abs() < 1e-9);
        assert_eq!(t.cost("unknown", 10, 10), 0.0);
    }

    #[test]
    fn json_is_found_in_fenced_text() {
        let v = json_from_text("here:\n```json\n{\"a\": 1}\n```").unwrap();
        assert_eq!(v["a"], 1);
        assert!(json_from_text("no json").is_none());
    }
}
