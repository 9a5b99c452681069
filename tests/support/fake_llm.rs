//! A fake LLM HTTP server for integration tests and benchmarks.
//!
//! It speaks the real wire formats of the Anthropic Messages API
//! (`POST /v1/messages`) and of OpenAI-compatible chat completions
//! (`POST /v1/chat/completions`), validates requests the way those APIs do
//! (auth headers, required fields, tool call / tool result pairing) and plays
//! scripted replies: every accepted request consumes the next
//! [`ScriptedReply`] of one queue.
//!
//! [`FakeLlm::start`] has a single shared queue. [`FakeLlm::start_conversations`]
//! adds one queue per [`Conversation`], so that several agents talking at the
//! same time each get their own replies: a request belongs to the conversation
//! whose `key` is a substring of the text of its first user message (for
//! Anthropic the first message whose role is `user`, normally `messages[0]`; for
//! OpenAI the first message with role `user`; a content given as a list of
//! blocks counts as the concatenation of its text blocks). When several keys
//! match, the longest wins (the first declared among equals). A request that
//! matches no key falls back to the shared queue.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

mod script;
mod strict;
pub use script::{script_nodes, script_responder, Picker, Played};
pub use strict::{Model, MODELS};

/// Largest request body the server reads at all: above the Messages API's 32 MB, so that a
/// body past Anthropic's limit is answered by the rule, in the API's error shape.
const BODY_LIMIT: usize = 64 * 1024 * 1024;

/// What the fake answers to one request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// One tool call (`stop_reason: tool_use` / `finish_reason: tool_calls`).
    ToolUse { name: String, input: Value },
    /// Several tool calls in one turn, in order (parallel tool use: `stop_reason: tool_use`
    /// / `finish_reason: tool_calls`).
    Calls { calls: Vec<Call> },
    /// A plain assistant answer (`stop_reason: end_turn` / `finish_reason: stop`).
    Text { text: String },
    /// An HTTP error with the error body of the API that was called; a 429 says
    /// `retry-after` (0 unless given).
    Error {
        status: u16,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after: Option<u32>,
    },
}

/// One tool call of a [`Reply::Calls`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Call {
    pub name: String,
    pub input: Value,
}

/// Chooses the reply to a validated request from its body (see
/// [`FakeLlm::start_responder`]); `None` is answered 500, naming no reply.
pub type Responder = Box<dyn Fn(&Value) -> Option<ScriptedReply> + Send + Sync>;

/// One entry of the script, with the token usage to report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScriptedReply {
    pub reply: Reply,
    #[serde(default = "default_input_tokens")]
    pub input_tokens: u64,
    #[serde(default = "default_output_tokens")]
    pub output_tokens: u64,
    /// An error reply's `x-should-retry` header (none unless given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub should_retry: Option<bool>,
    /// Anthropic's prompt-cache writes and reads, reported apart from `input_tokens`.
    #[serde(default)]
    pub cache_write: u64,
    #[serde(default)]
    pub cache_read: u64,
}

fn default_input_tokens() -> u64 {
    100
}

fn default_output_tokens() -> u64 {
    50
}

impl ScriptedReply {
    /// A reply with the default usage (100 input, 50 output tokens).
    pub fn new(reply: Reply) -> Self {
        Self {
            reply,
            input_tokens: default_input_tokens(),
            output_tokens: default_output_tokens(),
            should_retry: None,
            cache_write: 0,
            cache_read: 0,
        }
    }

    /// An error reply that says `x-should-retry: <retry>`.
    pub fn should_retry(mut self, retry: bool) -> Self {
        self.should_retry = Some(retry);
        self
    }

    /// Reports Anthropic prompt-cache writes and reads too.
    pub fn with_cache(mut self, cache_write: u64, cache_read: u64) -> Self {
        self.cache_write = cache_write;
        self.cache_read = cache_read;
        self
    }

    pub fn tool_use(name: impl Into<String>, input: Value) -> Self {
        Self::new(Reply::ToolUse {
            name: name.into(),
            input,
        })
    }

    /// Several tool calls in one turn, played in order by the agent loop.
    pub fn calls(calls: Vec<Call>) -> Self {
        Self::new(Reply::Calls { calls })
    }

    pub fn text(text: impl Into<String>) -> Self {
        Self::new(Reply::Text { text: text.into() })
    }

    pub fn error(status: u16) -> Self {
        Self::new(Reply::Error {
            status,
            retry_after: None,
        })
    }

    /// A 429 whose `retry-after` asks for `seconds`.
    pub fn throttled(seconds: u32) -> Self {
        Self::new(Reply::Error {
            status: 429,
            retry_after: Some(seconds),
        })
    }

    pub fn with_usage(mut self, input_tokens: u64, output_tokens: u64) -> Self {
        self.input_tokens = input_tokens;
        self.output_tokens = output_tokens;
        self
    }
}

/// A conversation of its own: the requests whose first user message contains
/// `key` consume `replies`, in order, independently of every other queue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    pub key: String,
    pub replies: Vec<ScriptedReply>,
}

impl Conversation {
    pub fn new(key: impl Into<String>, replies: Vec<ScriptedReply>) -> Self {
        Self {
            key: key.into(),
            replies,
        }
    }
}

/// A request as the fake saw it, with the status it answered.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedRequest {
    pub path: String,
    /// Header names are lowercase.
    pub headers: Vec<(String, String)>,
    /// The parsed JSON body; `Null` when empty, a JSON string when not JSON.
    pub body: Value,
    pub status: u16,
    /// The key of the conversation the request was routed to; `None` when it
    /// went to the shared queue or was refused before routing (validation).
    pub conversation: Option<String>,
    /// When the fake received it (its answer goes out after the configured delay).
    pub received_at: SystemTime,
}

impl RecordedRequest {
    /// The first value of a header, by lowercase name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// A running fake server; dropping it shuts the server down.
pub struct FakeLlm {
    /// Like `http://127.0.0.1:PORT`: no trailing slash, no `/v1`.
    pub base_url: String,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl FakeLlm {
    /// Starts on an ephemeral port of 127.0.0.1, without delay.
    pub async fn start(script: Vec<ScriptedReply>) -> anyhow::Result<FakeLlm> {
        Self::start_with(script, 0, Duration::ZERO).await
    }

    /// Starts on `port` of 127.0.0.1 (0 for ephemeral), waiting `delay`
    /// before answering each request.
    pub async fn start_with(
        script: Vec<ScriptedReply>,
        port: u16,
        delay: Duration,
    ) -> anyhow::Result<FakeLlm> {
        Self::start_conversations_with(script, Vec::new(), port, delay).await
    }

    /// Starts on an ephemeral port of 127.0.0.1 with one reply queue per
    /// conversation and an empty shared queue, waiting `delay` before
    /// answering each request. Keys must be unique and not empty.
    pub async fn start_conversations(
        convs: Vec<Conversation>,
        delay: Duration,
    ) -> anyhow::Result<FakeLlm> {
        Self::start_conversations_with(Vec::new(), convs, 0, delay).await
    }

    /// The general form: `script` is the shared queue used by requests that
    /// match no conversation; `port` 0 is ephemeral.
    pub async fn start_conversations_with(
        script: Vec<ScriptedReply>,
        convs: Vec<Conversation>,
        port: u16,
        delay: Duration,
    ) -> anyhow::Result<FakeLlm> {
        let queues = Queues::new(script, convs)?;
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(queues, delay));
        let (tx, rx) = oneshot::channel::<()>();
        let app = router(shared.clone());
        tokio::spawn(async move {
            let shutdown = async {
                let _ = rx.await;
            };
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await;
        });
        Ok(FakeLlm {
            base_url: format!("http://{addr}"),
            shared,
            shutdown: Some(tx),
        })
    }

    /// Starts on an ephemeral port with no script: every validated request is answered by
    /// `responder`, from its body (e.g. by the node whose prompt it carries).
    pub async fn start_responder(responder: Responder) -> anyhow::Result<FakeLlm> {
        let fake = Self::start(Vec::new()).await?;
        *lock(&fake.shared.responder) = Some(responder);
        Ok(fake)
    }

    /// Enforces a rate limit as the providers do: a valid request past `calls` accepted in
    /// the last `per` is answered 429 (`rate_limit_error` / `rate_limit_exceeded`) with
    /// `retry-after` (whole seconds until a slot frees, at least 1) and
    /// `x-should-retry: true`, consuming no reply.
    pub fn rate_limit(&self, calls: usize, per: Duration) {
        *lock(&self.shared.limit) = Some((calls, per, VecDeque::new()));
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// Scripted replies not yet played, over all queues.
    pub fn remaining(&self) -> usize {
        lock(&self.shared.queues).remaining()
    }

    /// Replies not yet played of one conversation; `None` for an unknown key.
    pub fn remaining_in(&self, key: &str) -> Option<usize> {
        lock(&self.shared.queues)
            .keyed
            .iter()
            .find(|(known, _)| known == key)
            .map(|(_, queue)| queue.len())
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// The shared queue and one queue per conversation, in declaration order.
struct Queues {
    default: VecDeque<ScriptedReply>,
    keyed: Vec<(String, VecDeque<ScriptedReply>)>,
}

/// Where a request's reply comes from.
enum Route {
    /// A reply of the named conversation, or `None` when its queue is empty.
    Conversation(String, Option<ScriptedReply>),
    /// A reply of the shared queue, or `None` when it is empty.
    Default(Option<ScriptedReply>),
}

impl Queues {
    fn new(script: Vec<ScriptedReply>, convs: Vec<Conversation>) -> anyhow::Result<Self> {
        let mut keyed: Vec<(String, VecDeque<ScriptedReply>)> = Vec::with_capacity(convs.len());
        for conv in convs {
            if conv.key.is_empty() {
                anyhow::bail!("fake llm: a conversation key must not be empty");
            }
            if keyed.iter().any(|(key, _)| *key == conv.key) {
                anyhow::bail!("fake llm: duplicate conversation key {:?}", conv.key);
            }
            keyed.push((conv.key, conv.replies.into()));
        }
        Ok(Self {
            default: script.into(),
            keyed,
        })
    }

    fn remaining(&self) -> usize {
        self.default.len() + self.keyed.iter().map(|(_, q)| q.len()).sum::<usize>()
    }

    /// Takes the next reply for a request whose first user message is `prompt`.
    fn pop(&mut self, prompt: Option<&str>) -> Route {
        let matched = prompt.and_then(|prompt| {
            let mut best: Option<usize> = None;
            for (index, (key, _)) in self.keyed.iter().enumerate() {
                let longer = best.is_none_or(|b| key.len() > self.keyed[b].0.len());
                if longer && prompt.contains(key.as_str()) {
                    best = Some(index);
                }
            }
            best
        });
        match matched {
            Some(index) => {
                let (key, queue) = &mut self.keyed[index];
                Route::Conversation(key.clone(), queue.pop_front())
            }
            None => Route::Default(self.default.pop_front()),
        }
    }
}

struct Shared {
    queues: Mutex<Queues>,
    requests: Mutex<Vec<RecordedRequest>>,
    responder: Mutex<Option<Responder>>,
    /// The provider's rate limit, if set: at most `.0` requests accepted in any `.1`, and
    /// when each accepted one came.
    limit: Mutex<Option<(usize, Duration, VecDeque<std::time::Instant>)>>,
    next_id: AtomicU64,
    delay: Duration,
}

impl Shared {
    fn new(queues: Queues, delay: Duration) -> Self {
        Self {
            queues: Mutex::new(queues),
            requests: Mutex::new(Vec::new()),
            responder: Mutex::new(None),
            limit: Mutex::new(None),
            next_id: AtomicU64::new(1),
            delay,
        }
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn record(&self, request: &Incoming, status: StatusCode, conversation: Option<String>) {
        lock(&self.requests).push(RecordedRequest {
            path: request.path.clone(),
            headers: header_pairs(&request.headers),
            body: recorded_body(&request.body),
            status: status.as_u16(),
            conversation,
            received_at: SystemTime::now(),
        });
    }
}

/// Locks a mutex, ignoring poisoning (a panicking test must not hide the log).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/messages", any(anthropic))
        .route("/v1/chat/completions", any(openai))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(shared)
}

async fn anthropic(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = Incoming::new(method, &uri, headers, body);
    handle(Api::Anthropic, &shared, request).await
}

async fn openai(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = Incoming::new(method, &uri, headers, body);
    handle(Api::OpenAi, &shared, request).await
}

async fn not_found(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = Incoming::new(method, &uri, headers, body);
    let message = format!("no route for {} {}", request.method, request.path);
    let outcome = Api::Anthropic.error(StatusCode::NOT_FOUND, &message);
    shared.record(&request, outcome.status, None);
    pause(shared.delay).await;
    outcome.into_response()
}

async fn handle(api: Api, shared: &Shared, request: Incoming) -> Response {
    let (outcome, conversation) = respond(api, shared, &request);
    shared.record(&request, outcome.status, conversation);
    pause(shared.delay).await;
    outcome.into_response()
}

async fn pause(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

/// Validates the request, then plays the next scripted reply of its queue;
/// also returns the key of the conversation the request was routed to.
fn respond(api: Api, shared: &Shared, request: &Incoming) -> (Outcome, Option<String>) {
    if request.method != Method::POST {
        let message = format!("method {} is not allowed, use POST", request.method);
        return (api.error(StatusCode::METHOD_NOT_ALLOWED, &message), None);
    }
    let model = match api.validate(&request.headers, &request.body) {
        Ok(model) => model,
        Err(rejection) => return (api.refusal(&rejection), None),
    };
    if let Some(throttled) = over_limit(api, shared) {
        return (throttled, None);
    }
    if let Some(responder) = lock(&shared.responder).as_ref() {
        let body = recorded_body(&request.body);
        let Some(scripted) = responder(&body) else {
            let message = "fake llm responder has no reply for this request";
            return (api.error(StatusCode::INTERNAL_SERVER_ERROR, message), None);
        };
        return (play(api, shared, &model, &scripted, request), None);
    }
    let prompt = first_user_text(&request.body);
    let route = {
        let mut queues = lock(&shared.queues);
        let route = queues.pop(prompt.as_deref());
        match route {
            Route::Default(None) if !queues.keyed.is_empty() => {
                let keys: Vec<&str> = queues.keyed.iter().map(|(key, _)| key.as_str()).collect();
                let message = format!(
                    "fake llm: no conversation matches the first user message (keys: {}) \
                     and the default script is empty",
                    keys.join(", ")
                );
                return (api.error(StatusCode::INTERNAL_SERVER_ERROR, &message), None);
            }
            route => route,
        }
    };
    let (scripted, conversation) = match route {
        Route::Conversation(key, Some(scripted)) => (scripted, Some(key)),
        Route::Conversation(key, None) => {
            let message = format!(
                "fake llm script of conversation {key:?} is exhausted: no scripted reply left"
            );
            return (
                api.error(StatusCode::INTERNAL_SERVER_ERROR, &message),
                Some(key),
            );
        }
        Route::Default(Some(scripted)) => (scripted, None),
        Route::Default(None) => {
            let message = "fake llm script is exhausted: no scripted reply left";
            return (api.error(StatusCode::INTERNAL_SERVER_ERROR, message), None);
        }
    };
    (play(api, shared, &model, &scripted, request), conversation)
}

/// A 429 when the rate limit is full; else the request takes a slot.
fn over_limit(api: Api, shared: &Shared) -> Option<Outcome> {
    let mut limit = lock(&shared.limit);
    let (calls, per, taken) = limit.as_mut()?;
    let now = std::time::Instant::now();
    while taken
        .front()
        .is_some_and(|t| now.duration_since(*t) >= *per)
    {
        taken.pop_front();
    }
    if taken.len() < *calls {
        taken.push_back(now);
        return None;
    }
    let free_in = taken.front().map_or(Duration::ZERO, |t| {
        (*t + *per).saturating_duration_since(now)
    });
    let mut outcome = api.error(
        StatusCode::TOO_MANY_REQUESTS,
        "This request would exceed your organization's rate limit of requests per minute.",
    );
    outcome.retry_after = Some(u32::try_from(free_in.as_secs() + 1).unwrap_or(u32::MAX));
    outcome.should_retry = Some(true);
    Some(outcome)
}

/// Plays a scripted reply to `request`: as the providers do, it reports no more output tokens
/// than the request's `max_tokens` (or `max_completion_tokens`) allowed.
fn play(
    api: Api,
    shared: &Shared,
    model: &str,
    scripted: &ScriptedReply,
    request: &Incoming,
) -> Outcome {
    let body = recorded_body(&request.body);
    let cap = ["max_tokens", "max_completion_tokens"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_u64));
    let mut scripted = scripted.clone();
    if let Some(cap) = cap {
        scripted.output_tokens = scripted.output_tokens.min(cap);
    }
    match Answer::of(&scripted.reply) {
        Err((status, retry_after)) => {
            let mut outcome = api.scripted_error(status, retry_after);
            outcome.should_retry = scripted.should_retry;
            outcome
        }
        Ok(answer) => api.success(shared.next_id(), model, answer, &scripted),
    }
}

/// The text of the first message whose role is `user` (a validated body):
/// the content string, or the concatenated `text` of its blocks.
fn first_user_text(body: &Bytes) -> Option<String> {
    let body: Value = serde_json::from_slice(body).ok()?;
    let message = body
        .get("messages")?
        .as_array()?
        .iter()
        .find(|message| role(message) == Some("user"))?;
    match message.get("content")? {
        Value::String(text) => Some(text.clone()),
        Value::Array(blocks) => Some(
            blocks
                .iter()
                .filter(|block| block.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|block| block.get("text").and_then(Value::as_str))
                .collect(),
        ),
        _ => None,
    }
}

/// A successful scripted reply.
#[derive(Clone, Copy)]
enum Answer<'a> {
    ToolUse { name: &'a str, input: &'a Value },
    Calls(&'a [Call]),
    Text(&'a str),
}

impl<'a> Answer<'a> {
    /// The answer to play, or the status of a scripted error.
    fn of(reply: &'a Reply) -> Result<Self, (u16, Option<u32>)> {
        match reply {
            Reply::ToolUse { name, input } => Ok(Answer::ToolUse { name, input }),
            Reply::Calls { calls } => Ok(Answer::Calls(calls)),
            Reply::Text { text } => Ok(Answer::Text(text)),
            Reply::Error {
                status,
                retry_after,
            } => Err((*status, *retry_after)),
        }
    }
}

/// The parts of a request the fake looks at.
struct Incoming {
    method: Method,
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

impl Incoming {
    fn new(method: Method, uri: &Uri, headers: HeaderMap, body: Bytes) -> Self {
        Self {
            method,
            path: uri.path().to_string(),
            headers,
            body,
        }
    }
}

fn header_pairs(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (name.as_str().to_string(), value)
        })
        .collect()
}

fn recorded_body(body: &Bytes) -> Value {
    if body.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|value| !value.is_empty())
}

/// An answer, before it becomes an HTTP response.
struct Outcome {
    status: StatusCode,
    body: Value,
    /// `retry-after` in seconds, if sent.
    retry_after: Option<u32>,
    /// `x-should-retry`, if sent.
    should_retry: Option<bool>,
}

impl IntoResponse for Outcome {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if let Some(seconds) = self.retry_after {
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert("retry-after", value);
            }
        }
        if let Some(retry) = self.should_retry {
            let value = HeaderValue::from_static(if retry { "true" } else { "false" });
            response.headers_mut().insert("x-should-retry", value);
        }
        response
    }
}

/// Why a request was refused before touching the script (OpenAI's bodies also name the
/// parameter and a code).
struct Rejection {
    status: StatusCode,
    message: String,
    param: Option<String>,
    code: Option<&'static str>,
}

impl Rejection {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    fn param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Anthropic,
    OpenAi,
}

impl Api {
    /// Checks headers and body; returns the requested model.
    fn validate(self, headers: &HeaderMap, body: &Bytes) -> Result<String, Rejection> {
        match self {
            Api::Anthropic => anthropic::validate(headers, body),
            Api::OpenAi => openai::validate(headers, body),
        }
    }

    fn success(self, id: u64, model: &str, answer: Answer, usage: &ScriptedReply) -> Outcome {
        let body = match self {
            Api::Anthropic => anthropic::success_body(id, model, answer, usage),
            Api::OpenAi => openai::success_body(id, model, answer, usage),
        };
        Outcome {
            status: StatusCode::OK,
            body,
            retry_after: None,
            should_retry: None,
        }
    }

    fn scripted_error(self, status: u16, retry_after: Option<u32>) -> Outcome {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut outcome = self.error(status, scripted_error_message(status));
        if retry_after.is_some() {
            outcome.retry_after = retry_after;
        }
        outcome
    }

    /// A refused request, in the API's error shape.
    fn refusal(self, r: &Rejection) -> Outcome {
        let mut outcome = self.error(r.status, &r.message);
        if self == Api::OpenAi {
            outcome.body["error"]["param"] = r.param.clone().into();
            outcome.body["error"]["code"] = r.code.into();
        }
        outcome
    }

    fn error(self, status: StatusCode, message: &str) -> Outcome {
        let body = match self {
            Api::Anthropic => anthropic::error_body(status, message),
            Api::OpenAi => openai::error_body(status, message),
        };
        Outcome {
            status,
            body,
            retry_after: (status == StatusCode::TOO_MANY_REQUESTS).then_some(0),
            should_retry: None,
        }
    }
}

fn scripted_error_message(status: StatusCode) -> &'static str {
    match status.as_u16() {
        429 => "rate limit exceeded (scripted by the fake llm)",
        529 | 503 => "overloaded (scripted by the fake llm)",
        500 => "internal server error (scripted by the fake llm)",
        _ => "error scripted by the fake llm",
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0)
}

/// The request body as a JSON object, or a 400.
fn body_object(body: &Bytes) -> Result<Map<String, Value>, Rejection> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(Rejection::bad_request("request body must be a json object")),
        Err(err) => Err(Rejection::bad_request(format!(
            "request body is not valid json: {err}"
        ))),
    }
}

fn refuse_streaming(object: &Map<String, Value>) -> Result<(), Rejection> {
    if object.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err(Rejection::bad_request(
            "stream: streaming is not supported by the fake llm",
        ));
    }
    Ok(())
}

fn required_messages(object: &Map<String, Value>) -> Result<&Vec<Value>, Rejection> {
    let messages = object
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| Rejection::bad_request("messages: field required"))?;
    if messages.is_empty() {
        return Err(Rejection::bad_request(
            "messages: at least one message is required",
        ));
    }
    Ok(messages)
}

fn role(message: &Value) -> Option<&str> {
    message.get("role").and_then(Value::as_str)
}

mod anthropic {
    use super::*;

    pub(super) fn validate(headers: &HeaderMap, body: &Bytes) -> Result<String, Rejection> {
        if header(headers, "x-api-key").is_none() {
            return Err(Rejection::unauthorized("x-api-key header is required"));
        }
        if header(headers, "anthropic-version").is_none() {
            return Err(Rejection::bad_request(
                "anthropic-version: header is required",
            ));
        }
        if body.len() > strict::ANTHROPIC_MAX_BODY {
            return Err(Rejection::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Request exceeds the maximum allowed number of bytes.",
            ));
        }
        let object = body_object(body)?;
        let model = object
            .get("model")
            .and_then(Value::as_str)
            .ok_or_else(|| Rejection::bad_request("model: field required"))?;
        if object.get("max_tokens").and_then(Value::as_u64).is_none() {
            return Err(Rejection::bad_request("max_tokens: field required"));
        }
        refuse_streaming(&object)?;
        let messages = required_messages(&object)?;
        strict::anthropic(&object, model)?;
        check_messages(messages)?;
        Ok(model.to_string())
    }

    fn check_messages(messages: &[Value]) -> Result<(), Rejection> {
        for (index, message) in messages.iter().enumerate() {
            check_shape(index, message)?;
            let previous = index.checked_sub(1).and_then(|i| messages.get(i));
            check_results_answer_previous(index, message, previous)?;
            check_uses_answered(index, message, messages.get(index + 1))?;
        }
        Ok(())
    }

    fn check_shape(index: usize, message: &Value) -> Result<(), Rejection> {
        match role(message) {
            Some("user" | "assistant") => {}
            Some(other) => {
                return Err(Rejection::bad_request(format!(
                    "messages.{index}.role: input should be 'user' or 'assistant', got '{other}'"
                )))
            }
            None => {
                return Err(Rejection::bad_request(format!(
                    "messages.{index}.role: field required"
                )))
            }
        }
        match message.get("content") {
            Some(Value::String(_) | Value::Array(_)) => Ok(()),
            _ => Err(Rejection::bad_request(format!(
                "messages.{index}.content: field required (a string or a list of blocks)"
            ))),
        }
    }

    /// Every `tool_result` must answer a `tool_use` of the previous message.
    fn check_results_answer_previous(
        index: usize,
        message: &Value,
        previous: Option<&Value>,
    ) -> Result<(), Rejection> {
        let results = block_ids(index, message, "tool_result", "tool_use_id")?;
        if results.is_empty() {
            return Ok(());
        }
        let uses = match previous {
            Some(previous)
                if role(previous) == Some("assistant") && role(message) == Some("user") =>
            {
                block_ids(index - 1, previous, "tool_use", "id")?
            }
            _ => Vec::new(),
        };
        let unexpected: Vec<&str> = results
            .iter()
            .filter(|id| !uses.contains(id))
            .map(String::as_str)
            .collect();
        if unexpected.is_empty() {
            return Ok(());
        }
        Err(Rejection::bad_request(format!(
            "messages.{index}.content: unexpected `tool_use_id` found in `tool_result` blocks: {}. \
             each `tool_result` block must have a corresponding `tool_use` block in the previous message",
            unexpected.join(", ")
        )))
    }

    /// Every `tool_use` must be answered by a `tool_result` in the next user message.
    fn check_uses_answered(
        index: usize,
        message: &Value,
        next: Option<&Value>,
    ) -> Result<(), Rejection> {
        let uses = block_ids(index, message, "tool_use", "id")?;
        if uses.is_empty() {
            return Ok(());
        }
        let results = match next {
            Some(next) if role(next) == Some("user") => {
                block_ids(index + 1, next, "tool_result", "tool_use_id")?
            }
            _ => Vec::new(),
        };
        let missing: Vec<&str> = uses
            .iter()
            .filter(|id| !results.contains(id))
            .map(String::as_str)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(Rejection::bad_request(format!(
            "messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. \
             each `tool_use` block must have a corresponding `tool_result` block in the next message",
            missing.join(", ")
        )))
    }

    /// The `key` of every content block of type `kind` in a message.
    fn block_ids(
        index: usize,
        message: &Value,
        kind: &str,
        key: &str,
    ) -> Result<Vec<String>, Rejection> {
        let Some(blocks) = message.get("content").and_then(Value::as_array) else {
            return Ok(Vec::new());
        };
        let mut ids = Vec::new();
        for (position, block) in blocks.iter().enumerate() {
            if block.get("type").and_then(Value::as_str) != Some(kind) {
                continue;
            }
            let id = block.get(key).and_then(Value::as_str).ok_or_else(|| {
                Rejection::bad_request(format!(
                    "messages.{index}.content.{position}.{kind}.{key}: field required"
                ))
            })?;
            ids.push(id.to_string());
        }
        Ok(ids)
    }

    pub(super) fn success_body(
        id: u64,
        model: &str,
        answer: Answer,
        usage: &ScriptedReply,
    ) -> Value {
        let (content, stop_reason) = match answer {
            Answer::ToolUse { name, input } => (
                json!([{
                    "type": "tool_use",
                    "id": format!("toolu_{id}"),
                    "name": name,
                    "input": input,
                }]),
                "tool_use",
            ),
            Answer::Calls(calls) => (
                calls
                    .iter()
                    .enumerate()
                    .map(|(n, c)| {
                        json!({"type": "tool_use", "id": format!("toolu_{id}_{n}"),
                            "name": c.name, "input": c.input})
                    })
                    .collect(),
                "tool_use",
            ),
            Answer::Text(text) => (json!([{ "type": "text", "text": text }]), "end_turn"),
        };
        json!({
            "id": format!("msg_{id}"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": null,
            "usage": {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cache_creation_input_tokens": usage.cache_write,
                "cache_read_input_tokens": usage.cache_read,
            },
        })
    }

    pub(super) fn error_body(status: StatusCode, message: &str) -> Value {
        json!({
            "type": "error",
            "error": { "type": error_type(status), "message": message },
        })
    }

    fn error_type(status: StatusCode) -> &'static str {
        match status.as_u16() {
            400 | 405 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            _ => "api_error",
        }
    }
}

mod openai {
    use super::*;

    const ROLES: [&str; 6] = [
        "system",
        "developer",
        "user",
        "assistant",
        "tool",
        "function",
    ];

    pub(super) fn validate(headers: &HeaderMap, body: &Bytes) -> Result<String, Rejection> {
        let bearer = header(headers, "authorization")
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|key| !key.is_empty());
        if bearer.is_none() {
            return Err(Rejection::unauthorized(
                "you didn't provide an api key. you need to provide your api key in an \
                 authorization header using bearer auth (i.e. authorization: bearer your_key)",
            ));
        }
        let object = body_object(body)?;
        let model = object
            .get("model")
            .and_then(Value::as_str)
            .ok_or_else(|| Rejection::bad_request("you must provide a model parameter"))?;
        refuse_streaming(&object)?;
        let messages = required_messages(&object)
            .map_err(|_| Rejection::bad_request("missing required parameter: 'messages'"))?;
        check_messages(messages)?;
        strict::openai(&object, model)?;
        Ok(model.to_string())
    }

    /// Tool call ids of the last assistant message, and those not yet answered.
    #[derive(Default)]
    struct OpenCalls {
        asked: Vec<String>,
        pending: Vec<String>,
    }

    fn check_messages(messages: &[Value]) -> Result<(), Rejection> {
        let mut calls = OpenCalls::default();
        for (index, message) in messages.iter().enumerate() {
            let role = checked_role(index, message)?;
            if role == "tool" {
                answer_call(index, message, &mut calls)?;
                continue;
            }
            require_all_answered(&calls)?;
            calls = OpenCalls::default();
            if role == "assistant" {
                let asked = tool_call_ids(index, message)?;
                calls.pending = asked.clone();
                calls.asked = asked;
            }
        }
        require_all_answered(&calls)
    }

    fn checked_role(index: usize, message: &Value) -> Result<&str, Rejection> {
        match role(message) {
            Some(role) if ROLES.contains(&role) => Ok(role),
            Some(other) => Err(Rejection::bad_request(format!(
                "invalid value: '{other}'. supported values are: {}. (messages[{index}].role)",
                ROLES.join(", ")
            ))),
            None => Err(Rejection::bad_request(format!(
                "missing required parameter: 'messages[{index}].role'"
            ))),
        }
    }

    fn answer_call(index: usize, message: &Value, calls: &mut OpenCalls) -> Result<(), Rejection> {
        let id = message
            .get("tool_call_id")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                Rejection::bad_request(format!(
                    "missing required parameter: 'messages[{index}].tool_call_id'"
                ))
            })?;
        if !calls.asked.iter().any(|asked| asked == id) {
            return Err(Rejection::bad_request(format!(
                "invalid parameter: messages with role 'tool' must be a response to a preceding \
                 message with 'tool_calls' (messages[{index}].tool_call_id '{id}' matches none)"
            )));
        }
        calls.pending.retain(|pending| pending != id);
        Ok(())
    }

    fn require_all_answered(calls: &OpenCalls) -> Result<(), Rejection> {
        if calls.pending.is_empty() {
            return Ok(());
        }
        Err(Rejection::bad_request(format!(
            "an assistant message with 'tool_calls' must be followed by tool messages responding \
             to each 'tool_call_id'. the following tool_call_ids did not have response messages: {}",
            calls.pending.join(", ")
        )))
    }

    fn tool_call_ids(index: usize, message: &Value) -> Result<Vec<String>, Rejection> {
        let Some(tool_calls) = message.get("tool_calls").and_then(Value::as_array) else {
            return Ok(Vec::new());
        };
        let mut ids = Vec::new();
        for (position, call) in tool_calls.iter().enumerate() {
            let id = call.get("id").and_then(Value::as_str).ok_or_else(|| {
                Rejection::bad_request(format!(
                    "missing required parameter: 'messages[{index}].tool_calls[{position}].id'"
                ))
            })?;
            ids.push(id.to_string());
        }
        Ok(ids)
    }

    pub(super) fn success_body(
        id: u64,
        model: &str,
        answer: Answer,
        usage: &ScriptedReply,
    ) -> Value {
        let (message, finish_reason) = match answer {
            Answer::ToolUse { name, input } => (
                json!({
                    "role": "assistant",
                    "content": null,
                    "refusal": null,
                    "tool_calls": [{
                        "id": format!("call_{id}"),
                        "type": "function",
                        "function": { "name": name, "arguments": input.to_string() },
                    }],
                }),
                "tool_calls",
            ),
            Answer::Calls(calls) => (
                json!({
                    "role": "assistant",
                    "content": null,
                    "refusal": null,
                    "tool_calls": calls.iter().enumerate().map(|(n, c)| json!({
                        "id": format!("call_{id}_{n}"),
                        "type": "function",
                        "function": { "name": c.name, "arguments": c.input.to_string() },
                    })).collect::<Vec<_>>(),
                }),
                "tool_calls",
            ),
            Answer::Text(text) => (
                json!({ "role": "assistant", "content": text, "refusal": null }),
                "stop",
            ),
        };
        json!({
            "id": format!("chatcmpl-{id}"),
            "object": "chat.completion",
            "created": unix_now(),
            "model": model,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": null,
                "finish_reason": finish_reason,
            }],
            "usage": {
                "prompt_tokens": usage.input_tokens,
                "completion_tokens": usage.output_tokens,
                "total_tokens": usage.input_tokens + usage.output_tokens,
            },
        })
    }

    pub(super) fn error_body(status: StatusCode, message: &str) -> Value {
        json!({
            "error": {
                "message": message,
                "type": error_type(status),
                "param": null,
                "code": null,
            },
        })
    }

    fn error_type(status: StatusCode) -> &'static str {
        match status.as_u16() {
            401 => "authentication_error",
            429 => "rate_limit_exceeded",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        }
    }
}
