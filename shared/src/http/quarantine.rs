//! The quarantine routes (`/v1/runs/:id/quarantine`): what waits for a person, and a decision.

use super::api_version;
use crate::engine::{Decision, RunStatus};
use crate::ids::RunId;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// One item waiting for a person, with what the graph says about it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct QuarantineItem {
    pub item: String,
    /// The graph's `details` for the item (e.g. its state and the verifier's reasons).
    #[serde(default)]
    pub details: Value,
}

/// `GET /v1/runs/:id/quarantine`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct QuarantineView {
    #[serde(default = "api_version")]
    pub v: u32,
    pub run_id: RunId,
    pub status: RunStatus,
    pub pending: Vec<QuarantineItem>,
    /// Every decision made so far, per item, in order.
    pub decisions: BTreeMap<String, Vec<Decision>>,
}

/// `POST /v1/runs/:id/quarantine/:item`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct QuarantineDecided {
    #[serde(default = "api_version")]
    pub v: u32,
    pub run_id: RunId,
    pub item: String,
    pub approved: bool,
    pub status: RunStatus,
}
