//! Strategies and helpers shared by the property tests of every crate (behind the
//! `test-support` feature, so only tests compile them): small arbitrary text and JSON, a case
//! count overridable with `PROPTEST_CASES`, and a time bound per case.

use proptest::prelude::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// A case of a property must finish well within this (the parsers are linear or close).
pub const CASE_LIMIT: Duration = Duration::from_secs(2);

/// `n` cases, or `PROPTEST_CASES` when set (for a longer hunt).
pub fn cases(n: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(n);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

/// Runs `f` and says how long it took.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let started = Instant::now();
    let out = f();
    (out, started.elapsed())
}

/// Short strings, over every char or over the ones JSON, YAML and paths care about.
pub fn arb_text() -> impl Strategy<Value = String> {
    prop_oneof!["\\PC{0,16}", "[{}\\[\\]\":,a-c0-9 ./\\\\\\-`\n]{0,24}"]
}

/// Any JSON value, small: a few levels, a few items per level.
pub fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| {
            serde_json::Number::from_f64(f).map(Value::Number)
        }),
        arb_text().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(arb_text(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
