use super::*;
use std::time::Duration;

#[test]
fn the_seed_table_classifies_in_its_order() {
    let cases = [
        (
            "net::ERR_CONNECTION_REFUSED (connection refused)",
            ToolErrorType::Transient,
        ),
        ("HTTP 429 Too Many Requests", ToolErrorType::Transient),
        (
            "Navigation timeout of 30000 ms exceeded",
            ToolErrorType::Transient,
        ),
        ("waiting for selector `#add` failed", ToolErrorType::Timing),
        ("no element matches", ToolErrorType::Timing),
        ("invalid selector", ToolErrorType::Selector),
        (
            "strict mode violation: resolved to 3 elements",
            ToolErrorType::Selector,
        ),
        ("the element cannot take focus", ToolErrorType::Capability),
        ("sh: 1: npx: command not found", ToolErrorType::NotInstalled),
        ("spawn chromium ENOENT", ToolErrorType::NotInstalled),
        ("access denied", ToolErrorType::Permission),
        ("malformed json", ToolErrorType::InvalidInput),
        ("something odd happened", ToolErrorType::Transient),
    ];
    for (text, want) in cases {
        assert_eq!(classify("browser", text).error_type, want, "{text}");
    }
    assert_eq!(classify("x", "weird").hint, "Unknown error. Will retry.");
    assert!(classify("browser", "invalid selector")
        .hint
        .contains("#new-todo"));
    assert_eq!(
        classify("npx", "command not found").hint,
        "Tool 'npx' may not be installed."
    );
}

#[test]
fn transient_errors_retry_after_one_then_three_seconds_then_stop() {
    let t = ToolErrorType::Transient;
    let secs = |s| Next::Retry {
        wait: Duration::from_secs(s),
    };
    assert_eq!(next_step(t, 1, None, true), secs(1));
    assert_eq!(next_step(t, 2, None, true), secs(3));
    assert_eq!(
        next_step(t, 3, None, true),
        Next::Stop(ExecutionOutcome::RetryExhausted)
    );
    assert_eq!(next_step(ToolErrorType::Timing, 1, None, true), secs(2));
    assert_eq!(next_step(ToolErrorType::Timing, 2, None, true), secs(5));
}

#[test]
fn fatal_and_hint_classes_are_never_retried() {
    for t in [ToolErrorType::NotInstalled, ToolErrorType::Permission] {
        assert_eq!(
            next_step(t, 1, None, true),
            Next::Stop(ExecutionOutcome::Fatal)
        );
    }
    for t in [
        ToolErrorType::Selector,
        ToolErrorType::InvalidInput,
        ToolErrorType::Capability,
    ] {
        assert_eq!(
            next_step(t, 1, None, true),
            Next::Stop(ExecutionOutcome::NeedsHint)
        );
    }
}

#[test]
fn a_call_that_may_have_taken_effect_is_not_run_again() {
    assert_eq!(
        next_step(ToolErrorType::Transient, 1, None, false),
        Next::Stop(ExecutionOutcome::NotReplayable)
    );
}

#[test]
fn a_configured_strategy_replaces_the_class_default() {
    let config = RetryConfig {
        max_attempts: 5,
        backoff_seconds: vec![0],
    };
    for attempt in 1..5 {
        assert_eq!(
            next_step(ToolErrorType::Transient, attempt, Some(&config), true),
            Next::Retry {
                wait: Duration::ZERO
            }
        );
    }
    assert_eq!(
        next_step(ToolErrorType::Transient, 5, Some(&config), true),
        Next::Stop(ExecutionOutcome::RetryExhausted)
    );
    let empty = RetryConfig {
        max_attempts: 2,
        backoff_seconds: vec![],
    };
    assert!(matches!(
        next_step(ToolErrorType::Timing, 1, Some(&empty), true),
        Next::Retry { .. }
    ));
}

#[test]
fn project_types_are_detected_from_the_spec_as_the_seed_scores_them() {
    assert_eq!(
        detect_project_type("A to-do page served by Python's standard library (todo.py)"),
        "python_app"
    );
    assert_eq!(
        detect_project_type("A REST endpoint returning a JSON response; no frontend"),
        "api_backend"
    );
    assert_eq!(
        detect_project_type("A command line tool reading stdin"),
        "cli_tool"
    );
    assert_eq!(
        detect_project_type("A static landing page, no backend"),
        "static_site"
    );
    assert_eq!(detect_project_type("something"), "web_app");
    assert_eq!(profile("nonsense").name, "web_app");
    assert_eq!(profile("python_app").required_tools, ["python3", "pip"]);
    assert!(!profile("api_backend").browser);
}
