//! Graph definitions: the YAML model, the typed model the engine runs, and the bundle that
//! carries a graph with its templates and schemas (content-addressed, so a job names the exact
//! graph it belongs to).

mod check;
mod model;

pub use check::{check, CheckError};
pub use model::*;

use crate::hashing::{canonical_hash, sha256_hex};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A graph plus every file it references (templates, schemas), keyed by path relative to the
/// graph file. This is what travels: it is stored once under its hash.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GraphBundle {
    pub source: String,
    pub graph: Graph,
    pub files: BTreeMap<String, String>,
}

impl GraphBundle {
    pub fn hash(&self) -> String {
        canonical_hash(self)
    }

    pub fn file(&self, path: &str) -> Option<&str> {
        self.files.get(path).map(String::as_str)
    }
}

/// Parses a graph file and gathers the files it references through `read`, then runs the static
/// checker. `read` is the only I/O and is supplied by the caller.
pub fn load_bundle(
    source: &str,
    yaml: &str,
    mut read: impl FnMut(&str) -> Result<String, String>,
) -> Result<GraphBundle, Vec<CheckError>> {
    let graph = parse(source, yaml)?;
    if let Some(why) = crate::limits::graph_exceeds(&graph) {
        return Err(vec![CheckError::new(source, None, "", why)]);
    }
    let mut files = BTreeMap::new();
    let mut errors = Vec::new();
    for (node, field, path) in graph.referenced_files() {
        if files.contains_key(&path) {
            continue;
        }
        match read(&path) {
            Ok(text) => {
                files.insert(path, text);
            }
            Err(e) => errors.push(CheckError::new(
                source,
                Some(&node),
                field,
                format!("cannot read `{path}`: {e}"),
            )),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let bundle = GraphBundle {
        source: source.to_string(),
        graph,
        files,
    };
    check(&bundle)?;
    Ok(bundle)
}

/// Languages the claim checker can parse.
pub fn claims_languages() -> &'static [&'static str] {
    &["python"]
}

/// Content key of any file text, used in error messages and caches.
pub fn text_hash(text: &str) -> String {
    sha256_hex(text.as_bytes())
}
