//! Object storage adapter over `object_store`: S3 (MinIO, moto) in the fleet, the local file
//! system in the embedded mode. Content-addressed JSON blobs, packs and artifacts, all under the
//! namespace prefix. Documented keys:
//!
//! - `blobs/<sha256>`: job specs and job results (JSON)
//! - `graphs/<sha256>.json`: graph bundles
//! - `packs/<sha256>.pack`: git packfiles
//! - `runs/<run_id>/...`: artifacts; `runs/<run_id>/run_summary.json`, `result.json`, `state.json`
//! - `cache/steps/<sha256>.json`: kept step results (`shared::step_cache`)

use bytes::Bytes;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, PutPayload};
use serde::de::DeserializeOwned;
use serde::Serialize;
use shared::hashing::sha256_hex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
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
    /// The key is not there (never written, or deleted). Callers decide with this, never by
    /// matching the object store's own error type.
    pub fn is_not_found(&self) -> bool {
        matches!(self, BlobError::Store(object_store::Error::NotFound { .. }))
    }

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
    /// For a store on a server (S3): whether the server answered the last call.
    up: Option<Arc<AtomicBool>>,
}

impl Blobs {
    /// `s3://bucket` (endpoint and credentials from `AWS_*` env, e.g. `AWS_ENDPOINT_URL`) or
    /// `file:///absolute/path`. Everything lives under `namespace/`.
    pub fn open(url: &str, namespace: &str) -> Result<Self, BlobError> {
        let inner: Arc<dyn ObjectStore> = if let Some(bucket) = url.strip_prefix("s3://") {
            // Every request is bounded: a stalled object store is an error that is retried,
            // not a job or a commit that hangs.
            let client = object_store::ClientOptions::new()
                .with_connect_timeout(Duration::from_secs(5))
                .with_timeout(Duration::from_secs(120));
            let mut b = AmazonS3Builder::from_env()
                .with_bucket_name(bucket.trim_end_matches('/'))
                .with_client_options(client)
                .with_retry(retry_config());
            if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
                b = b.with_endpoint(endpoint.clone());
                if endpoint.starts_with("http://") {
                    b = b.with_allow_http(true);
                }
            }
            let store: Arc<dyn ObjectStore> = Arc::new(b.build()?);
            let mut blobs = Self::from_store(store, namespace);
            blobs.up = Some(Arc::new(AtomicBool::new(true)));
            return Ok(blobs);
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
            up: None,
        }
    }

    /// The server this store reaches (`s3`) and whether it answered the last call; `None`
    /// for local files and memory.
    pub fn dependency(&self) -> Option<(&'static str, bool)> {
        (self.up.as_ref()).map(|up| ("s3", up.load(Ordering::Relaxed)))
    }

    /// Books whether the server answered `outcome` (any answer, "not found" included).
    fn seen<T>(&self, outcome: Result<T, object_store::Error>) -> Result<T, BlobError> {
        let outcome = outcome.map_err(BlobError::from);
        if let Some(up) = &self.up {
            let answered = match &outcome {
                Ok(_) => true,
                Err(e) => !e.is_transient(),
            };
            up.store(answered, Ordering::Relaxed);
        }
        outcome
    }

    pub async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<(), BlobError> {
        let put = (self.store)
            .put(&ObjPath::from(key), PutPayload::from(Bytes::from(bytes)))
            .await;
        self.seen(put)?;
        Ok(())
    }

    /// Copies `from` to `to` inside the store (server-side where the store can).
    pub async fn copy(&self, from: &str, to: &str) -> Result<(), BlobError> {
        let copied = (self.store)
            .copy(&ObjPath::from(from), &ObjPath::from(to))
            .await;
        self.seen(copied)
    }

    pub async fn get(&self, key: &str) -> Result<Vec<u8>, BlobError> {
        let got = self.seen(self.store.get(&ObjPath::from(key)).await)?;
        Ok(self.seen(got.bytes().await)?.to_vec())
    }

    pub async fn exists(&self, key: &str) -> Result<bool, BlobError> {
        match self.seen(self.store.head(&ObjPath::from(key)).await) {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), BlobError> {
        match self.seen(self.store.delete(&ObjPath::from(key)).await) {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
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
        let items: Vec<_> = self.seen(
            self.store
                .list(Some(&ObjPath::from(prefix)))
                .try_collect()
                .await,
        )?;
        let mut keys: Vec<String> = items.into_iter().map(|m| m.location.to_string()).collect();
        keys.sort();
        Ok(keys)
    }

    /// The names of the folders directly under `prefix`, sorted: one level of the store's
    /// listing with a delimiter, so a folder of a million keys is one name.
    pub async fn list_folders(&self, prefix: &str) -> Result<Vec<String>, BlobError> {
        let listed = self.seen(
            self.store
                .list_with_delimiter(Some(&ObjPath::from(prefix)))
                .await,
        )?;
        let mut names: Vec<String> = (listed.common_prefixes.iter())
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        names.sort();
        Ok(names)
    }
}

/// Retries of one S3 request: the backoff stays under a second, so a request that found the
/// server away goes through within about a second of its return (object_store's default
/// backoff grows to 15 s); about a minute of retries before the caller sees the error.
fn retry_config() -> object_store::RetryConfig {
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
        },
        max_retries: 60,
        retry_timeout: Duration::from_secs(90),
    }
}

/// The contract of [`Blobs`], written once and run against every backing store: object_store's
/// in-memory store in this crate's unit tests, local files (`file://`) and S3 (`s3://`) in
/// `tests/conformance.rs`. Each case takes a [`Blobs`] in a namespace of its own; the
/// namespace case takes two over the same backing store.
#[cfg(any(test, feature = "conformance"))]
pub mod conformance {
    use super::{BlobError, Blobs};
    use shared::hashing::sha256_hex;

    pub async fn put_then_get_returns_the_bytes(blobs: &Blobs) {
        blobs.put("runs/r/a.bin", b"first".to_vec()).await.unwrap();
        assert_eq!(blobs.get("runs/r/a.bin").await.unwrap(), b"first");
        blobs.put("runs/r/a.bin", b"second".to_vec()).await.unwrap();
        assert_eq!(
            blobs.get("runs/r/a.bin").await.unwrap(),
            b"second",
            "a put replaces the object"
        );
        blobs.put("runs/r/empty", Vec::new()).await.unwrap();
        assert!(blobs.get("runs/r/empty").await.unwrap().is_empty());
    }

    pub async fn a_missing_key_is_not_found_and_permanent(blobs: &Blobs) {
        let e = blobs.get("runs/r/missing.json").await.unwrap_err();
        assert!(e.is_not_found(), "{e}");
        assert!(!e.is_transient(), "{e}");
        let e = blobs
            .get_json::<serde_json::Value>("runs/r/missing.json")
            .await
            .unwrap_err();
        assert!(e.is_not_found(), "{e}");
        let e = blobs
            .get_content::<serde_json::Value>("blobs/00")
            .await
            .unwrap_err();
        assert!(e.is_not_found(), "{e}");
    }

    pub async fn exists_and_delete(blobs: &Blobs) {
        assert!(!blobs.exists("runs/r/x").await.unwrap());
        blobs.put("runs/r/x", b"x".to_vec()).await.unwrap();
        assert!(blobs.exists("runs/r/x").await.unwrap());
        blobs.delete("runs/r/x").await.unwrap();
        assert!(!blobs.exists("runs/r/x").await.unwrap());
        assert!(blobs.get("runs/r/x").await.unwrap_err().is_not_found());
        blobs
            .delete("runs/r/x")
            .await
            .expect("deleting a missing key is not an error");
    }

    pub async fn json_round_trips(blobs: &Blobs) {
        let v = serde_json::json!({"a": [1, 2, {"b": "ü"}], "n": null});
        blobs.put_json("runs/r/v.json", &v).await.unwrap();
        let back: serde_json::Value = blobs.get_json("runs/r/v.json").await.unwrap();
        assert_eq!(back, v);
        blobs
            .put("runs/r/bad.json", b"{not json".to_vec())
            .await
            .unwrap();
        let e = blobs
            .get_json::<serde_json::Value>("runs/r/bad.json")
            .await
            .unwrap_err();
        assert!(matches!(e, BlobError::Decode { .. }), "{e}");
        assert!(!e.is_not_found() && !e.is_transient(), "{e}");
    }

    pub async fn content_keys_are_checked(blobs: &Blobs) {
        let v = serde_json::json!({"spec": "x"});
        let key = blobs.put_content(&v).await.unwrap();
        let bytes = serde_json::to_vec(&v).unwrap();
        assert_eq!(key, format!("blobs/{}", sha256_hex(&bytes)));
        assert_eq!(
            blobs.put_content(&v).await.unwrap(),
            key,
            "storing the same content twice names the same key"
        );
        let back: serde_json::Value = blobs.get_content(&key).await.unwrap();
        assert_eq!(back, v);
        // An object that is not what its key says is refused, for good.
        blobs.put(&key, b"{\"spec\":\"y\"}".to_vec()).await.unwrap();
        let e = blobs
            .get_content::<serde_json::Value>(&key)
            .await
            .unwrap_err();
        assert!(matches!(e, BlobError::Corrupt { .. }), "{e}");
        assert!(!e.is_transient());
    }

    pub async fn small_values_ride_inline_large_ones_are_stored(blobs: &Blobs) {
        let small = serde_json::json!({"s": 1});
        let (key, inline) = blobs.inline_or_store(&small, 1024).await.unwrap();
        assert_eq!(inline, Some(small.clone()));
        assert!(
            !blobs.exists(&key).await.unwrap(),
            "an inlined value is not stored"
        );
        let large = serde_json::json!({"s": "x".repeat(2048)});
        let (key, inline) = blobs.inline_or_store(&large, 1024).await.unwrap();
        assert_eq!(inline, None);
        let back: serde_json::Value = blobs.get_content(&key).await.unwrap();
        assert_eq!(back, large);
    }

    pub async fn list_is_sorted_and_under_the_prefix(blobs: &Blobs) {
        for k in [
            "runs/r1/b",
            "runs/r1/a",
            "runs/r1/sub/c",
            "runs/r2/a",
            "graphs/g.json",
        ] {
            blobs.put(k, k.as_bytes().to_vec()).await.unwrap();
        }
        assert_eq!(
            blobs.list("runs/r1").await.unwrap(),
            vec!["runs/r1/a", "runs/r1/b", "runs/r1/sub/c"],
            "keys under the prefix, sorted, relative to the namespace"
        );
        assert_eq!(blobs.list("runs/none").await.unwrap(), Vec::<String>::new());
        assert_eq!(
            blobs.list_folders("runs/").await.unwrap(),
            vec!["r1", "r2"],
            "the folders directly under the prefix, by name"
        );
        assert_eq!(blobs.list_folders("runs/r1").await.unwrap(), vec!["sub"]);
        assert!(blobs.list_folders("none/").await.unwrap().is_empty());
    }

    pub async fn namespaces_do_not_see_each_other(a: &Blobs, b: &Blobs) {
        a.put("runs/r/k", b"a".to_vec()).await.unwrap();
        assert!(!b.exists("runs/r/k").await.unwrap());
        assert!(b.get("runs/r/k").await.unwrap_err().is_not_found());
        assert!(b.list("runs").await.unwrap().is_empty());
        b.put("runs/r/k", b"b".to_vec()).await.unwrap();
        assert_eq!(a.get("runs/r/k").await.unwrap(), b"a");
        assert_eq!(b.get("runs/r/k").await.unwrap(), b"b");
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
        assert!(missing.is_not_found());
        assert!(!down.is_not_found());
    }

    /// The blob contract over object_store's in-memory store (no I/O); the same suite runs
    /// over `file://` and `s3://` in tests/conformance.rs.
    mod conformance_in_memory {
        use super::super::conformance as c;
        use super::super::Blobs;
        use std::sync::Arc;

        fn open() -> impl FnMut(&str) -> Blobs {
            let store = Arc::new(object_store::memory::InMemory::new());
            move |ns: &str| Blobs::from_store(store.clone(), &format!("ns-{ns}"))
        }

        #[tokio::test]
        async fn put_then_get_returns_the_bytes() {
            c::put_then_get_returns_the_bytes(&open()("a")).await;
        }
        #[tokio::test]
        async fn a_missing_key_is_not_found_and_permanent() {
            c::a_missing_key_is_not_found_and_permanent(&open()("a")).await;
        }
        #[tokio::test]
        async fn exists_and_delete() {
            c::exists_and_delete(&open()("a")).await;
        }
        #[tokio::test]
        async fn json_round_trips() {
            c::json_round_trips(&open()("a")).await;
        }
        #[tokio::test]
        async fn content_keys_are_checked() {
            c::content_keys_are_checked(&open()("a")).await;
        }
        #[tokio::test]
        async fn small_values_ride_inline_large_ones_are_stored() {
            c::small_values_ride_inline_large_ones_are_stored(&open()("a")).await;
        }
        #[tokio::test]
        async fn list_is_sorted_and_under_the_prefix() {
            c::list_is_sorted_and_under_the_prefix(&open()("a")).await;
        }
        #[tokio::test]
        async fn namespaces_do_not_see_each_other() {
            let mut open = open();
            let (a, b) = (open("a"), open("b"));
            c::namespaces_do_not_see_each_other(&a, &b).await;
        }
    }
}
