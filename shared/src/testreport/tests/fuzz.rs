//! Hostile input: neither parser panics on arbitrary strings, XML-ish token soup, or real reports
//! with text spliced in.

use super::super::{parse_junit, parse_libtest};
use proptest::prelude::*;

const XML_TOKENS: &[&str] = &[
    "<?xml version=\"1.0\" encoding=\"utf-8\"?>",
    "<testsuites>",
    "</testsuites>",
    "<testsuites/>",
    "<testsuite name=\"pytest\" tests=\"3\">",
    "<testsuite>",
    "</testsuite>",
    "<testcase classname=\"tests.t\" name=\"test_a[1]\" time=\"0.001\">",
    "<testcase name=\"b\" time=\"1e400\"/>",
    "<testcase classname=\"\" name=\"tests.t\">",
    "<testcase>",
    "</testcase>",
    "<failure message=\"assert 1 == 2&#10;x\">",
    "<failure message=\"[XPASS(strict)] r\"/>",
    "</failure>",
    "<error message=\"collection failure\">",
    "</error>",
    "<skipped type=\"pytest.xfail\" message=\"m\"/>",
    "<skipped type=\"pytest.skip\">",
    "</skipped>",
    "<system-out>",
    "</system-out>",
    "<rerunFailure>",
    "</rerunFailure>",
    "<![CDATA[ <x> ]]>",
    "<!-- c -->",
    "<!DOCTYPE x [<!ENTITY a \"aaaa\">]>",
    "&a;",
    "&amp;",
    "&#x0;",
    "&#1114112;",
    "&lt;",
    "é☃",
    "\"",
    "'",
    "<",
    ">",
    "/>",
    "=",
    " ",
    "\n",
    "&",
    "test a::b ... ok\n",
    "test c ... FAILED\n",
    "running 2 tests\n",
    "failures:\n",
    "---- c stdout ----\n",
    "{\"type\":\"test\",\"event\":\"failed\",\"name\":\"c\",\"stdout\":\"thread 'c' panicked\"}\n",
    "{\"type\":\"suite\",\"event\":\"started\"}\n",
    "{\"type\":\"test\",\"event\":\"ok\",\"name\":\"d\",\"exec_time\":-1}\n",
    "[[[[[[[[[[[[[[[[",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_strings_never_panic(s in ".*") {
        let _ = parse_junit(&s);
        let _ = parse_libtest(&s);
    }

    #[test]
    fn xml_ish_strings_never_panic(
        parts in prop::collection::vec(prop::sample::select(XML_TOKENS), 0..60)
    ) {
        let s = parts.concat();
        let _ = parse_junit(&s);
        let _ = parse_libtest(&s);
    }

    #[test]
    fn mutated_real_reports_never_panic(
        cut in 0usize..4000, insert in ".{0,8}", which in 0usize..3
    ) {
        let sample = [super::PYTEST_STACK, super::NEXTEST, super::LIBTEST_HUMAN][which];
        let mut at = cut.min(sample.len());
        while !sample.is_char_boundary(at) {
            at -= 1;
        }
        let s = format!("{}{}{}", &sample[..at], insert, &sample[at..]);
        let _ = parse_junit(&s);
        let _ = parse_libtest(&s);
    }
}
