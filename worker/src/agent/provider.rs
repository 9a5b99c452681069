//! What the agent loop needs from a wire format, and the neutral forms it reads and writes.
//!
//! A provider does no I/O. It builds request bodies, reads replies into a `Reply`, and writes the
//! loop's answers (tool results, its own messages) back in its message shape. The conversation
//! itself stays in the provider's message shape: it is what the transcript stores, what a later
//! session continues, and what each request sends, so the loop holds it without reading it.

use super::llm::{LlmError, LlmSettings};
use crate::tools::ToolDef;
use serde_json::Value;
use shared::messages::LlmConfig;

/// Where requests go and the headers that authenticate them.
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
}

/// The token counts a response body reports (either may be missing).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tokens {
    pub input: Option<u64>,
    pub output: Option<u64>,
}

/// One tool call of a reply: its id, the tool's name and its input, or why the input cannot be
/// read (OpenAI sends the arguments as a JSON string).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub input: Result<Value, String>,
}

/// What one response body says, in neutral form.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// The assistant turn as the API wants it back in the conversation.
    pub turn: Value,
    pub calls: Vec<ToolCall>,
    /// The answer's text, all text blocks joined (read when there is no tool call).
    pub text: String,
    /// Why the model stopped, as the API names it (`end_turn`, `tool_calls`, ...).
    pub stop_reason: Option<String>,
}

/// How one tool call went.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolOutput {
    /// The tool ran; its output.
    Done(String),
    /// The tool was called and failed (not available, a bad path, a failed command).
    Failed(String),
    /// The call was refused before anything ran: its input is unreadable, or a `submit` breaks
    /// the schema.
    Refused(String),
}

/// The answer to one tool call, for the next request.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolResult {
    pub id: String,
    pub output: ToolOutput,
}

/// One wire format of a chat API with tool calls.
pub trait ChatApi: Sync {
    /// The API's name in transcripts and logs.
    const NAME: &'static str;
    /// What the API calls a tool, in what the agent reads ("tool", "function").
    const TOOL_NOUN: &'static str;

    /// The URL and authentication, or which key is missing.
    fn endpoint(&self, settings: &LlmSettings) -> Result<Endpoint, LlmError>;

    /// The conversation a job starts from: the continued session's messages, if any, with its
    /// open tool calls answered, then the prompt.
    fn start(&self, prior: Option<&Value>, prompt: &str) -> Vec<Value>;

    /// The request body for the next turn.
    fn request(&self, cfg: &LlmConfig, tools: &[ToolDef], messages: &[Value]) -> Value;

    /// The token counts of a response body, read also when the rest of it is malformed.
    fn usage(&self, body: &Value) -> Tokens;

    /// Reads a response body; `Malformed` when it has no assistant turn.
    fn parse(&self, body: &Value) -> Result<Reply, LlmError>;

    /// The messages answering the tool calls of the last turn, in their order.
    fn tool_results(&self, results: Vec<ToolResult>) -> Vec<Value>;

    /// A user message of plain text.
    fn user_text(&self, text: String) -> Value;

    /// Tells the agent to finish, in or after the conversation's last message.
    fn nudge(&self, messages: &mut Vec<Value>, text: &str);

    /// The transcript the job keeps (and a later session continues).
    fn transcript(&self, model: &str, messages: Vec<Value>) -> Value;
}
