//! A submission's repository as a run starts from it: a commit, the key of the pack that holds
//! it and the seed's tree hash. From a path on the coordinator's disk (an admin's allowed
//! roots, or the open API) it is packed here; from an upload it was checked and hashed when the
//! team uploaded it (`crate::uploads`) and nothing is read again.

use crate::driver::{Coordinator, DriverError};
use crate::submit::SubmitError;
use shared::hashing::sha256_hex;
use shared::http::RepoUpload;
use std::path::Path;
use worker::git::{pack_commit, resolve_clean, GitError};

/// A repository at a ref: the commit, its pack's key and the seed's tree hash, and the pack's
/// bytes when they are not known to be stored yet.
pub(crate) struct Snapshot {
    pub commit: String,
    pub pack_key: String,
    pub tree_hash: String,
    pub pack: Option<Vec<u8>>,
}

/// The object-storage key of the pack named by the SHA-256 of its bytes.
pub(crate) fn pack_key(sha256: &str) -> String {
    format!("packs/{sha256}.pack")
}

/// The clean-tree preflight and the commit of `git_ref` every time; the pack and the tree
/// hash from the coordinator's memory when this repository's commit was packed before (a
/// batch's items share their repositories), else packed now.
pub(crate) async fn of_path(
    coord: &Coordinator,
    repo: &str,
    git_ref: &str,
) -> Result<Snapshot, DriverError> {
    let (path, refname) = (Path::new(repo).to_path_buf(), git_ref.to_string());
    let commit = blocking_git(move || resolve_clean(&path, &refname)).await?;
    if let Some((pack_key, tree_hash)) = coord.known_snapshot(repo, &commit) {
        return Ok(Snapshot {
            commit,
            pack_key,
            tree_hash,
            pack: None,
        });
    }
    let path = Path::new(repo).to_path_buf();
    let packed = blocking_git(move || pack_commit(&path, &commit)).await?;
    let tree_hash =
        shared::factory::tree_hash(packed.files.iter().map(|(p, b)| (p.as_str(), b.as_slice())));
    Ok(Snapshot {
        commit: packed.commit,
        pack_key: pack_key(&sha256_hex(&packed.pack)),
        tree_hash,
        pack: Some(packed.pack),
    })
}

/// The uploaded commit, when the submitter's team uploaded it in that pack.
pub(crate) async fn of_upload(
    coord: &Coordinator,
    team: Option<&str>,
    upload: &RepoUpload,
) -> Result<Snapshot, DriverError> {
    let not_uploaded = || {
        SubmitError::Input(format!(
            "commit {} was not uploaded in pack {} by this team: upload it first \
             (`fleet submit` does)",
            upload.commit, upload.pack
        ))
    };
    if !shared::http::is_commit_id(&upload.commit) || !shared::http::is_sha256_hex(&upload.pack) {
        return Err(not_uploaded().into());
    }
    let known = crate::uploads::find_pack(coord, team, &upload.commit, &upload.pack)
        .await?
        .ok_or_else(not_uploaded)?;
    Ok(Snapshot {
        commit: known.commit,
        pack_key: pack_key(&known.pack),
        tree_hash: known.tree_hash,
        pack: None,
    })
}

/// `f` (libgit2 work) on the blocking pool; its error a preflight error of the submission.
pub(crate) async fn blocking_git<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, GitError> + Send + 'static,
) -> Result<T, SubmitError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SubmitError::Preflight(e.to_string()))?
        .map_err(SubmitError::from)
}
