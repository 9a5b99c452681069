//! What a schedule is, as stored when it was added ([`ScheduleDef`]): its name, cron
//! expression, the batch it fires (graph, the dataset's text with its sha256, agent, options,
//! spec) and its webhook. Never changed afterwards: to change a schedule, remove it and add it
//! again. Everything a firing needs is checked here when the schedule is added, so a firing
//! cannot be refused later for its input.

use super::{CronSchedule, ScheduleError};
use crate::batch::{parse_dataset, BatchSpec, MAX_BATCH_RUNS};
use crate::graph::GraphBundle;
use crate::hashing::{canonical_hash, sha256_hex};
use crate::messages::{AgentConfig, ScriptStep};
use crate::time::rfc3339;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The version of [`ScheduleDef`]'s stored form.
pub const SCHEDULE_DEF_VERSION: u32 = 1;
/// A name is 1 to this many characters.
pub const MAX_NAME_CHARS: usize = 64;
/// A webhook URL is at most this long.
pub const MAX_URL_CHARS: usize = 2048;
/// A webhook secret (the HMAC key) is this many bytes at least and at most.
pub const MIN_SECRET_BYTES: usize = 16;
pub const MAX_SECRET_BYTES: usize = 1024;
/// Labels every fired batch carries (a schedule's own labels may not use them).
pub const SCHEDULE_LABEL: &str = "schedule";
pub const SCHEDULED_FOR_LABEL: &str = "scheduled_for";

/// A name: 1 to [`MAX_NAME_CHARS`] of `[A-Za-z0-9_.-]`, starting with a letter or digit (so a
/// name is never `.` or `..` in an object key, and never looks like an option).
/// The name a schedule is stored under: a team's schedules live in the team's own names
/// (`<team>~<name>`; `~` is in neither a team's nor a schedule's name), so two teams may use
/// the same name and neither learns of the other's. The open API's are stored as named.
pub fn stored_name(team: Option<&str>, name: &str) -> String {
    match team {
        Some(t) => format!("{t}~{name}"),
        None => name.to_string(),
    }
}

/// The name its team sees of a stored schedule.
pub fn shown_name(stored: &str) -> &str {
    stored.split_once('~').map_or(stored, |(_, name)| name)
}

pub fn check_name(name: &str) -> Result<(), ScheduleError> {
    let bad = |why: &str| {
        let shown: String = name.chars().take(MAX_NAME_CHARS + 1).collect();
        Err(ScheduleError::Name(shown, why.to_string()))
    };
    if name.is_empty() || name.len() > MAX_NAME_CHARS {
        return bad(&format!("a name is 1 to {MAX_NAME_CHARS} characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return bad("a name is made of `[A-Za-z0-9_.-]` only");
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return bad("a name starts with a letter or a digit");
    }
    Ok(())
}

/// Where a finished firing's report is sent, and the key of its signature.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Webhook {
    /// `http://` or `https://`, without credentials.
    pub url: String,
    /// The HMAC-SHA256 key; never shown, logged or written to object storage.
    pub secret: String,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("url", &shown_url(&self.url))
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// The scheme and authority of `url`, and `/…` when a path or query follows: what lists and
/// logs show of a webhook (a path may carry a token, as chat services' hooks do).
pub fn shown_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<invalid url>".into();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let tail = &rest[end..];
    let more = if tail.is_empty() || tail == "/" {
        ""
    } else {
        "/…"
    };
    format!("{}://{}{more}", scheme.to_ascii_lowercase(), &rest[..end])
}

impl Webhook {
    /// The URL: at most [`MAX_URL_CHARS`], `http` or `https`, a host, no credentials (a list
    /// would show them), no fragment, no space or control character. The secret:
    /// [`MIN_SECRET_BYTES`] to [`MAX_SECRET_BYTES`] bytes.
    pub fn check(&self) -> Result<(), ScheduleError> {
        let bad = |why: &str| Err(ScheduleError::Webhook(why.to_string()));
        let url = &self.url;
        if url.len() > MAX_URL_CHARS {
            return bad(&format!("the url is over {MAX_URL_CHARS} characters"));
        }
        if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return bad("the url has a space or a control character");
        }
        let Some((scheme, rest)) = url.split_once("://") else {
            return bad("the url is not `http://...` or `https://...`");
        };
        if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
            return bad(&format!(
                "the url's scheme is `{scheme}`; only http and https are sent to"
            ));
        }
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        if authority.is_empty() {
            return bad("the url has no host");
        }
        if authority.contains('@') {
            return bad("the url carries credentials (`user@`); the secret signs deliveries");
        }
        if url.contains('#') {
            return bad("the url has a fragment (`#...`)");
        }
        if self.secret.len() < MIN_SECRET_BYTES || self.secret.len() > MAX_SECRET_BYTES {
            return bad(&format!(
                "the secret is {} bytes; it is {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES}",
                self.secret.len()
            ));
        }
        Ok(())
    }
}

/// A schedule as added: what it fires and where its reports go.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ScheduleDef {
    /// [`SCHEDULE_DEF_VERSION`].
    pub v: u32,
    pub name: String,
    pub cron: String,
    pub graph: GraphBundle,
    /// The dataset's JSONL text as it was when the schedule was added.
    pub dataset: String,
    /// sha256 (hex) of `dataset`.
    pub dataset_sha256: String,
    #[serde(default)]
    pub agent: AgentConfig,
    #[serde(default)]
    pub options: Value,
    pub spec: BatchSpec,
    #[serde(default)]
    pub webhook: Option<Webhook>,
    pub created_at: DateTime<Utc>,
    /// The team that owns the schedule and the batches it starts (none: the open API's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// Where items read from a mirror (SWE-bench lines) find their repositories, as for
    /// `fleet batch submit --mirror-dir` (an absolute path on the coordinators).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_dir: Option<String>,
}

impl ScheduleDef {
    /// Tells this schedule from another added later under the same name: the first 16 hex
    /// digits of the sha256 of its name, creation time, cron, dataset hash and graph hash (not
    /// of its secret).
    pub fn uid(&self) -> String {
        let hash = canonical_hash(&json!({
            "name": self.name,
            "created_at": rfc3339(&self.created_at),
            "cron": self.cron,
            "dataset": self.dataset_sha256,
            "graph": self.graph.hash(),
        }));
        hash[..16].to_string()
    }

    /// The spec of a batch it fires for `scheduled_for`: its own, labelled with the schedule's
    /// name and the time.
    pub fn fired_spec(&self, scheduled_for: &DateTime<Utc>) -> BatchSpec {
        let mut spec = self.spec.clone();
        spec.labels.insert(SCHEDULE_LABEL.into(), self.name.clone());
        spec.labels
            .insert(SCHEDULED_FOR_LABEL.into(), rfc3339(scheduled_for));
        spec
    }

    /// Checks everything a firing will need, so none is refused later: the name, the cron
    /// expression (it must fire after `now`), the graph (the static checker), the dataset (its
    /// lines, its hash, items × trials, each item's script), the options, the spec as fired
    /// (with the schedule's labels), the webhook. The parsed cron expression on success.
    pub fn check(&self, now: DateTime<Utc>) -> Result<CronSchedule, ScheduleError> {
        check_name(shown_name(&self.name))?;
        if self.name != stored_name(self.team.as_deref(), shown_name(&self.name)) {
            return Err(ScheduleError::Name(
                self.name.clone(),
                "not stored under its team's names".into(),
            ));
        }
        let cron = CronSchedule::parse(&self.cron, now)?;
        crate::graph::check(&self.graph)
            .map_err(|es| ScheduleError::Graph(es.iter().map(|e| e.to_string()).collect()))?;
        if sha256_hex(self.dataset.as_bytes()) != self.dataset_sha256 {
            return Err(ScheduleError::Dataset(
                "the sha256 does not match the text".into(),
            ));
        }
        let items =
            parse_dataset(&self.dataset).map_err(|e| ScheduleError::Dataset(e.to_string()))?;
        if items.is_empty() {
            return Err(ScheduleError::Dataset("it has no item".into()));
        }
        crate::batch::dataset::check_mirror_dir(&items, self.mirror_dir.as_deref())
            .map_err(ScheduleError::Dataset)?;
        let runs = items.len().saturating_mul(self.spec.trials as usize);
        if runs > MAX_BATCH_RUNS {
            return Err(ScheduleError::Dataset(format!(
                "{} items × {} trials is {runs} runs; a batch makes at most {MAX_BATCH_RUNS}",
                items.len(),
                self.spec.trials
            )));
        }
        for item in &items {
            if let Some(script) = &item.script {
                serde_json::from_value::<BTreeMap<String, Vec<ScriptStep>>>(script.clone())
                    .map_err(|e| {
                        ScheduleError::Dataset(format!(
                            "item `{}`: the script is malformed: {e}",
                            item.id
                        ))
                    })?;
            }
        }
        if !self.options.is_null() && !self.options.is_object() {
            return Err(ScheduleError::Spec("`options` is an object".into()));
        }
        for reserved in [SCHEDULE_LABEL, SCHEDULED_FOR_LABEL] {
            if self.spec.labels.contains_key(reserved) {
                return Err(ScheduleError::Spec(format!(
                    "label `{reserved}` is set on every fired batch; choose another key"
                )));
            }
        }
        self.fired_spec(&now)
            .validate()
            .map_err(ScheduleError::Spec)?;
        if let Some(hook) = &self.webhook {
            hook.check()?;
        }
        Ok(cron)
    }
}
