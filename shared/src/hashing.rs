//! Content hashes: sha256 hex of bytes and of canonical JSON (sorted keys, no whitespace).

use serde::Serialize;
use sha2::{Digest, Sha256};

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Canonical JSON bytes: object keys sorted, no whitespace, UTF-8.
///
/// `serde_json::Value` keeps objects in a `BTreeMap` (sorted by key) because the
/// `preserve_order` feature is off in this workspace, and the compact writer emits no spaces,
/// which matches Python's `json.dumps(sort_keys=True, separators=(",", ":"))` for the ASCII and
/// UTF-8 inputs work orders carry.
pub fn canonical_json(value: &impl Serialize) -> Vec<u8> {
    let value = serde_json::to_value(value).expect("serializable value");
    serde_json::to_vec(&value).expect("json value serializes")
}

pub fn canonical_hash(value: &impl Serialize) -> String {
    sha256_hex(&canonical_json(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_and_drops_whitespace() {
        let v = json!({"b": 1, "a": {"d": [1, 2], "c": "x"}});
        assert_eq!(
            String::from_utf8(canonical_json(&v)).unwrap(),
            r#"{"a":{"c":"x","d":[1,2]},"b":1}"#
        );
    }

    #[test]
    fn sha256_of_empty_input_is_the_known_value() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
