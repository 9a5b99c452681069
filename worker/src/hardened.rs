//! Seed 004's harness steps (the hardened coder): the feature list is read from the worktree
//! and judged by `shared::features`, never taken from an agent's word; what the harness
//! decides is written back to disk (and committed by the job), so the next session, verifier
//! and person see the list as the run state holds it. The quality gates run in the container.

use crate::harness::{read_params, run_logged, Artifacts, StepOutcome};
use crate::safe_fs;
use crate::sandbox::Session;
use crate::verify::bad_params;
use serde::Deserialize;
use serde_json::{json, Value};
use shared::features::{self, Claim, Feature, FeatureState, HumanDecision, FEATURE_LIST};
use shared::messages::JobStatus;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The list file is read up to this size.
const LIST_CAP: usize = 4 << 20;

fn failed(error: String) -> StepOutcome {
    StepOutcome {
        status: JobStatus::Failed,
        output: json!({}),
        error: Some(error),
    }
}

fn write_list(root: &Path, list: &[Feature]) -> Result<(), String> {
    safe_fs::write_beneath(root, FEATURE_LIST, features::render(list).as_bytes())
        .map_err(|e| format!("cannot write {FEATURE_LIST}: {e}"))
}

/// The list on disk as text; `None` when there is no such file.
fn read_list(root: &Path) -> Result<Option<String>, String> {
    match safe_fs::read_text_within(root, FEATURE_LIST, LIST_CAP) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(format!("cannot read {FEATURE_LIST}: {e}")),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReviewParams {
    #[serde(default)]
    bounds: Option<features::ReviewBounds>,
    /// The list a person sent with their approval of an earlier review: checked as strictly
    /// as the file, and written in its place; refused (the list on disk kept, the reason
    /// among the warnings) when it does not parse.
    #[serde(default)]
    edits: Option<Value>,
}

/// `review_features`: the initializer's list (or the person's edited one), its statistics and
/// warnings; features marked passing are set back to `passes: false` on disk (nothing is
/// verified before coding).
pub fn review_features(params: &Value, root: &Path) -> StepOutcome {
    let p: ReviewParams = match read_params(params) {
        Ok(p) => p,
        Err(o) => return o,
    };
    let text = match read_list(root) {
        Ok(Some(t)) => t,
        Ok(None) => return failed(format!("the initializer wrote no {FEATURE_LIST}")),
        Err(e) => return failed(e),
    };
    let mut list = match features::parse(&text) {
        Ok(l) => l,
        Err(e) => return failed(e.to_string()),
    };
    let mut refused_edit = None;
    let mut edited = false;
    if let Some(edits) = &p.edits {
        match features::parse(&edits.to_string()) {
            Ok(l) => {
                list = l;
                edited = true;
            }
            Err(e) => refused_edit = Some(format!("the edited list was refused: {e}")),
        }
    }
    let mut stats = features::review(&list, &p.bounds.unwrap_or_default());
    if let Some(why) = refused_edit {
        stats.warnings.insert(0, why);
    }
    for f in &mut list {
        f.passes = false;
    }
    if edited || !stats.already_passing.is_empty() {
        if let Err(e) = write_list(root, &list) {
            return failed(e);
        }
    }
    StepOutcome {
        status: JobStatus::Ok,
        output: json!({"stats": stats, "features": list}),
        error: None,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimsParams {
    /// The list as the run state holds it (the review's, then each settling's).
    accepted: Vec<Feature>,
}

/// `extract_claims`: the coder's claims from the list it left on disk; every other edit is
/// refused and reverted (the accepted list, with the clean claims, is written back).
pub fn extract_claims(params: &Value, root: &Path) -> StepOutcome {
    let p: ClaimsParams = match read_params(params) {
        Ok(p) => p,
        Err(o) => return o,
    };
    let on_disk = match read_list(root) {
        Ok(t) => t,
        Err(e) => return failed(e),
    };
    let edit = features::judge_edit(&p.accepted, on_disk.as_deref());
    if on_disk.as_deref() != Some(features::render(&edit.repaired).as_str()) {
        if let Err(e) = write_list(root, &edit.repaired) {
            return failed(e);
        }
    }
    let claimed: Vec<&Feature> = edit
        .repaired
        .iter()
        .filter(|f| edit.claims.contains(&f.id))
        .collect();
    StepOutcome {
        status: JobStatus::Ok,
        output: json!({
            "claims": edit.claims,
            "claimed": claimed,
            "refused": edit.refused,
            "features": edit.repaired,
        }),
        error: None,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Gate {
    name: String,
    command: String,
    #[serde(default = "yes")]
    blocking: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GatesParams {
    gates: Vec<Gate>,
    #[serde(default = "gate_timeout")]
    timeout_seconds: u64,
}

fn gate_timeout() -> u64 {
    300
}

/// `run_gates`: each gate's command in the container; the step fails when a blocking gate
/// does, and every gate's result (blocking or not) is in the output for the next prompt.
pub async fn run_gates(
    params: &Value,
    session: &dyn Session,
    art: &mut Artifacts<'_>,
) -> Result<StepOutcome, crate::runner::RunError> {
    let p: GatesParams = match read_params(params) {
        Ok(p) => p,
        Err(o) => return Ok(o),
    };
    if p.gates.len() > 32 {
        return Ok(bad_params("at most 32 gates"));
    }
    let timeout = Duration::from_secs(p.timeout_seconds.clamp(1, 3600));
    let mut results = Vec::new();
    let mut blocking_failed = Vec::new();
    for (i, gate) in p.gates.iter().enumerate() {
        let argv = vec!["sh".to_string(), "-c".to_string(), gate.command.clone()];
        let r = run_logged(session, &argv, timeout, &format!("gate_{i}"), art).await?;
        let passed = r.exit_code == 0;
        if !passed && gate.blocking {
            blocking_failed.push(gate.name.clone());
        }
        results.push(json!({
            "name": gate.name,
            "blocking": gate.blocking,
            "passed": passed,
            "exit_code": r.exit_code,
            "excerpt": crate::harness::excerpt(&r),
        }));
    }
    let ok = blocking_failed.is_empty();
    Ok(StepOutcome {
        status: if ok { JobStatus::Ok } else { JobStatus::Failed },
        output: json!({"gates": results, "blocking_failed": blocking_failed}),
        error: (!ok).then(|| format!("blocking gates failed: {}", blocking_failed.join(", "))),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleParams {
    /// The list after the claims (the claims step's `features`).
    features: Vec<Feature>,
    /// Per-feature state from the last settling (keys are feature ids).
    #[serde(default)]
    states: Option<BTreeMap<String, FeatureState>>,
    /// Each claim with its verifier votes: a list, or the verification join's arrivals (a map
    /// of branch to claim).
    #[serde(default)]
    claims: Value,
    /// People's decisions on quarantined features, per feature id, in the order made.
    #[serde(default)]
    decisions: Option<BTreeMap<String, Vec<HumanDecision>>>,
}

fn by_id<T>(map: BTreeMap<String, T>) -> Result<BTreeMap<u64, T>, String> {
    map.into_iter()
        .map(|(k, v)| {
            k.parse::<u64>()
                .map(|id| (id, v))
                .map_err(|_| format!("`{k}` is not a feature id"))
        })
        .collect()
}

/// `settle_claims`: verdicts from the votes, the list on disk as they leave it, the state and
/// metrics for the run, and what the next coder session hears.
pub fn settle_claims(params: &Value, root: &Path) -> StepOutcome {
    let p: SettleParams = match read_params(params) {
        Ok(p) => p,
        Err(o) => return o,
    };
    let (states, decisions) = match (
        by_id(p.states.unwrap_or_default()),
        by_id(p.decisions.unwrap_or_default()),
    ) {
        (Ok(s), Ok(d)) => (s, d),
        (Err(e), _) | (_, Err(e)) => return bad_params(e),
    };
    let claims: Vec<Value> = match p.claims {
        Value::Null => Vec::new(),
        Value::Array(list) => list,
        Value::Object(map) => map.into_iter().map(|(_, v)| v).collect(),
        other => return bad_params(format!("`claims` is neither a list nor a map: {other}")),
    };
    let claims: Vec<Claim> = match claims.into_iter().map(serde_json::from_value).collect() {
        Ok(c) => c,
        Err(e) => return bad_params(format!("a claim is malformed: {e}")),
    };
    let settled = features::settle(&p.features, &states, &claims, &decisions);
    if let Err(e) = write_list(root, &settled.list) {
        return failed(e);
    }
    let done = settled.open.is_empty() && settled.pending.is_empty();
    StepOutcome {
        status: JobStatus::Ok,
        output: json!({
            "features": settled.list,
            "states": settled.states,
            "verdicts": settled.verdicts,
            "feedback": settled.feedback,
            "pending": settled.pending,
            "open": settled.open,
            "metrics": settled.metrics,
            "done": done,
        }),
        error: None,
    }
}
