//! A schedule's cron expression, read by `croner`: the standard 5 fields (minute, hour, day of
//! month, month, day of week; POSIX rules: a day matches when the day of month *or* the day of
//! week does, both when neither is `*`), or 6 with seconds first (`*/2 * * * * *`), or a
//! nickname (`@daily`, `@hourly`, ...). Names of months and days are accepted. Every time is
//! UTC.
//!
//! What fires: the latest tick at or before now that is after the last one claimed ([`Due`]).
//! Ticks missed in between (every coordinator was down) are counted, never fired: a schedule
//! fires at most once on recovery.

use super::ScheduleError;
use chrono::{DateTime, SubsecRound, Utc};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// A cron expression is at most this long.
pub const MAX_CRON_CHARS: usize = 128;

/// Missed ticks are counted up to this many.
pub const MAX_MISSED_COUNTED: u32 = 1000;

/// A parsed cron expression.
#[derive(Clone, Debug)]
pub struct CronSchedule {
    expr: String,
    cron: Cron,
}

/// The tick to fire now: `at`, and how many ticks between the last claimed one and `at` were
/// missed (counted up to [`MAX_MISSED_COUNTED`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Due {
    pub at: DateTime<Utc>,
    pub missed: u32,
}

impl CronSchedule {
    /// Reads `expr`; refused with what is wrong (empty, too long, not 5 or 6 fields, a field
    /// out of range, a pattern that never fires after `now`).
    pub fn parse(expr: &str, now: DateTime<Utc>) -> Result<Self, ScheduleError> {
        let bad =
            |why: String| ScheduleError::Cron(expr.chars().take(MAX_CRON_CHARS).collect(), why);
        let text = expr.trim();
        if text.is_empty() {
            return Err(bad("it is empty".into()));
        }
        if text.len() > MAX_CRON_CHARS {
            return Err(bad(format!("it is over {MAX_CRON_CHARS} characters")));
        }
        if !text.chars().all(|c| c.is_ascii_graphic() || c == ' ') {
            return Err(bad(
                "only printable ASCII and single spaces may be used".into()
            ));
        }
        let fields = text.split_whitespace().count();
        if !text.starts_with('@') && !(5..=6).contains(&fields) {
            return Err(bad(format!(
                "it has {fields} fields; write 5 (minute hour day-of-month month day-of-week) \
                 or 6 (seconds first)"
            )));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(text)
            .map_err(|e| {
                bad(e
                    .to_string()
                    .to_lowercase()
                    .trim_end_matches('.')
                    .to_string())
            })?;
        let parsed = CronSchedule {
            expr: text.to_string(),
            cron,
        };
        if parsed.next_after(now).is_none() {
            return Err(bad("it never fires".into()));
        }
        Ok(parsed)
    }

    /// The expression as given (trimmed).
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&t.trunc_subsecs(0), false)
            .ok()
    }

    /// The last tick at or before `t`.
    pub fn latest_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_previous_occurrence(&t.trunc_subsecs(0), true)
            .ok()
    }

    /// The tick to fire at `now` when the last one claimed is `last`: the latest tick in
    /// (`last`, `now`], once, with the ticks before it in that interval counted as missed.
    pub fn due(&self, last: DateTime<Utc>, now: DateTime<Utc>) -> Option<Due> {
        let first = self.next_after(last)?;
        if first > now {
            return None;
        }
        let at = self.latest_at_or_before(now)?;
        if at <= last {
            return None;
        }
        let mut missed = 0;
        let mut t = first;
        while t < at && missed < MAX_MISSED_COUNTED {
            missed += 1;
            match self.next_after(t) {
                Some(next) => t = next,
                None => break,
            }
        }
        Some(Due { at, missed })
    }
}
