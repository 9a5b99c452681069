//! The `browser` tool: the agent's input checked (`shared::browser`), `fleet-browser` run in the
//! job's container with the request on stdin, its screenshots read back out of the container
//! (in bounded chunks of raw bytes, checked to be PNGs) and kept as the job's artifacts
//! `screenshots/<n>-<name>.png`, and every call written to the job's `verification_log.json`.
//! The agent's answer is `fleet-browser`'s JSON with artifact names in place of file paths.

use crate::blobs::{BlobError, Blobs};
use crate::harness::Artifacts;
use crate::sandbox::Session;
use crate::tools::Failure;
use serde_json::{json, Value};
use shared::browser::{self, BrowserRequest};
use shared::resilience::ToolErrorType;
use shared::text;
use std::collections::BTreeMap;
use std::time::Duration;
use tracing::{debug, warn};

/// Where `fleet-browser` writes a call's screenshots inside the container.
const SHOT_ROOT: &str = "/tmp/fleet-browser";
/// The largest screenshot kept (a 1280 × 800 viewport is far below it).
pub const MAX_SHOT_BYTES: u64 = 4 << 20;
/// Read in chunks this size: far below the exec's output cap (1 MiB unless configured), and a
/// chunk that was cut short is noticed (the sizes must add up).
const CHUNK: u64 = 256 << 10;
/// Screenshots kept per job, over all its calls.
pub const MAX_SHOTS_PER_JOB: u32 = 100;
/// Calls written to the verification log per job (later ones are counted, not written).
const MAX_LOGGED_CALLS: usize = 200;
/// The answer's cap.
const MAX_ANSWER: usize = 40_000;
const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

/// What a job's browser calls leave behind: screenshots and the verification log, kept under
/// the job's artifact prefix; added to the job's artifacts by [`Evidence::flush`] after each
/// agent run (an incremental session flushes after every invocation, numbering on).
pub struct Evidence {
    store: tokio::sync::Mutex<Book>,
}

struct Book {
    blobs: Blobs,
    prefix: String,
    calls: u32,
    shots: u32,
    written: BTreeMap<String, String>,
    log: Vec<Value>,
}

impl Evidence {
    pub fn new(art: &Artifacts<'_>) -> Self {
        Evidence {
            store: tokio::sync::Mutex::new(Book {
                blobs: art.blobs.clone(),
                prefix: art.prefix.to_string(),
                calls: 0,
                shots: 0,
                written: BTreeMap::new(),
                log: Vec::new(),
            }),
        }
    }

    /// Adds the screenshots kept so far to `art` and writes the verification log (all calls so
    /// far; nothing when there were none).
    pub async fn flush(&self, art: &mut Artifacts<'_>) -> Result<(), BlobError> {
        let mut book = self.store.lock().await;
        art.written.append(&mut book.written);
        if book.calls > 0 {
            let log = json!({"calls": book.calls, "screenshots": book.shots, "log": book.log});
            art.put_json("verification_log.json", &log).await?;
        }
        Ok(())
    }
}

/// Runs one browser call. `Err` is a failed call for the resilient executor: input refused
/// here (its class known), a browser that is missing or broke, or a page that failed (the
/// browser's own error, classified by the seed's table; run again only when no action that
/// can change the app's state — a click, typing, a key — had been done).
pub async fn call(
    session: &dyn Session,
    evidence: Option<&Evidence>,
    input: &Value,
) -> Result<String, Failure> {
    let request = browser::validate(input).map_err(|e| {
        let kind = match e {
            browser::BrowserInputError::Url { .. } => ToolErrorType::Permission,
            _ => ToolErrorType::InvalidInput,
        };
        Failure::known(kind, e.to_string())
    })?;
    let evidence = evidence.ok_or_else(|| {
        Failure::known(
            ToolErrorType::Capability,
            "the browser tool cannot keep screenshots in this step",
        )
    })?;
    let n = {
        let mut book = evidence.store.lock().await;
        book.calls += 1;
        book.calls
    };
    let dir = format!("{SHOT_ROOT}/call-{n}");
    let stdin = serde_json::to_vec(&request.to_json(&dir)).expect("json serializes");
    // fleet-browser bounds itself by the request's timeout; the exec's is a backstop past its own.
    let timeout = Duration::from_secs(request.timeout_seconds + 30);
    debug!(call = n, url = %request.url, actions = request.actions.len(), "browser call");
    let out = session
        .exec(&["fleet-browser".to_string()], Some(stdin), timeout)
        .await
        .map_err(|e| Failure::sandbox(e, false))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.exit_code == 126 || out.exit_code == 127 {
        return Err(Failure::known(ToolErrorType::NotInstalled, "fleet-browser is not installed in this node's image (use an image built with images/agents/, such as fleet-agent-web:1)"));
    }
    let last = stdout.lines().rev().find(|l| !l.trim().is_empty());
    let mut result: Value = match last.map(serde_json::from_str::<Value>) {
        Some(Ok(v)) if v.is_object() => v,
        _ => {
            return Err(Failure::unknown(
                format!(
                    "the browser gave no answer (exit code {}{}): {}",
                    out.exit_code,
                    if out.timed_out { ", timed out" } else { "" },
                    text::tail(&stderr, 10, 1000)
                ),
                false,
            ))
        }
    };
    if result.get("refused") == Some(&json!(true)) {
        let why = result
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("no reason");
        return Err(Failure::known(
            ToolErrorType::InvalidInput,
            format!("the browser refused the request: {why}"),
        ));
    }
    keep_screenshots(session, evidence, &request, &dir, &mut result).await;
    let mut book = evidence.store.lock().await;
    if book.log.len() < MAX_LOGGED_CALLS {
        book.log
            .push(json!({"call": n, "input": input, "result": result}));
    }
    drop(book);
    let answer = text::head(
        &serde_json::to_string_pretty(&result).expect("json serializes"),
        MAX_ANSWER,
    );
    match result.get("ok") {
        Some(Value::Bool(false)) => {
            let error = result
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("the browser call failed")
                .to_string();
            Err(Failure {
                detail: Some(answer),
                ..Failure::unknown(error, browser::replay_safe(&result))
            })
        }
        _ => Ok(answer),
    }
}

/// Reads each screenshot the call reports out of the container and keeps it; the action's
/// `path` becomes `artifact` (or an `error`). Paths are this call's own, never the answer's.
async fn keep_screenshots(
    session: &dyn Session,
    evidence: &Evidence,
    request: &BrowserRequest,
    dir: &str,
    result: &mut Value,
) {
    let names = request.screenshots();
    let Some(actions) = result.get_mut("actions").and_then(Value::as_array_mut) else {
        return;
    };
    let shots = actions
        .iter_mut()
        .filter(|a| a.get("action").and_then(Value::as_str) == Some("screenshot"));
    for (action, name) in shots.zip(names) {
        let Some(obj) = action.as_object_mut() else {
            continue;
        };
        let taken = obj.remove("path").is_some() && obj.get("ok") == Some(&json!(true));
        obj.insert("name".into(), json!(name));
        if !taken {
            continue;
        }
        let path = format!("{dir}/{name}.png");
        let kept = match read_png(session, &path).await {
            Ok(bytes) => store(evidence, name, bytes).await,
            Err(e) => Err(e),
        };
        match kept {
            Ok(artifact) => {
                obj.insert("artifact".into(), json!(artifact));
            }
            Err(e) => {
                warn!(path = %path, error = %e, "screenshot not kept");
                obj.insert("ok".into(), json!(false));
                obj.insert("error".into(), json!(format!("screenshot not kept: {e}")));
            }
        }
    }
    let rm = ["rm".to_string(), "-rf".into(), "--".into(), dir.to_string()];
    let _ = session.exec(&rm, None, Duration::from_secs(10)).await;
}

async fn store(evidence: &Evidence, name: &str, bytes: Vec<u8>) -> Result<String, String> {
    let mut book = evidence.store.lock().await;
    if book.shots >= MAX_SHOTS_PER_JOB {
        return Err(format!(
            "this job already keeps {MAX_SHOTS_PER_JOB} screenshots"
        ));
    }
    book.shots += 1;
    let artifact = format!("screenshots/{}-{name}.png", book.shots);
    let key = format!("{}{artifact}", book.prefix);
    book.blobs
        .put(&key, bytes)
        .await
        .map_err(|e| format!("cannot store it: {e}"))?;
    book.written.insert(artifact.clone(), key);
    Ok(artifact)
}

/// A PNG file of the container, read in chunks; its size bounded first.
async fn read_png(session: &dyn Session, path: &str) -> Result<Vec<u8>, String> {
    let stat = sh(session, "stat -c %s -- \"$1\"", &[path]).await?;
    let size: u64 = String::from_utf8_lossy(&stat)
        .trim()
        .parse()
        .map_err(|_| "cannot read its size".to_string())?;
    if size > MAX_SHOT_BYTES {
        return Err(format!("{size} bytes, more than {MAX_SHOT_BYTES}"));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    while (bytes.len() as u64) < size {
        let from = (bytes.len() as u64 + 1).to_string();
        let chunk = CHUNK.to_string();
        let script = "tail -c +\"$2\" -- \"$1\" | head -c \"$3\"";
        let part = sh(session, script, &[path, &from, &chunk]).await?;
        if part.is_empty() || part.len() as u64 > CHUNK {
            break;
        }
        bytes.extend(part);
    }
    if bytes.len() as u64 != size {
        return Err(format!("read {} of {size} bytes", bytes.len()));
    }
    if !bytes.starts_with(PNG_MAGIC) {
        return Err("the file is not a png".into());
    }
    Ok(bytes)
}

async fn sh(session: &dyn Session, script: &str, args: &[&str]) -> Result<Vec<u8>, String> {
    let mut argv = vec!["sh".to_string(), "-c".into(), script.into(), "sh".into()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let out = session
        .exec(&argv, None, Duration::from_secs(30))
        .await
        .map_err(|e| e.to_string())?;
    if out.exit_code != 0 {
        return Err(format!(
            "exit code {}: {}",
            out.exit_code,
            text::tail(&String::from_utf8_lossy(&out.stderr), 5, 500)
        ));
    }
    Ok(out.stdout)
}

#[cfg(test)]
mod tests;
