//! What the LLM gateway lets a command agent send (pure rules, no I/O): the operator's limits on
//! the gateway ([`GatewayLimits`]) and the request body as it is forwarded ([`police`]). Nothing
//! the program in the container writes in a body may raise what the call can cost: the model is
//! the configured one, the output is clamped (to the operator's cap and to the tokens left in
//! the job's budget), one choice only, no priority tier, no tool or connector that runs on the
//! provider's side and bills there.

use serde_json::{json, Value};
use shared::messages::LlmApi;

/// The gateway's bounds, set by the operator for every job of the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatewayLimits {
    /// A request body is at most this many bytes (`FLEET_LLM_GATEWAY_MAX_BODY_BYTES`); larger
    /// ones are answered 413 before they are read.
    pub max_body_bytes: usize,
    /// Request bytes one job's gateway holds at once, over all its connections (read, parsed
    /// or being forwarded): a connection waits for room before its body is read. At least
    /// `max_body_bytes`.
    pub in_flight_bytes: usize,
    /// The most output tokens one call may ask for (`FLEET_LLM_GATEWAY_MAX_OUTPUT_TOKENS`).
    pub max_output_tokens: u64,
}

impl Default for GatewayLimits {
    fn default() -> Self {
        GatewayLimits {
            max_body_bytes: 4 << 20,
            in_flight_bytes: 8 << 20,
            max_output_tokens: 16_384,
        }
    }
}

impl GatewayLimits {
    /// The defaults with the operator's environment applied; a malformed value is an error.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<GatewayLimits, String> {
        let mut limits = GatewayLimits::default();
        let num = |key: &str| -> Result<Option<u64>, String> {
            get(key)
                .filter(|v| !v.trim().is_empty())
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| format!("{key} must be a positive integer, not `{v}`"))
                })
                .transpose()
        };
        if let Some(n) = num("FLEET_LLM_GATEWAY_MAX_BODY_BYTES")? {
            limits.max_body_bytes = usize::try_from(n).unwrap_or(usize::MAX).min(1 << 30);
            limits.in_flight_bytes = limits.max_body_bytes.saturating_mul(2);
        }
        if let Some(n) = num("FLEET_LLM_GATEWAY_MAX_OUTPUT_TOKENS")? {
            limits.max_output_tokens = n;
        }
        Ok(limits)
    }
}

/// Why a body is refused (answered 400 in the API's error shape).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("streaming is not served through the gateway; send `stream: false`")]
    Stream,
    #[error("the gateway serves no tool that runs on the provider's side (`{0}`); declare your own tools")]
    ServerTool(String),
    #[error("the gateway does not forward `{0}`")]
    Field(&'static str),
    #[error("no output tokens are left in this job's budget")]
    NoTokensLeft,
    /// A tool definition the provider would refuse (the whole request): refused here, before
    /// it leaves the worker, naming the tool and the provider's rule.
    #[error("tool `{tool}`: {breach}")]
    ToolRule { tool: String, breach: String },
}

/// Fields a body may not carry at all: connectors and tools the provider runs and bills.
const REFUSED_FIELDS: [&str; 3] = ["mcp_servers", "web_search_options", "container"];

/// Fields dropped from every body: they would raise the price of the same call.
const DROPPED_FIELDS: [&str; 1] = ["service_tier"];

/// The body as it is forwarded: the configured model, the output clamped to
/// `min(limits.max_output_tokens, tokens_left)` (set to that when absent), `n` forced to 1,
/// `service_tier` dropped; streaming, provider-side tools and connectors refused.
pub fn police(
    api: LlmApi,
    body: &mut Value,
    model: &str,
    limits: &GatewayLimits,
    tokens_left: u64,
) -> Result<(), Refused> {
    let Some(obj) = body.as_object_mut() else {
        return Ok(());
    };
    if obj.get("stream") == Some(&json!(true)) {
        return Err(Refused::Stream);
    }
    if let Some(field) = REFUSED_FIELDS.iter().find(|f| obj.contains_key(**f)) {
        return Err(Refused::Field(field));
    }
    if let Some(Value::Array(tools)) = obj.get("tools") {
        if let Some(kind) = tools.iter().find_map(|t| server_tool(api, t)) {
            return Err(Refused::ServerTool(kind));
        }
    }
    if let Some(Value::Array(tools)) = obj.get("tools") {
        tool_rules(api, tools)?;
    }
    for field in DROPPED_FIELDS {
        obj.remove(field);
    }
    obj.insert("model".into(), json!(model));
    if api == LlmApi::Openai && super::openai::reasoning_model(model) {
        // OpenAI's reasoning models refuse `max_tokens` ("Use 'max_completion_tokens'
        // instead") and any temperature but the default: rewritten, not refused, since the
        // program could not know which model the gateway pins.
        if let Some(v) = obj.remove("max_tokens") {
            obj.entry("max_completion_tokens").or_insert(v);
        }
        if obj
            .get("temperature")
            .is_some_and(|t| t.as_f64() != Some(1.0))
        {
            obj.remove("temperature");
        }
    }
    let cap = limits.max_output_tokens.min(tokens_left);
    if cap == 0 {
        return Err(Refused::NoTokensLeft);
    }
    let fields: &[&str] = match api {
        LlmApi::Anthropic => &["max_tokens"],
        LlmApi::Openai => &["max_tokens", "max_completion_tokens"],
    };
    let mut set = false;
    for field in fields {
        if let Some(v) = obj.get_mut(*field) {
            let asked = v.as_u64().unwrap_or(cap);
            *v = json!(asked.min(cap));
            set = true;
        }
    }
    if !set {
        let field = match api {
            LlmApi::Anthropic => "max_tokens",
            LlmApi::Openai => "max_completion_tokens",
        };
        obj.insert(field.into(), json!(cap));
    }
    if obj.contains_key("n") {
        obj.insert("n".into(), json!(1));
    }
    if let Some(thinking) = obj.get_mut("thinking").and_then(Value::as_object_mut) {
        // Anthropic's thinking budget counts against `max_tokens`; kept below it.
        if let Some(b) = thinking.get_mut("budget_tokens") {
            let asked = b.as_u64().unwrap_or(0);
            *b = json!(asked.min(cap.saturating_sub(1)));
        }
    }
    Ok(())
}

/// The provider's rules for the program's own tools (`shared::providers`): a definition the
/// provider would refuse is refused here with the rule.
fn tool_rules(api: LlmApi, tools: &[Value]) -> Result<(), Refused> {
    use shared::providers::{tool_breaches, Provider};
    let provider = match api {
        LlmApi::Anthropic => Provider::Anthropic,
        LlmApi::Openai => Provider::Openai,
    };
    for tool in tools {
        let (name, schema) = match api {
            LlmApi::Anthropic => (&tool["name"], &tool["input_schema"]),
            LlmApi::Openai => (&tool["function"]["name"], &tool["function"]["parameters"]),
        };
        let name = name.as_str().unwrap_or_default();
        // OpenAI's `parameters` may be left out (a function without arguments).
        if api == LlmApi::Openai && schema.is_null() {
            continue;
        }
        if let Some(b) = tool_breaches(provider, name, schema).into_iter().next() {
            return Err(Refused::ToolRule {
                tool: shared::text::head(name, 80),
                breach: b.to_string(),
            });
        }
    }
    Ok(())
}

/// The type of a tool that runs on the provider's side, if `tool` is one: Anthropic's typed
/// tools (`web_search_20250305`, `code_execution_...`, ...: anything with a `type` but
/// `custom`), OpenAI's tools of any type but `function` and `custom`.
fn server_tool(api: LlmApi, tool: &Value) -> Option<String> {
    let kind = tool.get("type").and_then(Value::as_str);
    let client_side: &[&str] = match api {
        LlmApi::Anthropic => &["custom"],
        LlmApi::Openai => &["function", "custom"],
    };
    match kind {
        None if api == LlmApi::Anthropic => None,
        None => Some("(no type)".into()),
        Some(k) if client_side.contains(&k) => None,
        Some(k) => Some(shared::text::head(k, 80)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: GatewayLimits = GatewayLimits {
        max_body_bytes: 1000,
        in_flight_bytes: 2000,
        max_output_tokens: 4096,
    };

    #[test]
    fn what_raises_the_price_is_clamped_or_dropped() {
        let mut body = json!({
            "model": "the-priciest", "max_tokens": 1_000_000, "n": 8,
            "service_tier": "priority", "messages": [],
            "tools": [{"type": "function", "function": {"name": "f"}}],
        });
        police(LlmApi::Openai, &mut body, "m", &LIMITS, 1_000_000).unwrap();
        assert_eq!(body["model"], "m");
        assert_eq!(body["max_tokens"], 4096);
        assert_eq!(body["n"], 1);
        assert!(body.get("service_tier").is_none());
        assert_eq!(body["tools"][0]["type"], "function");
    }

    #[test]
    fn the_output_is_clamped_to_what_is_left_and_set_when_absent() {
        let mut body = json!({"messages": []});
        police(LlmApi::Openai, &mut body, "m", &LIMITS, 100).unwrap();
        assert_eq!(body["max_completion_tokens"], 100);
        let mut body = json!({"max_tokens": 50, "thinking": {"budget_tokens": 10_000}});
        police(LlmApi::Anthropic, &mut body, "m", &LIMITS, 1_000_000).unwrap();
        assert_eq!(body["max_tokens"], 50);
        assert_eq!(body["thinking"]["budget_tokens"], 4095);
        let mut body = json!({"max_tokens": 50});
        let e = police(LlmApi::Anthropic, &mut body, "m", &LIMITS, 0).unwrap_err();
        assert_eq!(e, Refused::NoTokensLeft);
    }

    #[test]
    fn provider_side_tools_connectors_and_streams_are_refused() {
        let search = json!({"tools": [{"name": "s", "type": "web_search_20250305"}]});
        let e = police(LlmApi::Anthropic, &mut search.clone(), "m", &LIMITS, 10).unwrap_err();
        assert_eq!(e, Refused::ServerTool("web_search_20250305".into()));
        let own = json!({"tools": [{"name": "f", "input_schema": {"type": "object"}}]});
        assert!(police(LlmApi::Anthropic, &mut own.clone(), "m", &LIMITS, 10).is_ok());
        let openai = json!({"tools": [{"type": "file_search"}]});
        assert!(police(LlmApi::Openai, &mut openai.clone(), "m", &LIMITS, 10).is_err());
        let mcp = json!({"mcp_servers": [{"url": "https://x"}]});
        let e = police(LlmApi::Anthropic, &mut mcp.clone(), "m", &LIMITS, 10).unwrap_err();
        assert_eq!(e, Refused::Field("mcp_servers"));
        let stream = json!({"stream": true});
        let e = police(LlmApi::Openai, &mut stream.clone(), "m", &LIMITS, 10).unwrap_err();
        assert_eq!(e, Refused::Stream);
    }

    #[test]
    fn a_tool_the_provider_would_refuse_is_refused_naming_its_rule() {
        let one_of = json!({"tools": [{"name": "t", "input_schema":
            {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}}]});
        let e = police(LlmApi::Anthropic, &mut one_of.clone(), "m", &LIMITS, 10).unwrap_err();
        assert!(
            e.to_string()
                .contains("tool `t`: anthropic refuses it: rule `input_schema does not support"),
            "{e}"
        );
        let array = json!({"tools": [{"type": "function",
            "function": {"name": "f", "parameters": {"type": "array"}}}]});
        let e = police(LlmApi::Openai, &mut array.clone(), "m", &LIMITS, 10).unwrap_err();
        assert!(e.to_string().contains("openai refuses it"), "{e}");
        let bad_name = json!({"tools": [{"name": "a b", "input_schema": {"type": "object"}}]});
        assert!(police(LlmApi::Anthropic, &mut bad_name.clone(), "m", &LIMITS, 10).is_err());
        let bare = json!({"tools": [{"type": "function", "function": {"name": "f"}}]});
        assert!(police(LlmApi::Openai, &mut bare.clone(), "m", &LIMITS, 10).is_ok());
    }

    #[test]
    fn a_reasoning_model_gets_max_completion_tokens_and_no_temperature() {
        let mut body = json!({"max_tokens": 500, "temperature": 0.2, "messages": []});
        police(LlmApi::Openai, &mut body, "gpt-5-mini", &LIMITS, 1_000_000).unwrap();
        assert_eq!(body["max_completion_tokens"], 500);
        assert!(body.get("max_tokens").is_none() && body.get("temperature").is_none());
        let mut body = json!({"max_tokens": 500, "temperature": 0.2});
        police(LlmApi::Openai, &mut body, "gpt-4o-mini", &LIMITS, 1_000_000).unwrap();
        assert_eq!(body["max_tokens"], 500);
        assert_eq!(body["temperature"], 0.2);
    }

    #[test]
    fn the_environment_sets_the_limits_and_bad_values_are_refused() {
        let env = |k: &str| match k {
            "FLEET_LLM_GATEWAY_MAX_BODY_BYTES" => Some("1048576".to_string()),
            "FLEET_LLM_GATEWAY_MAX_OUTPUT_TOKENS" => Some("2048".to_string()),
            _ => None,
        };
        let l = GatewayLimits::from_env(env).unwrap();
        assert_eq!(l.max_body_bytes, 1 << 20);
        assert_eq!(l.in_flight_bytes, 2 << 20);
        assert_eq!(l.max_output_tokens, 2048);
        assert_eq!(
            GatewayLimits::from_env(|_| None).unwrap(),
            GatewayLimits::default()
        );
        let bad = |_: &str| Some("lots".to_string());
        assert!(GatewayLimits::from_env(bad).is_err());
    }
}
