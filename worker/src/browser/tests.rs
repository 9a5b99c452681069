//! The browser call against a scripted session (what `fleet-browser`, `stat` and the chunked
//! reads answer) and an in-memory store: screenshots are read from the call's own folder
//! whatever path the answer names, kept only when they are PNGs, and logged.

use super::*;
use crate::sandbox::{ExecOutput, Mounts, SandboxError};
use async_trait::async_trait;
use std::sync::{Arc, Mutex};

/// A container with one file at `/tmp/fleet-browser/call-1/shot.png` and a `fleet-browser`
/// that answers `answer`; every argv is recorded.
struct Scripted {
    answer: String,
    file: Vec<u8>,
    seen: Mutex<Vec<Vec<String>>>,
}

fn ok(stdout: Vec<u8>) -> ExecOutput {
    ExecOutput {
        stdout,
        ..ExecOutput::default()
    }
}

#[async_trait]
impl Session for Scripted {
    async fn exec(
        &self,
        argv: &[String],
        _stdin: Option<Vec<u8>>,
        _timeout: Duration,
    ) -> Result<ExecOutput, SandboxError> {
        self.seen.lock().unwrap().push(argv.to_vec());
        let a: Vec<&str> = argv.iter().map(String::as_str).collect();
        Ok(match a[..] {
            ["fleet-browser"] => ok(format!("starting\n{}\n", self.answer).into_bytes()),
            ["sh", "-c", script, "sh", "/tmp/fleet-browser/call-1/shot.png", ..] => {
                if script.starts_with("stat") {
                    ok(format!("{}\n", self.file.len()).into_bytes())
                } else {
                    let from: usize = a[5].parse::<usize>().unwrap() - 1;
                    let len: usize = a[6].parse().unwrap();
                    let end = (from + len).min(self.file.len());
                    ok(self.file[from.min(end)..end].to_vec())
                }
            }
            ["rm", "-rf", "--", _] => ok(vec![]),
            _ => ExecOutput {
                exit_code: 1,
                stderr: b"no such file".to_vec(),
                ..ExecOutput::default()
            },
        })
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

fn png(len: usize) -> Vec<u8> {
    let mut bytes = PNG_MAGIC.to_vec();
    bytes.extend((0..len).map(|i| (i % 251) as u8));
    bytes
}

fn answer(path: &str) -> String {
    json!({"ok": true, "url": "http://127.0.0.1:8000/", "title": "t", "actions": [
        {"action": "text", "ok": true, "text": "hi"},
        {"action": "screenshot", "ok": true, "name": "shot", "path": path, "bytes": 9}
    ]})
    .to_string()
}

fn input() -> Value {
    json!({"url": "http://127.0.0.1:8000/", "actions": [{"text": "p"}, {"screenshot": "shot"}]})
}

async fn call_with(session: &Scripted) -> (Result<String, String>, Artifacts<'static>) {
    let blobs: &'static Blobs = Box::leak(Box::new(Blobs::from_store(
        Arc::new(object_store::memory::InMemory::new()),
        "t",
    )));
    let mut art = Artifacts {
        blobs,
        prefix: "runs/r/verify/",
        written: Default::default(),
        events: Vec::new(),
    };
    let evidence = Evidence::new(&art);
    let answer = call(session, Some(&evidence), &input())
        .await
        .map_err(|f| f.error);
    evidence.flush(&mut art).await.unwrap();
    (answer, art)
}

#[tokio::test]
async fn a_screenshot_is_read_from_the_calls_own_folder_in_chunks_and_kept() {
    // More than one chunk, and an answer that names another file.
    let file = png(CHUNK as usize + 1000);
    let session = Scripted {
        answer: answer("/etc/passwd"),
        file: file.clone(),
        seen: Mutex::new(Vec::new()),
    };
    let (answer, art) = call_with(&session).await;
    let answer: Value = serde_json::from_str(&answer.unwrap()).unwrap();
    let shot = &answer["actions"][1];
    assert_eq!(shot["artifact"], "screenshots/1-shot.png", "{answer}");
    assert!(shot.get("path").is_none());
    let key = &art.written["screenshots/1-shot.png"];
    assert_eq!(key, "runs/r/verify/screenshots/1-shot.png");
    assert_eq!(art.blobs.get(key).await.unwrap(), file);
    let seen = session.seen.lock().unwrap().clone();
    assert!(
        seen.iter().flatten().all(|a| a != "/etc/passwd"),
        "{seen:?}"
    );
    let chunks = seen
        .iter()
        .filter(|a| a.get(2).is_some_and(|s| s.starts_with("tail")))
        .count();
    assert_eq!(chunks, 2);
    let log = art
        .blobs
        .get(&art.written["verification_log.json"])
        .await
        .unwrap();
    let log: Value = serde_json::from_slice(&log).unwrap();
    assert_eq!(log["calls"], 1);
    assert_eq!(
        log["log"][0]["result"]["actions"][1]["artifact"],
        "screenshots/1-shot.png"
    );
}

#[tokio::test]
async fn a_file_that_is_not_a_png_is_not_kept() {
    let session = Scripted {
        answer: answer("/tmp/fleet-browser/call-1/shot.png"),
        file: b"<html>not an image</html>".to_vec(),
        seen: Mutex::new(Vec::new()),
    };
    let (answer, art) = call_with(&session).await;
    let answer: Value = serde_json::from_str(&answer.unwrap()).unwrap();
    let shot = &answer["actions"][1];
    assert_eq!(shot["ok"], false);
    assert!(
        shot["error"].as_str().unwrap().contains("not a png"),
        "{shot}"
    );
    assert!(!art.written.contains_key("screenshots/1-shot.png"));
}

#[tokio::test]
async fn bad_input_runs_nothing_and_a_broken_answer_is_an_error() {
    let session = Scripted {
        answer: "not json".into(),
        file: vec![],
        seen: Mutex::new(Vec::new()),
    };
    let evidence_less = call(&session, None, &json!({"url": "http://10.0.0.1/"})).await;
    let refused = evidence_less.unwrap_err();
    assert!(refused.error.contains("only 127.0.0.1 and localhost"));
    assert_eq!(
        refused.known,
        Some(shared::resilience::ToolErrorType::Permission),
        "a page off the loopback is a policy refusal"
    );
    assert!(
        session.seen.lock().unwrap().is_empty(),
        "refused before anything ran"
    );
    let (answer, art) = call_with(&session).await;
    assert!(answer.unwrap_err().contains("the browser gave no answer"));
    // The call ran, so it is logged; nothing else is kept.
    assert_eq!(art.written.len(), 1, "{:?}", art.written);
}
