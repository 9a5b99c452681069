//! Repositories that come with a submission: the client packs the commits of its ref and
//! uploads the pack (`POST /v1/uploads?commit=`); the server names it by the SHA-256 of its
//! bytes and records, for the caller's team, which commit it holds. A commit the team uploaded
//! before is found by its id (`GET /v1/uploads/commits/:commit`), so the same repository
//! submitted again uploads nothing.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A commit a team uploaded: the pack that holds it and the seed's tree hash of its files,
/// computed by the server from the pack.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Uploaded {
    #[serde(default = "super::api_version")]
    pub v: u32,
    pub commit: String,
    /// The SHA-256 of the pack's bytes (its content address).
    pub pack: String,
    pub tree_hash: String,
    /// The pack's size in bytes.
    pub bytes: u64,
    /// False when these bytes were in object storage already (stored by any submission).
    #[serde(default)]
    pub stored: bool,
}

/// A submission's repository when it was uploaded: the pack and the commit it starts from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RepoUpload {
    /// The SHA-256 of the uploaded pack, as `POST /v1/uploads` answered it.
    pub pack: String,
    /// The full id of the commit the run starts from.
    pub commit: String,
    /// Where the submitter packed it from (its own path), shown as the run's repository
    /// (the seed's `repo_path`); never opened by anyone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl RepoUpload {
    /// What the run shows as its repository: the submitter's path, or the pack.
    pub fn shown(&self) -> Result<String, String> {
        match &self.source {
            None => Ok(format!("upload:{}", self.pack)),
            Some(s) if s.is_empty() || s.len() > 1024 || s.chars().any(char::is_control) => {
                Err("upload.source: 1 to 1024 characters, none of them control characters".into())
            }
            Some(s) => Ok(s.clone()),
        }
    }
}

/// Whether `text` is a lowercase SHA-256 in hex (a pack's name).
pub fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `text` is a full git commit id in lowercase hex.
pub fn is_commit_id(text: &str) -> bool {
    text.len() == 40 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lowercase_hex_of_their_length() {
        assert!(is_sha256_hex(&"a1".repeat(32)));
        assert!(!is_sha256_hex(&"A1".repeat(32)));
        assert!(!is_sha256_hex(&"a1".repeat(31)));
        assert!(!is_sha256_hex("../../etc/passwd"));
        assert!(is_commit_id(&"0f".repeat(20)));
        assert!(!is_commit_id("HEAD"));
        assert!(!is_commit_id(&"0g".repeat(20)));
    }

    #[test]
    fn an_upload_names_only_its_pack_and_commit() {
        let bad = serde_json::json!({"pack": "p", "commit": "c", "path": "/etc"});
        assert!(serde_json::from_value::<RepoUpload>(bad).is_err());
        let mut u = RepoUpload {
            pack: "p".into(),
            commit: "c".into(),
            source: None,
        };
        assert_eq!(u.shown().unwrap(), "upload:p");
        u.source = Some("/home/ana/calc".into());
        assert_eq!(u.shown().unwrap(), "/home/ana/calc");
        for bad in ["", "a\nb", "bell\u{7}"] {
            u.source = Some(bad.into());
            assert!(u.shown().is_err(), "{bad:?}");
        }
        u.source = Some("x".repeat(1025));
        assert!(u.shown().is_err());
    }
}
