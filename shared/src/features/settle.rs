//! Settling one round of verification (seed 004): each claim's verifier votes become a verdict
//! (verified on a first pass; refuted only when every vote fails; anything else, a verifier
//! that could not decide or votes that disagree, is quarantined), the list on disk follows the
//! verdicts (a refuted or quarantined claim is `passes: false` again), people's decisions on
//! quarantined features are applied, and per-feature state and the seed's metrics are kept.

use super::Feature;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One verifier run on a claim: `passes` is `None` when it could not decide (it failed, its
/// answer broke the schema, or it said so).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct VerifierVote {
    pub passes: Option<bool>,
    #[serde(default)]
    pub reason: Option<String>,
    /// The verifier job's artifacts (name → stored path): its screenshots and verification
    /// log are the vote's evidence.
    #[serde(default)]
    pub artifacts: BTreeMap<String, String>,
}

impl VerifierVote {
    /// The stored paths of the evidence the harness kept: screenshots and the browser log.
    pub fn evidence(&self) -> impl Iterator<Item = &String> {
        self.artifacts
            .iter()
            .filter(|(k, _)| k.starts_with("screenshots/") || *k == "verification_log.json")
            .map(|(_, v)| v)
    }
}

/// A claim of this round with its votes, in order, and the coder session that made it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Claim {
    pub id: u64,
    pub votes: Vec<VerifierVote>,
    #[serde(default)]
    pub session: Option<u32>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Verified,
    Refuted,
    Quarantined,
}

impl Claim {
    pub fn verdict(&self) -> Verdict {
        match self.votes.first().map(|v| v.passes) {
            Some(Some(true)) => Verdict::Verified,
            Some(_) if self.votes.iter().all(|v| v.passes == Some(false)) => Verdict::Refuted,
            _ => Verdict::Quarantined,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FeatureStatus {
    #[default]
    Open,
    Verified,
    Refuted,
    Quarantined,
    /// Quarantined, then accepted by a person.
    Approved,
    /// Quarantined, then rejected by a person (open again, with their reason).
    Rejected,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct FeatureState {
    pub status: FeatureStatus,
    /// Claims the coder made of it.
    pub attempts: u32,
    /// Verifier runs on its claims.
    pub verifications: u32,
    /// Times the harness set it back to `passes: false`.
    pub reverts: u32,
    /// Times it went to quarantine.
    pub quarantines: u32,
    /// People's decisions on it seen so far: the first one after these decides its current
    /// quarantine, and any made with it are spent too (one decision per quarantine).
    pub decisions: u32,
    /// Quarantines of it a person decided.
    pub reviews: u32,
    /// The latest reason it is not accepted (a verifier's or a person's).
    #[serde(default)]
    pub reason: Option<String>,
    /// The coder session that made its latest claim.
    #[serde(default)]
    pub claimed_session: Option<u32>,
    /// The stored evidence of its latest verification (screenshots, browser logs).
    #[serde(default)]
    pub evidence: Vec<String>,
}

/// A person's decision on a quarantined feature.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HumanDecision {
    pub approved: bool,
    #[serde(default)]
    pub by: String,
    #[serde(default)]
    pub comment: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Metrics {
    pub claims: u32,
    pub verified: u32,
    pub reverts: u32,
    pub quarantined: u32,
    pub human_decisions: u32,
    pub revert_rate: f64,
    pub quarantine_rate: f64,
    pub human_intervention_rate: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Settled {
    pub list: Vec<Feature>,
    pub states: BTreeMap<u64, FeatureState>,
    /// Verdicts of this round, by feature.
    pub verdicts: BTreeMap<u64, Verdict>,
    /// What the next coder session hears: (feature, why it is open again).
    pub feedback: Vec<(u64, String)>,
    /// Features waiting for a person.
    pub pending: Vec<u64>,
    /// Features neither accepted nor waiting: the coder's work left.
    pub open: Vec<u64>,
    pub metrics: Metrics,
}

fn accepted(s: FeatureStatus) -> bool {
    matches!(s, FeatureStatus::Verified | FeatureStatus::Approved)
}

/// Settles `claims` (and `decisions` on quarantined features: per feature in the order made,
/// each taken once, by a quarantine that is still waiting) into the list and the state carried
/// from the last round.
pub fn settle(
    list: &[Feature],
    states: &BTreeMap<u64, FeatureState>,
    claims: &[Claim],
    decisions: &BTreeMap<u64, Vec<HumanDecision>>,
) -> Settled {
    let mut list = list.to_vec();
    let mut states = states.clone();
    let mut verdicts = BTreeMap::new();
    let mut feedback = Vec::new();
    for claim in claims {
        let Some(feature) = list.iter_mut().find(|f| f.id == claim.id) else {
            continue;
        };
        let state = states.entry(claim.id).or_default();
        state.attempts += 1;
        state.verifications += claim.votes.len() as u32;
        state.claimed_session = claim.session;
        state.evidence = claim
            .votes
            .iter()
            .flat_map(|v| v.evidence().cloned())
            .collect();
        let verdict = claim.verdict();
        verdicts.insert(claim.id, verdict);
        let reason = claim
            .votes
            .iter()
            .rev()
            .find_map(|v| v.reason.clone())
            .unwrap_or_else(|| "no reason given".into());
        match verdict {
            Verdict::Verified => {
                state.status = FeatureStatus::Verified;
                state.reason = None;
                feature.passes = true;
            }
            Verdict::Refuted => {
                state.status = FeatureStatus::Refuted;
                state.reverts += 1;
                state.reason = Some(reason.clone());
                feature.passes = false;
                feedback.push((claim.id, format!("refuted by the verifier: {reason}")));
            }
            Verdict::Quarantined => {
                state.status = FeatureStatus::Quarantined;
                state.quarantines += 1;
                state.reason = Some(reason);
                feature.passes = false;
            }
        }
    }
    for (id, made) in decisions {
        let Some(state) = states.get_mut(id) else {
            continue;
        };
        if state.status != FeatureStatus::Quarantined {
            continue;
        }
        let Some(decision) = made.get(state.decisions as usize) else {
            continue;
        };
        state.decisions = made.len() as u32;
        state.reviews += 1;
        let Some(feature) = list.iter_mut().find(|f| f.id == *id) else {
            continue;
        };
        if decision.approved {
            state.status = FeatureStatus::Approved;
            state.reason = None;
            feature.passes = true;
        } else {
            state.status = FeatureStatus::Rejected;
            let why = format!(
                "rejected from quarantine by {}: {}",
                decision.by, decision.comment
            );
            state.reason = Some(why.clone());
            feedback.push((*id, why));
        }
    }
    let pending = states
        .iter()
        .filter(|(_, s)| s.status == FeatureStatus::Quarantined)
        .map(|(id, _)| *id)
        .collect();
    let open = list
        .iter()
        .filter(|f| {
            let s = states.get(&f.id).map(|s| s.status).unwrap_or_default();
            !accepted(s) && s != FeatureStatus::Quarantined
        })
        .map(|f| f.id)
        .collect();
    let metrics = metrics(&states);
    Settled {
        list,
        states,
        verdicts,
        feedback,
        pending,
        open,
        metrics,
    }
}

fn metrics(states: &BTreeMap<u64, FeatureState>) -> Metrics {
    let claims: u32 = states.values().map(|s| s.attempts).sum();
    let verified = states
        .values()
        .filter(|s| s.status == FeatureStatus::Verified)
        .count() as u32;
    let reverts: u32 = states.values().map(|s| s.reverts).sum();
    let quarantined: u32 = states.values().map(|s| s.quarantines).sum();
    let human_decisions: u32 = states.values().map(|s| s.reviews).sum();
    let rate = |n: u32| {
        if claims == 0 {
            0.0
        } else {
            f64::from(n) / f64::from(claims)
        }
    };
    Metrics {
        claims,
        verified,
        reverts,
        quarantined,
        human_decisions,
        revert_rate: rate(reverts),
        quarantine_rate: rate(quarantined),
        human_intervention_rate: rate(human_decisions),
    }
}
