//! Runs the fake LLM server until interrupted.
//!
//! usage: fake-llm (--script PATH | --conversations PATH) [--port N] [--delay-ms N]
//!
//! The script is a JSON array of scripted replies, for instance
//! `[{"reply":{"type":"tool_use","name":"read_file","input":{"path":"a"}}},
//!   {"reply":{"type":"text","text":"done"},"input_tokens":10,"output_tokens":5}]`.
//! The conversations file is a JSON array of conversations, each with its own
//! replies, chosen by a key found in the first user message of a request:
//! `[{"key":"task-a","replies":[{"reply":{"type":"text","text":"a"}}]},
//!   {"key":"task-b","replies":[{"reply":{"type":"text","text":"b"}}]}]`.
//! Both may be given: the script is then the queue of requests that match no key.
//! The first line on stdout is `listening on http://127.0.0.1:PORT`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use fleet_tests::fake_llm::{Conversation, FakeLlm, ScriptedReply};
use serde::de::DeserializeOwned;

const USAGE: &str =
    "usage: fake-llm (--script PATH | --conversations PATH) [--port N] [--delay-ms N]";

#[derive(Debug)]
struct Args {
    script: Option<PathBuf>,
    conversations: Option<PathBuf>,
    port: u16,
    delay: Duration,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> anyhow::Result<Args> {
    let mut script = None;
    let mut conversations = None;
    let mut port = 0;
    let mut delay = Duration::ZERO;
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--script" => script = Some(PathBuf::from(value()?)),
            "--conversations" => conversations = Some(PathBuf::from(value()?)),
            "--port" => port = value()?.parse().context("--port must be a port number")?,
            "--delay-ms" => {
                let millis = value()?.parse().context("--delay-ms must be an integer")?;
                delay = Duration::from_millis(millis);
            }
            "-h" | "--help" => bail!("{USAGE}"),
            other => bail!("unknown argument {other}\n{USAGE}"),
        }
    }
    if script.is_none() && conversations.is_none() {
        bail!("--script or --conversations is required\n{USAGE}");
    }
    Ok(Args {
        script,
        conversations,
        port,
        delay,
    })
}

fn read_json<T: DeserializeOwned>(what: &str, path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading {what} {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {what} {}", path.display()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args(std::env::args().skip(1))?;
    let script: Vec<ScriptedReply> = match &args.script {
        Some(path) => read_json("script", path)?,
        None => Vec::new(),
    };
    let conversations: Vec<Conversation> = match &args.conversations {
        Some(path) => read_json("conversations", path)?,
        None => Vec::new(),
    };
    let fake =
        FakeLlm::start_conversations_with(script, conversations, args.port, args.delay).await?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on {}", fake.base_url)?;
    stdout.flush()?;
    tokio::signal::ctrl_c()
        .await
        .context("waiting for ctrl-c")?;
    eprintln!(
        "fake-llm: {} requests received, {} scripted replies left",
        fake.requests().len(),
        fake.remaining()
    );
    Ok(())
}
