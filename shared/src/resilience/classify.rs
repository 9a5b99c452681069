//! A failed tool call's class, from the seed's signal table (checked in the seed's order: the
//! first class whose signal occurs in the lower-cased error wins; nothing matching is
//! transient, the seed's optimistic default). Only errors of unknown origin are classified by
//! text: failures the harness raised itself (a refused argument, a tool the node lacks) carry
//! their class.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolErrorType {
    /// Network timeout, rate limit (retried).
    Transient,
    /// Element not found yet, page loading (retried).
    Timing,
    /// The selector did not match (a hint, not retried).
    Selector,
    /// The tool cannot do this action (a hint, not retried).
    Capability,
    /// The tool or its server is not available (fatal).
    NotInstalled,
    /// Blocked by policy (fatal).
    Permission,
    /// Malformed input (a hint, not retried).
    InvalidInput,
}

impl ToolErrorType {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolErrorType::Transient => "transient",
            ToolErrorType::Timing => "timing",
            ToolErrorType::Selector => "selector",
            ToolErrorType::Capability => "capability",
            ToolErrorType::NotInstalled => "not_installed",
            ToolErrorType::Permission => "permission",
            ToolErrorType::InvalidInput => "invalid_input",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassifiedError {
    pub error_type: ToolErrorType,
    pub tool: String,
    pub original: String,
    pub hint: String,
}

const SIGNALS: &[(ToolErrorType, &[&str])] = &[
    (
        ToolErrorType::Transient,
        &[
            "timeout",
            "timed out",
            "rate limit",
            "429",
            "503",
            "connection refused",
            "connection reset",
            "network",
            "temporarily unavailable",
            "retry",
        ],
    ),
    (
        ToolErrorType::Timing,
        &[
            "waiting for selector",
            "element not found",
            "no element matches",
            "target closed",
            "page closed",
            "navigation timeout",
            "waiting for",
            "did not appear",
        ],
    ),
    (
        ToolErrorType::Selector,
        &[
            "selector",
            "locator",
            "multiple elements",
            "ambiguous",
            "strict mode violation",
            "resolved to",
            "matches",
        ],
    ),
    (
        ToolErrorType::Capability,
        &[
            "not supported",
            "not implemented",
            "cannot",
            "unable to",
            "doesn't support",
            "no such method",
            "invalid action",
        ],
    ),
    (
        ToolErrorType::NotInstalled,
        &[
            "not found",
            "command not found",
            "no such file",
            "enoent",
            "spawn",
            "executable",
            "not recognized",
        ],
    ),
    (
        ToolErrorType::Permission,
        &[
            "blocked",
            "denied",
            "permission",
            "not allowed",
            "forbidden",
        ],
    ),
    (
        ToolErrorType::InvalidInput,
        &[
            "invalid",
            "malformed",
            "expected",
            "required",
            "missing",
            "type error",
            "argument",
        ],
    ),
];

/// Classifies an error of unknown origin by the seed's table.
pub fn classify(tool: &str, error: &str) -> ClassifiedError {
    let text = error.to_lowercase();
    let found = SIGNALS
        .iter()
        .find(|(_, signals)| signals.iter().any(|s| text.contains(s)))
        .map(|(t, _)| *t);
    let (error_type, hint) = match found {
        Some(t) => (t, hint(t, tool)),
        None => (
            ToolErrorType::Transient,
            "Unknown error. Will retry.".into(),
        ),
    };
    ClassifiedError {
        error_type,
        tool: tool.to_string(),
        original: error.to_string(),
        hint,
    }
}

impl ClassifiedError {
    /// An error whose class the harness knows (it raised it itself).
    pub fn known(error_type: ToolErrorType, tool: &str, error: &str) -> ClassifiedError {
        ClassifiedError {
            error_type,
            tool: tool.to_string(),
            original: error.to_string(),
            hint: hint(error_type, tool),
        }
    }
}

/// The seed's hint for a class.
fn hint(error_type: ToolErrorType, tool: &str) -> String {
    match error_type {
        ToolErrorType::Transient => "Temporary failure. Will retry automatically.".into(),
        ToolErrorType::Timing => "Element not ready. Will retry with delay.".into(),
        ToolErrorType::Selector => selector_hint(tool),
        ToolErrorType::Capability => {
            "This action may not be supported. Try alternative approach.".into()
        }
        ToolErrorType::NotInstalled => format!("Tool '{tool}' may not be installed."),
        ToolErrorType::Permission => "Action blocked by security policy.".into(),
        ToolErrorType::InvalidInput => usage_hint(tool),
    }
}

/// What to try when a selector failed (the fleet's browser tool takes CSS selectors).
pub fn selector_hint(tool: &str) -> String {
    if tool == "browser" {
        return "Selector failed. Try these approaches:\n\
            1. Use an id: selector=\"#new-todo\"\n\
            2. Use an attribute: selector=\"button[name='submit']\"\n\
            3. Use a test ID: selector=\"[data-testid='my-button']\"\n\
            4. First take a `text` of \"body\" or a screenshot to see what is on the page"
            .into();
    }
    "Selector did not match any elements. Verify element exists.".into()
}

/// How to call a tool whose input was refused.
pub fn usage_hint(tool: &str) -> String {
    match tool {
        "read_file" => "read_file requires 'path' (relative to the repository root)".into(),
        "list_dir" => "list_dir takes an optional 'path' (relative to the repository root)".into(),
        "write_file" => "write_file requires 'path' and 'content'".into(),
        "edit_file" => {
            "edit_file requires 'path', 'old_text' (occurring once) and 'new_text'".into()
        }
        "run_command" => "run_command requires 'command'".into(),
        "browser" => "browser requires 'url' (http://127.0.0.1:PORT/...) and optional 'actions' \
            such as {\"click\": \"#id\"}, {\"type\": {\"selector\": \"#id\", \"text\": \"...\"}}, \
            {\"screenshot\": \"name\"}"
            .into(),
        _ => format!("Check {tool} documentation for required parameters"),
    }
}
