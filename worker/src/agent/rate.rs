//! A worker's rate limit on LLM calls, per provider: at most `calls` calls in any window of
//! `per` (a sliding window), shared by every agent of the worker (the built-in loop and the
//! command agents' gateways). A call over the limit waits for the window to move; it is never
//! refused.

use std::collections::VecDeque;
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::Instant;

pub struct RateLimit {
    calls: u32,
    per: Duration,
    sent: Mutex<VecDeque<Instant>>,
}

impl std::fmt::Debug for RateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} calls per {:?}", self.calls, self.per)
    }
}

impl RateLimit {
    /// `N/S`: at most N calls per S seconds (`N` alone: per 60 s). N and S are at least 1.
    pub fn parse(spec: &str) -> Result<RateLimit, String> {
        let bad = || format!("bad llm rate `{spec}`: write N/S, at most N calls per S seconds");
        let (calls, seconds) = match spec.trim().split_once('/') {
            Some((n, s)) => (n.trim(), s.trim()),
            None => (spec.trim(), "60"),
        };
        let calls: u32 = calls.parse().map_err(|_| bad())?;
        let seconds: u64 = seconds.parse().map_err(|_| bad())?;
        if calls == 0 || seconds == 0 || seconds > 86_400 {
            return Err(bad());
        }
        Ok(RateLimit {
            calls,
            per: Duration::from_secs(seconds),
            sent: Mutex::new(VecDeque::new()),
        })
    }

    /// Waits until a call may go, and counts it.
    pub async fn acquire(&self) {
        loop {
            let wait = {
                let mut sent = self.sent.lock().await;
                let now = Instant::now();
                match wait_for(&mut sent, self.calls, self.per, now) {
                    None => {
                        sent.push_back(now);
                        return;
                    }
                    Some(wait) => wait,
                }
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// Forgets calls older than the window; how long until one more call fits (none: it fits now).
fn wait_for(
    sent: &mut VecDeque<Instant>,
    calls: u32,
    per: Duration,
    now: Instant,
) -> Option<Duration> {
    while sent.front().is_some_and(|t| now.duration_since(*t) >= per) {
        sent.pop_front();
    }
    if sent.len() < calls as usize {
        return None;
    }
    sent.front().map(|oldest| per - now.duration_since(*oldest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_parsed_and_nonsense_refused() {
        let r = RateLimit::parse("5/2").unwrap();
        assert_eq!((r.calls, r.per), (5, Duration::from_secs(2)));
        let r = RateLimit::parse(" 30 ").unwrap();
        assert_eq!((r.calls, r.per), (30, Duration::from_secs(60)));
        for bad in ["", "0/1", "1/0", "x/1", "1/x", "-1/5", "1/999999", "1/2/3"] {
            assert!(RateLimit::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_call_over_the_limit_waits_until_the_oldest_leaves_the_window() {
        let t0 = Instant::now();
        let per = Duration::from_secs(1);
        let mut sent = VecDeque::new();
        assert_eq!(wait_for(&mut sent, 2, per, t0), None);
        sent.push_back(t0);
        let t1 = t0 + Duration::from_millis(300);
        assert_eq!(wait_for(&mut sent, 2, per, t1), None);
        sent.push_back(t1);
        let t2 = t0 + Duration::from_millis(400);
        assert_eq!(
            wait_for(&mut sent, 2, per, t2),
            Some(Duration::from_millis(600))
        );
        // Once the first call is a window old it is forgotten and one more fits.
        let t3 = t0 + per;
        assert_eq!(wait_for(&mut sent, 2, per, t3), None);
        assert_eq!(sent.len(), 1);
    }
}
