//! The reconnect pacing of the RabbitMQ adapter's loops: exponential backoff with jitter, and
//! one warning per long outage.

use shared::ports::PortError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// First pause before a reconnect; it doubles per failed attempt up to [`RECONNECT_CAP`].
const RECONNECT_BASE: Duration = Duration::from_millis(200);
/// Longest pause between two reconnect attempts: small, so a loop reconnects within about this
/// long of the broker answering again however long it was away (issue 43: 5 s at most).
const RECONNECT_CAP: Duration = Duration::from_secs(2);
/// An outage that lasts this long is worth one warning (reconnects before that are expected:
/// a broker restart, a network blip) and are logged at INFO.
const LONG_OUTAGE: Duration = Duration::from_secs(30);

/// The pause before reconnect attempt `attempt` (0 for the first): exponential from
/// [`RECONNECT_BASE`], capped at [`RECONNECT_CAP`], with "equal jitter": half of it fixed, the
/// other half scaled by `jitter` (in 0..=1), so workers that lost the broker together do not
/// all come back in the same instant.
fn reconnect_delay(attempt: u32, jitter: f64) -> Duration {
    let exp = RECONNECT_BASE
        .saturating_mul(1u32 << attempt.min(16))
        .min(RECONNECT_CAP);
    let half = exp / 2;
    half + half.mul_f64(jitter.clamp(0.0, 1.0))
}

/// A number in 0..1 that differs between processes and calls (no `rand` crate needed).
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The reconnect state of one connection loop: INFO per attempt (a reconnect is expected),
/// backoff with jitter, and one WARN per outage once it has lasted [`LONG_OUTAGE`].
#[derive(Default)]
pub(super) struct Outage {
    attempt: u32,
    since: Option<Instant>,
    warned: bool,
    /// The process's view of whether the broker is reachable, kept by this loop too.
    up: Option<Arc<AtomicBool>>,
}

impl Outage {
    /// An outage tracker that also keeps `up` (false while this loop has no connection).
    pub(super) fn watching(up: Arc<AtomicBool>) -> Self {
        Outage {
            up: Some(up),
            ..Outage::default()
        }
    }

    fn set_up(&self, value: bool) {
        if let Some(up) = &self.up {
            up.store(value, Ordering::Relaxed);
        }
    }

    /// A connection attempt failed or a live connection broke: logs and returns the pause.
    pub(super) fn failed(&mut self, what: &str, error: &PortError) -> Duration {
        self.set_up(false);
        let since = *self.since.get_or_insert_with(Instant::now);
        let delay = reconnect_delay(self.attempt, jitter());
        self.attempt = self.attempt.saturating_add(1);
        let down = since.elapsed();
        info!(
            error = %error,
            attempt = self.attempt,
            backoff_ms = delay.as_millis() as u64,
            down_s = down.as_secs(),
            "{what} lost its connection, reconnecting"
        );
        if down >= LONG_OUTAGE && !self.warned {
            self.warned = true;
            let secs = down.as_secs();
            warn!(
                error = %error,
                down_s = secs,
                "{what} has been without RabbitMQ for {secs}s, still reconnecting"
            );
        }
        delay
    }

    /// The connection is up again: the next outage starts from the first pause.
    pub(super) fn connected(&mut self, what: &str) {
        self.set_up(true);
        if let Some(since) = self.since.take() {
            info!(
                attempts = self.attempt,
                down_ms = since.elapsed().as_millis() as u64,
                "{what} reconnected"
            );
        }
        self.attempt = 0;
        self.warned = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_pauses_grow_exponentially_up_to_the_cap() {
        // Without jitter: half the exponential pause.
        assert_eq!(reconnect_delay(0, 0.0), Duration::from_millis(100));
        assert_eq!(reconnect_delay(1, 0.0), Duration::from_millis(200));
        assert_eq!(reconnect_delay(2, 0.0), Duration::from_millis(400));
        // With full jitter: the whole pause.
        assert_eq!(reconnect_delay(0, 1.0), Duration::from_millis(200));
        assert_eq!(reconnect_delay(3, 1.0), Duration::from_millis(1600));
        // Capped, however long the outage.
        for attempt in [6, 7, 20, 64, u32::MAX] {
            let d = reconnect_delay(attempt, 1.0);
            assert_eq!(d, RECONNECT_CAP, "attempt {attempt}");
            assert!(reconnect_delay(attempt, 0.0) >= RECONNECT_CAP / 2);
        }
        // Out-of-range jitter is clamped.
        assert_eq!(reconnect_delay(0, 7.0), Duration::from_millis(200));
        assert_eq!(reconnect_delay(0, -1.0), Duration::from_millis(100));
    }

    #[test]
    fn jitter_is_in_range_and_varies() {
        let xs: Vec<f64> = (0..64).map(|_| jitter()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)), "{xs:?}");
        assert!(xs.windows(2).any(|w| w[0] != w[1]), "{xs:?}");
    }

    #[test]
    fn an_outage_backs_off_and_a_reconnect_starts_over() {
        let mut o = Outage::default();
        let err = PortError::Connection("refused".into());
        let first = o.failed("test", &err);
        assert!(first <= Duration::from_millis(200));
        for _ in 0..10 {
            o.failed("test", &err);
        }
        let late = o.failed("test", &err);
        assert!(
            late >= RECONNECT_CAP / 2 && late <= RECONNECT_CAP,
            "{late:?}"
        );
        assert!(o.since.is_some());
        o.connected("test");
        assert_eq!(o.attempt, 0);
        assert!(o.since.is_none());
        assert!(o.failed("test", &err) <= Duration::from_millis(200));
    }

    #[test]
    fn a_watching_outage_keeps_the_up_flag() {
        let up = Arc::new(AtomicBool::new(true));
        let mut o = Outage::watching(up.clone());
        o.failed("test", &PortError::Connection("refused".into()));
        assert!(!up.load(Ordering::Relaxed));
        o.connected("test");
        assert!(up.load(Ordering::Relaxed));
    }
}
