//! Startup dependency checks of the servers: each dependency (RabbitMQ, Redis, the bucket,
//! Docker and the agent image) is tried with backoff for a bounded time, with a progress line
//! per failed attempt, and a failure names the dependency and its address (never the
//! credentials a URL may carry).

use std::future::Future;
use std::time::{Duration, Instant};
use tracing::info;

/// First pause between two attempts; it doubles per attempt up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(250);
const MAX_PAUSE: Duration = Duration::from_secs(5);
/// However short the wait, one attempt gets at least this long to answer.
const MIN_ATTEMPT: Duration = Duration::from_millis(500);
/// However long the wait, one attempt gets at most this long to answer.
const MAX_ATTEMPT: Duration = Duration::from_secs(10);

/// `url` without the user name and password it may carry (`amqp://user:pw@host/` becomes
/// `amqp://host/`), so it can be logged.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => (&url[..i + 3], &url[i + 3..]),
        None => ("", url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// `text` (an error message that may quote the URL) with the URL's credentials removed.
pub fn scrub(text: &str, url: &str) -> String {
    let redacted = redact_url(url);
    let mut out = text.replace(url, &redacted);
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        let password = userinfo.split_once(':').map(|(_, p)| p).unwrap_or("");
        for secret in [userinfo, password] {
            if secret.len() >= 3 {
                out = out.replace(secret, "***");
            }
        }
    }
    out
}

/// Pause after failed attempt `attempt` (1 for the first): doubling, capped.
pub fn pause_after(attempt: u32) -> Duration {
    FIRST_PAUSE
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
        .min(MAX_PAUSE)
}

/// How long an attempt may take when `remaining` of the wait is left.
pub fn attempt_budget(remaining: Duration) -> Duration {
    remaining.clamp(MIN_ATTEMPT, MAX_ATTEMPT)
}

/// `text` on one line (whitespace runs become one space), at most `max` characters.
pub fn one_line(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &flat[..cut]),
        None => flat,
    }
}

/// One dependency: its name as an operator knows it and its address.
pub struct Dependency {
    /// `cannot reach` (the default) or another verb for the final error.
    pub verb: &'static str,
    pub name: String,
    /// The address, already free of credentials.
    pub url: String,
    /// The address as configured, for scrubbing it out of error messages.
    raw_url: String,
}

impl Dependency {
    pub fn new(name: impl Into<String>, url: &str) -> Self {
        Self {
            verb: "cannot reach",
            name: name.into(),
            url: redact_url(url),
            raw_url: url.to_string(),
        }
    }

    /// Tries `attempt` until it succeeds or `wait` has passed (at least once); each failure
    /// logs `waiting for <name> at <url> (attempt n)` at INFO. The error names the dependency,
    /// its address and the last failure.
    pub async fn wait_for<T, E, F, Fut>(&self, wait: Duration, mut attempt: F) -> anyhow::Result<T>
    where
        E: std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let deadline = Instant::now() + wait;
        let mut n = 0u32;
        loop {
            n += 1;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let budget = attempt_budget(remaining);
            let failure = match tokio::time::timeout(budget, attempt()).await {
                Ok(Ok(v)) => {
                    if n > 1 {
                        info!("{} at {} is reachable (attempt {n})", self.name, self.url);
                    }
                    return Ok(v);
                }
                Ok(Err(e)) => one_line(&scrub(&e.to_string(), &self.raw_url), 500),
                Err(_) => format!("no answer within {:.1}s", budget.as_secs_f64()),
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                anyhow::bail!(
                    "{} {} at {}: {failure} (gave up after {:.0}s and {n} attempt(s); \
                     FLEET_STARTUP_WAIT_SECONDS sets the wait)",
                    self.verb,
                    self.name,
                    self.url,
                    wait.as_secs_f64()
                );
            }
            info!(error = %failure, "waiting for {} at {} (attempt {n})", self.name, self.url);
            tokio::time::sleep(pause_after(n).min(remaining)).await;
        }
    }
}

/// `host:port` of a network URL (`default_port` when it names none); `None` when it names no
/// host (a socket path).
pub fn host_port(url: &str, default_port: u16) -> Option<String> {
    let rest = url.split_once("://").map(|(_, r)| r)?;
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() {
        return None;
    }
    let port_of = |p: &str| p.parse::<u16>().ok();
    if let Some(v6) = host.strip_prefix('[') {
        let (addr, after) = v6.split_once(']')?;
        let port = after
            .strip_prefix(':')
            .and_then(port_of)
            .unwrap_or(default_port);
        return Some(format!("[{addr}]:{port}"));
    }
    Some(match host.rsplit_once(':') {
        Some((h, p)) if port_of(p).is_some() => format!("{h}:{p}"),
        _ => format!("{host}:{default_port}"),
    })
}

/// Opens (and drops) a TCP connection to the URL's host: a closed port fails at once with the
/// system's reason, before a client library starts retrying on its own.
pub async fn tcp_probe(url: &str, default_port: u16) -> Result<(), String> {
    match host_port(url, default_port) {
        Some(addr) => tokio::net::TcpStream::connect(&addr)
            .await
            .map(drop)
            .map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

/// The address of the object store for messages: the bucket URL and, for S3, the endpoint.
pub fn store_address(store: &str) -> String {
    match (
        store.strip_prefix("s3://"),
        std::env::var("AWS_ENDPOINT_URL"),
    ) {
        (Some(_), Ok(endpoint)) if !endpoint.is_empty() => {
            format!("{store} (endpoint {})", redact_url(&endpoint))
        }
        _ => store.to_string(),
    }
}

/// What to call the object store in messages: `bucket `b`` for S3, the folder otherwise.
pub fn store_name(store: &str) -> String {
    match store.strip_prefix("s3://") {
        Some(bucket) => format!("bucket `{}`", bucket.trim_end_matches('/')),
        None => "the object store".to_string(),
    }
}

/// A clearer message for the object store's "no such bucket" (S3 answers a list of a bucket
/// that is not there with 404 and `NoSuchBucket`).
pub fn explain_store_error(error: &str) -> String {
    if error.contains("NoSuchBucket") || error.contains("404 Not Found") {
        "it does not exist (create it, or point FLEET_STORE at a bucket that does)".to_string()
    } else {
        error.to_string()
    }
}

/// Docker's address as bollard's local defaults pick it.
pub fn docker_address() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .map(|h| redact_url(&h))
        .unwrap_or_else(|| "unix:///var/run/docker.sock".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_leave_a_url() {
        assert_eq!(
            redact_url("amqp://guest:guest@rabbitmq:5672/%2f"),
            "amqp://rabbitmq:5672/%2f"
        );
        assert_eq!(
            redact_url("redis://:s3cret@redis:6379/0"),
            "redis://redis:6379/0"
        );
        assert_eq!(redact_url("redis://u@h"), "redis://h");
        assert_eq!(
            redact_url("amqp://127.0.0.1:5673/%2f"),
            "amqp://127.0.0.1:5673/%2f"
        );
        // An @ after the authority is not a credential.
        assert_eq!(redact_url("http://h/a@b"), "http://h/a@b");
        assert_eq!(redact_url("s3://fleet"), "s3://fleet");
        assert_eq!(redact_url("no scheme"), "no scheme");
        // A password holding an @.
        assert_eq!(redact_url("amqp://u:p@ss@h:1/v"), "amqp://h:1/v");
    }

    #[test]
    fn errors_are_scrubbed_of_the_urls_secrets() {
        let url = "amqp://fleet:hunter22@mq:5672/%2f";
        let e = format!("failed to connect to {url}; auth hunter22 refused for fleet:hunter22");
        let s = scrub(&e, url);
        assert!(!s.contains("hunter22"), "{s}");
        assert!(s.contains("amqp://mq:5672/%2f"), "{s}");
        assert_eq!(
            scrub("connection refused", "redis://h"),
            "connection refused"
        );
    }

    #[test]
    fn pauses_double_up_to_a_cap_and_attempts_are_bounded() {
        assert_eq!(pause_after(1), Duration::from_millis(250));
        assert_eq!(pause_after(2), Duration::from_millis(500));
        assert_eq!(pause_after(3), Duration::from_secs(1));
        assert_eq!(pause_after(10), MAX_PAUSE);
        assert_eq!(pause_after(u32::MAX), MAX_PAUSE);
        assert_eq!(attempt_budget(Duration::ZERO), MIN_ATTEMPT);
        assert_eq!(
            attempt_budget(Duration::from_secs(2)),
            Duration::from_secs(2)
        );
        assert_eq!(attempt_budget(Duration::from_secs(300)), MAX_ATTEMPT);
    }

    #[test]
    fn a_urls_host_and_port() {
        let hp = |u| host_port(u, 6379);
        assert_eq!(
            hp("redis://127.0.0.1:6380").as_deref(),
            Some("127.0.0.1:6380")
        );
        assert_eq!(hp("redis://:pw@redis/0").as_deref(), Some("redis:6379"));
        assert_eq!(hp("rediss://u:p@h:1?x=y").as_deref(), Some("h:1"));
        assert_eq!(hp("redis://[::1]:7000/").as_deref(), Some("[::1]:7000"));
        assert_eq!(hp("redis://[::1]").as_deref(), Some("[::1]:6379"));
        assert_eq!(hp("redis+unix:///run/redis.sock"), None);
        assert_eq!(hp("no scheme"), None);
    }

    #[test]
    fn a_missing_bucket_is_named() {
        let e = explain_store_error("list: 404 Not Found <Code>NoSuchBucket</Code>");
        assert!(e.starts_with("it does not exist"), "{e}");
        assert_eq!(explain_store_error("timeout"), "timeout");
        assert_eq!(one_line("a\n  <b>\tc ", 100), "a <b> c");
        assert_eq!(one_line("abcdef", 3), "abc…");
        assert_eq!(store_name("s3://b/"), "bucket `b`");
        assert_eq!(store_name("file:///x"), "the object store");
    }

    #[tokio::test]
    async fn a_dependency_that_never_answers_fails_within_the_wait_naming_it() {
        let dep = Dependency::new("Redis", "redis://:pw123@127.0.0.1:1");
        let started = Instant::now();
        let mut calls = 0;
        let r: anyhow::Result<()> = dep
            .wait_for(Duration::from_millis(600), || {
                calls += 1;
                async { Err::<(), _>("connection refused by pw123") }
            })
            .await;
        let e = r.unwrap_err().to_string();
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(calls >= 2, "{calls}");
        assert!(
            e.starts_with("cannot reach Redis at redis://127.0.0.1:1: connection refused"),
            "{e}"
        );
        assert!(!e.contains("pw123"), "{e}");
    }

    #[tokio::test]
    async fn a_hanging_attempt_is_cut_off_and_a_late_success_counts() {
        let dep = Dependency::new("RabbitMQ", "amqp://127.0.0.1:1/%2f");
        let e = dep
            .wait_for(Duration::ZERO, || async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<(), String>(())
            })
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot reach RabbitMQ at amqp://127.0.0.1:1/%2f: no answer"),
            "{e}"
        );
        let mut n = 0;
        let v = dep
            .wait_for(Duration::from_secs(5), || {
                n += 1;
                let ok = n >= 3;
                async move {
                    if ok {
                        Ok(7)
                    } else {
                        Err("not yet")
                    }
                }
            })
            .await
            .unwrap();
        assert_eq!((v, n), (7, 3));
    }
}
