//! Times. Every time the fleet records (run states, jobs, outcomes, approvals, results, API
//! bodies) is a `DateTime<Utc>`, written as RFC 3339 text: what earlier versions stored
//! (`2026-11-22T10:00:00.123Z`) reads back as it is.
//!
//! "Now" comes from a [`Clock`] its holder was given: [`SystemClock`] in the services,
//! [`ManualClock`] in tests. The engine holds none: its caller puts the time in each event.

use chrono::{DateTime, SecondsFormat, SubsecRound, TimeDelta, Utc};
use serde::{Deserialize, Deserializer};
use std::sync::{Mutex, PoisonError};

/// Where "now" comes from.
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
}

/// The system's clock, to the millisecond (the precision times were always written with).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now().trunc_subsecs(3)
    }
}

/// A clock that says what it is told: fixed until set or advanced.
#[derive(Debug)]
pub struct ManualClock(Mutex<DateTime<Utc>>);

impl ManualClock {
    pub fn new(at: DateTime<Utc>) -> Self {
        Self(Mutex::new(at))
    }

    pub fn set(&self, at: DateTime<Utc>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = at;
    }

    pub fn advance(&self, by: TimeDelta) {
        let mut at = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *at += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The text of a time: RFC 3339 in UTC (`Z`), with as many fraction digits as it has (none,
/// 3, 6 or 9), the form serde writes too. Parses back to the same time.
pub fn rfc3339(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// Reads an optional time where earlier versions wrote a string that was empty when unset:
/// `""`, `null` (and, with `#[serde(default)]`, a missing field) are `None`.
pub fn empty_as_none<'de, D>(d: D) -> Result<Option<DateTime<Utc>>, D::Error>
where
    D: Deserializer<'de>,
{
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(text) if text.is_empty() => Ok(None),
        Some(text) => text
            .parse::<DateTime<Utc>>()
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use serde_json::json;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Times {
        at: DateTime<Utc>,
        #[serde(
            default,
            deserialize_with = "empty_as_none",
            skip_serializing_if = "Option::is_none"
        )]
        maybe: Option<DateTime<Utc>>,
    }

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    #[test]
    fn the_old_text_reads_and_what_is_written_reads_back() {
        let old: Times = serde_json::from_value(
            json!({"at": "2026-11-22T10:00:00.123Z", "maybe": "2026-11-22T10:00:01Z"}),
        )
        .unwrap();
        assert_eq!(old.at.timestamp_millis(), 1_795_341_600_123);
        assert_eq!(old.maybe, Some(at("2026-11-22T10:00:01.000Z")));
        let written = serde_json::to_value(&old).unwrap();
        assert_eq!(written["at"], "2026-11-22T10:00:00.123Z");
        assert_eq!(serde_json::from_value::<Times>(written).unwrap(), old);
        // An offset other than `Z` is the same instant.
        assert_eq!(at("2026-11-22T11:00:00.123+01:00"), old.at);
    }

    #[test]
    fn an_empty_null_or_missing_optional_time_is_none_and_junk_is_refused() {
        for maybe in [json!(""), json!(null)] {
            let t: Times =
                serde_json::from_value(json!({"at": "2026-11-22T10:00:00Z", "maybe": maybe}))
                    .unwrap();
            assert_eq!(t.maybe, None);
            assert_eq!(serde_json::to_value(&t).unwrap().get("maybe"), None);
        }
        let missing: Times = serde_json::from_value(json!({"at": "2026-11-22T10:00:00Z"})).unwrap();
        assert_eq!(missing.maybe, None);
        for junk in [
            json!({"at": "t0"}),
            json!({"at": "2026-11-22T10:00:00Z", "maybe": "t"}),
        ] {
            assert!(serde_json::from_value::<Times>(junk).is_err());
        }
    }

    #[test]
    fn the_system_clock_keeps_milliseconds_and_a_manual_clock_moves_when_told() {
        let now = SystemClock.now();
        assert_eq!(now.timestamp_subsec_nanos() % 1_000_000, 0);
        assert_eq!(rfc3339(&now).parse::<DateTime<Utc>>().unwrap(), now);
        let clock = ManualClock::new(at("2026-11-22T10:00:00Z"));
        assert_eq!(clock.now(), clock.now());
        clock.advance(TimeDelta::milliseconds(1500));
        assert_eq!(rfc3339(&clock.now()), "2026-11-22T10:00:01.500Z");
        clock.set(at("2027-01-01T00:00:00Z"));
        assert_eq!(rfc3339(&clock.now()), "2027-01-01T00:00:00Z");
    }
}
