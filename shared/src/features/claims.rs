//! What a coder session did to the feature list, judged against the accepted list the run
//! state holds (never against the agent's account): a feature flipped from `passes: false` to
//! `true` with nothing else changed is a claim; every other edit (steps rewritten, a feature
//! deleted, added, renamed, recategorised, un-claimed, or a list that no longer parses) is
//! refused, and the list to write back is the accepted one with only the claims applied.

use super::{parse, Feature};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RefusedEdit {
    /// The feature edited; `None` for the list as a whole.
    pub id: Option<u64>,
    pub what: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ListEdit {
    /// Features claimed this session, in list order.
    pub claims: Vec<u64>,
    pub refused: Vec<RefusedEdit>,
    /// The accepted list with the claims applied: what the harness writes back.
    pub repaired: Vec<Feature>,
}

/// Judges the list on disk (`on_disk`, as text; `None` when the file is gone) against the
/// `accepted` list.
pub fn judge_edit(accepted: &[Feature], on_disk: Option<&str>) -> ListEdit {
    let refuse_all = |what: String| ListEdit {
        claims: Vec::new(),
        refused: vec![RefusedEdit { id: None, what }],
        repaired: accepted.to_vec(),
    };
    let Some(text) = on_disk else {
        return refuse_all("feature_list.json was deleted".into());
    };
    let edited = match parse(text) {
        Ok(list) => list,
        Err(e) => return refuse_all(e.to_string()),
    };
    let mut claims = Vec::new();
    let mut refused = Vec::new();
    let mut repaired = accepted.to_vec();
    for (slot, before) in repaired.iter_mut().zip(accepted) {
        let Some(after) = edited.iter().find(|f| f.id == before.id) else {
            refused.push(RefusedEdit {
                id: Some(before.id),
                what: "deleted".into(),
            });
            continue;
        };
        let mut changed = Vec::new();
        if after.category != before.category {
            changed.push("category");
        }
        if after.description != before.description {
            changed.push("description");
        }
        if after.steps != before.steps {
            changed.push("steps");
        }
        if !changed.is_empty() {
            refused.push(RefusedEdit {
                id: Some(before.id),
                what: format!("{} rewritten", changed.join(", ")),
            });
            continue;
        }
        match (before.passes, after.passes) {
            (false, true) => {
                claims.push(before.id);
                slot.passes = true;
            }
            (true, false) => refused.push(RefusedEdit {
                id: Some(before.id),
                what: "un-claimed (only the harness reverts a feature)".into(),
            }),
            _ => {}
        }
    }
    for added in edited
        .iter()
        .filter(|f| !accepted.iter().any(|a| a.id == f.id))
    {
        refused.push(RefusedEdit {
            id: Some(added.id),
            what: "added".into(),
        });
    }
    let order_kept = edited
        .iter()
        .map(|f| f.id)
        .filter(|id| accepted.iter().any(|a| a.id == *id))
        .eq(accepted
            .iter()
            .map(|f| f.id)
            .filter(|id| edited.iter().any(|e| e.id == *id)));
    if !order_kept {
        refused.push(RefusedEdit {
            id: None,
            what: "features reordered".into(),
        });
    }
    ListEdit {
        claims,
        refused,
        repaired,
    }
}
