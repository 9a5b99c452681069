//! Edits a person sends with an approval: taken only by an approval node that declares their
//! schema (`edits:`), only with an approval (a rejection changes nothing), and only when they
//! fit the schema. A refused decision leaves the run as it was, still waiting.

use crate::graph::{GraphBundle, NodeBody};
use crate::ids::NodeId;
use serde_json::Value;

/// The largest edits taken, as JSON text.
pub const MAX_EDITS_BYTES: usize = 1 << 20;

/// Why a decision's edits are refused, if they are.
pub fn edits_refusal(
    bundle: &GraphBundle,
    node: &NodeId,
    approved: bool,
    edits: Option<&Value>,
) -> Option<String> {
    let edits = edits?;
    let schema = match bundle.graph.node(node).map(|n| &n.body) {
        Some(NodeBody::Approval {
            edits: Some(schema),
            ..
        }) => schema,
        Some(NodeBody::Approval { edits: None, .. }) => {
            return Some(format!("approval node `{node}` takes no edits"))
        }
        _ => return Some(format!("`{node}` is not an approval node")),
    };
    if !approved {
        return Some("edits come with an approval; a rejection changes nothing".into());
    }
    let size = serde_json::to_string(edits).map(|s| s.len()).unwrap_or(0);
    if size > MAX_EDITS_BYTES {
        return Some(format!(
            "the edits are {size} bytes (at most {MAX_EDITS_BYTES})"
        ));
    }
    let schema: Value = match bundle.file(schema).map(serde_json::from_str) {
        Some(Ok(s)) => s,
        _ => return Some(format!("the edits schema `{schema}` cannot be read")),
    };
    crate::schema::validate(&schema, edits)
        .err()
        .map(|e| format!("the edits do not fit `{node}`'s schema: {e}"))
}
