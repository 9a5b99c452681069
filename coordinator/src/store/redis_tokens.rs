//! API tokens in Redis: one hash, the token's SHA-256 to its record (JSON). The token itself
//! is never stored; a revoked token keeps its record, with `revoked_at`.

use super::redis::{encode, timed, RedisRunStore};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use redis::AsyncCommands;
use shared::auth::TokenRecord;
use shared::ports::{PortError, TokenStore};

impl RedisRunStore {
    fn tokens_key(&self) -> String {
        format!("{}:tokens", self.ns)
    }
}

fn decode(text: &str) -> Result<TokenRecord, PortError> {
    serde_json::from_str(text).map_err(|e| PortError::Encoding(e.to_string()))
}

#[async_trait]
impl TokenStore for RedisRunStore {
    async fn add_token(&self, record: &TokenRecord) -> Result<(), PortError> {
        let (key, raw) = (self.tokens_key(), encode(record)?);
        timed("add token", &self.conn, |mut c| {
            let (key, raw, hash) = (key.clone(), raw.clone(), record.hash.clone());
            async move { c.hset::<_, _, _, ()>(key, hash, raw).await }
        })
        .await
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>, PortError> {
        let key = self.tokens_key();
        let raw: Option<String> = timed("token", &self.conn, |mut c| {
            let (key, hash) = (key.clone(), hash.to_string());
            async move { c.hget(key, hash).await }
        })
        .await?;
        raw.as_deref().map(decode).transpose()
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, PortError> {
        let key = self.tokens_key();
        let raws: Vec<String> = timed("list tokens", &self.conn, |mut c| {
            let key = key.clone();
            async move { c.hvals(key).await }
        })
        .await?;
        let mut all = raws
            .iter()
            .map(|r| decode(r))
            .collect::<Result<Vec<_>, _>>()?;
        all.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(all)
    }

    async fn revoke_token(&self, id: &str, at: DateTime<Utc>) -> Result<bool, PortError> {
        let Some(mut record) = self.list_tokens().await?.into_iter().find(|t| t.id == id) else {
            return Ok(false);
        };
        record.revoked_at.get_or_insert(at);
        self.add_token(&record).await?;
        Ok(true)
    }
}
