//! The seed's events of the harness's own steps, from what each step found on disk: a claim
//! per feature flipped, a refused edit per edit reverted, a pass or failure per gate, and per
//! settled claim its verification, with a revert or a quarantine where the verdict says so.

use crate::tracking::{EventType, JobEvent};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// `extract_claims`'s output: its claims and refused edits.
pub fn claims_events(output: &Value, at: DateTime<Utc>) -> Vec<JobEvent> {
    let mut out: Vec<JobEvent> = list(output, "claims")
        .iter()
        .map(|id| JobEvent::new(at, EventType::Claim, json!({"feature": id})))
        .collect();
    out.extend(list(output, "refused").iter().map(|r| {
        JobEvent::new(
            at,
            EventType::EditRefused,
            json!({"feature": r["id"], "what": r["what"], "reverted": true}),
        )
    }));
    out
}

/// `run_gates`'s output: one event per gate.
pub fn gates_events(output: &Value, at: DateTime<Utc>) -> Vec<JobEvent> {
    list(output, "gates")
        .iter()
        .map(|g| {
            let kind = if g["passed"].as_bool() == Some(true) {
                EventType::GatePass
            } else {
                EventType::GateFail
            };
            let data =
                json!({"gate": g["name"], "blocking": g["blocking"], "exit_code": g["exit_code"]});
            JobEvent::new(at, kind, data)
        })
        .collect()
}

/// `settle_claims`'s output: a verification per verdict, then what the verdict did.
pub fn settle_events(output: &Value, at: DateTime<Utc>) -> Vec<JobEvent> {
    let mut out = Vec::new();
    let Some(verdicts) = output.get("verdicts").and_then(Value::as_object) else {
        return out;
    };
    let reason = |id: &str| {
        list(output, "feedback")
            .iter()
            .find(|f| f[0].as_u64().map(|n| n.to_string()).as_deref() == Some(id))
            .map_or(Value::Null, |f| f[1].clone())
    };
    for (id, verdict) in verdicts {
        let feature: Value = id.parse::<u64>().map_or(json!(id), Value::from);
        out.push(JobEvent::new(
            at,
            EventType::Verification,
            json!({"feature": feature, "result": verdict}),
        ));
        match verdict.as_str() {
            Some("refuted") => out.push(JobEvent::new(
                at,
                EventType::Revert,
                json!({"feature": feature, "passes": false, "reason": reason(id)}),
            )),
            Some("quarantined") => out.push(JobEvent::new(
                at,
                EventType::Quarantine,
                json!({"feature": feature, "reason": reason(id)}),
            )),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn kinds(events: &[JobEvent]) -> Vec<EventType> {
        events.iter().map(|e| e.event_type).collect()
    }

    #[test]
    fn each_step_names_what_it_found() {
        let at = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        let claims = json!({"claims": [1, 2], "refused": [{"id": 3, "what": "steps rewritten"}]});
        assert_eq!(
            kinds(&claims_events(&claims, at)),
            [EventType::Claim, EventType::Claim, EventType::EditRefused]
        );
        let gates = json!({"gates": [{"name": "build", "passed": true}, {"name": "lint", "passed": false}]});
        assert_eq!(
            kinds(&gates_events(&gates, at)),
            [EventType::GatePass, EventType::GateFail]
        );
        let settled = json!({"verdicts": {"1": "verified", "2": "refuted", "5": "quarantined"},
            "feedback": [[2, "the button does nothing"], [5, "could not decide"]]});
        let events = settle_events(&settled, at);
        assert_eq!(
            kinds(&events),
            [
                EventType::Verification,
                EventType::Verification,
                EventType::Revert,
                EventType::Verification,
                EventType::Quarantine
            ]
        );
        assert_eq!(events[2].data["reason"], "the button does nothing");
        assert!(settle_events(&json!({}), at).is_empty());
    }
}
