//! The morning report of a finished firing and its webhook delivery: what is written to object
//! storage (`schedules/<name>/<batch>/`: `report.json`, `junit.xml`, `report.html`,
//! `comparison.json` when there is an earlier finished firing, and `morning.json`, the exact
//! body every attempt sends), the signature of the body, the delivery id and the retry policy.
//!
//! Every attempt POSTs the same bytes with these headers:
//! - `X-Fleet-Signature: sha256=<hex>`: HMAC-SHA256 of the body with the schedule's secret;
//! - `X-Fleet-Delivery: <id>`: the same for every attempt of one delivery (receivers drop
//!   repeats by it);
//! - `X-Fleet-Timestamp: <unix seconds>`: when the batch was seen finished (also in the body,
//!   which the signature covers);
//! - `X-Fleet-Event: schedule.report`.

use super::state::Firing;
use crate::batch::{compare, json_report, BatchState, Comparison};
use crate::hashing::sha256_hex;
use crate::ids::BatchId;
use crate::time::rfc3339;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use std::time::Duration;

pub const SIGNATURE_HEADER: &str = "x-fleet-signature";
pub const DELIVERY_HEADER: &str = "x-fleet-delivery";
pub const TIMESTAMP_HEADER: &str = "x-fleet-timestamp";
pub const EVENT_HEADER: &str = "x-fleet-event";
pub const EVENT: &str = "schedule.report";
/// The version of the body's form.
pub const BODY_VERSION: u32 = 1;

/// HMAC-SHA256 of `body` under `secret`, as lowercase hex.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("hmac takes a key of any length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// The key a team's notices are signed with: derived from the coordinator's
/// `FLEET_WEBHOOK_SECRET` and the team's name, so one team's key neither signs nor verifies
/// another's notices, and the operator keeps one secret.
pub fn team_secret(master: &str, team: &str) -> String {
    sign(
        master.as_bytes(),
        format!("fleet-team-webhook:{team}").as_bytes(),
    )
}

/// Whether `header` (`sha256=<hex>`, or the bare hex) is the signature of `body` under
/// `secret`; compared in constant time.
pub fn verify(secret: &[u8], body: &[u8], header: &str) -> bool {
    let text = header.trim();
    let text = text.strip_prefix("sha256=").unwrap_or(text);
    let Ok(given) = hex::decode(text) else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("hmac takes a key of any length");
    mac.update(body);
    mac.verify_slice(&given).is_ok()
}

/// The delivery id of a firing's report: 32 hex digits from its batch id.
pub fn delivery_id(batch: &BatchId) -> String {
    sha256_hex(format!("fleet schedule delivery\n{batch}").as_bytes())[..32].to_string()
}

/// The folder of a firing's report files: `schedules/<name>/<batch>/`.
pub fn report_folder(name: &str, batch: &BatchId) -> String {
    format!("schedules/{name}/{batch}/")
}

/// How deliveries are retried: at most `max_attempts` POSTs; after failed attempt `n` the next
/// waits `base × 2^(n-1)`, at most `cap`; an attempt under way holds the delivery for `lease`
/// (then another coordinator may take it over).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub base: Duration,
    pub cap: Duration,
    pub lease: Duration,
}

impl Default for RetryPolicy {
    /// 8 attempts over about 21 minutes (10 s, 20 s, ... 640 s apart).
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 8,
            base: Duration::from_secs(10),
            cap: Duration::from_secs(3600),
            lease: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait after failed attempt `n` (1-based).
    pub fn delay_after(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }
}

/// A finished firing's report: the batch's JSON report, the comparison with the earlier
/// firing's batch, and the webhook body that carries both.
#[derive(Clone, Debug, PartialEq)]
pub struct MorningReport {
    pub report: Value,
    pub comparison: Option<Comparison>,
    pub body: Value,
}

/// The report of `firing` of schedule `name`, whose batch is `batch` (finished) and whose
/// earlier finished firing's batch is `previous`. A function of its inputs only, so any
/// coordinator writing it writes the same bytes.
pub fn morning_report(
    name: &str,
    firing: &Firing,
    batch: &BatchState,
    previous: Option<&BatchState>,
) -> MorningReport {
    let report = json_report(batch);
    let comparison = previous.map(|before| compare(before, batch));
    let folder = report_folder(name, &firing.batch_id);
    let finished_at = firing.finished_at.or(batch.finished_at);
    let body = json!({
        "v": BODY_VERSION,
        "event": EVENT,
        "delivery_id": delivery_id(&firing.batch_id),
        "timestamp": finished_at.map(|t| t.timestamp()),
        "schedule": name,
        "team": batch.team,
        "batch_id": firing.batch_id,
        "kind": firing.kind,
        "scheduled_for": rfc3339(&firing.scheduled_for),
        "finished_at": finished_at.as_ref().map(rfc3339),
        "counts": report["counts"],
        "pass_rate": report["pass_rate"],
        "previous_batch_id": previous.map(|p| &p.batch_id),
        "keys": {
            "report": format!("{folder}report.json"),
            "junit": format!("{folder}junit.xml"),
            "html": format!("{folder}report.html"),
            "comparison": previous.map(|_| format!("{folder}comparison.json")),
        },
        "comparison": comparison,
        "report": report,
    });
    MorningReport {
        report,
        comparison,
        body,
    }
}
