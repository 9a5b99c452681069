use super::*;
use crate::schema::tests::{arb_json, arb_text, cases, timed, CASE_LIMIT};
use proptest::prelude::*;
use serde_json::json;

/// A script step: the fields a step has, mostly of the right types, sometimes any JSON.
fn arb_step() -> impl Strategy<Value = Value> {
    let delay = prop_oneof![
        any::<f64>().prop_filter_map("finite", |f| {
            serde_json::Number::from_f64(f).map(Value::Number)
        }),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
    ];
    let files = prop::collection::btree_map(arb_text(), arb_text(), 0..3).prop_map(|m| json!(m));
    let commands = prop::collection::vec(arb_text(), 0..3).prop_map(|c| json!(c));
    let or_any = |good: BoxedStrategy<Value>| {
        prop::option::weighted(0.8, prop_oneof![9 => good, 1 => arb_json()])
    };
    (
        or_any(files.boxed()),
        or_any(arb_json().boxed()),
        or_any(commands.boxed()),
        or_any(delay.boxed()),
        prop::option::weighted(0.05, arb_json()),
    )
        .prop_map(|(files, output, commands, delay, extra)| {
            let mut step = json!({});
            for (k, v) in [
                ("files", files),
                ("output", output),
                ("commands", commands),
                ("delay_seconds", delay),
                ("unknown", extra),
            ] {
                if let Some(v) = v {
                    step[k] = v;
                }
            }
            step
        })
}

/// An agent configuration: scripted (by node, a list of steps), an LLM's, or anything.
fn arb_agent() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::collection::btree_map("[a-c]{1,2}", prop::collection::vec(arb_step(), 0..3), 0..3)
            .prop_map(|script| json!({"backend": "scripted", "script": script})),
        (
            prop::sample::select(vec!["anthropic", "openai", "other"]),
            arb_json(),
            arb_json(),
        )
            .prop_map(|(backend, model, turns)| {
                json!({"backend": backend, "model": model, "max_turns": turns})
            }),
        arb_json(),
    ]
}

fn finished() -> ResultEnvelope {
    let result: JobResult = serde_json::from_value(json!({
        "v": WIRE_VERSION, "job_id": "r1.a.1", "run_id": "r1", "attempt": 2,
        "status": "ok", "output": {"n": 1.5}, "error": null, "commit": null, "pack": null,
        "artifacts": {}, "usage": Usage::default(), "worker": "w1", "execution": "e1-aa",
        "started_at": "2026-11-22T10:00:00.123Z", "finished_at": "2026-11-22T10:00:01.500Z",
        "container_seconds": 0.25,
    }))
    .unwrap();
    ResultEnvelope {
        v: WIRE_VERSION,
        job_id: JobId::new("r1.a.1"),
        run_id: RunId::new("r1"),
        attempt: 2,
        result_ref: "blobs/abc".into(),
        result: Some(Box::new(result)),
    }
}

#[test]
fn each_result_message_round_trips_under_its_kind() {
    let started = ResultMessage::Started(StartNotice {
        v: WIRE_VERSION,
        job_id: JobId::new("r1.a.1"),
        run_id: RunId::new("r1"),
        attempt: 2,
        worker: "w1".into(),
    });
    let stored = ResultEnvelope {
        result: None,
        ..finished()
    };
    for (msg, kind) in [
        (started, "started"),
        (ResultMessage::Finished(finished()), "finished"),
        (ResultMessage::Finished(stored.clone()), "finished"),
        (
            ResultMessage::FinishedBatch(ResultBatch {
                v: WIRE_VERSION,
                results: vec![finished(), stored],
            }),
            "finished_batch",
        ),
    ] {
        let body = serde_json::to_vec(&msg).unwrap();
        let raw: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(raw["kind"], kind);
        assert_eq!(raw["v"], WIRE_VERSION);
        assert!(ResultMessage::KINDS.contains(&kind));
        assert_eq!(ResultMessage::decode(&body).unwrap(), msg);
    }
}

#[test]
fn a_result_of_the_previous_version_reads_and_what_is_written_reads_back() {
    let result = finished().result.expect("an inline result");
    assert_eq!(result.started_at.timestamp_millis(), 1_795_341_600_123);
    let written = serde_json::to_value(&result).unwrap();
    assert_eq!(written["started_at"], "2026-11-22T10:00:00.123Z");
    assert_eq!(written["finished_at"], "2026-11-22T10:00:01.500Z");
    assert_eq!(
        serde_json::from_value::<JobResult>(written).unwrap(),
        *result
    );
}

#[test]
fn another_version_an_unknown_kind_or_junk_is_refused() {
    let mut body = serde_json::to_value(ResultMessage::Finished(finished())).unwrap();
    body["v"] = json!(WIRE_VERSION + 1);
    let err = ResultMessage::decode(body.to_string().as_bytes()).unwrap_err();
    assert!(
        matches!(err, WireError::Version(v) if v == WIRE_VERSION + 1),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "wire version {}; this side speaks {WIRE_VERSION}",
            WIRE_VERSION + 1
        )
    );
    // The version is read before the kind: a later version may have other kinds.
    body["kind"] = json!("paused");
    let err = ResultMessage::decode(body.to_string().as_bytes()).unwrap_err();
    assert!(matches!(err, WireError::Version(_)), "{err}");
    body["v"] = json!(WIRE_VERSION);
    let err = ResultMessage::decode(body.to_string().as_bytes()).unwrap_err();
    assert_eq!(err.to_string(), "unknown result message kind `paused`");
    let junk: [&[u8]; 3] = [b"not json", br#"{"kind": "started"}"#, b"[1]"];
    for junk in junk {
        let err = ResultMessage::decode(junk).unwrap_err();
        assert!(matches!(err, WireError::Malformed(_)), "{err}");
    }
    // A known kind without its fields.
    let err = ResultMessage::decode(br#"{"v": 1, "kind": "started"}"#).unwrap_err();
    assert!(
        err.to_string().starts_with("not a result message: "),
        "{err}"
    );
}

/// Envelopes of workers from before the kinds: a result, or a start notice that names its
/// worker in `started`.
#[test]
fn envelopes_without_a_kind_are_still_read() {
    let mut old = serde_json::to_value(finished()).unwrap();
    assert!(old.get("kind").is_none());
    let read = ResultMessage::decode(old.to_string().as_bytes()).unwrap();
    assert_eq!(read, ResultMessage::Finished(finished()));
    old["result_ref"] = json!("");
    old.as_object_mut().unwrap().remove("result");
    old["started"] = json!("w1");
    match ResultMessage::decode(old.to_string().as_bytes()).unwrap() {
        ResultMessage::Started(n) => {
            assert_eq!(
                (n.job_id.as_str(), n.attempt, n.worker.as_str()),
                ("r1.a.1", 2, "w1")
            )
        }
        other => panic!("a start notice, not {other:?}"),
    }
}

#[test]
fn a_huge_or_negative_delay_is_capped_or_none() {
    // Panicked in the scripted agent: `Duration::from_secs_f64(2.66e176)`.
    let config =
        r#"{"backend":"scripted","script":{"a":[{"delay_seconds":2.6663255344907375e+176}]}}"#;
    let AgentConfig::Scripted { script } = serde_json::from_str(config).unwrap() else {
        panic!("a script")
    };
    assert_eq!(script["a"][0].delay(), MAX_SCRIPT_DELAY);
    for (seconds, delay) in [
        (86401.0, MAX_SCRIPT_DELAY),
        (-1.0, std::time::Duration::ZERO),
        (f64::NAN, std::time::Duration::ZERO),
        (f64::INFINITY, MAX_SCRIPT_DELAY),
        (0.5, std::time::Duration::from_millis(500)),
    ] {
        let step = ScriptStep {
            delay_seconds: seconds,
            ..ScriptStep::default()
        };
        assert_eq!(step.delay(), delay, "{seconds}");
    }
}

proptest! {
    #![proptest_config(cases(256))]

    /// Scripts come from whoever submits a run: any of them parses or is refused, and a
    /// parsed one's delays are durations.
    #[test]
    fn any_agent_config_parses_or_is_refused(
        config in prop_oneof![
            4 => arb_agent().prop_map(|v| v.to_string()),
            1 => arb_text(),
        ],
    ) {
        let (parsed, took) = timed(|| serde_json::from_str::<AgentConfig>(&config));
        prop_assert!(took < CASE_LIMIT);
        if let Ok(agent) = parsed {
            prop_assert!(!agent.model_identity().is_empty());
            if let AgentConfig::Scripted { script } = &agent {
                for step in script.values().flatten() {
                    prop_assert!(step.delay() <= MAX_SCRIPT_DELAY);
                }
            }
        }
    }
}
