//! One connection to Redis shared by all of a process's tasks, replaced the moment it is seen
//! dead, and the process's view of whether Redis is reachable.
//!
//! Not redis-rs's `ConnectionManager`: in redis 0.27 its reconnect waits 1 s, then 60 s (its
//! backoff's `factor` of 100 multiplies the 1 s `min_delay` of the backon crate, capped at
//! 60 s, plus up to as much again of jitter; redis-rs issue #1556), and every call waits
//! behind that one reconnect future, so a Redis restart of 3 s stalled every caller for about
//! 105 s. A call that times out there does not count as a dead connection either, so a
//! connection to a peer that went away silently is kept. Here:
//!
//! - a call on a connection that dropped, failed beyond repair or did not answer within the
//!   response timeout forgets that connection (only that one: a newer one is kept);
//! - the next call connects again at once (one connect at a time, bounded by the connect
//!   timeout); callers that waited on a connect that failed fail at once, and for a short
//!   pause after a failed connect every call fails at once instead of trying again: while Redis
//!   is away, callers get an error in milliseconds, and the first call after it is back
//!   reconnects;
//! - nothing waits behind the timeouts of calls already in flight on the dead connection.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How long a connect may take before it counts as failed.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a call may wait for its answer before its connection is taken for dead.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed connect, calls fail at once for this long instead of connecting again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A shared, self-healing connection; cheap to clone (all clones share one connection).
#[derive(Clone)]
pub struct RedisLink {
    inner: Arc<Inner>,
    db: i64,
}

struct Inner {
    client: redis::Client,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    response_timeout: Duration,
    current: Mutex<Current>,
    /// One connect at a time.
    connecting: tokio::sync::Mutex<()>,
    up: AtomicBool,
}

#[derive(Default)]
struct Current {
    conn: Option<(u64, MultiplexedConnection)>,
    generation: u64,
    failed_at: Option<Instant>,
}

fn io_error(kind: std::io::ErrorKind, text: String) -> RedisError {
    RedisError::from(std::io::Error::new(kind, text))
}

impl RedisLink {
    /// A link to `url` with the default timeouts; the first connection is made here, so an
    /// unreachable server is an error now.
    pub async fn connect(url: &str) -> RedisResult<Self> {
        Self::connect_with(url, CONNECT_TIMEOUT, RESPONSE_TIMEOUT).await
    }

    /// A link with the given connect and response timeouts.
    pub async fn connect_with(
        url: &str,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<Self> {
        let client = redis::Client::open(url)?;
        let db = client.get_connection_info().redis.db;
        let link = RedisLink {
            inner: Arc::new(Inner {
                client,
                config: AsyncConnectionConfig::new().set_connection_timeout(connect_timeout),
                connect_timeout,
                response_timeout,
                current: Mutex::new(Current::default()),
                connecting: tokio::sync::Mutex::new(()),
                up: AtomicBool::new(false),
            }),
            db,
        };
        link.connection().await?;
        Ok(link)
    }

    /// Whether Redis answered the last call or connect (false from a dropped connection, a
    /// failed connect or a call without an answer until the next success).
    pub fn is_up(&self) -> bool {
        self.inner.up.load(Ordering::Relaxed)
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.inner.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live connection, or a new one.
    async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let asked = Instant::now();
        if let Some(c) = self.current().conn.clone() {
            return Ok(c);
        }
        let _one = self.inner.connecting.lock().await;
        {
            let cur = self.current();
            if let Some(c) = cur.conn.clone() {
                return Ok(c);
            }
            if let Some(failed) = cur.failed_at {
                if failed >= asked || failed.elapsed() < RETRY_PAUSE {
                    return Err(io_error(
                        std::io::ErrorKind::ConnectionRefused,
                        format!(
                            "redis is unreachable (a connect failed {failed:.0?} ago)",
                            failed = failed.elapsed()
                        ),
                    ));
                }
            }
        }
        let timeout = self.inner.connect_timeout;
        let made = tokio::time::timeout(
            timeout,
            self.inner
                .client
                .get_multiplexed_async_connection_with_config(&self.inner.config),
        )
        .await
        .unwrap_or_else(|_| {
            Err(io_error(
                std::io::ErrorKind::TimedOut,
                format!("redis did not accept a connection within {timeout:?}"),
            ))
        });
        let mut cur = self.current();
        match made {
            Ok(conn) => {
                cur.generation += 1;
                cur.conn = Some((cur.generation, conn.clone()));
                if cur.failed_at.take().is_some() || cur.generation > 1 {
                    info!(generation = cur.generation, "redis connection made again");
                }
                self.inner.up.store(true, Ordering::Relaxed);
                Ok((cur.generation, conn))
            }
            Err(e) => {
                if cur.failed_at.is_none() {
                    warn!(error = %e, "cannot connect to redis");
                }
                cur.failed_at = Some(Instant::now());
                self.inner.up.store(false, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Forgets connection `generation` (if it is still the current one).
    fn forget(&self, generation: u64, why: &RedisError) {
        let mut cur = self.current();
        if matches!(cur.conn, Some((g, _)) if g == generation) {
            warn!(generation, error = %why, "redis connection lost; the next call connects again");
            cur.conn = None;
            self.inner.up.store(false, Ordering::Relaxed);
        }
    }

    /// A call's answer, with its connection forgotten when the answer shows it dead.
    fn judge<T>(
        &self,
        generation: u64,
        answer: Result<RedisResult<T>, tokio::time::error::Elapsed>,
    ) -> RedisResult<T> {
        match answer {
            Ok(Ok(v)) => {
                self.inner.up.store(true, Ordering::Relaxed);
                Ok(v)
            }
            Ok(Err(e)) => {
                if e.is_unrecoverable_error() || e.is_connection_dropped() {
                    self.forget(generation, &e);
                }
                Err(e)
            }
            Err(_) => {
                let e = io_error(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "redis did not answer within {:?}",
                        self.inner.response_timeout
                    ),
                );
                self.forget(generation, &e);
                Err(e)
            }
        }
    }
}

impl ConnectionLike for RedisLink {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.connection().await?;
            let answer =
                tokio::time::timeout(self.inner.response_timeout, conn.send_packed_command(cmd))
                    .await;
            self.judge(generation, answer)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.connection().await?;
            let answer = tokio::time::timeout(
                self.inner.response_timeout,
                conn.send_packed_commands(cmd, offset, count),
            )
            .await;
            self.judge(generation, answer)
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}
