//! Seed 004's pre-flight for an agent node with a tool policy, before the agent starts: the
//! node's profile (for `auto`, detected from the node's `spec` parameter, the input's `spec`
//! or the node's prompt), the tools offered under it (no
//! browser under a profile without one) and the profile's executables looked up in the job's
//! container. A missing required one fails the step (`not_installed`, nothing spent on the
//! agent); a missing optional one is a warning event.

use crate::sandbox::Session;
use crate::tools::Journal;
use serde_json::json;
use shared::graph::{AgentBody, Tool};
use shared::tracking::EventType;
use std::time::Duration;
use tracing::{info, warn};

/// What the agent may use, or why it cannot start.
pub(super) enum Preflight {
    Ready(Vec<Tool>),
    Missing(String),
}

/// Prints each argument that names no executable on the container's `PATH`.
const LOOKUP: &str = "for t in \"$@\"; do command -v \"$t\" >/dev/null 2>&1 || echo \"$t\"; done";

pub(super) async fn preflight(
    node: &AgentBody,
    spec: &str,
    session: &dyn Session,
    journal: &Journal,
) -> Result<Preflight, String> {
    let Some(policy) = &node.tool_policy else {
        return Ok(Preflight::Ready(node.tools.clone()));
    };
    let profile = policy.resolve(spec);
    let tools: Vec<Tool> = node
        .tools
        .iter()
        .copied()
        .filter(|t| *t != Tool::Browser || profile.browser)
        .collect();
    let mut argv: Vec<String> = vec!["sh".into(), "-c".into(), LOOKUP.into(), "sh".into()];
    argv.extend(
        profile
            .required_tools
            .iter()
            .chain(profile.optional_tools)
            .map(|t| t.to_string()),
    );
    let out = session
        .exec(&argv, None, Duration::from_secs(30))
        .await
        .map_err(|e| format!("the tool pre-flight could not run: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let missing: Vec<&str> = stdout.lines().map(str::trim).collect();
    let mut required_missing = Vec::new();
    for tool in profile.required_tools.iter().chain(profile.optional_tools) {
        if !missing.contains(tool) {
            continue;
        }
        let required = profile.required_tools.contains(tool);
        journal.record(
            EventType::ToolError,
            json!({"tool": tool, "attempt": 0, "error_type": "not_installed", "preflight": true,
                "profile": profile.name, "required": required,
                "error": format!("{} tool '{tool}' not found in PATH",
                    if required { "required" } else { "optional" })}),
        );
        if required {
            required_missing.push(*tool);
        } else {
            warn!(tool, profile = profile.name, "optional tool missing");
        }
    }
    info!(
        profile = profile.name,
        browser = profile.browser,
        "tool profile"
    );
    if required_missing.is_empty() {
        return Ok(Preflight::Ready(tools));
    }
    Ok(Preflight::Missing(format!(
        "pre-flight: the tool profile `{}` needs {} not found in the container's PATH",
        profile.name,
        required_missing
            .iter()
            .map(|t| format!("`{t}`"))
            .collect::<Vec<_>>()
            .join(", ")
    )))
}
