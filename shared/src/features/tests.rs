//! The feature list judged as a coder that wants the green light would edit it.

use super::review::ReviewBounds;
use super::settle::HumanDecision;
use super::*;
use std::collections::BTreeMap;

fn feature(id: u64, steps: usize) -> Feature {
    Feature {
        id,
        category: "functional".into(),
        description: format!("feature {id}"),
        steps: (1..=steps).map(|s| format!("Step {s}: do {s}")).collect(),
        passes: false,
    }
}

fn list() -> Vec<Feature> {
    vec![feature(1, 4), feature(2, 5), feature(3, 8)]
}

fn edited(f: impl Fn(&mut Vec<Feature>)) -> String {
    let mut l = list();
    f(&mut l);
    render(&l)
}

#[test]
fn the_list_is_parsed_strictly() {
    assert_eq!(parse(&render(&list())), Ok(list()));
    assert!(matches!(parse("{}"), Err(FeatureError::Malformed(_))));
    let extra = render(&list()).replacen("\"passes\"", "\"verified_by\": \"me\", \"passes\"", 1);
    assert!(matches!(parse(&extra), Err(FeatureError::Malformed(_))));
    let twice = edited(|l| l[1].id = 1);
    assert_eq!(parse(&twice), Err(FeatureError::DuplicateId(1)));
    let long = edited(|l| l[0].steps[0] = "x".repeat(MAX_TEXT + 1));
    assert!(matches!(parse(&long), Err(FeatureError::Bad(1, _))));
}

#[test]
fn a_flip_to_passing_with_nothing_else_changed_is_a_claim() {
    let e = judge_edit(&list(), Some(&edited(|l| l[1].passes = true)));
    assert_eq!(e.claims, vec![2]);
    assert!(e.refused.is_empty());
    assert!(e.repaired[1].passes && !e.repaired[0].passes);
}

#[test]
fn every_other_edit_is_refused_and_the_accepted_list_comes_back() {
    let cases: Vec<(String, &str)> = vec![
        (
            edited(|l| {
                l[0].passes = true;
                l[0].steps = vec!["Step 1: it works".into()];
            }),
            "steps rewritten",
        ),
        (
            edited(|l| l[0].description = "easier".into()),
            "description rewritten",
        ),
        (
            edited(|l| l[0].category = "style".into()),
            "category rewritten",
        ),
        (
            edited(|l| {
                l.remove(2);
            }),
            "deleted",
        ),
        (edited(|l| l.push(feature(9, 4))), "added"),
        (edited(|l| l.swap(0, 1)), "features reordered"),
        ("not json".into(), "not a feature list"),
    ];
    for (text, what) in cases {
        let e = judge_edit(&list(), Some(&text));
        assert!(
            e.refused.iter().any(|r| r.what.contains(what)),
            "{what}: {:?}",
            e.refused
        );
        assert!(e.claims.is_empty(), "{what}: {:?}", e.claims);
        assert_eq!(e.repaired, list(), "{what}");
    }
    let gone = judge_edit(&list(), None);
    assert_eq!(gone.repaired, list());
    assert_eq!(gone.refused[0].what, "feature_list.json was deleted");
    // Un-claiming is the harness's alone.
    let mut claimed = list();
    claimed[0].passes = true;
    let e = judge_edit(&claimed, Some(&render(&list())));
    assert_eq!(e.repaired, claimed);
    assert!(e.refused[0].what.starts_with("un-claimed"));
    // A refused edit of one feature keeps a clean claim of another.
    let e = judge_edit(
        &list(),
        Some(&edited(|l| {
            l[0].steps.pop();
            l[2].passes = true;
        })),
    );
    assert_eq!(e.claims, vec![3]);
    assert_eq!(e.refused.len(), 1);
}

fn vote(passes: Option<bool>, reason: &str) -> VerifierVote {
    VerifierVote {
        passes,
        reason: Some(reason.into()),
        artifacts: BTreeMap::new(),
    }
}

#[test]
fn verdicts_need_a_pass_or_agreeing_failures_and_doubt_goes_to_quarantine() {
    let claim = |votes: Vec<VerifierVote>| {
        Claim {
            id: 1,
            votes,
            session: None,
        }
        .verdict()
    };
    assert_eq!(claim(vec![vote(Some(true), "ok")]), Verdict::Verified);
    assert_eq!(
        claim(vec![vote(Some(false), "a"), vote(Some(false), "b")]),
        Verdict::Refuted
    );
    assert_eq!(
        claim(vec![vote(Some(false), "a"), vote(Some(true), "b")]),
        Verdict::Quarantined
    );
    assert_eq!(
        claim(vec![vote(None, "crashed"), vote(None, "crashed")]),
        Verdict::Quarantined
    );
    assert_eq!(
        claim(vec![vote(Some(false), "a"), vote(None, "b")]),
        Verdict::Quarantined
    );
    assert_eq!(claim(vec![]), Verdict::Quarantined);
}

#[test]
fn settling_reverts_refuted_claims_on_disk_and_keeps_per_feature_state() {
    let mut l = list();
    for f in &mut l {
        f.passes = true;
    }
    let claims = vec![
        Claim {
            id: 1,
            votes: vec![vote(Some(true), "fine")],
            session: None,
        },
        Claim {
            id: 2,
            votes: vec![
                vote(Some(false), "no button"),
                vote(Some(false), "still none"),
            ],
            session: None,
        },
        Claim {
            id: 3,
            votes: vec![vote(Some(false), "slow"), vote(Some(true), "fine")],
            session: None,
        },
    ];
    let s = settle(&l, &BTreeMap::new(), &claims, &BTreeMap::new());
    assert_eq!(
        s.list.iter().map(|f| f.passes).collect::<Vec<_>>(),
        [true, false, false]
    );
    assert_eq!(
        s.feedback,
        vec![(2, "refuted by the verifier: still none".into())]
    );
    assert_eq!(s.pending, vec![3]);
    assert_eq!(s.open, vec![2]);
    assert_eq!(s.states[&2].reverts, 1);
    assert_eq!(s.states[&2].verifications, 2);
    assert_eq!(s.metrics.claims, 3);
    assert_eq!(s.metrics.verified, 1);
    assert!((s.metrics.revert_rate - 1.0 / 3.0).abs() < 1e-9);

    // The coder fixes 2, and a person approves 3: each decision is taken once.
    let mut l2 = s.list.clone();
    l2[1].passes = true;
    let approve = |approved| HumanDecision {
        approved,
        by: "ana".into(),
        comment: "looked".into(),
    };
    let decisions = BTreeMap::from([(3, vec![approve(true)])]);
    let again = vec![Claim {
        id: 2,
        votes: vec![vote(Some(true), "button there")],
        session: None,
    }];
    let s2 = settle(&l2, &s.states, &again, &decisions);
    assert!(s2.list.iter().all(|f| f.passes));
    assert_eq!(s2.states[&3].status, FeatureStatus::Approved);
    assert!(s2.pending.is_empty() && s2.open.is_empty());
    assert_eq!(s2.metrics.human_decisions, 1);
    assert_eq!(s2.metrics.claims, 4);
    let s3 = settle(&s2.list, &s2.states, &[], &decisions);
    assert_eq!(s3.states, s2.states);
    // A rejection opens the feature again, with the person's reason for the coder.
    let rejected = settle(
        &s.list,
        &s.states,
        &[],
        &BTreeMap::from([(3, vec![approve(false)])]),
    );
    assert_eq!(rejected.states[&3].status, FeatureStatus::Rejected);
    assert!(rejected.open.contains(&3));
    assert!(rejected.feedback[0]
        .1
        .contains("rejected from quarantine by ana"));
}

#[test]
fn the_review_shows_the_seeds_statistics_and_warnings() {
    let mut l = list();
    l[0].steps.truncate(2);
    l[1].passes = true;
    l.push(feature(4, 25));
    let r = review(&l, &ReviewBounds::default());
    assert_eq!((r.total, r.functional, r.deep), (4, 4, 2));
    assert!(r
        .warnings
        .iter()
        .any(|w| w.contains("below the minimum feature count (40): 4")));
    assert!(r
        .warnings
        .iter()
        .any(|w| w.contains("already marked passing")));
    assert_eq!(r.already_passing, vec![2]);
    assert_eq!(r.feature_warnings[0].0, 1);
    assert!(r.feature_warnings[0].1.starts_with("too vague"));
    assert!(r.feature_warnings[1].1.starts_with("too large"));
}
