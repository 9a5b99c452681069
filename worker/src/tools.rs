//! Agent tools, executed inside the job's container through the sandbox session. Paths are
//! checked before anything runs: a path that escapes the worktree is an error, never a read.

use crate::sandbox::Session;
use serde_json::{json, Value};
use shared::graph::Tool;
use shared::paths::normalize_relative;
use shared::text;
use std::time::Duration;

const MAX_TOOL_OUTPUT: usize = 50_000;

pub struct ToolBox<'a> {
    pub session: &'a dyn Session,
    pub allowed: &'a [Tool],
    pub command_timeout: Duration,
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
    }
}

fn arg<'v>(input: &'v Value, key: &str) -> Result<&'v str, String> {
    input
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("missing string argument `{key}`"))
}

fn safe_path(input: &Value, key: &str) -> Result<String, String> {
    normalize_relative(arg(input, key)?).map_err(|e| e.to_string())
}

impl ToolBox<'_> {
    pub fn definitions(&self) -> Vec<ToolDef> {
        self.allowed.iter().map(|t| definition(*t)).collect()
    }

    fn allowed(&self, name: &str) -> Option<Tool> {
        self.allowed.iter().copied().find(|t| tool_name(*t) == name)
    }

    /// Runs one tool call. `Err` is a message for the agent (a failed tool), not a job failure.
    pub async fn call(&self, name: &str, input: &Value) -> Result<String, String> {
        let tool = self
            .allowed(name)
            .ok_or_else(|| format!("tool `{name}` is not available to this node"))?;
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
                        self.write(&path, current.replacen(old, new, 1).into_bytes())
                            .await?;
                        Ok(format!("edited {path}"))
                    }
                    0 => Err(format!("old_text not found in {path}")),
                    n => Err(format!(
                        "old_text occurs {n} times in {path}; make it unique"
                    )),
                }
            }
            Tool::RunCommand => {
                let command = arg(input, "command")?;
                let out = self
                    .session
                    .exec(
                        &["sh".into(), "-c".into(), command.to_string()],
                        None,
                        self.command_timeout,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
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
    pub async fn write(&self, path: &str, bytes: Vec<u8>) -> Result<(), String> {
        let script = "mkdir -p -- \"$(dirname -- \"$1\")\" && cat > \"$1\"";
        self.run(&["sh", "-c", script, "sh", path], Some(bytes))
            .await
            .map(|_| ())
    }

    async fn run(&self, argv: &[&str], stdin: Option<Vec<u8>>) -> Result<String, String> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let out = self
            .session
            .exec(&argv, stdin, self.command_timeout)
            .await
            .map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.exit_code != 0 {
            return Err(format!(
                "exit code {}: {}",
                out.exit_code,
                text::tail(&String::from_utf8_lossy(&out.stderr), 20, 2000)
            ));
        }
        Ok(text::head(&stdout, MAX_TOOL_OUTPUT))
    }
}
