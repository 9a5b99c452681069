//! Agent tools, executed inside the job's container through the sandbox session. Paths are
//! checked before anything runs: a path that escapes the worktree is an error, never a read.
//! Every call goes through seed 004's resilient executor (`resilient.rs`): a failure is
//! classified (by its known cause, or by the seed's signal table when the cause is unknown),
//! retried per its class when running it again is safe, and recorded as events.

mod resilient;

use crate::browser::Evidence;
use crate::sandbox::Session;
use serde_json::{json, Value};
use shared::graph::Tool;
use shared::paths::normalize_relative;
use shared::resilience::{RetryConfig, ToolErrorType};
use shared::text;
use std::time::Duration;

pub use resilient::Journal;

const MAX_TOOL_OUTPUT: usize = 50_000;

pub struct ToolBox<'a> {
    pub session: &'a dyn Session,
    pub allowed: &'a [Tool],
    pub command_timeout: Duration,
    /// Where the `browser` tool keeps its screenshots and log (none: the tool refuses).
    pub evidence: Option<&'a Evidence>,
    /// Where the calls' `tool_use`, `tool_error` and `tool_retry` events go.
    pub journal: &'a Journal,
    /// Replaces the seed's strategy for the retriable classes (the node's tool policy).
    pub retry: Option<&'a RetryConfig>,
}

/// Why one attempt of a call failed.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The class, when the harness knows the cause (it refused the input itself, or the tool
    /// answered about the input); `None`: classified by the seed's table from `error`.
    pub known: Option<ToolErrorType>,
    pub error: String,
    /// What the tool answered besides the error (the browser's outcome of each action).
    pub detail: Option<String>,
    /// Whether running the call again is safe (nothing it did can have taken effect).
    pub replayable: bool,
}

impl Failure {
    pub fn known(kind: ToolErrorType, error: impl Into<String>) -> Failure {
        Failure {
            known: Some(kind),
            error: error.into(),
            detail: None,
            replayable: false,
        }
    }

    fn invalid(error: impl Into<String>) -> Failure {
        Failure::known(ToolErrorType::InvalidInput, error)
    }

    /// The container could not run the call: the class the sandbox knows (the engine busy or
    /// unreachable, a missing image, a refused request), otherwise classified by its message.
    pub fn sandbox(e: crate::sandbox::SandboxError, replayable: bool) -> Failure {
        use crate::sandbox::SandboxError as E;
        let known = match &e {
            E::Engine {
                transient: true, ..
            } => Some(ToolErrorType::Transient),
            E::MissingImage(_) => Some(ToolErrorType::NotInstalled),
            E::Refused(_) => Some(ToolErrorType::Permission),
            E::Engine { .. } | E::Io(_) | E::Other(_) => None,
        };
        Failure {
            known,
            ..Failure::unknown(e.to_string(), replayable)
        }
    }

    /// A failure of unknown cause (the container, the browser).
    pub fn unknown(error: impl Into<String>, replayable: bool) -> Failure {
        Failure {
            known: None,
            error: error.into(),
            detail: None,
            replayable,
        }
    }
}

/// A tool definition in neutral form: name, description and JSON schema of its input.
pub struct ToolDef {
    pub name: &'static str,
    pub description: &'static str,
    pub schema: Value,
}

pub fn tool_name(tool: Tool) -> &'static str {
    match tool {
        Tool::ReadFile => "read_file",
        Tool::ListDir => "list_dir",
        Tool::WriteFile => "write_file",
        Tool::EditFile => "edit_file",
        Tool::RunCommand => "run_command",
        Tool::Browser => "browser",
    }
}

pub fn definition(tool: Tool) -> ToolDef {
    let path = json!({"type": "string", "description": "path relative to the repository root"});
    match tool {
        Tool::ReadFile => ToolDef {
            name: "read_file",
            description: "Read a file of the repository.",
            schema: json!({"type": "object", "properties": {"path": path}, "required": ["path"]}),
        },
        Tool::ListDir => ToolDef {
            name: "list_dir",
            description: "List a folder of the repository (default: its root).",
            schema: json!({"type": "object", "properties": {"path": path}}),
        },
        Tool::WriteFile => ToolDef {
            name: "write_file",
            description: "Create or overwrite a file with the given content.",
            schema: json!({"type": "object", "properties": {"path": path, "content": {"type": "string"}},
                "required": ["path", "content"]}),
        },
        Tool::EditFile => ToolDef {
            name: "edit_file",
            description: "Replace the one occurrence of old_text in a file by new_text.",
            schema: json!({"type": "object", "properties": {"path": path,
                "old_text": {"type": "string"}, "new_text": {"type": "string"}},
                "required": ["path", "old_text", "new_text"]}),
        },
        Tool::RunCommand => ToolDef {
            name: "run_command",
            description: "Run a shell command in the repository root (no network).",
            schema: json!({"type": "object", "properties": {"command": {"type": "string"}},
                "required": ["command"]}),
        },
        Tool::Browser => ToolDef {
            name: "browser",
            description: "Open a page served inside the container (http://127.0.0.1:PORT or \
                localhost; start the server first with run_command, in the background) in headless \
                Chromium and perform actions in order: click, type, press, wait_for, text (returns \
                the visible text), screenshot (kept as an artifact), navigate. Returns each \
                action's outcome, the final url and title, and console messages.",
            schema: shared::browser::input_schema(),
        },
    }
}

fn arg<'v>(input: &'v Value, key: &str) -> Result<&'v str, Failure> {
    input
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| Failure::invalid(format!("missing string argument `{key}`")))
}

/// A path argument: one that escapes the worktree is refused (a permission error).
fn safe_path(input: &Value, key: &str) -> Result<String, Failure> {
    normalize_relative(arg(input, key)?)
        .map_err(|e| Failure::known(ToolErrorType::Permission, e.to_string()))
}

impl ToolBox<'_> {
    pub fn definitions(&self) -> Vec<ToolDef> {
        self.allowed.iter().map(|t| definition(*t)).collect()
    }

    fn allowed(&self, name: &str) -> Option<Tool> {
        self.allowed.iter().copied().find(|t| tool_name(*t) == name)
    }

    /// Runs one tool call through the resilient executor. `Err` is a message for the agent (a
    /// failed tool, with its class and the seed's hint), not a job failure.
    pub async fn call(&self, name: &str, input: &Value) -> Result<String, String> {
        resilient::execute(self, name, input).await
    }

    /// One attempt of a call.
    async fn attempt(&self, name: &str, input: &Value) -> Result<String, Failure> {
        let tool = self.allowed(name).ok_or_else(|| {
            Failure::known(
                ToolErrorType::Permission,
                format!("tool `{name}` is not available to this node"),
            )
        })?;
        match tool {
            Tool::ReadFile => {
                let path = safe_path(input, "path")?;
                self.run(&["cat", "--", &path], None).await
            }
            Tool::ListDir => {
                let path = match input.get("path").and_then(Value::as_str) {
                    None | Some("") | Some(".") => ".".to_string(),
                    Some(_) => safe_path(input, "path")?,
                };
                self.run(&["ls", "-la", "--", &path], None).await
            }
            Tool::WriteFile => {
                let path = safe_path(input, "path")?;
                let content = arg(input, "content")?;
                self.write(&path, content.as_bytes().to_vec()).await?;
                Ok(format!("wrote {} bytes to {path}", content.len()))
            }
            Tool::EditFile => {
                let path = safe_path(input, "path")?;
                let old = arg(input, "old_text")?;
                let new = arg(input, "new_text")?;
                let current = self.run(&["cat", "--", &path], None).await?;
                match current.matches(old).count() {
                    1 => {
                        // Replacing again after a write that failed half-way is not safe.
                        self.write(&path, current.replacen(old, new, 1).into_bytes())
                            .await
                            .map_err(|f| Failure {
                                replayable: false,
                                ..f
                            })?;
                        Ok(format!("edited {path}"))
                    }
                    0 => Err(Failure::invalid(format!("old_text not found in {path}"))),
                    n => Err(Failure::invalid(format!(
                        "old_text occurs {n} times in {path}; make it unique"
                    ))),
                }
            }
            Tool::Browser => crate::browser::call(self.session, self.evidence, input).await,
            Tool::RunCommand => {
                let command = arg(input, "command")?;
                // A command that ran is an answer whatever its exit code; only a container
                // that could not run it fails, and the command is never run twice.
                let out = self
                    .session
                    .exec(
                        &["sh".into(), "-c".into(), command.to_string()],
                        None,
                        self.command_timeout,
                    )
                    .await
                    .map_err(|e| Failure::sandbox(e, false))?;
                Ok(format!(
                    "exit code: {}{}\nstdout:\n{}\nstderr:\n{}",
                    out.exit_code,
                    if out.timed_out { " (timed out)" } else { "" },
                    text::tail(
                        &String::from_utf8_lossy(&out.stdout),
                        200,
                        MAX_TOOL_OUTPUT / 2
                    ),
                    text::tail(
                        &String::from_utf8_lossy(&out.stderr),
                        200,
                        MAX_TOOL_OUTPUT / 2
                    ),
                ))
            }
        }
    }

    /// Writes a file through the container (creating folders), as the agent's own user.
    pub async fn write(&self, path: &str, bytes: Vec<u8>) -> Result<(), Failure> {
        let script = "mkdir -p -- \"$(dirname -- \"$1\")\" && cat > \"$1\"";
        let out = self
            .session
            .exec(
                &["sh", "-c", script, "sh", path].map(String::from),
                Some(bytes),
                self.command_timeout,
            )
            .await
            // Writing the same bytes again is safe.
            .map_err(|e| Failure::sandbox(e, true))?;
        if out.exit_code != 0 {
            // The shell's own message (a folder in the way, a read-only file): the seed's table.
            return Err(Failure::unknown(exit_message(&out), true));
        }
        Ok(())
    }

    /// Reads through a command; a nonzero exit is the tool's answer about the input.
    async fn run(&self, argv: &[&str], stdin: Option<Vec<u8>>) -> Result<String, Failure> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let out = self
            .session
            .exec(&argv, stdin, self.command_timeout)
            .await
            .map_err(|e| Failure::sandbox(e, true))?;
        if out.exit_code != 0 {
            return Err(Failure::invalid(exit_message(&out)));
        }
        Ok(text::head(
            &String::from_utf8_lossy(&out.stdout),
            MAX_TOOL_OUTPUT,
        ))
    }
}

fn exit_message(out: &crate::sandbox::ExecOutput) -> String {
    format!(
        "exit code {}: {}",
        out.exit_code,
        text::tail(&String::from_utf8_lossy(&out.stderr), 20, 2000)
    )
}

#[cfg(test)]
mod tests;

/// A strategy that never retries (tests that must not wait).
#[cfg(test)]
pub static NO_RETRY: RetryConfig = RetryConfig {
    max_attempts: 1,
    backoff_seconds: Vec::new(),
};
