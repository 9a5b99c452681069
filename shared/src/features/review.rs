//! The review a person sees before coding may start (seed 004's `cli.py review`): counts by
//! category, deep tests, average steps, the seed's warnings about the list as a whole, and
//! warnings per feature (too vague to verify, too large for one claim).

use super::Feature;
use serde::{Deserialize, Serialize};

/// The seed's bounds, overridable per run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ReviewBounds {
    pub min_features: usize,
    pub max_features: usize,
    /// The share of features with `deep_steps` steps or more.
    pub min_deep_ratio: f64,
    pub deep_steps: usize,
    pub min_avg_steps: f64,
    /// A feature with fewer steps is too vague for a skeptical verifier.
    pub vague_below_steps: usize,
    /// A feature with more steps is too large for one claim.
    pub large_above_steps: usize,
}

impl Default for ReviewBounds {
    fn default() -> Self {
        ReviewBounds {
            min_features: 40,
            max_features: 150,
            min_deep_ratio: 0.30,
            deep_steps: 8,
            min_avg_steps: 4.0,
            vague_below_steps: 4,
            large_above_steps: 20,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ReviewStats {
    pub total: usize,
    pub functional: usize,
    pub edge_cases: usize,
    pub style: usize,
    pub deep: usize,
    pub avg_steps: f64,
    /// Features already marked passing (an initializer may not claim anything).
    pub already_passing: Vec<u64>,
    pub warnings: Vec<String>,
    /// Per feature: (id, why).
    pub feature_warnings: Vec<(u64, String)>,
}

pub fn review(list: &[Feature], bounds: &ReviewBounds) -> ReviewStats {
    let total = list.len();
    let category = |c: &str| list.iter().filter(|f| f.category == c).count();
    let edge_cases = list
        .iter()
        .filter(|f| {
            f.category.to_lowercase().contains("edge")
                || f.description.to_lowercase().contains("error")
        })
        .count();
    let deep = list
        .iter()
        .filter(|f| f.steps.len() >= bounds.deep_steps)
        .count();
    let steps: usize = list.iter().map(|f| f.steps.len()).sum();
    let avg_steps = if total == 0 {
        0.0
    } else {
        steps as f64 / total as f64
    };
    let mut warnings = Vec::new();
    if total < bounds.min_features {
        warnings.push(format!(
            "below the minimum feature count ({}): {total}",
            bounds.min_features
        ));
    }
    if total > bounds.max_features {
        warnings.push(format!(
            "above the maximum feature count ({}): {total}",
            bounds.max_features
        ));
    }
    let deep_ratio = if total == 0 {
        0.0
    } else {
        deep as f64 / total as f64
    };
    if deep_ratio < bounds.min_deep_ratio {
        warnings.push(format!(
            "deep features ({}+ steps) below {:.0}%: {:.0}%",
            bounds.deep_steps,
            bounds.min_deep_ratio * 100.0,
            deep_ratio * 100.0
        ));
    }
    if avg_steps < bounds.min_avg_steps {
        warnings.push(format!(
            "average steps per feature below {:.1}: {avg_steps:.1}",
            bounds.min_avg_steps
        ));
    }
    let mut feature_warnings = Vec::new();
    for f in list {
        if f.steps.len() < bounds.vague_below_steps {
            feature_warnings.push((
                f.id,
                format!(
                    "too vague: {} steps (fewer than {})",
                    f.steps.len(),
                    bounds.vague_below_steps
                ),
            ));
        }
        if f.steps.len() > bounds.large_above_steps {
            feature_warnings.push((
                f.id,
                format!(
                    "too large for one claim: {} steps (more than {})",
                    f.steps.len(),
                    bounds.large_above_steps
                ),
            ));
        }
    }
    let already_passing: Vec<u64> = list.iter().filter(|f| f.passes).map(|f| f.id).collect();
    if !already_passing.is_empty() {
        warnings.push(format!(
            "{} features are already marked passing: nothing is verified before coding",
            already_passing.len()
        ));
    }
    ReviewStats {
        total,
        functional: category("functional"),
        edge_cases,
        style: category("style"),
        deep,
        avg_steps,
        already_passing,
        warnings,
        feature_warnings,
    }
}
