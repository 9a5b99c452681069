//! `fleet submit`'s repository: the clean-tree preflight and the commit of the ref on the
//! client, then the coordinator asked whether this team uploaded that commit before; if not,
//! the commit and its history packed here and uploaded. The run then names the pack and the
//! commit, never a path: the coordinator need not see the client's disk.

use super::client::Client;
use crate::submit::SubmitRequest;
use anyhow::Context;
use shared::http::RepoUpload;
use std::path::{Path, PathBuf};

/// What the upload did, for the one line `fleet submit` prints on stderr.
pub enum Sent {
    /// The team uploaded this commit before: nothing was sent.
    Known { commit: String },
    /// A pack was sent; `stored` is false when the coordinator had these bytes already.
    Uploaded {
        commit: String,
        bytes: u64,
        stored: bool,
    },
}

impl std::fmt::Display for Sent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sent::Known { commit } => write!(
                f,
                "repository at {} already uploaded: nothing sent",
                &commit[..12.min(commit.len())]
            ),
            Sent::Uploaded {
                commit,
                bytes,
                stored,
            } => write!(
                f,
                "repository at {} uploaded: {bytes} bytes{}",
                &commit[..12.min(commit.len())],
                if *stored {
                    ""
                } else {
                    " (the coordinator had them)"
                }
            ),
        }
    }
}

/// Uploads `repo` at `git_ref` when the coordinator does not have it for this team, and
/// points `req` at the upload instead of the path.
pub async fn attach(
    client: &Client,
    req: &mut SubmitRequest,
    repo: &Path,
    git_ref: &str,
) -> anyhow::Result<Sent> {
    let (path, refname) = (repo.to_path_buf(), git_ref.to_string());
    let commit = blocking(move || worker::git::resolve_clean(&path, &refname))
        .await
        .map_err(|e| anyhow::anyhow!("preflight: {e}"))?;
    let source = Some(repo.display().to_string());
    let sent = match client.uploaded(&commit).await? {
        Some(known) => {
            req.upload = Some(RepoUpload {
                pack: known.pack,
                commit: commit.clone(),
                source,
            });
            Sent::Known { commit }
        }
        None => {
            let (path, tip) = (PathBuf::from(repo), commit.clone());
            let packed = blocking(move || worker::git::pack_commit(&path, &tip)).await?;
            let answer = client
                .upload(&commit, packed.pack)
                .await
                .context("uploading the repository")?;
            req.upload = Some(RepoUpload {
                pack: answer.pack,
                commit: commit.clone(),
                source,
            });
            Sent::Uploaded {
                commit,
                bytes: answer.bytes,
                stored: answer.stored,
            }
        }
    };
    req.repo.clear();
    Ok(sent)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, worker::git::GitError> + Send + 'static,
) -> anyhow::Result<T> {
    Ok(tokio::task::spawn_blocking(f).await??)
}
