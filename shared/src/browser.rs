//! The `browser` tool's input, checked before anything runs: a page on the container's own
//! loopback (`http(s)` to `127.0.0.1` or `localhost`), at most [`MAX_ACTIONS`] well-formed
//! actions with bounded selectors and text, screenshot names that are plain words (they become
//! file and artifact names), a bounded timeout. The worker hands the checked request to
//! `fleet-browser` in the job's container; a refusal here is a message for the agent.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use thiserror::Error;

pub const MAX_ACTIONS: usize = 50;
pub const MAX_SCREENSHOTS: usize = 10;
pub const MAX_URL: usize = 2000;
pub const MAX_SELECTOR: usize = 500;
pub const MAX_TYPED: usize = 10_000;
pub const MAX_NAME: usize = 40;
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 30;
pub const MAX_TIMEOUT_SECONDS: u64 = 120;

/// Keys an agent may press (what forms and lists need).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Key {
    Enter,
    Tab,
    Escape,
    Backspace,
    ArrowDown,
    ArrowUp,
}

/// One step on the page, in the order given; `fleet-browser` stops at the first that fails.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    /// A mouse click at the centre of the first element the selector matches.
    Click(String),
    /// Focus the element, then type the text (as a user would, input events included).
    Type {
        selector: String,
        text: String,
    },
    Press(Key),
    /// Wait (within the timeout) until an element matches.
    WaitFor(String),
    /// The visible text of every element that matches, joined by lines.
    Text(String),
    /// A PNG of the viewport, kept as the job's artifact `screenshots/<n>-<name>.png`.
    Screenshot(String),
    /// Load another page (the same rules as `url`).
    Navigate(String),
}

impl Action {
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Click(_) => "click",
            Action::Type { .. } => "type",
            Action::Press(_) => "press",
            Action::WaitFor(_) => "wait_for",
            Action::Text(_) => "text",
            Action::Screenshot(_) => "screenshot",
            Action::Navigate(_) => "navigate",
        }
    }
}

/// The agent's input, as read.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BrowserInput {
    pub url: String,
    #[serde(default)]
    pub actions: Vec<Action>,
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// A checked input: what `fleet-browser` is asked to do.
#[derive(Clone, Debug, PartialEq)]
pub struct BrowserRequest {
    pub url: String,
    pub actions: Vec<Action>,
    pub timeout_seconds: u64,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BrowserInputError {
    #[error("the browser input does not fit its schema: {0}")]
    Shape(String),
    #[error("url `{url}` refused: {reason}")]
    Url { url: String, reason: &'static str },
    #[error("{0} actions given; at most {MAX_ACTIONS}")]
    TooManyActions(usize),
    #[error("{0} screenshots asked for; at most {MAX_SCREENSHOTS} per call")]
    TooManyScreenshots(usize),
    #[error("action {index} ({kind}): the selector must be 1 to {MAX_SELECTOR} characters")]
    Selector { index: usize, kind: &'static str },
    #[error("action {index} (type): the text is longer than {MAX_TYPED} characters")]
    Typed { index: usize },
    #[error("action {index} (screenshot): name `{name}` must be 1 to {MAX_NAME} letters, digits, `-` or `_`")]
    ScreenshotName { index: usize, name: String },
    #[error("action {index} (screenshot): name `{name}` is used twice in this call")]
    DuplicateScreenshot { index: usize, name: String },
    #[error("timeout_seconds must be from 1 to {MAX_TIMEOUT_SECONDS}, not {0}")]
    Timeout(u64),
}

/// Whether `url` is a page on the container's loopback: `http` or `https`, host `127.0.0.1` or
/// `localhost` written plainly (no user info, no escapes, no backslashes), any port.
pub fn check_url(url: &str) -> Result<(), BrowserInputError> {
    let refuse = |reason| {
        Err(BrowserInputError::Url {
            url: url.chars().take(200).collect(),
            reason,
        })
    };
    if url.len() > MAX_URL {
        return refuse("longer than 2000 bytes");
    }
    if url
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || c == '\\')
    {
        return refuse("it has spaces, control characters or backslashes");
    }
    let lower = url.to_ascii_lowercase();
    let Some(rest) = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))
    else {
        return refuse("only http and https pages on 127.0.0.1 or localhost may be opened");
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return refuse("user info is not allowed");
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    };
    if host != "127.0.0.1" && host != "localhost" {
        return refuse(
            "only 127.0.0.1 and localhost may be opened (the container has no other network)",
        );
    }
    if let Some(port) = port {
        let valid = !port.is_empty()
            && port.len() <= 5
            && port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p));
        if !valid {
            return refuse("the port must be a number from 1 to 65535");
        }
    }
    Ok(())
}

/// A screenshot name: a plain word that is safe as a file and artifact name.
pub fn plain_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn selector(index: usize, kind: &'static str, s: &str) -> Result<(), BrowserInputError> {
    if s.trim().is_empty() || s.chars().count() > MAX_SELECTOR {
        return Err(BrowserInputError::Selector { index, kind });
    }
    Ok(())
}

/// Reads and checks the tool's input.
pub fn validate(input: &Value) -> Result<BrowserRequest, BrowserInputError> {
    let input: BrowserInput = serde_json::from_value(input.clone())
        .map_err(|e| BrowserInputError::Shape(e.to_string()))?;
    check_url(&input.url)?;
    if input.actions.len() > MAX_ACTIONS {
        return Err(BrowserInputError::TooManyActions(input.actions.len()));
    }
    let mut names = BTreeSet::new();
    for (index, action) in input.actions.iter().enumerate() {
        match action {
            Action::Click(s) | Action::WaitFor(s) | Action::Text(s) => {
                selector(index, action.kind(), s)?
            }
            Action::Type { selector: s, text } => {
                selector(index, "type", s)?;
                if text.chars().count() > MAX_TYPED {
                    return Err(BrowserInputError::Typed { index });
                }
            }
            Action::Press(_) => {}
            Action::Navigate(url) => check_url(url)?,
            Action::Screenshot(name) => {
                if !plain_name(name) {
                    return Err(BrowserInputError::ScreenshotName {
                        index,
                        name: name.chars().take(60).collect(),
                    });
                }
                if !names.insert(name.as_str()) {
                    return Err(BrowserInputError::DuplicateScreenshot {
                        index,
                        name: name.clone(),
                    });
                }
            }
        }
    }
    if names.len() > MAX_SCREENSHOTS {
        return Err(BrowserInputError::TooManyScreenshots(names.len()));
    }
    let timeout_seconds = input.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    if !(1..=MAX_TIMEOUT_SECONDS).contains(&timeout_seconds) {
        return Err(BrowserInputError::Timeout(timeout_seconds));
    }
    Ok(BrowserRequest {
        url: input.url,
        actions: input.actions,
        timeout_seconds,
    })
}

impl BrowserRequest {
    /// The request `fleet-browser` reads on stdin, its screenshots written in `screenshot_dir`.
    pub fn to_json(&self, screenshot_dir: &str) -> Value {
        json!({
            "url": self.url,
            "actions": self.actions,
            "timeout_seconds": self.timeout_seconds,
            "screenshot_dir": screenshot_dir,
        })
    }

    /// The screenshot names, in order.
    pub fn screenshots(&self) -> Vec<&str> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::Screenshot(n) => Some(n.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// The JSON schema of the tool's input, as the agent sees it.
pub fn input_schema() -> Value {
    let selector = json!({"type": "string", "description": "a CSS selector"});
    json!({
        "type": "object",
        "properties": {
            "url": {"type": "string", "description": "http(s) page on 127.0.0.1 or localhost inside the container (start the server first with run_command, in the background)"},
            "actions": {
                "type": "array",
                "maxItems": MAX_ACTIONS,
                "description": "performed in order; the first that fails stops the rest",
                "items": {"oneOf": [
                    {"type": "object", "properties": {"click": selector}, "required": ["click"]},
                    {"type": "object", "properties": {"type": {"type": "object", "properties": {
                        "selector": selector, "text": {"type": "string"}},
                        "required": ["selector", "text"]}}, "required": ["type"]},
                    {"type": "object", "properties": {"press": {"enum": ["Enter", "Tab", "Escape", "Backspace", "ArrowDown", "ArrowUp"]}}, "required": ["press"]},
                    {"type": "object", "properties": {"wait_for": selector}, "required": ["wait_for"]},
                    {"type": "object", "properties": {"text": selector}, "required": ["text"]},
                    {"type": "object", "properties": {"screenshot": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"}}, "required": ["screenshot"]},
                    {"type": "object", "properties": {"navigate": {"type": "string"}}, "required": ["navigate"]}
                ]}
            },
            "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_SECONDS}
        },
        "required": ["url"]
    })
}

#[cfg(test)]
mod tests;

/// Whether a failed call may be run again: no action that can change the app's state (a
/// click, typing, a key press) reached the page. `fleet-browser` marks each action it
/// dispatched input for as `acted`; an effectful action without the mark that was not skipped
/// counts as acted.
pub fn replay_safe(result: &Value) -> bool {
    let Some(actions) = result.get("actions").and_then(Value::as_array) else {
        return true;
    };
    !actions.iter().any(|a| match a.get("acted") {
        Some(Value::Bool(acted)) => *acted,
        _ => {
            let kind = a.get("action").and_then(Value::as_str).unwrap_or_default();
            let skipped = a.get("error").and_then(Value::as_str) == Some("skipped");
            matches!(kind, "click" | "type" | "press") && !skipped
        }
    })
}
