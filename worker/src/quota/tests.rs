//! The ledger's rules through the gate, on the memory ledger (the Redis ledger runs the same
//! cases on the real server in `tests/quotas.rs`).

use super::memory::MemoryLedger;
use super::{Admission, Call, FleetGate, JobScope, Ledger, Rates};
use shared::quota::{QuotaScope, Rate, Spent, TeamLimits};
use std::sync::Arc;
use std::time::Duration;

fn scope(team: Option<&str>, run: &str) -> JobScope {
    JobScope {
        team: team.map(str::to_string),
        run: run.into(),
    }
}

#[tokio::test]
async fn a_team_is_warned_at_80_percent_and_stopped_at_100_other_teams_go_on() {
    let ledger = Arc::new(MemoryLedger::new());
    let limits = TeamLimits {
        daily_usd: Some(1.0),
        ..TeamLimits::default()
    };
    ledger.set_limits("a", &limits).await.unwrap();
    let gate = FleetGate::new(ledger.clone(), None);
    let a = scope(Some("a"), "run-a");
    gate.admit(&a, "anthropic").await.unwrap();
    gate.record(&a, "anthropic", 100, 0.5).await;
    gate.admit(&a, "anthropic").await.unwrap();
    gate.record(&a, "anthropic", 100, 0.35).await;
    let events = ledger.events("a", 10).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].event.as_str(), events[0].percent),
        ("budget_warning", 80)
    );
    gate.admit(&a, "anthropic").await.unwrap();
    gate.record(&a, "anthropic", 100, 0.2).await;
    let e = gate.admit(&a, "anthropic").await.unwrap_err();
    assert!(e.to_string().starts_with("budget_exhausted"), "{e}");
    let events = ledger.events("a", 10).await.unwrap();
    assert_eq!(events[0].event, "budget_exhausted");
    assert_eq!(events.len(), 2, "each mark once");
    // Another team, and a run of the open API, are not held by team a's spend.
    gate.admit(&scope(Some("b"), "run-b"), "anthropic")
        .await
        .unwrap();
    gate.admit(&scope(None, "run-c"), "anthropic")
        .await
        .unwrap();
    assert_eq!(ledger.take_notices("c1").await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_run_limit_stops_only_that_run() {
    let ledger = Arc::new(MemoryLedger::new());
    let limits = TeamLimits {
        run_tokens: Some(1000),
        ..TeamLimits::default()
    };
    ledger.set_limits("a", &limits).await.unwrap();
    let gate = FleetGate::new(ledger.clone(), None);
    gate.record(&scope(Some("a"), "r1"), "openai", 1000, 0.0)
        .await;
    let e = gate
        .admit(&scope(Some("a"), "r1"), "openai")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("run_tokens"), "{e}");
    gate.admit(&scope(Some("a"), "r2"), "openai").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn rates_hold_calls_and_a_429_halves_the_fleet_rate_until_successes_restore_it() {
    let ledger = MemoryLedger::new();
    let fleet = Rate {
        calls: 4,
        per_seconds: 10,
    };
    let rates = Rates {
        team: None,
        fleet: Some(fleet),
    };
    let bounds = TeamLimits::default().bounds();
    let call = Call {
        team: Some("a"),
        run: "r",
        provider: "anthropic",
        day: "2026-11-23",
    };
    for _ in 0..4 {
        assert_eq!(
            ledger.admit(&call, &bounds, &rates).await.unwrap(),
            Admission::Go
        );
    }
    assert!(matches!(
        ledger.admit(&call, &bounds, &rates).await.unwrap(),
        Admission::Wait(_)
    ));
    tokio::time::advance(Duration::from_secs(10)).await;
    ledger
        .throttled("anthropic", Duration::from_secs(3), Some(fleet))
        .await
        .unwrap();
    // Held for everyone while the provider backs off, then at half the rate.
    assert!(matches!(
        ledger.admit(&call, &bounds, &rates).await.unwrap(),
        Admission::Wait(w) if w <= Duration::from_secs(3)
    ));
    tokio::time::advance(Duration::from_secs(3)).await;
    for _ in 0..2 {
        assert_eq!(
            ledger.admit(&call, &bounds, &rates).await.unwrap(),
            Admission::Go
        );
    }
    assert!(matches!(
        ledger.admit(&call, &bounds, &rates).await.unwrap(),
        Admission::Wait(_)
    ));
    // Two successes bring it back to 4.
    for _ in 0..2 {
        ledger
            .record(&call, Spent::default(), &bounds, Some(fleet), "t")
            .await
            .unwrap();
    }
    assert_eq!(
        ledger.admit(&call, &bounds, &rates).await.unwrap(),
        Admission::Go
    );
    assert_eq!(
        ledger.admit(&call, &bounds, &rates).await.unwrap(),
        Admission::Go
    );
}

#[tokio::test]
async fn runs_under_way_are_counted_against_the_limit() {
    let ledger = MemoryLedger::new();
    assert!(ledger.admit_run("a", "r1", Some(1)).await.unwrap());
    assert!(
        ledger.admit_run("a", "r1", Some(1)).await.unwrap(),
        "the same run again"
    );
    assert!(!ledger.admit_run("a", "r2", Some(1)).await.unwrap());
    assert!(ledger.admit_run("b", "r3", Some(1)).await.unwrap());
    ledger.run_ended("a", "r1").await.unwrap();
    assert!(ledger.admit_run("a", "r2", Some(1)).await.unwrap());
    assert_eq!(
        ledger.runs_under_way("a").await.unwrap(),
        vec!["r2".to_string()]
    );
    assert_eq!(QuotaScope::parse("run_usd"), Some(QuotaScope::RunUsd));
}
