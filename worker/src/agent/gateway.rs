//! The LLM gateway of one command-agent job: an HTTP server on a unix socket that only that
//! job's container can reach (the socket's folder is bind-mounted into it; the container has no
//! network). It speaks the API the agent was configured with, adds the worker's key, makes
//! every call with the configured model, and keeps the job's budget (what is left of the
//! run's, `JobSpec::llm_budget`): once its calls were made or its tokens spent, every further
//! call is answered 429
//! `budget_exhausted` (with `x-should-retry: false`). Calls are made one at a time, so the
//! budget is exact; at most [`MAX_CONNECTIONS`] connections are served at once, so a program
//! cannot hold more of the worker than that. What the calls cost is counted here, never taken
//! from the agent.

use super::anthropic::Anthropic;
use super::gateway_policy::{police, GatewayLimits};
use super::llm::{count_tokens, post_with_retry, Billed, LlmError, LlmSettings};
use super::openai::OpenAi;
use super::provider::{ChatApi, Endpoint, Tokens};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};
use shared::messages::{CommandAgent, LlmApi, LlmBudget, Usage};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::net::UnixListener;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// The socket's file name in the gateway's folder.
pub const SOCKET_NAME: &str = "llm.sock";

/// A request body not sent whole within this long is refused (its room given back).
const BODY_READ: std::time::Duration = std::time::Duration::from_secs(60);

/// Connections served at once: a program that opens more waits (in the socket's backlog), so a
/// hostile one cannot hold more of the worker than this.
pub const MAX_CONNECTIONS: usize = 16;

/// A connection that sends no request headers for this long is closed.
const IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// One call through the gateway, as the transcript records it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CallRecord {
    /// When the call was answered, in milliseconds since the gateway started.
    pub at_ms: u64,
    pub status: u16,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Why the gateway refused or failed the call, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A closed gateway's books.
pub struct Closed {
    pub usage: Usage,
    pub calls: Vec<CallRecord>,
    /// The most connections served at once.
    pub peak_connections: usize,
    /// The most request bytes held at once (room taken before reading).
    pub peak_body_bytes: usize,
}

/// The semaphore's permits: one a byte of the bytes in flight, never fewer than one body.
fn in_flight_permits(limits: &GatewayLimits) -> usize {
    limits
        .in_flight_bytes
        .max(limits.max_body_bytes)
        .min(u32::MAX as usize)
}

#[derive(Default)]
struct Books {
    usage: Usage,
    calls: Vec<CallRecord>,
}

/// Connections open now and the most ever open at once.
#[derive(Default)]
struct Connections {
    open: usize,
    peak: usize,
}

struct Shared {
    started: std::time::Instant,
    api: LlmApi,
    model: String,
    max_calls: u32,
    max_tokens: u64,
    /// What the run's dollar budget had left when the job was published
    /// (`JobSpec::llm_usd_left`), if the run has one.
    usd_left: Option<f64>,
    settings: LlmSettings,
    http: reqwest::Client,
    /// Held across a call: one call at a time.
    books: Mutex<Books>,
    connections: std::sync::Mutex<Connections>,
    /// Room for request bodies (`GatewayLimits::in_flight_bytes`, one permit a byte), taken
    /// before a body is read.
    in_flight: tokio::sync::Semaphore,
    /// Request bytes held now, and the most ever held at once.
    held: AtomicUsize,
    peak_held: AtomicUsize,
}

impl Shared {
    fn at_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Counts a connection opened (+1) or closed (-1).
    fn opened(&self, delta: isize) {
        if let Ok(mut c) = self.connections.lock() {
            c.open = c.open.saturating_add_signed(delta);
            c.peak = c.peak.max(c.open);
        }
    }
}

/// A running gateway; [`Gateway::close`] stops it and gives its books.
pub struct Gateway {
    dir: PathBuf,
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Gateway {
    /// Serves the agent's API on `<dir>/llm.sock` (the folder is made, and its socket opened
    /// to the container's user, whoever it is: only the container that mounts it reaches it;
    /// the folder is removed when the gateway closes or is dropped).
    pub fn start(
        dir: &Path,
        agent: &CommandAgent,
        budget: LlmBudget,
        usd_left: Option<f64>,
        settings: &LlmSettings,
        http: &reqwest::Client,
    ) -> std::io::Result<Gateway> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        let socket = dir.join(SOCKET_NAME);
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket)?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))?;
        let shared = Arc::new(Shared {
            started: std::time::Instant::now(),
            api: agent.api,
            model: agent.model.clone(),
            max_calls: budget.calls,
            max_tokens: budget.tokens,
            usd_left,
            settings: settings.clone(),
            http: http.clone(),
            books: Mutex::new(Books::default()),
            connections: std::sync::Mutex::new(Connections::default()),
            in_flight: tokio::sync::Semaphore::new(in_flight_permits(&settings.gateway)),
            held: AtomicUsize::new(0),
            peak_held: AtomicUsize::new(0),
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(listener, shared.clone(), stop.clone()));
        Ok(Gateway {
            dir: dir.to_path_buf(),
            shared,
            stop,
            task,
        })
    }

    /// The folder holding the socket (what the sandbox mounts).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops serving (the folder is removed); the job's usage, its calls and the most it held
    /// at once.
    pub async fn close(mut self) -> Closed {
        self.stop.cancel();
        let _ = (&mut self.task).await;
        let books = self.shared.books.lock().await;
        let peak_connections = self
            .shared
            .connections
            .lock()
            .map(|c| c.peak)
            .unwrap_or_default();
        Closed {
            usage: books.usage,
            calls: books.calls.clone(),
            peak_connections,
            peak_body_bytes: self.shared.peak_held.load(Ordering::SeqCst),
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn serve(listener: UnixListener, shared: Arc<Shared>, stop: CancellationToken) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        // A connection is accepted only when one of the slots is free.
        let slot = tokio::select! {
            _ = stop.cancelled() => return,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
        };
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    warn!(error = %e, "the llm gateway cannot accept a connection");
                    continue;
                }
            },
        };
        let shared = shared.clone();
        let stop = stop.clone();
        shared.opened(1);
        tokio::spawn(async move {
            let _slot = slot;
            let counted = shared.clone();
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(&shared, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(IDLE)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::select! {
                _ = stop.cancelled() => {}
                served = conn => if let Err(e) = served {
                    debug!(error = %e, "llm gateway connection ended");
                },
            }
            counted.opened(-1);
        });
    }
}

/// The path the API is served at.
fn api_path(api: LlmApi) -> &'static str {
    match api {
        LlmApi::Anthropic => "/v1/messages",
        LlmApi::Openai => "/v1/chat/completions",
    }
}

/// An error in the API's own error shape.
fn error(api: LlmApi, status: StatusCode, kind: &str, message: &str) -> Response<Full<Bytes>> {
    let body = match api {
        LlmApi::Anthropic => {
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
        LlmApi::Openai => json!({"error": {"type": kind, "code": kind, "message": message}}),
    };
    respond(status, &body, kind == "budget_exhausted")
}

fn respond(status: StatusCode, body: &Value, final_answer: bool) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    if final_answer {
        headers.insert(
            "x-should-retry",
            hyper::header::HeaderValue::from_static("false"),
        );
    }
    resp
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let api = shared.api;
    if req.method() != hyper::Method::POST || req.uri().path() != api_path(api) {
        let message = format!(
            "the gateway serves POST {} only (the agent's api)",
            api_path(api)
        );
        return error(api, StatusCode::NOT_FOUND, "not_found_error", &message);
    }
    // Room for the body is taken before a byte of it is read; it is given back when the call
    // is answered (the body, its parse and the forwarded copy live until then).
    let (_held, body) = match read_body(shared, req).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let mut body: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            let message = "the request body is not a json object";
            return error(
                api,
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                message,
            );
        }
    };
    let mut books = shared.books.lock().await;
    let spent = books.usage.input_tokens + books.usage.output_tokens;
    let made = books.calls.iter().filter(|c| c.status == 200).count() as u32;
    if made >= shared.max_calls || spent >= shared.max_tokens {
        let message = format!(
            "budget_exhausted: {made} of {} calls made, {spent} of {} tokens spent",
            shared.max_calls, shared.max_tokens
        );
        return refuse(shared, &mut books, 429, "budget_exhausted", message);
    }
    let left = match affordable(shared, &books, &body).await {
        Ok(tokens) => tokens.min(shared.max_tokens.saturating_sub(spent)),
        Err(message) => return refuse(shared, &mut books, 429, "budget_exhausted", message),
    };
    let limits = &shared.settings.gateway;
    if let Err(why) = police(api, &mut body, &shared.model, limits, left) {
        let message = why.to_string();
        return refuse(shared, &mut books, 400, "invalid_request_error", message);
    }
    forward(shared, &mut books, &body).await
}

/// The output tokens the run's dollars (less what this job spent) and the team's dollars
/// left today still pay for once this call's input is paid (estimated from the body's size,
/// 4 bytes a token); `u64::MAX` when neither has a limit. An error when not one is left, or
/// the model has no price (closed by default), or the ledger cannot say.
async fn affordable(shared: &Shared, books: &Books, body: &Value) -> Result<u64, String> {
    let settings = &shared.settings;
    let team_left = match (&settings.gate, &settings.scope) {
        (Some(gate), Some(scope)) => gate
            .usd_left(scope)
            .await
            .map_err(|e| format!("the team's budget cannot be read: {e}"))?,
        _ => None,
    };
    let run_left = shared.usd_left.map(|l| l - books.usage.cost_usd);
    let left = match (run_left, team_left) {
        (None, None) => return Ok(u64::MAX),
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
    };
    let price = settings
        .prices
        .price(&shared.model)
        .ok_or_else(|| LlmError::NoPrice(shared.model.clone()).to_string())?;
    let input = Billed {
        input: body.to_string().len() as u64 / 4,
        ..Billed::default()
    };
    let team_binds = team_left.is_some_and(|t| run_left.is_none_or(|r| t < r));
    match price.output_tokens_for(left - price.cost(&input)) {
        // As in the built-in loop: the team's ledger stops the next call at 100%.
        0 if team_binds => Ok(1),
        0 => Err(format!(
            "budget_exhausted: the run's or the team's budget has ${:.6} left, not enough for another call",
            left.max(0.0)
        )),
        n => Ok(n),
    }
}

/// Bytes of request bodies a gateway holds now, given back when dropped.
struct Held<'a> {
    shared: &'a Shared,
    bytes: usize,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.shared.held.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

/// The request's body, read only once room for it was taken from the job's bytes in flight;
/// a body declared (or found) over the cap is answered 413 without being read (further).
async fn read_body<'a>(
    shared: &'a Shared,
    req: Request<Incoming>,
) -> Result<(Held<'a>, Bytes), Response<Full<Bytes>>> {
    let api = shared.api;
    let cap = shared.settings.gateway.max_body_bytes;
    let too_large = |what: &str| {
        let message = format!("the request body {what}: at most {cap} bytes are served");
        error(
            api,
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            &message,
        )
    };
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap as u64) {
        return Err(too_large("is declared larger than the cap"));
    }
    // A body of unknown length reserves the whole cap.
    let bytes = declared.map_or(cap, |n| n as usize).max(1);
    let permits = u32::try_from(bytes).unwrap_or(u32::MAX);
    let Ok(permit) = shared.in_flight.acquire_many(permits).await else {
        return Err(error(
            api,
            StatusCode::SERVICE_UNAVAILABLE,
            "api_error",
            "the gateway is closing",
        ));
    };
    let now = shared.held.fetch_add(bytes, Ordering::SeqCst) + bytes;
    shared.peak_held.fetch_max(now, Ordering::SeqCst);
    let held = Held {
        shared,
        bytes,
        _permit: permit,
    };
    let read = tokio::time::timeout(BODY_READ, Limited::new(req.into_body(), cap).collect());
    match read.await {
        Ok(Ok(b)) => Ok((held, b.to_bytes())),
        Ok(Err(_)) => Err(too_large("is unreadable or over the cap")),
        Err(_) => Err(error(
            api,
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "the request body was not sent in time",
        )),
    }
}

/// Makes the call with the worker's key, counts its usage and answers with the provider's
/// reply (or its error).
async fn forward(shared: &Shared, books: &mut Books, body: &Value) -> Response<Full<Bytes>> {
    // The providers' own endpoint (URL, key) and usage reading, as the built-in loop uses them.
    let (endpoint, tokens_of): (_, fn(&Value) -> Tokens) = match shared.api {
        LlmApi::Anthropic => (Anthropic.endpoint(&shared.settings), |b| Anthropic.usage(b)),
        LlmApi::Openai => (OpenAi.endpoint(&shared.settings), |b| OpenAi.usage(b)),
    };
    let Endpoint { url, headers } = match endpoint {
        Ok(e) => e,
        Err(e) => return refuse(shared, books, 503, "api_error", e.to_string()),
    };
    let mut usage = Usage::default();
    let answer = post_with_retry(
        &shared.http,
        &url,
        &headers,
        body,
        &shared.settings,
        &mut usage,
    )
    .await;
    match answer {
        Ok(reply) => {
            let tokens = tokens_of(&reply);
            count_tokens(&mut usage, tokens.input, tokens.output);
            // Cache writes and reads at their own prices, as the built-in loop counts them (a
            // model without a price never gets here: `post_with_retry` does not send it).
            let billed = Billed::of_reply(&reply);
            usage.input_tokens = usage
                .input_tokens
                .saturating_add(billed.cache_write.saturating_add(billed.cache_read));
            usage.cost_usd = shared
                .settings
                .prices
                .price(&shared.model)
                .map_or(0.0, |p| p.cost(&billed));
            books.usage.add(&usage);
            books.calls.push(CallRecord {
                at_ms: shared.at_ms(),
                status: 200,
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                error: None,
            });
            respond(StatusCode::OK, &reply, false)
        }
        Err(LlmError::Api { status, body }) => {
            // The provider's own error, passed on as it came (its status and its body in the
            // API's shape), so that the program's SDK reads it as the provider's.
            let mut resp = refuse(shared, books, status, "api_error", body.clone());
            if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(&body) {
                let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
                resp = respond(code, &v, false);
            }
            resp
        }
        Err(other) => refuse(shared, books, 502, "api_error", other.to_string()),
    }
}

/// Records a call the gateway did not get answered (refused, or failed upstream) and answers
/// it in the API's error shape.
fn refuse(
    shared: &Shared,
    books: &mut Books,
    status: u16,
    kind: &str,
    message: String,
) -> Response<Full<Bytes>> {
    let message = shared::text::head(&message, 2000);
    books.calls.push(CallRecord {
        at_ms: shared.at_ms(),
        status,
        input_tokens: 0,
        output_tokens: 0,
        error: Some(message.clone()),
    });
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    error(shared.api, code, kind, &message)
}
