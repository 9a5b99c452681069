//! Object storage adapter over `object_store`: S3 (MinIO, moto) in the fleet, the local file
//! system in the embedded mode. Content-addressed JSON blobs, packs and artifacts, all under the
//! namespace prefix. Documented keys:
//!
//! - `blobs/<sha256>`: job specs and job results (JSON)
//! - `graphs/<sha256>.json`: graph bundles
//! - `packs/<sha256>.pack`: git packfiles
//! - `runs/<run_id>/...`: artifacts; `runs/<run_id>/run_summary.json`, `result.json`, `state.json`

use bytes::Bytes;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, PutPayload};
use serde::de::DeserializeOwned;
use serde::Serialize;
use shared::hashing::sha256_hex;
use std::sync::Arc;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum BlobError {
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("object `{key}` is not valid json: {source}")]
    Decode {
        key: String,
        source: serde_json::Error,
    },
    #[error("object `{key}` does not match its hash")]
    Corrupt { key: String },
    #[error("object store url `{0}` is not supported (use s3://bucket or file:///path)")]
    BadUrl(String),
}

impl BlobError {
    /// May pass on another try: the store unreachable, slow or refusing for now. A key that is
    /// not there (object storage is read-after-write consistent: whoever names a key wrote it
    /// first), an object that is not what its key says, and a bad store url are for good.
    pub fn is_transient(&self) -> bool {
        match self {
            BlobError::Store(
                object_store::Error::NotFound { .. } | object_store::Error::InvalidPath { .. },
            ) => false,
            BlobError::Store(_) => true,
            BlobError::Decode { .. } | BlobError::Corrupt { .. } | BlobError::BadUrl(_) => false,
        }
    }
}

#[derive(Clone)]
pub struct Blobs {
    store: Arc<dyn ObjectStore>,
}

impl Blobs {
    /// `s3://bucket` (endpoint and credentials from `AWS_*` env, e.g. `AWS_ENDPOINT_URL`) or
    /// `file:///absolute/path`. Everything lives under `namespace/`.
    pub fn open(url: &str, namespace: &str) -> Result<Self, BlobError> {
        let inner: Arc<dyn ObjectStore> = if let Some(bucket) = url.strip_prefix("s3://") {
            // Every request is bounded: a stalled object store is an error that is retried,
            // not a job or a commit that hangs.
            let client = object_store::ClientOptions::new()
                .with_connect_timeout(std::time::Duration::from_secs(5))
                .with_timeout(std::time::Duration::from_secs(120));
            let mut b = AmazonS3Builder::from_env()
                .with_bucket_name(bucket.trim_end_matches('/'))
                .with_client_options(client);
            if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
                b = b.with_endpoint(endpoint.clone());
                if endpoint.starts_with("http://") {
                    b = b.with_allow_http(true);
                }
            }
            Arc::new(b.build()?)
        } else if let Some(path) = url.strip_prefix("file://") {
            std::fs::create_dir_all(path).map_err(|e| {
                BlobError::Store(object_store::Error::Generic {
                    store: "local",
                    source: Box::new(e),
                })
            })?;
            Arc::new(LocalFileSystem::new_with_prefix(path)?)
        } else {
            return Err(BlobError::BadUrl(url.to_string()));
        };
        Ok(Self::from_store(inner, namespace))
    }

    pub fn from_store(store: Arc<dyn ObjectStore>, namespace: &str) -> Self {
        Self {
            store: Arc::new(PrefixStore::new(store, namespace)),
        }
    }

    pub async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<(), BlobError> {
        self.store
            .put(&ObjPath::from(key), PutPayload::from(Bytes::from(bytes)))
            .await?;
        Ok(())
    }

    pub async fn get(&self, key: &str) -> Result<Vec<u8>, BlobError> {
        let got = self.store.get(&ObjPath::from(key)).await?;
        Ok(got.bytes().await?.to_vec())
    }

    pub async fn exists(&self, key: &str) -> Result<bool, BlobError> {
        match self.store.head(&ObjPath::from(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), BlobError> {
        match self.store.delete(&ObjPath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn put_json(&self, key: &str, value: &impl Serialize) -> Result<(), BlobError> {
        let bytes = serde_json::to_vec_pretty(value).expect("serializable value");
        self.put(key, bytes).await
    }

    pub async fn get_json<T: DeserializeOwned>(&self, key: &str) -> Result<T, BlobError> {
        let bytes = self.get(key).await?;
        serde_json::from_slice(&bytes).map_err(|source| BlobError::Decode {
            key: key.to_string(),
            source,
        })
    }

    /// Stores JSON under `blobs/<sha256>` and returns the key. Idempotent.
    pub async fn put_content(&self, value: &impl Serialize) -> Result<String, BlobError> {
        let bytes = serde_json::to_vec(value).expect("serializable value");
        let key = format!("blobs/{}", sha256_hex(&bytes));
        self.put(&key, bytes).await?;
        Ok(key)
    }

    /// Content key of a JSON value and, when it is small, the value to carry inline; a large
    /// value is stored under its key instead.
    pub async fn inline_or_store<T: Serialize + Clone>(
        &self,
        value: &T,
        limit: usize,
    ) -> Result<(String, Option<T>), BlobError> {
        let bytes = serde_json::to_vec(value).expect("serializable value");
        let key = format!("blobs/{}", sha256_hex(&bytes));
        if bytes.len() <= limit {
            return Ok((key, Some(value.clone())));
        }
        self.put(&key, bytes).await?;
        Ok((key, None))
    }

    /// Reads a content-addressed blob and checks its hash.
    pub async fn get_content<T: DeserializeOwned>(&self, key: &str) -> Result<T, BlobError> {
        let bytes = self.get(key).await?;
        if let Some(expected) = key.strip_prefix("blobs/") {
            if sha256_hex(&bytes) != expected {
                return Err(BlobError::Corrupt {
                    key: key.to_string(),
                });
            }
        }
        serde_json::from_slice(&bytes).map_err(|source| BlobError::Decode {
            key: key.to_string(),
            source,
        })
    }

    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, BlobError> {
        use futures::TryStreamExt;
        let items: Vec<_> = self
            .store
            .list(Some(&ObjPath::from(prefix)))
            .try_collect()
            .await?;
        let mut keys: Vec<String> = items.into_iter().map(|m| m.location.to_string()).collect();
        keys.sort();
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::BlobError;

    #[test]
    fn missing_and_malformed_objects_are_permanent_store_trouble_is_not() {
        let missing = BlobError::Store(object_store::Error::NotFound {
            path: "graphs/x.json".into(),
            source: "no such key".into(),
        });
        assert!(!missing.is_transient());
        let down = BlobError::Store(object_store::Error::Generic {
            store: "S3",
            source: "connection refused".into(),
        });
        assert!(down.is_transient());
        let decode = BlobError::Decode {
            key: "k".into(),
            source: serde_json::from_str::<u8>("x").unwrap_err(),
        };
        assert!(!decode.is_transient());
        assert!(!BlobError::Corrupt { key: "k".into() }.is_transient());
        assert!(!BlobError::BadUrl("ftp://x".into()).is_transient());
    }
}
