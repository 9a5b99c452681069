//! Typed ids, so a `RunId` is never mistaken for a `JobId`.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[derive(utoipa::ToSchema)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn new(value: impl Into<String>) -> Self {
                Self(value.into())
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

string_id!(
    /// A run of a graph; deterministic, derived from the hashes of its inputs.
    RunId
);
string_id!(
    /// A batch: one run per dataset item and trial; deterministic, see `batch::batch_id`.
    BatchId
);
string_id!(
    /// A node of a graph.
    NodeId
);
string_id!(
    /// One visit of one node in one run: `<run>.<node>.<visit>`; deterministic.
    JobId
);

impl JobId {
    pub fn for_visit(run: &RunId, node: &NodeId, visit: u32) -> Self {
        Self(format!("{run}.{node}.{visit}"))
    }
}

/// The delivery generation of a job. A result carrying an older attempt than the run state's is
/// from a superseded attempt and is rejected (fencing).
pub type Attempt = u32;
