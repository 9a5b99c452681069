//! The run's event log in seed 004's shape (`timestamp`, `session_id`, `agent_type`,
//! `event_type`, `data`), one JSON line per event. Nothing in it comes from an agent's
//! answer: sessions start and end from the run's job records, a job's own events are the ones
//! its trusted code recorded (the tool executor, the harness ops), decisions and budget
//! events from the run state.

use crate::engine::RunState;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The most events one job's result may carry; the rest are counted, not kept.
pub const MAX_JOB_EVENTS: usize = 200;
/// The largest `data` of one event, as JSON text; larger data is replaced by its size.
pub const MAX_EVENT_DATA_BYTES: usize = 4096;

/// The seed's event types, and the ones the fleet adds (refused edits, reverts, people's
/// decisions, the budget).
#[derive(
    Clone,
    Copy,
    Debug,
    Serialize,
    Deserialize,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    SessionStart,
    SessionEnd,
    ToolUse,
    ToolError,
    ToolRetry,
    Claim,
    Verification,
    GatePass,
    GateFail,
    Quarantine,
    Error,
    EditRefused,
    Revert,
    Decision,
    BudgetWarning,
    BudgetExhausted,
    Resumed,
    ApprovalRequested,
    RunFinished,
}

/// An event a job's trusted code recorded while it ran.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JobEvent {
    pub at: DateTime<Utc>,
    pub event_type: EventType,
    pub data: Value,
}

impl JobEvent {
    /// An event with its data bounded (`MAX_EVENT_DATA_BYTES`).
    pub fn new(at: DateTime<Utc>, event_type: EventType, data: Value) -> JobEvent {
        let size = serde_json::to_string(&data).map(|s| s.len()).unwrap_or(0);
        let data = if size > MAX_EVENT_DATA_BYTES {
            json!({"truncated_bytes": size})
        } else {
            data
        };
        JobEvent {
            at,
            event_type,
            data,
        }
    }
}

/// Keeps at most `MAX_JOB_EVENTS`, then one `error` event counting the rest.
pub fn bounded(mut events: Vec<JobEvent>) -> Vec<JobEvent> {
    if events.len() > MAX_JOB_EVENTS {
        let dropped = events.len() - (MAX_JOB_EVENTS - 1);
        let at = events[MAX_JOB_EVENTS - 1].at;
        events.truncate(MAX_JOB_EVENTS - 1);
        events.push(JobEvent::new(
            at,
            EventType::Error,
            json!({"events_dropped": dropped}),
        ));
    }
    events
}

/// One line of the run's log.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunEvent {
    pub timestamp: DateTime<Utc>,
    /// The job (one agent session or harness step); empty for the run's own events.
    pub session_id: String,
    /// The node the job ran (the seed's agent type: `initializer`, `coder`, `verify`...).
    pub agent_type: String,
    pub event_type: EventType,
    pub data: Value,
}

/// The run's events, oldest first (ties keep the order they were recorded in).
/// `is_agent` tells the nodes whose jobs are agent sessions (a session starts and ends).
pub fn run_events(state: &RunState, is_agent: &dyn Fn(&str) -> bool) -> Vec<RunEvent> {
    let mut out = Vec::new();
    for o in &state.history {
        let session = o.job_id.to_string();
        let node = o.node.to_string();
        let line = |at, event_type, data| RunEvent {
            timestamp: at,
            session_id: session.clone(),
            agent_type: node.clone(),
            event_type,
            data,
        };
        let session = is_agent(&node);
        if session {
            out.push(line(
                o.started_at,
                EventType::SessionStart,
                json!({"visit": o.visit, "worker": o.worker}),
            ));
        }
        for e in &o.events {
            out.push(line(e.at, e.event_type, e.data.clone()));
        }
        if session {
            out.push(line(
                o.finished_at,
                EventType::SessionEnd,
                json!({"status": o.status, "usage": o.usage, "model": state.agent.model_identity()}),
            ));
        }
    }
    for (node, a) in &state.approvals {
        out.push(RunEvent {
            timestamp: a.requested_at,
            session_id: String::new(),
            agent_type: node.to_string(),
            event_type: EventType::ApprovalRequested,
            data: json!({"approval": node, "shown": a.shown}),
        });
        if let Some(d) = a.decision.as_ref() {
            out.push(RunEvent {
                timestamp: d.at,
                session_id: String::new(),
                agent_type: node.to_string(),
                event_type: EventType::Decision,
                data: json!({"approval": node, "decision": d}),
            });
        }
    }
    for (item, decisions) in &state.quarantine {
        for d in decisions {
            out.push(RunEvent {
                timestamp: d.at,
                session_id: String::new(),
                agent_type: "quarantine".into(),
                event_type: EventType::Decision,
                data: json!({"item": item, "decision": d}),
            });
        }
    }
    if let Some(b) = &state.budget {
        out.extend(b.events());
    }
    if let Some(at) = state.finished_at {
        out.push(RunEvent {
            timestamp: at,
            session_id: String::new(),
            agent_type: "run".into(),
            event_type: EventType::RunFinished,
            data: json!({"status": state.status,
                "reason": state.result.as_ref().and_then(|r| r.get("reason"))}),
        });
    }
    out.sort_by_key(|e| e.timestamp);
    out
}
