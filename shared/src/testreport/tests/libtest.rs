//! The libtest parser on real `cargo test` output (human and JSON lines).

use super::*;

#[test]
fn libtest_human_output() {
    let r = parse_libtest(LIBTEST_HUMAN).unwrap();
    assert_eq!(r.format, "libtest");
    let got: Vec<(&str, CaseOutcome)> =
        r.cases.iter().map(|c| (c.id.as_str(), c.outcome)).collect();
    assert_eq!(
        got,
        [
            ("tests::ignored_plain", Skipped),
            ("tests::ignored_reason", Skipped),
            ("tests::panics", Passed),
            ("tests::fails", Failed),
            ("tests::passes", Passed),
            ("tests::unicode_fail", Failed),
        ]
    );
    assert_eq!(
        case(&r, "tests::ignored_reason").message,
        "needs a database"
    );
    let fails = &case(&r, "tests::fails").message;
    assert!(fails.starts_with("thread 'tests::fails'"), "{fails}");
    assert!(fails.ends_with("left: 2\n right: 3"), "{fails}");
    let unicode = &case(&r, "tests::unicode_fail").message;
    assert!(unicode.ends_with("\nünïcode ☃"), "{unicode}");
    assert_eq!(r.counts().executed, 4);
}

#[test]
fn libtest_json_output() {
    let r = parse_libtest(LIBTEST_JSON).unwrap();
    let human = parse_libtest(LIBTEST_HUMAN).unwrap();
    assert_eq!(r.ids(), human.ids());
    assert_eq!(r.counts(), human.counts());
    for c in &r.cases {
        let h = case(&human, &c.id);
        assert_eq!(c.outcome, h.outcome, "{}", c.id);
        // The thread id in the panic line differs between the two runs.
        let tail = |m: &str| m.lines().skip(1).map(String::from).collect::<Vec<_>>();
        assert_eq!(tail(&c.message), tail(&h.message), "{}", c.id);
        assert_eq!(c.message.is_empty(), h.message.is_empty(), "{}", c.id);
    }
    assert!(case(&r, "tests::panics").seconds > 0.0);
}

#[test]
fn libtest_doc_tests_and_timings() {
    let r = parse_libtest(LIBTEST_DOC).unwrap();
    assert_eq!(r.cases.len(), 1);
    assert_eq!(r.cases[0].id, "src/lib.rs - two (line 1)");
    assert_eq!(r.cases[0].outcome, Passed);
    let timed =
        parse_libtest("test a::b ... ok <0.001s>\ntest a::c ... FAILED <0.002s>\n").unwrap();
    assert_eq!(timed.cases[0].outcome, Passed);
    assert_eq!(timed.cases[1].outcome, Failed);
}

#[test]
fn libtest_zero_tests_and_no_tests() {
    let r = parse_libtest("\nrunning 0 tests\n\ntest result: ok. 0 passed; 0 failed\n").unwrap();
    assert!(r.cases.is_empty());
    assert_eq!(
        parse_libtest("error[E0425]: cannot find value `x`\n"),
        Err(ReportError::NoLibtestResults)
    );
    assert_eq!(parse_libtest(""), Err(ReportError::NoLibtestResults));
    // Bench lines are not test results.
    assert_eq!(
        parse_libtest("test bench_x ... bench:         123 ns/iter (+/- 4)\n"),
        Err(ReportError::NoLibtestResults)
    );
}

#[test]
fn libtest_output_inside_a_failure_block_is_not_a_result() {
    let out = "running 1 test\ntest a ... FAILED\n\nfailures:\n\n---- a stdout ----\ntest inner ... ok\nthread 'a' panicked at x.rs:1:1:\nboom\n\nfailures:\n    a\n\ntest result: FAILED. 0 passed; 1 failed\n";
    let r = parse_libtest(out).unwrap();
    assert_eq!(r.ids(), set(&["a"]));
    assert_eq!(r.cases[0].message, "thread 'a' panicked at x.rs:1:1:\nboom");
}

#[test]
fn libtest_too_many_cases() {
    let many: String = (0..=MAX_CASES)
        .map(|i| format!("test t{i} ... ok\n"))
        .collect();
    assert_eq!(parse_libtest(&many), Err(ReportError::TooManyCases));
}

#[test]
fn the_closing_line_counts_come_from_the_last_one() {
    use super::super::libtest_summary;
    let out = "test result: ok. 9 passed; 0 failed; 0 ignored\n\
               test a ... FAILED\n\
               test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n";
    assert_eq!(libtest_summary(out), Some((2, 1)));
    assert_eq!(libtest_summary("test a ... ok\n"), None);
    assert_eq!(libtest_summary("test result: ok. lots passed\n"), None);
}
