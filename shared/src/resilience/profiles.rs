//! The seed's tool profiles by project type and its detection of the type from the spec. A
//! profile names the executables a node's container must have (checked before the agent
//! starts: a missing required one fails the job, a missing optional one is a warning event)
//! and whether browser automation is offered (the seed's Playwright server; here the fleet's
//! `browser` tool).

use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ToolProfile {
    pub name: &'static str,
    pub description: &'static str,
    pub required_tools: &'static [&'static str],
    pub optional_tools: &'static [&'static str],
    /// Browser automation offered (the seed's `playwright` MCP server).
    pub browser: bool,
    /// The seed's additions to the bash allow-list (the fleet's commands run in a container
    /// without network instead; kept for the record).
    pub bash_allowlist_additions: &'static [&'static str],
}

pub const PROFILE_NAMES: [&str; 5] = [
    "web_app",
    "api_backend",
    "cli_tool",
    "static_site",
    "python_app",
];

const PROFILES: [ToolProfile; 5] = [
    ToolProfile {
        name: "web_app",
        description: "Full-stack web application with UI",
        required_tools: &["node", "npm"],
        optional_tools: &["npx", "git"],
        browser: true,
        bash_allowlist_additions: &["npx"],
    },
    ToolProfile {
        name: "api_backend",
        description: "API/backend service without UI",
        required_tools: &["node", "npm"],
        optional_tools: &["curl", "git"],
        browser: false,
        bash_allowlist_additions: &["curl"],
    },
    ToolProfile {
        name: "cli_tool",
        description: "Command-line application",
        required_tools: &["node", "npm"],
        optional_tools: &["git"],
        browser: false,
        bash_allowlist_additions: &[],
    },
    ToolProfile {
        name: "static_site",
        description: "Static website with minimal interactivity",
        required_tools: &["npm"],
        optional_tools: &["npx", "git"],
        browser: true,
        bash_allowlist_additions: &[],
    },
    ToolProfile {
        name: "python_app",
        description: "Python application (CLI, API, or web)",
        required_tools: &["python3", "pip"],
        optional_tools: &["git", "pytest"],
        browser: true,
        bash_allowlist_additions: &["python3", "pip", "pytest"],
    },
];

/// A profile by name; an unknown name gets `web_app`, as in the seed.
pub fn profile(name: &str) -> &'static ToolProfile {
    PROFILES
        .iter()
        .find(|p| p.name == name)
        .unwrap_or(&PROFILES[0])
}

const SIGNALS: [(&str, &[(&str, u32)]); 5] = [
    (
        "web_app",
        &[
            ("react", 3),
            ("next.js", 3),
            ("frontend", 2),
            ("UI", 2),
            ("page", 1),
            ("button", 1),
            ("form", 1),
            ("CSS", 1),
            ("component", 2),
            ("dashboard", 2),
            ("login page", 2),
        ],
    ),
    (
        "api_backend",
        &[
            ("API", 2),
            ("endpoint", 3),
            ("REST", 3),
            ("GraphQL", 3),
            ("POST", 2),
            ("GET", 2),
            ("JSON response", 2),
            ("no frontend", 5),
            ("backend only", 5),
            ("microservice", 3),
        ],
    ),
    (
        "cli_tool",
        &[
            ("command line", 4),
            ("CLI", 4),
            ("terminal", 2),
            ("arguments", 2),
            ("flags", 2),
            ("--", 2),
            ("stdin", 3),
        ],
    ),
    (
        "static_site",
        &[
            ("landing page", 4),
            ("static", 3),
            ("no backend", 4),
            ("HTML only", 4),
            ("brochure", 3),
        ],
    ),
    (
        "python_app",
        &[
            ("python", 3),
            ("django", 4),
            ("flask", 4),
            ("fastapi", 4),
            ("pip", 2),
            (".py", 2),
        ],
    ),
];

/// The seed's `detect_project_type`: keyword weights per type (case-insensitive substring),
/// the best score wins (the first listed on a tie), `web_app` below a score of 3.
pub fn detect_project_type(spec: &str) -> &'static str {
    let spec = spec.to_lowercase();
    let mut best = ("web_app", 0);
    for (kind, keywords) in SIGNALS {
        let score: u32 = keywords
            .iter()
            .filter(|(k, _)| spec.contains(&k.to_lowercase()))
            .map(|(_, w)| w)
            .sum();
        if score > best.1 {
            best = (kind, score);
        }
    }
    if best.1 < 3 {
        "web_app"
    } else {
        best.0
    }
}
