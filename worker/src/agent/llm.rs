//! What both LLM wire formats share: settings, retries with backoff on 429 and 5xx (529
//! included, `retry-after` honoured), the price table, token counting, and the final-answer
//! rules.

use serde_json::Value;
use shared::messages::Usage;
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
    /// Closed by default: a call whose model has no price is never sent (its cost would be
    /// unknown, never $0).
    #[error("no price for model `{0}`: the call is not sent (price it in FLEET_PRICES)")]
    NoPrice(String),
    /// The run's budget has less left than the call's input would cost.
    #[error("budget_exhausted: the run's or the team's budget has ${left:.6} left, not enough for another call")]
    Budget { left: f64 },
    /// The fleet's ledger refused the call (`budget_exhausted: …`) or could not be asked.
    #[error("{0}")]
    Quota(#[from] crate::quota::Refusal),
}

pub use super::prices::{Billed, Price, PriceTable, MAX_PRICE, PRICES_READ};

/// The worker's LLM settings. API keys stay here and never enter a container (nor a log:
/// `Debug` shows whether a key is set, never the key).
#[derive(Clone)]
pub struct LlmSettings {
    pub anthropic_base_url: String,
    pub anthropic_api_key: Option<String>,
    pub openai_base_url: String,
    pub openai_api_key: Option<String>,
    pub prices: PriceTable,
    pub max_retries: u32,
    pub request_timeout: Duration,
    /// Calls per window to each provider, over every agent of this worker (`FLEET_LLM_RATE`).
    pub anthropic_rate: Option<std::sync::Arc<super::rate::RateLimit>>,
    pub openai_rate: Option<std::sync::Arc<super::rate::RateLimit>>,
    /// The fleet's ledger (a worker with Redis): team budgets, team and fleet call rates, and
    /// the fleet-wide back-off on 429s. With it, `FLEET_LLM_RATE` holds over the whole fleet
    /// and the worker's own limits above are not used.
    pub gate: Option<crate::quota::FleetGate>,
    /// The job the calls are made for (set per job by [`LlmSettings::for_job`]).
    pub scope: Option<crate::quota::JobScope>,
    /// What a command agent's gateway serves (body sizes, output tokens per call).
    pub gateway: super::gateway_policy::GatewayLimits,
}

impl std::fmt::Debug for LlmSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = |k: &Option<String>| k.as_ref().map(|_| "<redacted>");
        f.debug_struct("LlmSettings")
            .field("anthropic_base_url", &self.anthropic_base_url)
            .field("anthropic_api_key", &key(&self.anthropic_api_key))
            .field("openai_base_url", &self.openai_base_url)
            .field("openai_api_key", &key(&self.openai_api_key))
            .field("max_retries", &self.max_retries)
            .field("request_timeout", &self.request_timeout)
            .field("gateway", &self.gateway)
            .finish_non_exhaustive()
    }
}

impl LlmSettings {
    /// These settings for one job's calls: its run and team, under the fleet's ledger.
    pub fn for_job(&self, run: &str, team: Option<&str>) -> LlmSettings {
        LlmSettings {
            scope: Some(crate::quota::JobScope {
                team: team.map(str::to_string),
                run: run.to_string(),
            }),
            ..self.clone()
        }
    }

    /// The provider `url` belongs to.
    fn provider_of(&self, url: &str) -> Option<&'static str> {
        if url.starts_with(self.anthropic_base_url.as_str()) {
            Some("anthropic")
        } else if url.starts_with(self.openai_base_url.as_str()) {
            Some("openai")
        } else {
            None
        }
    }

    /// The rate limit of the provider `url` belongs to, if it has one.
    fn rate_for(&self, url: &str) -> Option<&super::rate::RateLimit> {
        if url.starts_with(self.anthropic_base_url.as_str()) {
            self.anthropic_rate.as_deref()
        } else if url.starts_with(self.openai_base_url.as_str()) {
            self.openai_rate.as_deref()
        } else {
            None
        }
    }
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
            anthropic_rate: None,
            openai_rate: None,
            gate: None,
            scope: None,
            gateway: super::gateway_policy::GatewayLimits::default(),
        }
    }
}

/// Posts `body`, retrying 408, 409, 429, 5xx and transport errors with exponential backoff or
/// after the provider's `retry-after`; a reply's `x-should-retry` decides over its status.
pub async fn post_with_retry(
    http: &reqwest::Client,
    url: &str,
    headers: &[(&str, String)],
    body: &Value,
    settings: &LlmSettings,
    usage: &mut Usage,
) -> Result<Value, LlmError> {
    let model = body["model"].as_str().unwrap_or_default();
    let price = settings
        .prices
        .price(model)
        .ok_or_else(|| LlmError::NoPrice(model.to_string()))?;
    let mut attempt = 0;
    let gated = match (&settings.gate, &settings.scope, settings.provider_of(url)) {
        (Some(gate), Some(scope), Some(provider)) => Some((gate, scope, provider)),
        _ => None,
    };
    loop {
        attempt += 1;
        match gated {
            Some((gate, scope, provider)) => gate.admit(scope, provider).await?,
            None => {
                if let Some(rate) = settings.rate_for(url) {
                    rate.acquire().await;
                }
            }
        }
        let mut req = http.post(url).timeout(settings.request_timeout).json(body);
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let outcome = req.send().await;
        let retry_after = match outcome {
            Ok(resp) if resp.status().is_success() => {
                usage.llm_calls += 1;
                let reply = resp.json::<Value>().await.map_err(LlmError::Http)?;
                if let Some((gate, scope, provider)) = gated {
                    let billed = Billed::of_reply(&reply);
                    let tokens = [billed.output, billed.cache_write, billed.cache_read]
                        .into_iter()
                        .fold(billed.input, u64::saturating_add);
                    gate.record(scope, provider, tokens, price.cost(&billed))
                        .await;
                }
                return Ok(reply);
            }
            Ok(resp) => {
                let status = resp.status().as_u16();
                let retry_after = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                // The provider says whether to retry (`x-should-retry`, Anthropic's and
                // OpenAI's SDKs obey it); else 408, 409, 429 and 5xx are retried as they do.
                let should_retry = resp
                    .headers()
                    .get("x-should-retry")
                    .and_then(|v| v.to_str().ok())
                    .map(|v| v.trim().eq_ignore_ascii_case("true"));
                let body = resp.text().await.unwrap_or_default();
                let retryable =
                    should_retry.unwrap_or(matches!(status, 408 | 409 | 429) || status >= 500);
                if !retryable || attempt > settings.max_retries {
                    return Err(LlmError::Api { status, body });
                }
                if let (429, Some((gate, _, provider))) = (status, gated) {
                    // The whole fleet holds its calls to this provider, not this worker alone.
                    gate.throttled(provider, retry_wait(retry_after.as_deref(), attempt))
                        .await;
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
        tokio::time::sleep(retry_wait(retry_after.as_deref(), attempt)).await;
    }
}

/// How long to wait after failed attempt `attempt` (1, 2, ...): the server's `retry-after` in
/// seconds when it sends one, else exponential backoff from 0.25 s; at most a minute.
pub fn retry_wait(retry_after: Option<&str>, attempt: u32) -> Duration {
    let backoff = 0.25 * 2f64.powi(attempt.min(64) as i32 - 1);
    let wait = retry_after
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|w| !w.is_nan())
        .unwrap_or(backoff)
        .clamp(0.0, 60.0);
    Duration::from_secs_f64(wait)
}

/// Adds a reply's token counts to `usage` (saturating: the numbers are the provider's).
pub fn count_tokens(usage: &mut Usage, input_tokens: Option<u64>, output_tokens: Option<u64>) {
    usage.input_tokens = usage.input_tokens.saturating_add(input_tokens.unwrap_or(0));
    usage.output_tokens = usage
        .output_tokens
        .saturating_add(output_tokens.unwrap_or(0));
}

/// Parses a JSON object out of a text answer (bare, or in a ```json fence).
pub fn json_from_text(text: &str) -> Option<Value> {
    let trimmed = text.trim();
    if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
        return v.is_object().then_some(v);
    }
    let start = trimmed.find('{')?;
    let end = trimmed.rfind('}')?;
    serde_json::from_str::<Value>(trimmed.get(start..=end)?)
        .ok()
        .filter(Value::is_object)
}

pub const SUBMIT: &str = "submit";
pub const SUBMIT_DESCRIPTION: &str =
    "Submit your final answer. Its input must match the required output schema exactly.";

#[cfg(test)]
pub(crate) mod tests {
    #[test]
    fn the_settings_debug_form_never_shows_a_key() {
        let settings = super::LlmSettings {
            anthropic_api_key: Some("sk-ant-secret-1".into()),
            openai_api_key: Some("sk-oai-secret-2".into()),
            ..super::LlmSettings::default()
        };
        let shown = format!("{settings:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    use super::*;
    use proptest::prelude::*;

    pub(crate) use shared::proptest_support::{arb_json, arb_text, cases, timed, CASE_LIMIT};

    /// A `retry-after` header: anything, or a number written any way (`NaN`, `inf`, `1e400`).
    fn arb_retry_after() -> impl Strategy<Value = String> {
        prop_oneof![
            "\\PC{0,12}",
            any::<f64>().prop_map(|f| f.to_string()),
            any::<f64>().prop_map(|f| format!("{f:e}")),
            prop::sample::select(vec![
                "NaN", "nan", "-NaN", "inf", "-inf", "infinity", "1e400", "-0", "1e-400"
            ])
            .prop_map(str::to_string),
        ]
    }

    proptest! {
        #![proptest_config(cases(512))]

        #[test]
        fn any_retry_after_gives_a_wait_of_at_most_a_minute(
            header in prop::option::of(arb_retry_after()),
            attempt in any::<u32>(),
        ) {
            let wait = retry_wait(header.as_deref(), attempt);
            prop_assert!(wait <= Duration::from_secs(60), "{header:?} {attempt}: {wait:?}");
        }

        #[test]
        fn json_from_text_never_panics_and_finds_only_objects(text in arb_text()) {
            let (found, took) = timed(|| json_from_text(&text));
            prop_assert!(found.is_none_or(|v| v.is_object()));
            prop_assert!(took < CASE_LIMIT);
        }

        #[test]
        fn any_price_table_gives_finite_non_negative_costs(
            json in prop_oneof![
                arb_text(),
                prop::collection::btree_map(
                    "[a-c]{0,3}", (any::<f64>(), any::<f64>()), 0..4,
                ).prop_map(|m| serde_json::to_string(&m).unwrap_or_default()),
            ],
            model in "[a-c]{0,4}",
            input_tokens in any::<u64>(),
            output_tokens in any::<u64>(),
        ) {
            let mut table = PriceTable::with_defaults();
            if table.extend_from_json(&json).is_ok() {
                let cost = table.cost(&model, input_tokens, output_tokens);
                prop_assert!(cost.is_finite() && cost >= 0.0, "{json} {model}: {cost}");
            }
        }

        #[test]
        fn token_counts_of_any_size_add_up_without_panicking(
            start in any::<(u64, u64)>(),
            input in any::<Option<u64>>(),
            output in any::<Option<u64>>(),
        ) {
            let mut usage = Usage { input_tokens: start.0, output_tokens: start.1, ..Usage::default() };
            count_tokens(&mut usage, input, output);
            prop_assert!(usage.input_tokens >= start.0 && usage.output_tokens >= start.1);
        }
    }

    #[test]
    fn prices_use_the_longest_entry_a_snapshot_belongs_to() {
        let t = PriceTable::with_defaults();
        let mini = t.cost("gpt-4o-mini-2024-07-18", 1_000_000, 0);
        assert!((mini - 0.15).abs() < 1e-9);
        assert!(t.price("unknown").is_none());
    }

    #[test]
    fn a_nan_retry_after_or_a_huge_attempt_waits_the_backoff() {
        // Both panicked: `Duration::from_secs_f64(NaN)`, and `attempt as i32 - 1` overflowing.
        assert_eq!(retry_wait(Some("NaN"), 0), Duration::from_secs_f64(0.125));
        assert_eq!(retry_wait(Some("NaN"), 3), Duration::from_secs(1));
        assert_eq!(retry_wait(None, u32::MAX), Duration::from_secs(60));
        assert_eq!(retry_wait(Some("inf"), 1), Duration::from_secs(60));
        assert_eq!(retry_wait(Some("-5"), 1), Duration::ZERO);
        assert_eq!(retry_wait(Some("2.5"), 1), Duration::from_secs_f64(2.5));
    }

    #[test]
    fn a_closing_brace_before_the_opening_one_is_no_json() {
        // Panicked: `trimmed[start..=end]` with `end < start`.
        assert!(json_from_text("}`{").is_none());
    }

    #[test]
    fn prices_out_of_range_are_refused() {
        // A price of -4e301 was accepted; its cost is negative (or infinite, which JSON
        // writes as null and a `JobResult` then fails to read).
        let mut t = PriceTable::with_defaults();
        assert!(t
            .extend_from_json(r#"{"":[-4.2661255008206724e+301,0.0]}"#)
            .is_err());
        assert!(t.extend_from_json(r#"{"m":[1e300,1.0]}"#).is_err());
        assert!(t.extend_from_json(r#"{"m":[1.0,2.0]}"#).is_ok());
        assert!(t.cost("m", u64::MAX, u64::MAX).is_finite());
    }

    #[test]
    fn token_counts_saturate() {
        // Panicked: `usage.output_tokens += ...` overflowing.
        let mut usage = Usage {
            output_tokens: 4199908635904747956,
            ..Usage::default()
        };
        count_tokens(&mut usage, None, Some(14246835437804803660));
        assert_eq!(usage.output_tokens, u64::MAX);
    }

    #[test]
    fn json_is_found_in_fenced_text() {
        let v = json_from_text("here:\n```json\n{\"a\": 1}\n```").unwrap();
        assert_eq!(v["a"], 1);
        assert!(json_from_text("no json").is_none());
    }
}
