use super::*;
use proptest::prelude::*;

fn refused(input: Value) -> BrowserInputError {
    validate(&input).expect_err("refused")
}

#[test]
fn a_loopback_page_with_every_action_is_accepted() {
    let req = validate(&json!({
        "url": "http://127.0.0.1:8000/index.html?x=1#top",
        "actions": [
            {"type": {"selector": "#new", "text": "buy milk"}},
            {"click": "#add"},
            {"press": "Enter"},
            {"wait_for": "#items li"},
            {"text": "#items"},
            {"screenshot": "after-add"},
            {"navigate": "https://localhost/other"}
        ],
        "timeout_seconds": 20
    }))
    .unwrap();
    assert_eq!(req.actions.len(), 7);
    assert_eq!(req.timeout_seconds, 20);
    assert_eq!(req.screenshots(), vec!["after-add"]);
    let sent = req.to_json("/tmp/fleet-browser/call-1");
    assert_eq!(
        sent["actions"][0],
        json!({"type": {"selector": "#new", "text": "buy milk"}})
    );
    assert_eq!(sent["actions"][2], json!({"press": "Enter"}));
    assert_eq!(sent["screenshot_dir"], "/tmp/fleet-browser/call-1");
}

#[test]
fn the_timeout_defaults_and_is_bounded() {
    let req = validate(&json!({"url": "http://localhost:3000"})).unwrap();
    assert_eq!(req.timeout_seconds, DEFAULT_TIMEOUT_SECONDS);
    assert!(req.actions.is_empty());
    for t in [0, 121, 100_000] {
        assert_eq!(
            refused(json!({"url": "http://localhost", "timeout_seconds": t})),
            BrowserInputError::Timeout(t)
        );
    }
}

#[test]
fn pages_off_the_loopback_are_refused_with_a_reason() {
    for url in [
        "file:///etc/passwd",
        "http://10.0.0.1/",
        "https://example.com/",
        "http://127.0.0.2/",
        "http://127.0.0.1.evil.com/",
        "http://evil.com@127.0.0.1/",
        "http://127.0.0.1@evil.com/",
        "http://evil.com\\@127.0.0.1/",
        "javascript:alert(1)",
        "chrome://settings",
        "ftp://127.0.0.1/",
        "http://[::1]/",
        "http://127.0.0.1:0/",
        "http://127.0.0.1:99999/",
        "http://127.0.0.1:/",
        "http://127.0.0.1 /",
        "http://127.0.0.1:80x/",
        "",
    ] {
        match refused(json!({ "url": url })) {
            BrowserInputError::Url { .. } => {}
            other => panic!("{url:?}: {other:?}"),
        }
    }
    let msg = refused(json!({"url": "file:///etc/passwd"})).to_string();
    assert!(msg.contains("only http and https"), "{msg}");
    let msg = refused(json!({"url": "http://10.0.0.1"})).to_string();
    assert!(msg.contains("only 127.0.0.1 and localhost"), "{msg}");
    // A navigation is held to the same rule.
    let e =
        refused(json!({"url": "http://127.0.0.1/", "actions": [{"navigate": "http://10.0.0.1/"}]}));
    assert!(matches!(e, BrowserInputError::Url { .. }), "{e:?}");
}

#[test]
fn malformed_actions_are_refused() {
    let bad = |actions: Value| refused(json!({"url": "http://127.0.0.1/", "actions": actions}));
    assert!(matches!(
        bad(json!([{"bogus": "x"}])),
        BrowserInputError::Shape(_)
    ));
    assert!(matches!(
        bad(json!([{"click": "a", "text": "b"}])),
        BrowserInputError::Shape(_)
    ));
    assert!(matches!(
        bad(json!([{"press": "F13"}])),
        BrowserInputError::Shape(_)
    ));
    assert!(matches!(
        bad(json!([{"type": {"selector": "a"}}])),
        BrowserInputError::Shape(_)
    ));
    assert!(matches!(
        bad(json!([{"type": {"selector": "a", "text": "b", "x": 1}}])),
        BrowserInputError::Shape(_)
    ));
    assert_eq!(
        bad(json!([{"click": "  "}])),
        BrowserInputError::Selector {
            index: 0,
            kind: "click"
        }
    );
    assert_eq!(
        bad(json!([{"text": "a"}, {"wait_for": "x".repeat(MAX_SELECTOR + 1)}])),
        BrowserInputError::Selector {
            index: 1,
            kind: "wait_for"
        }
    );
    assert_eq!(
        bad(json!([{"type": {"selector": "a", "text": "x".repeat(MAX_TYPED + 1)}}])),
        BrowserInputError::Typed { index: 0 }
    );
    let many: Vec<Value> = (0..MAX_ACTIONS + 1)
        .map(|_| json!({"click": "a"}))
        .collect();
    assert_eq!(
        bad(json!(many)),
        BrowserInputError::TooManyActions(MAX_ACTIONS + 1)
    );
    assert!(matches!(
        refused(json!({"url": "http://127.0.0.1/", "extra": 1})),
        BrowserInputError::Shape(_)
    ));
    assert!(matches!(
        refused(json!("http://127.0.0.1/")),
        BrowserInputError::Shape(_)
    ));
}

#[test]
fn screenshot_names_are_plain_words_used_once() {
    let shot = |name: &str| {
        refused(json!({"url": "http://127.0.0.1/", "actions": [{"screenshot": name}]}))
    };
    for name in [
        "",
        "../x",
        "a/b",
        "a.png",
        "a b",
        "é",
        &"x".repeat(MAX_NAME + 1),
    ] {
        assert!(
            matches!(shot(name), BrowserInputError::ScreenshotName { .. }),
            "{name:?}"
        );
    }
    let twice = refused(json!({"url": "http://127.0.0.1/",
        "actions": [{"screenshot": "a"}, {"click": "b"}, {"screenshot": "a"}]}));
    assert_eq!(
        twice,
        BrowserInputError::DuplicateScreenshot {
            index: 2,
            name: "a".into()
        }
    );
    let many: Vec<Value> = (0..=MAX_SCREENSHOTS)
        .map(|i| json!({"screenshot": format!("s{i}")}))
        .collect();
    assert_eq!(
        refused(json!({"url": "http://127.0.0.1/", "actions": many})),
        BrowserInputError::TooManyScreenshots(MAX_SCREENSHOTS + 1)
    );
}

proptest! {
    /// Whatever the input, an accepted request opens only loopback pages and names only plain
    /// screenshot files; nothing panics.
    #[test]
    fn accepted_requests_stay_on_the_loopback(
        url in prop_oneof![
            "(http|https|file|ftp)://(127\\.0\\.0\\.1|localhost|10\\.0\\.0\\.1|[a-z@.:]{0,12})(:[0-9]{0,6})?(/[a-z@\\\\]{0,5})?",
            ".{0,30}",
        ],
        name in prop_oneof!["[A-Za-z0-9_-]{1,40}", ".{0,50}"],
        selector in ".{0,20}",
    ) {
        let input = json!({"url": url, "actions": [{"click": selector}, {"screenshot": name}]});
        if let Ok(req) = validate(&input) {
            let lower = req.url.to_ascii_lowercase();
            let after = lower.split_once("://").map(|(_, r)| r).unwrap_or_default();
            prop_assert!(lower.starts_with("http://") || lower.starts_with("https://"));
            prop_assert!(after.starts_with("127.0.0.1") || after.starts_with("localhost"));
            let host_end = after.find(['/', '?', '#']).unwrap_or(after.len());
            prop_assert!(!after[..host_end].contains('@'));
            for n in req.screenshots() {
                prop_assert!(plain_name(n));
            }
        }
    }
}
