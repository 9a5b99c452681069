//! The mirror-index cases of the run-store contract: no id is vouched for before the store is
//! reconciled under its current identity; after it, only ids the mirror may hold (noted, or
//! removed by retention) are left to the mirror to answer.

use super::{state, Profile};
use shared::ids::RunId;
use shared::ports::RunStore;

pub async fn the_mirror_index_vouches_only_once_reconciled(s: &dyn RunStore, _: &Profile) {
    let fresh = RunId::new("m-fresh");
    assert_eq!(
        s.index_token().await.unwrap(),
        None,
        "no identity before the epoch"
    );
    assert!(
        s.mirror_may_hold(&fresh).await.unwrap(),
        "before the epoch is set"
    );
    s.epoch("e1").await.unwrap();
    let token = s
        .index_token()
        .await
        .unwrap()
        .expect("an identity once the epoch is set");
    assert!(token.starts_with("e1"), "{token}");
    assert!(!s.reconciled().await.unwrap());
    assert!(
        s.mirror_may_hold(&fresh).await.unwrap(),
        "not reconciled yet"
    );

    s.note_mirror_runs(&[RunId::new("m-old")]).await.unwrap();
    assert!(
        !s.mark_reconciled("e0|another").await.unwrap(),
        "a reconcile of another identity marks nothing"
    );
    assert!(!s.reconciled().await.unwrap());
    assert!(s.mark_reconciled(&token).await.unwrap());
    assert!(s.reconciled().await.unwrap());
    assert!(
        !s.mirror_may_hold(&fresh).await.unwrap(),
        "an id neither stored nor noted is vouched for"
    );
    assert!(
        s.mirror_may_hold(&RunId::new("m-old")).await.unwrap(),
        "a noted run is the mirror's to answer for"
    );

    let removed = RunId::new("m-removed");
    assert!(s.create(&state("m-removed"), &[]).await.unwrap());
    s.remove(&removed).await.unwrap();
    assert!(
        s.mirror_may_hold(&removed).await.unwrap(),
        "a removed run is the mirror's to answer for"
    );
}
