//! Agent tools, executed inside the job's container through the sandbox session. Paths are
//! checked before anything runs: a path that escapes the worktree is an error, never a read.

use crate::browser::Evidence;
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
    /// Where the `browser` tool keeps its screenshots and log (none: the tool refuses).
    pub evidence: Option<&'a Evidence>,
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
            Tool::Browser => crate::browser::call(self.session, self.evidence, input).await,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::llm::tests::{arb_json, arb_text, cases, timed, CASE_LIMIT};
    use crate::sandbox::{ExecOutput, Mounts, SandboxError};
    use async_trait::async_trait;
    use proptest::prelude::*;
    use std::sync::Mutex;

    /// A session that records every argv and answers with canned output.
    struct Canned {
        out: ExecOutput,
        seen: Mutex<Vec<Vec<String>>>,
    }

    #[async_trait]
    impl Session for Canned {
        async fn exec(
            &self,
            argv: &[String],
            _stdin: Option<Vec<u8>>,
            _timeout: Duration,
        ) -> Result<ExecOutput, SandboxError> {
            self.seen.lock().unwrap().push(argv.to_vec());
            Ok(self.out.clone())
        }
        async fn remove(&self) -> Result<(), SandboxError> {
            Ok(())
        }
        fn mounts(&self) -> Mounts {
            Mounts {
                work: "/work".into(),
                harness: None,
                gateway: None,
            }
        }
        async fn kill_strays(&self) -> Result<(), SandboxError> {
            Ok(())
        }
        fn isolated(&self) -> bool {
            true
        }
    }

    const ALL: [Tool; 6] = [
        Tool::ReadFile,
        Tool::ListDir,
        Tool::WriteFile,
        Tool::EditFile,
        Tool::RunCommand,
        Tool::Browser,
    ];

    /// Tool arguments: mostly objects with the tools' keys holding paths and text of any kind
    /// (or values of the wrong type), sometimes any JSON at all.
    fn arb_input() -> impl Strategy<Value = Value> {
        let path = prop_oneof![
            arb_text(),
            "[a./\\\\:C ]{0,12}",
            prop::sample::select(vec!["..", "../x", "/etc/passwd", "a/../../b", "C:x", "."])
                .prop_map(str::to_string),
        ];
        let value = prop_oneof![
            4 => path.prop_map(Value::from),
            1 => arb_json(),
        ];
        let keys = prop::sample::subsequence(
            vec!["path", "content", "old_text", "new_text", "command"],
            0..=5,
        );
        let shaped = (keys, prop::collection::vec(value, 5)).prop_map(|(keys, values)| {
            Value::Object(keys.into_iter().map(str::to_string).zip(values).collect())
        });
        prop_oneof![4 => shaped, 1 => arb_json()]
    }

    proptest! {
        #![proptest_config(cases(256))]

        #[test]
        fn any_tool_call_is_answered_and_never_leaves_the_worktree(
            name in prop_oneof![
                4 => prop::sample::select(ALL.to_vec()).prop_map(tool_name),
                1 => Just("submit"),
            ],
            allowed in prop::sample::subsequence(ALL.to_vec(), 0..=6),
            input in arb_input(),
            stdout in prop_oneof![arb_text(), "(ab|a|b|\\\\PC){0,40}"],
            exit_code in prop_oneof![Just(0i64), any::<i64>()],
            timed_out in any::<bool>(),
        ) {
            let session = Canned {
                out: ExecOutput {
                    exit_code,
                    stdout: stdout.clone().into_bytes(),
                    stderr: stdout.into_bytes(),
                    timed_out,
                    ..ExecOutput::default()
                },
                seen: Mutex::new(Vec::new()),
            };
            let tools = ToolBox {
                session: &session,
                allowed: &allowed,
                command_timeout: Duration::from_secs(1),
                evidence: None,
            };
            let (answer, took) = timed(|| futures::executor::block_on(tools.call(name, &input)));
            prop_assert!(took < CASE_LIMIT);
            let offered = allowed.iter().any(|t| tool_name(*t) == name);
            prop_assert!(offered || answer.is_err());
            // Every path that reached the container is relative and stays beneath the root.
            for argv in session.seen.lock().unwrap().iter() {
                let path = match argv.iter().map(String::as_str).collect::<Vec<_>>()[..] {
                    ["cat", "--", p] | ["ls", "-la", "--", p] | ["sh", "-c", _, "sh", p] => p,
                    ["sh", "-c", _] | ["fleet-browser"] => continue,
                    _ => return Err(TestCaseError::fail(format!("unexpected argv {argv:?}"))),
                };
                prop_assert!(
                    !path.is_empty()
                        && !path.starts_with('/')
                        && !path.split('/').any(|c| c == ".."),
                    "{path:?} from {input}"
                );
            }
        }
    }
}
