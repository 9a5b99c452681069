//! The JUnit parser on real pytest and nextest reports, and the documents it rejects.

use super::*;

// ----- JUnit: pytest ------------------------------------------------------------------

#[test]
fn pytest_outcomes_from_real_output() {
    let r = parse_junit(PYTEST_STACK).unwrap();
    assert_eq!(r.format, "junit");
    let expect = [
        ("tests.test_stack::test_pass", Passed),
        ("tests.test_stack::test_fail", Failed),
        ("tests.test_stack::test_fixture_error", Errored),
        ("tests.test_stack::test_teardown_error", Errored),
        ("tests.test_stack::test_skip", Skipped),
        ("tests.test_stack::test_skipif", Skipped),
        ("tests.test_stack::test_xfail", Xfailed),
        ("tests.test_stack::test_xpass", Passed),
        ("tests.test_stack::test_xpass_strict", Xpassed),
        ("tests.test_stack::test_push[1]", Passed),
        ("tests.test_stack::test_push[2]", Failed),
        ("tests.test_stack::test_push[a b]", Passed),
        ("tests.test_stack.TestStack::test_in_class", Passed),
        ("tests.test_stack.TestStack::test_unicode", Failed),
    ];
    let got: Vec<(&str, CaseOutcome)> =
        r.cases.iter().map(|c| (c.id.as_str(), c.outcome)).collect();
    assert_eq!(got, expect);
    assert_eq!(
        r.counts(),
        Counts {
            executed: 12,
            passed: 5,
            failed: 3,
            errored: 2,
            skipped: 2,
            xfailed: 1,
            xpassed: 1,
        }
    );
    assert_eq!(case(&r, "tests.test_stack::test_pass").seconds, 0.001);
}

#[test]
fn pytest_messages_from_real_output() {
    let r = parse_junit(PYTEST_STACK).unwrap();
    let msg = |id: &str| case(&r, id).message.clone();
    assert!(msg("tests.test_stack::test_fail").starts_with("assert [1, 2] == [1, 3]\n"));
    assert_eq!(
        msg("tests.test_stack::test_fixture_error"),
        r#"failed on setup with "RuntimeError: fixture exploded""#
    );
    assert_eq!(
        msg("tests.test_stack::test_teardown_error"),
        r#"failed on teardown with "ValueError: teardown boom""#
    );
    assert_eq!(msg("tests.test_stack::test_skip"), "not today");
    assert_eq!(msg("tests.test_stack::test_skipif"), "py3 only skip");
    assert_eq!(msg("tests.test_stack::test_xfail"), "known bug");
    assert_eq!(
        msg("tests.test_stack::test_xpass_strict"),
        "[XPASS(strict)] must fail"
    );
    assert_eq!(msg("tests.test_stack::test_pass"), "");
    assert_eq!(
        msg("tests.test_stack.TestStack::test_unicode"),
        "assert 'héllo <ünï> & \"q\"' == '✓ ☃ <tag>'\n  - ✓ ☃ <tag>\n  + héllo <ünï> & \"q\""
    );
}

#[test]
fn pytest_collection_error_has_an_id_without_separator() {
    let r = parse_junit(PYTEST_COLLECTION_ERROR).unwrap();
    assert_eq!(r.cases.len(), 1);
    assert_eq!(r.cases[0].id, "tests.test_broken");
    assert_eq!(r.cases[0].outcome, Errored);
    assert_eq!(r.cases[0].message, "collection failure");
    let j = judge_fail(&r, 2);
    assert!(!j.ok);
    assert!(
        j.reasons
            .contains(&"1 collection error: tests.test_broken".to_string()),
        "{:?}",
        j.reasons
    );
    assert!(!judge_pass(&r, 2, None, &BTreeSet::new()).ok);
}

#[test]
fn pytest_repeated_testcase_is_merged_and_module_skip_read() {
    let r = parse_junit(PYTEST_MORE).unwrap();
    let got: Vec<(&str, CaseOutcome)> =
        r.cases.iter().map(|c| (c.id.as_str(), c.outcome)).collect();
    assert_eq!(
        got,
        [
            ("tests.test_modskip", Skipped),
            ("tests.test_more::test_fail_and_teardown", Failed),
            ("tests.test_more::test_xfail_norun", Xfailed),
            ("tests.test_more::test_imperative_xfail", Xfailed),
        ]
    );
    assert_eq!(case(&r, "tests.test_modskip").message, "collection skipped");
    assert_eq!(
        case(&r, "tests.test_more::test_fail_and_teardown").message,
        "assert 1 == 2"
    );
    assert_eq!(
        case(&r, "tests.test_more::test_xfail_norun").message,
        "[NOTRUN] known bug"
    );
    assert_eq!(
        case(&r, "tests.test_more::test_imperative_xfail").message,
        "imperative"
    );
}

#[test]
fn pytest_xunit1_family() {
    let r = parse_junit(PYTEST_XUNIT1).unwrap();
    let got: Vec<(&str, CaseOutcome)> =
        r.cases.iter().map(|c| (c.id.as_str(), c.outcome)).collect();
    assert_eq!(
        got,
        [
            ("tests.test_small::test_ok", Passed),
            ("tests.test_small::test_bad", Failed),
            ("tests.test_small::test_later", Xfailed),
        ]
    );
}

#[test]
fn bare_testsuite_root() {
    let start = PYTEST_XUNIT1.find("<testsuite ").unwrap();
    let end = PYTEST_XUNIT1.find("</testsuites>").unwrap();
    let bare = &PYTEST_XUNIT1[start..end];
    assert!(bare.starts_with("<testsuite ") && bare.ends_with("</testsuite>"));
    let r = parse_junit(bare).unwrap();
    assert_eq!(r.cases.len(), 3);
    assert_eq!(r.counts().failed, 1);
}

#[test]
fn legacy_xpass_skip_is_an_xpass() {
    let xml = r#"<testsuite><testcase classname="t" name="x"><skipped message="xfail-marked test passes unexpectedly"/></testcase></testsuite>"#;
    assert_eq!(parse_junit(xml).unwrap().cases[0].outcome, Xpassed);
}

#[test]
fn worst_result_in_one_testcase_wins() {
    let xml = r#"<testsuite><testcase name="x"><skipped message="s"/><error message="e"/><system-out>o</system-out></testcase></testsuite>"#;
    let r = parse_junit(xml).unwrap();
    assert_eq!(r.cases[0].id, "x");
    assert_eq!(r.cases[0].outcome, Errored);
    assert_eq!(r.cases[0].message, "e");
}

#[test]
fn message_falls_back_to_text_and_is_clipped() {
    let long = "é".repeat(2 * MAX_MESSAGE_CHARS);
    let xml = format!(
        r#"<testsuite><testcase name="a"><failure>  first line
second</failure></testcase><testcase name="b"><failure message="{long}"/></testcase><testcase name="c"><error><![CDATA[cdata <raw>]]></error></testcase></testsuite>"#
    );
    let r = parse_junit(&xml).unwrap();
    assert_eq!(case(&r, "a").message, "first line\nsecond");
    assert_eq!(case(&r, "b").message.chars().count(), MAX_MESSAGE_CHARS);
    assert_eq!(case(&r, "c").message, "cdata <raw>");
}

#[test]
fn odd_times_become_zero() {
    let xml = r#"<testsuite><testcase name="a" time="NaN"/><testcase name="b" time="-1"/><testcase name="c" time="x"/><testcase name="d" time=" 2.5 "/></testsuite>"#;
    let r = parse_junit(xml).unwrap();
    let secs: Vec<f64> = r.cases.iter().map(|c| c.seconds).collect();
    assert_eq!(secs, [0.0, 0.0, 0.0, 2.5]);
    serde_json::to_string(&r).unwrap();
}

// ----- JUnit: nextest ------------------------------------------------------------------

#[test]
fn nextest_junit() {
    let r = parse_junit(NEXTEST).unwrap();
    let got: Vec<(&str, CaseOutcome)> =
        r.cases.iter().map(|c| (c.id.as_str(), c.outcome)).collect();
    assert_eq!(
        got,
        [
            ("nextest-tests::basic::test_cwd", Passed),
            ("nextest-tests::basic::test_failure_assert", Failed),
            ("nextest-tests::basic::test_flaky", Passed),
            ("nextest-tests::basic::test_ignored", Skipped),
        ]
    );
    assert_eq!(
            case(&r, "nextest-tests::basic::test_failure_assert").message,
            "thread 'test_failure_assert' panicked at tests/basic.rs:19:5:\nassertion `left == right` failed: this is an assertion"
        );
}

// ----- JUnit: rejected documents -------------------------------------------------------

#[test]
fn not_a_report_is_an_error() {
    for doc in [
        "",
        "   ",
        "hello world",
        "<?xml version=\"1.0\"?>",
        "<html><body>502 bad gateway</body></html>",
        "<testsuites/>",
        "<testsuites></testsuites>",
        "<testsuites><testcase name=\"a\"/></testsuites>",
        "<testsuite/><testsuite/>",
        "<testsuite><testcase name=\"a\"><testcase name=\"b\"/></testcase></testsuite>",
    ] {
        assert!(
            matches!(parse_junit(doc), Err(ReportError::NotJunit(_))),
            "{doc:?}: {:?}",
            parse_junit(doc)
        );
    }
}

#[test]
fn malformed_xml_is_an_error() {
    for doc in [
        "<testsuite><testcase name=\"a\"></testsuite>",
        "<testsuite></testcase></testsuite>",
        "<testsuite><testcase name=\"a\" name=\"b\"/></testsuite>",
        "<testsuite><testcase name=\"a&bogus;\"/></testsuite>",
        "<testsuite><testcase name=\"a\"><failure>&bogus;</failure></testcase></testsuite>",
        "<testsuite><testcase name=a/></testsuite>",
        "</testsuite>",
    ] {
        assert!(
            matches!(parse_junit(doc), Err(ReportError::Xml { .. })),
            "{doc:?}: {:?}",
            parse_junit(doc)
        );
    }
}

#[test]
fn every_truncation_of_a_real_report_is_an_error() {
    for sample in [PYTEST_STACK, PYTEST_MORE, NEXTEST.trim_end()] {
        for (i, _) in sample.char_indices() {
            assert!(
                parse_junit(&sample[..i]).is_err(),
                "prefix of {i} bytes parsed"
            );
        }
        assert!(parse_junit(sample).is_ok());
    }
    assert_eq!(
        parse_junit("<testsuites><testsuite><testcase name=\"a\"/>"),
        Err(ReportError::Truncated(2))
    );
}

#[test]
fn testcase_without_name_is_an_error() {
    for doc in [
        r#"<testsuite><testcase classname="c"/></testsuite>"#,
        r#"<testsuite><testcase classname="c" name=""></testcase></testsuite>"#,
    ] {
        assert_eq!(parse_junit(doc), Err(ReportError::MissingName));
    }
}

#[test]
fn too_deep_is_an_error() {
    let ok = format!(
        "<testsuites><testsuite>{}{}</testsuite></testsuites>",
        "<p>".repeat(MAX_DEPTH - 2),
        "</p>".repeat(MAX_DEPTH - 2)
    );
    assert!(parse_junit(&ok).is_ok());
    let deep = format!(
        "<testsuites><testsuite>{}{}</testsuite></testsuites>",
        "<p>".repeat(MAX_DEPTH - 1),
        "</p>".repeat(MAX_DEPTH - 1)
    );
    assert_eq!(parse_junit(&deep), Err(ReportError::TooDeep));
    let very_deep = format!("<testsuites>{}", "<p>".repeat(1_000_000));
    assert_eq!(parse_junit(&very_deep), Err(ReportError::TooDeep));
}

#[test]
fn too_many_cases_is_an_error() {
    let many = |n: usize| {
        let mut s = String::from("<testsuite>");
        for i in 0..n {
            s.push_str(&format!("<testcase name=\"t{i}\"/>"));
        }
        s.push_str("</testsuite>");
        s
    };
    assert_eq!(
        parse_junit(&many(MAX_CASES)).unwrap().cases.len(),
        MAX_CASES
    );
    assert_eq!(
        parse_junit(&many(MAX_CASES + 1)),
        Err(ReportError::TooManyCases)
    );
}

#[test]
fn error_messages_are_lowercase() {
    for e in [
        ReportError::Xml {
            position: 3,
            message: "x".into(),
        },
        ReportError::NotJunit("no testsuite element".into()),
        ReportError::Truncated(2),
        ReportError::MissingName,
        ReportError::TooManyCases,
        ReportError::TooDeep,
        ReportError::NoLibtestResults,
    ] {
        let s = e.to_string();
        assert!(s.starts_with(|c: char| c.is_lowercase()), "{s}");
    }
}
