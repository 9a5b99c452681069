//! The providers' documented request rules, enforced by the fake so that it is never kinder
//! than the real APIs. Each rule names its source; "undocumented" marks a rule known only
//! from the API's own error message (quoted in public issue trackers), and rules that are
//! neither documented nor observed are not enforced (said so where it matters).
//!
//! Sources, read 2025-10 through public copies:
//! - [A-tools] Anthropic "Tool use" guide and Messages API reference (`tools[].name` matches
//!   `^[a-zA-Z0-9_-]{1,64}$`, `input_schema` is a JSON Schema with `type: "object"`).
//! - [A-msg] Anthropic Messages API reference: `model`, `max_tokens` and `messages` required;
//!   roles `user` / `assistant` only, the system prompt in the top-level `system`;
//!   `temperature` from 0.0 to 1.0; consecutive turns of one role are *combined*, not refused.
//! - [A-tooluse] Anthropic tool use guide: each `tool_result` follows its `tool_use` in the next
//!   user message, and in that message the `tool_result` blocks come first.
//! - [A-errors] Anthropic "Errors" page: status codes and error types, the error shape
//!   `{"type":"error","error":{"type","message"}}`, 32 MB request limit (413
//!   `request_too_large`), 529 `overloaded_error`.
//! - [A-models] Anthropic models overview: max output per model (see `MODELS`).
//! - [O-ref] OpenAI chat completions reference: `tools[].function.name` "a-z, A-Z, 0-9, or
//!   underscores and dashes, with a maximum length of 64", `parameters` a JSON Schema object,
//!   `temperature` 0 to 2, `max_tokens` deprecated for `max_completion_tokens` and "not
//!   compatible with o-series models".
//! - [O-errors] OpenAI's 400 bodies `{"error":{"message","type","param","code"}}` as quoted
//!   in issue trackers: `array_above_max_length` for more than 128 tools, `max_tokens is too
//!   large: N. This model supports at most M completion tokens`, `unsupported_parameter`.
//! - Not enforced, because not documented: a body size limit for OpenAI chat completions; a
//!   first message of role `user` for Anthropic; top-level combinators in OpenAI (only
//!   Structured Outputs with `strict: true` documents that, and the fleet never sends it).

use super::Rejection;
use serde_json::{Map, Value};

/// A model the fake knows: the API's name, its provider, its documented max output tokens,
/// and (OpenAI) whether it is a reasoning model that refuses `max_tokens` and a temperature.
pub struct Model {
    pub name: &'static str,
    pub anthropic: bool,
    pub max_output: u64,
    pub reasoning: bool,
}

const fn a(name: &'static str, max_output: u64) -> Model {
    Model {
        name,
        anthropic: true,
        max_output,
        reasoning: false,
    }
}
const fn o(name: &'static str, max_output: u64, reasoning: bool) -> Model {
    Model {
        name,
        anthropic: false,
        max_output,
        reasoning,
    }
}

/// The fixture of known model names ([A-models]; OpenAI's model pages). The Claude 4.5
/// family's and Opus 4.5's ceilings are from third-party copies of the models page
/// (unverified against Anthropic's own page here).
pub const MODELS: &[Model] = &[
    a("claude-haiku-4-5", 64_000),
    a("claude-haiku-4-5-20251001", 64_000),
    a("claude-sonnet-4-5", 64_000),
    a("claude-sonnet-4-5-20250929", 64_000),
    a("claude-opus-4-5", 64_000),
    a("claude-opus-4-5-20251101", 64_000),
    a("claude-opus-4-1", 32_000),
    a("claude-opus-4-1-20250805", 32_000),
    a("claude-opus-4-0", 32_000),
    a("claude-opus-4-20250514", 32_000),
    a("claude-sonnet-4-0", 64_000),
    a("claude-sonnet-4-20250514", 64_000),
    a("claude-3-7-sonnet-latest", 64_000),
    a("claude-3-7-sonnet-20250219", 64_000),
    a("claude-3-5-haiku-latest", 8_192),
    a("claude-3-5-haiku-20241022", 8_192),
    a("claude-3-haiku-20240307", 4_096),
    o("gpt-4o", 16_384, false),
    o("gpt-4o-2024-08-06", 16_384, false),
    o("gpt-4o-mini", 16_384, false),
    o("gpt-4o-mini-2024-07-18", 16_384, false),
    o("gpt-4.1", 32_768, false),
    o("gpt-4.1-mini", 32_768, false),
    o("gpt-4.1-nano", 32_768, false),
    o("gpt-5", 128_000, true),
    o("gpt-5-mini", 128_000, true),
    o("gpt-5-nano", 128_000, true),
    o("o3", 100_000, true),
    o("o4-mini", 100_000, true),
];

pub fn model(name: &str, anthropic: bool) -> Option<&'static Model> {
    MODELS
        .iter()
        .find(|m| m.name == name && m.anthropic == anthropic)
}

/// The Messages API's largest request body ([A-errors]).
pub const ANTHROPIC_MAX_BODY: usize = 32 * 1024 * 1024;
/// OpenAI's most tools in one request ([O-errors]).
pub const OPENAI_MAX_TOOLS: usize = 128;

fn bad(message: String) -> Rejection {
    Rejection::bad_request(message)
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Anthropic's rules beyond the shape checks of `fake_llm::anthropic`.
pub fn anthropic(object: &Map<String, Value>, model_name: &str) -> Result<(), Rejection> {
    // [A-models] + [A-errors]: an unknown model is 404 not_found_error.
    let Some(m) = model(model_name, true) else {
        return Err(Rejection::not_found(format!("model: {model_name}")));
    };
    // [A-msg], message text as the API words it (anthropics/claude-code#24451).
    let max = object
        .get("max_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if max < 1 {
        return Err(bad("max_tokens: must be greater than or equal to 1".into()));
    }
    if max > m.max_output {
        return Err(bad(format!(
            "max_tokens: {max} > {}, which is the maximum allowed number of output tokens for {model_name}",
            m.max_output
        )));
    }
    if let Some(t) = object.get("temperature") {
        if !t.as_f64().is_some_and(|t| (0.0..=1.0).contains(&t)) {
            return Err(bad(format!("temperature: range: 0..1, got {t}")));
        }
    }
    match object.get("system") {
        None | Some(Value::String(_)) => {}
        Some(Value::Array(blocks))
            if blocks
                .iter()
                .all(|b| b["type"] == "text" && b["text"].is_string()) => {}
        Some(_) => {
            return Err(bad(
                "system: input should be a string or a list of text blocks".into(),
            ))
        }
    }
    anthropic_tools(object.get("tools"))?;
    let messages = object
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (i, message) in messages.iter().enumerate() {
        anthropic_blocks(i, message)?;
    }
    Ok(())
}

fn anthropic_tools(tools: Option<&Value>) -> Result<(), Rejection> {
    let Some(tools) = tools else { return Ok(()) };
    let Some(tools) = tools.as_array() else {
        return Err(bad("tools: input should be a valid list".into()));
    };
    let mut names = std::collections::BTreeSet::new();
    for (i, tool) in tools.iter().enumerate() {
        let name = tool["name"].as_str().unwrap_or_default();
        // [A-tools]
        if !valid_name(name) {
            return Err(bad(format!(
                "tools.{i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
            )));
        }
        // Undocumented; the API's message for a repeated name.
        if !names.insert(name) {
            return Err(bad("tools: Tool names must be unique.".into()));
        }
        let schema = &tool["input_schema"];
        // [A-tools]: required, an object schema.
        if schema["type"] != "object" {
            return Err(bad(format!(
                "tools.{i}.custom.input_schema.type: Input should be 'object'"
            )));
        }
        // Undocumented; the API's 400 (anthropics/claude-code#5319).
        if ["oneOf", "allOf", "anyOf"]
            .iter()
            .any(|k| schema.get(k).is_some())
        {
            return Err(bad(format!(
                "tools.{i}.custom.input_schema: input_schema does not support oneOf, allOf, or anyOf at the top level"
            )));
        }
        // [A-tools]: a JSON Schema (draft 2020-12) the API can compile.
        if let Err(e) = shared::schema::compile(schema) {
            return Err(bad(format!(
                "tools.{i}.custom.input_schema: JSON schema is invalid. It must match JSON Schema draft 2020-12 ({e})"
            )));
        }
    }
    Ok(())
}

/// [A-msg] and [A-tooluse]: the block types each role may send, text that is not empty, and
/// `tool_result` blocks before any other block of their message.
fn anthropic_blocks(i: usize, message: &Value) -> Result<(), Rejection> {
    let Some(blocks) = message["content"].as_array() else {
        return match message["content"].as_str() {
            Some("") => Err(bad(format!("messages.{i}: content must be non-empty"))),
            _ => Ok(()),
        };
    };
    let user = message["role"] == "user";
    let allowed: &[&str] = if user {
        &["text", "image", "document", "tool_result", "search_result"]
    } else {
        &["text", "tool_use", "thinking", "redacted_thinking"]
    };
    let mut seen_other = false;
    for (j, block) in blocks.iter().enumerate() {
        let kind = block["type"].as_str().unwrap_or_default();
        if !allowed.contains(&kind) {
            return Err(bad(format!(
                "messages.{i}.content.{j}.type: Input tag '{kind}' found using 'type' does not match any of the expected tags: {}",
                allowed.join(", ")
            )));
        }
        if kind == "text" && block["text"].as_str().is_none_or(str::is_empty) {
            return Err(bad(format!(
                "messages.{i}.content.{j}: text content blocks must be non-empty"
            )));
        }
        if kind == "tool_result" && seen_other {
            return Err(bad(format!(
                "messages.{i}: tool_result blocks must come first in the content of a user message, before any text"
            )));
        }
        seen_other |= kind != "tool_result";
    }
    Ok(())
}

/// OpenAI's rules beyond the shape checks of `fake_llm::openai`.
pub fn openai(object: &Map<String, Value>, model_name: &str) -> Result<(), Rejection> {
    let Some(m) = model(model_name, false) else {
        return Err(Rejection::not_found(format!(
            "The model `{model_name}` does not exist or you do not have access to it."
        ))
        .code("model_not_found"));
    };
    if let Some(max) = object.get("max_tokens") {
        if m.reasoning {
            return Err(bad("Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.".into())
                .param("max_tokens")
                .code("unsupported_parameter"));
        }
        let n = max.as_u64().unwrap_or(0);
        if n < 1 || n > m.max_output {
            return Err(bad(format!(
                "max_tokens is too large: {n}. This model supports at most {} completion tokens, whereas you provided {n}.",
                m.max_output
            ))
            .param("max_tokens")
            .code("invalid_value"));
        }
    }
    if let Some(n) = object.get("max_completion_tokens").and_then(Value::as_u64) {
        if n > m.max_output {
            return Err(bad(format!(
                "max_completion_tokens is too large: {n}. This model supports at most {} completion tokens, whereas you provided {n}.",
                m.max_output
            ))
            .param("max_completion_tokens")
            .code("invalid_value"));
        }
    }
    if let Some(t) = object.get("temperature") {
        let value = t.as_f64();
        if m.reasoning && value != Some(1.0) {
            return Err(bad(format!("Unsupported value: 'temperature' does not support {t} with this model. Only the default (1) value is supported."))
                .param("temperature")
                .code("unsupported_value"));
        }
        if !value.is_some_and(|t| (0.0..=2.0).contains(&t)) {
            return Err(bad(format!("Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got {t} instead."))
                .param("temperature")
                .code("decimal_above_max_value"));
        }
    }
    openai_tools(object.get("tools"))
}

fn openai_tools(tools: Option<&Value>) -> Result<(), Rejection> {
    let Some(tools) = tools else { return Ok(()) };
    let tools = tools.as_array().cloned().unwrap_or_default();
    if tools.len() > OPENAI_MAX_TOOLS {
        return Err(bad(format!(
            "Invalid 'tools': array too long. Expected an array with maximum length {OPENAI_MAX_TOOLS}, but got an array with length {} instead.",
            tools.len()
        ))
        .param("tools")
        .code("array_above_max_length"));
    }
    for (i, tool) in tools.iter().enumerate() {
        if tool["type"] != "function" {
            return Err(bad(format!(
                "Invalid value: '{}'. Supported values are: 'function' and 'custom'.",
                tool["type"]
            ))
            .param(&format!("tools[{i}].type"))
            .code("invalid_value"));
        }
        let f = &tool["function"];
        let name = f["name"].as_str().unwrap_or_default();
        if !valid_name(name) {
            return Err(bad(format!("Invalid 'tools[{i}].function.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."))
                .param(&format!("tools[{i}].function.name"))
                .code("invalid_value"));
        }
        if let Some(p) = f.get("parameters") {
            if p["type"] != "object" {
                let got = p.get("type").map_or("None".to_string(), |t| {
                    t.as_str().unwrap_or("?").to_string()
                });
                return Err(bad(format!("Invalid schema for function '{name}': schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{got}\"'."))
                    .param(&format!("tools[{i}].function.parameters"))
                    .code("invalid_function_parameters"));
            }
        }
    }
    Ok(())
}
