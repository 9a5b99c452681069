//! What the LLM providers refuse in a tool definition, as pure rules: the graph checker reads
//! them (an agent node's output schema is sent as the `submit` tool's schema), and so can the
//! worker before a request leaves it.
//!
//! Each rule says where it comes from. Read 2025-10 through the public copies of the
//! providers' documentation and their API's error messages quoted in public issue trackers:
//!
//! - Anthropic Messages API, "Tool use" guide and API reference: a tool's `name` must match
//!   `^[a-zA-Z0-9_-]{1,64}$`; `input_schema` is a JSON Schema object whose `type` is
//!   `"object"` (the reference gives `type: "object"` as required and constant).
//! - Anthropic, *undocumented* (the docs say nothing; the API's 400 says it):
//!   `tools.N.custom.input_schema: input_schema does not support oneOf, allOf, or anyOf at the
//!   top level`, reported e.g. in anthropics/claude-code#5319, #5973, mobile-next/mobile-mcp#344.
//! - OpenAI chat completions, API reference (`tools[].function`): `name` "must be a-z, A-Z,
//!   0-9, or contain underscores and dashes, with a maximum length of 64"; `parameters` is
//!   "described as a JSON Schema object".
//! - OpenAI, from the API's 400 (not in the reference): `Invalid schema for function 'x':
//!   schema must be a JSON Schema of 'type: "object"', got 'type: "None"'` (e.g.
//!   browserbase/stagehand#1159). Top-level `oneOf` / `anyOf` / `allOf` are refused by OpenAI
//!   only in Structured Outputs (`strict: true`, which the fleet never sends); for plain
//!   function calling no such rule is documented, so none is checked here.

use serde_json::Value;
use std::fmt;

/// An LLM provider whose wire format the fleet speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Provider {
    Anthropic,
    Openai,
}

impl Provider {
    pub const ALL: [Provider; 2] = [Provider::Anthropic, Provider::Openai];

    pub fn name(self) -> &'static str {
        match self {
            Provider::Anthropic => "anthropic",
            Provider::Openai => "openai",
        }
    }

    /// What the provider calls a tool's schema in its request body.
    pub fn schema_field(self) -> &'static str {
        match self {
            Provider::Anthropic => "input_schema",
            Provider::Openai => "function.parameters",
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A rule a tool definition breaks, with where the rule comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Breach {
    pub provider: Provider,
    /// The rule, as the provider states it (or as its API's error says it).
    pub rule: &'static str,
    /// What in this definition breaks it.
    pub detail: String,
    /// Where the rule is written.
    pub source: &'static str,
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} refuses it: rule `{}` ({}; source: {})",
            self.provider, self.rule, self.detail, self.source
        )
    }
}

/// The tool the agent loop answers with; its schema is the node's output schema.
pub const SUBMIT_TOOL: &str = "submit";

pub const RULE_NAME: &str = "tool name matches ^[a-zA-Z0-9_-]{1,64}$";
pub const RULE_OBJECT: &str = "schema has `type: \"object\"` at the top level";
pub const RULE_NO_COMBINATORS: &str =
    "input_schema does not support oneOf, allOf, or anyOf at the top level";

const ANTHROPIC_DOCS: &str = "Anthropic tool use guide and Messages API reference";
const ANTHROPIC_ERROR: &str =
    "undocumented; the Messages API's 400, quoted in anthropics/claude-code#5319";
const OPENAI_DOCS: &str = "OpenAI chat completions API reference, tools[].function";
const OPENAI_ERROR: &str =
    "the reference says only \"a JSON Schema object\"; the API's 400 says 'type: \"object\"'";

/// Whether `name` is a tool name both providers accept: 1 to 64 ASCII letters, digits, `_`, `-`.
pub fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Every rule of `provider` that a tool named `name` with schema `schema` breaks.
pub fn tool_breaches(provider: Provider, name: &str, schema: &Value) -> Vec<Breach> {
    let mut out = Vec::new();
    let (docs, type_source) = match provider {
        Provider::Anthropic => (ANTHROPIC_DOCS, ANTHROPIC_DOCS),
        Provider::Openai => (OPENAI_DOCS, OPENAI_ERROR),
    };
    if !valid_tool_name(name) {
        out.push(Breach {
            provider,
            rule: RULE_NAME,
            detail: format!("the name is `{name}`"),
            source: docs,
        });
    }
    let top_type = schema.get("type");
    if top_type.and_then(Value::as_str) != Some("object") {
        let got = match top_type {
            None if schema.is_object() => "no `type`".to_string(),
            None => format!("the schema is not an object but {}", kind_of(schema)),
            Some(t) => format!("`type` is {t}"),
        };
        out.push(Breach {
            provider,
            rule: RULE_OBJECT,
            detail: got,
            source: type_source,
        });
    }
    if provider == Provider::Anthropic {
        let found: Vec<&str> = ["oneOf", "allOf", "anyOf"]
            .into_iter()
            .filter(|k| schema.get(*k).is_some())
            .collect();
        if !found.is_empty() {
            out.push(Breach {
                provider,
                rule: RULE_NO_COMBINATORS,
                detail: format!("the top level has `{}`", found.join("`, `")),
                source: ANTHROPIC_ERROR,
            });
        }
    }
    out
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_plain_object_schema_passes_both() {
        let s = json!({"type": "object", "properties": {"a": {"type": "string"}},
            "if": {"required": ["a"]}, "then": {}, "else": {}});
        for p in Provider::ALL {
            assert_eq!(tool_breaches(p, "submit", &s), vec![]);
        }
    }

    #[test]
    fn top_level_combinators_break_anthropic_only() {
        for k in ["oneOf", "allOf", "anyOf"] {
            let s = json!({"type": "object", k: [{"required": ["a"]}]});
            let b = tool_breaches(Provider::Anthropic, "submit", &s);
            assert_eq!(b.len(), 1, "{k}: {b:?}");
            assert_eq!(b[0].rule, RULE_NO_COMBINATORS);
            assert!(b[0].detail.contains(k));
            assert_eq!(tool_breaches(Provider::Openai, "submit", &s), vec![]);
        }
        // Nested combinators are fine.
        let nested = json!({"type": "object", "properties": {"a": {"oneOf": [{}, {}]}}});
        assert_eq!(
            tool_breaches(Provider::Anthropic, "submit", &nested),
            vec![]
        );
    }

    #[test]
    fn a_top_level_other_than_an_object_breaks_both() {
        for s in [json!({"oneOf": []}), json!({"type": "array"}), json!(true)] {
            for p in Provider::ALL {
                let b = tool_breaches(p, "submit", &s);
                assert!(b.iter().any(|b| b.rule == RULE_OBJECT), "{p} {s}: {b:?}");
            }
        }
    }

    #[test]
    fn tool_names_are_checked_by_the_documented_pattern() {
        let s = json!({"type": "object"});
        for bad in ["", "a b", "a.b", "é", &"x".repeat(65)] {
            for p in Provider::ALL {
                let b = tool_breaches(p, bad, &s);
                assert_eq!(b.len(), 1, "{bad:?}");
                assert_eq!(b[0].rule, RULE_NAME);
            }
        }
        for good in ["submit", "read_file", "a-b", &"x".repeat(64)] {
            assert!(valid_tool_name(good), "{good}");
        }
    }
}
