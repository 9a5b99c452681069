//! The token cases of the run-store contract: found by hash only, listed oldest first, revoked
//! in place (kept, with the time) and never by an unknown id.

use super::Profile;
use shared::auth::{hash_token, token_from, Role, TokenRecord};
use shared::ports::RunStore;

fn record(id: &str, secret: u8, created: i64) -> (String, TokenRecord) {
    let token = token_from(&[secret; 32]);
    let record = TokenRecord {
        id: id.into(),
        hash: hash_token(&token),
        team: "team-a".into(),
        role: Role::Member,
        name: format!("token {id}"),
        created_at: chrono::DateTime::from_timestamp(1_767_225_600 + created, 0).expect("a time"),
        revoked_at: None,
    };
    (token, record)
}

pub async fn tokens_are_found_by_hash_and_revoked_in_place(s: &dyn RunStore, _: &Profile) {
    let (first, a) = record("tok_a", 1, 0);
    let (_, b) = record("tok_b", 2, 10);
    s.add_token(&b).await.unwrap();
    s.add_token(&a).await.unwrap();
    assert_eq!(
        s.token_by_hash(&hash_token(&first)).await.unwrap(),
        Some(a.clone())
    );
    assert_eq!(
        s.token_by_hash(&first).await.unwrap(),
        None,
        "the token itself is no key"
    );
    let ids: Vec<String> = s
        .list_tokens()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(ids, ["tok_a", "tok_b"], "oldest first");
    let at = chrono::DateTime::from_timestamp(1_767_225_700, 0).expect("a time");
    assert!(s.revoke_token("tok_a", at).await.unwrap());
    assert!(!s.revoke_token("tok_nope", at).await.unwrap());
    let revoked = s.token_by_hash(&a.hash).await.unwrap().expect("kept");
    assert_eq!(revoked.revoked_at, Some(at));
    assert_eq!(s.list_tokens().await.unwrap().len(), 2);
}
