//! Seed 004's `feature_list.json`, as the harness reads it from disk (never from the agent's
//! word): parsing with bounds (`parse`), the review statistics and warnings shown before coding
//! may start (`review.rs`), the claims a coder session made and the edits it may not make
//! (`claims.rs`), and the settling of verifier verdicts into the list and per-feature state
//! (`settle.rs`).

mod claims;
pub mod events;
mod review;
mod settle;
mod steps;
#[cfg(test)]
mod tests;

pub use claims::{judge_edit, ListEdit, RefusedEdit};
pub use review::{review, ReviewBounds, ReviewStats};
pub use settle::{
    settle, Claim, FeatureState, FeatureStatus, HumanDecision, Metrics, Settled, Verdict,
    VerifierVote,
};
pub use steps::{check_answer, StepsError};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The list's file in the project.
pub const FEATURE_LIST: &str = "feature_list.json";

/// At most this many features, steps per feature, and characters per text.
pub const MAX_FEATURES: usize = 1_000;
pub const MAX_STEPS: usize = 100;
pub const MAX_TEXT: usize = 2_000;

/// One feature (seed 004's test case): what to build and the steps a verifier follows.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Feature {
    pub id: u64,
    pub category: String,
    pub description: String,
    pub steps: Vec<String>,
    pub passes: bool,
}

#[derive(Debug, Error, PartialEq)]
pub enum FeatureError {
    #[error("feature_list.json is not a feature list: {0}")]
    Malformed(String),
    #[error("feature_list.json holds {0} features (at most {MAX_FEATURES})")]
    TooMany(usize),
    #[error("feature {0}: {1}")]
    Bad(u64, String),
    #[error("feature id {0} appears twice")]
    DuplicateId(u64),
}

/// The list in `text`, checked: a JSON array of features with unique ids, bounded sizes.
pub fn parse(text: &str) -> Result<Vec<Feature>, FeatureError> {
    let list: Vec<Feature> =
        serde_json::from_str(text).map_err(|e| FeatureError::Malformed(e.to_string()))?;
    if list.len() > MAX_FEATURES {
        return Err(FeatureError::TooMany(list.len()));
    }
    let mut seen = std::collections::BTreeSet::new();
    for f in &list {
        if !seen.insert(f.id) {
            return Err(FeatureError::DuplicateId(f.id));
        }
        if f.steps.len() > MAX_STEPS {
            return Err(FeatureError::Bad(
                f.id,
                format!("{} steps (at most {MAX_STEPS})", f.steps.len()),
            ));
        }
        let long = [&f.category, &f.description]
            .into_iter()
            .chain(f.steps.iter())
            .any(|t| t.chars().count() > MAX_TEXT);
        if long {
            return Err(FeatureError::Bad(
                f.id,
                format!("a text longer than {MAX_TEXT} characters"),
            ));
        }
    }
    Ok(list)
}

/// The list as the harness writes it: pretty JSON with a final newline.
pub fn render(list: &[Feature]) -> String {
    let mut text = serde_json::to_string_pretty(list).expect("features serialize");
    text.push('\n');
    text
}
