//! Datasets: JSON Lines, one [`DatasetItem`] a line, read and checked by [`parse_dataset`]. A
//! line in SWE-bench's form (it has `instance_id`) is read by `factory::swe_item` and becomes a
//! factory item: its work order judged by the named tests, its repository `owner/name` in the
//! batch's mirror directory, checked out at `base_commit`.

use super::MAX_BATCH_ITEMS;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use thiserror::Error;

/// A line of a dataset is at most this many bytes (its newline not counted).
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// An item id is at most this many characters.
pub const MAX_ITEM_ID_CHARS: usize = 128;
/// Ids quoted in errors are cut to this many characters.
const QUOTED_ID_CHARS: usize = 64;

/// One item of a dataset: what one run (per trial) starts from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DatasetItem {
    /// Unique in its dataset: 1 to [`MAX_ITEM_ID_CHARS`] of `[A-Za-z0-9_.-]`.
    pub id: String,
    /// The repository the item's runs work on (non-empty).
    pub repo: String,
    /// The git ref to check out (the repository's default when absent).
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<String>,
    /// The run's input, as given (not both this and `work_order`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// A factory work order: the run's input is `{"work_order": ...}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_order: Option<Value>,
    /// A scripted agent's steps for this item: the value of `AgentConfig::Scripted { script }`
    /// (kept as JSON here; the submission reads it as the agent config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<Value>,
    /// `repo` is `owner/name`, the repository `<mirror dir>/owner__name` of the batch's mirror
    /// directory (SWE-bench lines; a batch with such items needs one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mirror: bool,
}

/// Why a dataset was refused; each names the 1-based line at fault.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum DatasetError {
    #[error("line {line}: {bytes} bytes, over the limit of {MAX_LINE_BYTES}")]
    LineTooLong { line: usize, bytes: usize },
    #[error("line {line}: not a dataset item: {message}")]
    Malformed { line: usize, message: String },
    #[error("line {line}: id {id:?} is not 1 to {MAX_ITEM_ID_CHARS} of `[A-Za-z0-9_.-]`")]
    BadId { line: usize, id: String },
    #[error("line {line}: id {id:?} is already the id of line {first}")]
    DuplicateId {
        line: usize,
        id: String,
        first: usize,
    },
    #[error("line {line}: `repo` is empty")]
    EmptyRepo { line: usize },
    #[error("line {line}: both `input` and `work_order` are given (one at most)")]
    InputAndWorkOrder { line: usize },
    #[error("line {line}: `repo` {repo:?} is not `owner/name`, as an item read from the mirror directory names it")]
    BadMirrorName { line: usize, repo: String },
    #[error("line {line}: SWE-bench instance {id:?}: {source}")]
    Swe {
        line: usize,
        id: String,
        source: crate::factory::SweError,
    },
    #[error("line {line}: more than {MAX_BATCH_ITEMS} items")]
    TooManyItems { line: usize },
    #[error("the dataset has no items")]
    Empty,
}

/// A batch with items read from a mirror directory (`mirror`, SWE-bench lines) needs that
/// directory, given as an absolute path.
pub fn check_mirror_dir(items: &[DatasetItem], dir: Option<&str>) -> Result<(), String> {
    match (items.iter().find(|i| i.mirror), dir) {
        (Some(item), None) => Err(format!(
            "item `{}` names its repository `{}` as `owner/name` in a mirror directory, and the \
             batch has none (`--mirror-dir DIR`: DIR/owner__name is the repository)",
            item.id, item.repo
        )),
        (_, Some(dir)) if !dir.starts_with('/') => Err(format!(
            "the mirror directory `{dir}` is not an absolute path"
        )),
        _ => Ok(()),
    }
}

/// Whether `id` may name a dataset item: 1 to [`MAX_ITEM_ID_CHARS`] ASCII letters, digits,
/// `_`, `.` or `-`.
pub fn valid_item_id(id: &str) -> bool {
    (1..=MAX_ITEM_ID_CHARS).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Reads a dataset: one JSON object a line (a `\r` before the newline is allowed), blank lines
/// skipped; a line with `instance_id` is a SWE-bench instance ([`crate::factory::swe_item`]).
/// Refused, naming the line: a line over [`MAX_LINE_BYTES`], a line that is not a
/// [`DatasetItem`] (unknown fields included) or not a valid SWE-bench instance (naming the
/// field), a bad or repeated id, an empty `repo`, both `input` and `work_order`, more than
/// [`MAX_BATCH_ITEMS`] items; and a dataset with none.
pub fn parse_dataset(jsonl: &str) -> Result<Vec<DatasetItem>, DatasetError> {
    let mut items = Vec::new();
    let mut first_line: BTreeMap<String, usize> = BTreeMap::new();
    for (i, raw) in jsonl.split('\n').enumerate() {
        let line = i + 1;
        let text = raw.strip_suffix('\r').unwrap_or(raw);
        if text.len() > MAX_LINE_BYTES {
            return Err(DatasetError::LineTooLong {
                line,
                bytes: text.len(),
            });
        }
        if text.trim().is_empty() {
            continue;
        }
        if items.len() == MAX_BATCH_ITEMS {
            return Err(DatasetError::TooManyItems { line });
        }
        let value: Value = serde_json::from_str(text).map_err(|e| DatasetError::Malformed {
            line,
            message: json_message(&e),
        })?;
        let item = if crate::factory::is_swe_line(&value) {
            swe_line(&value, line)?
        } else {
            // Read from the text again, so an error says its column.
            serde_json::from_str(text).map_err(|e| DatasetError::Malformed {
                line,
                message: json_message(&e),
            })?
        };
        check_item(&item, line)?;
        if let Some(&first) = first_line.get(&item.id) {
            return Err(DatasetError::DuplicateId {
                line,
                id: item.id,
                first,
            });
        }
        first_line.insert(item.id.clone(), line);
        items.push(item);
    }
    if items.is_empty() {
        return Err(DatasetError::Empty);
    }
    Ok(items)
}

fn check_item(item: &DatasetItem, line: usize) -> Result<(), DatasetError> {
    if !valid_item_id(&item.id) {
        return Err(DatasetError::BadId {
            line,
            id: item.id.chars().take(QUOTED_ID_CHARS).collect(),
        });
    }
    if item.repo.trim().is_empty() {
        return Err(DatasetError::EmptyRepo { line });
    }
    if item.input.is_some() && item.work_order.is_some() {
        return Err(DatasetError::InputAndWorkOrder { line });
    }
    if item.mirror && !crate::factory::valid_mirror_name(&item.repo) {
        return Err(DatasetError::BadMirrorName {
            line,
            repo: item.repo.chars().take(QUOTED_ID_CHARS).collect(),
        });
    }
    Ok(())
}

/// A SWE-bench line as a factory item (its id checked like any other).
fn swe_line(value: &Value, line: usize) -> Result<DatasetItem, DatasetError> {
    let quoted = || {
        value["instance_id"]
            .as_str()
            .unwrap_or_default()
            .chars()
            .take(QUOTED_ID_CHARS)
            .collect::<String>()
    };
    if let Some(id) = value["instance_id"]
        .as_str()
        .filter(|id| !valid_item_id(id))
    {
        return Err(DatasetError::BadId {
            line,
            id: id.chars().take(QUOTED_ID_CHARS).collect(),
        });
    }
    let item = crate::factory::swe_item(value).map_err(|source| DatasetError::Swe {
        line,
        id: quoted(),
        source,
    })?;
    Ok(DatasetItem {
        id: item.id,
        repo: item.repo,
        git_ref: Some(item.base_commit),
        input: None,
        work_order: Some(serde_json::to_value(&item.work_order).unwrap_or(Value::Null)),
        script: item.script,
        mirror: true,
    })
}

/// serde_json's message with its position as a column of the line (its "line 1" is ours).
fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&position) {
        Some(message) => format!("{message} (column {})", e.column()),
        None => text,
    }
}
