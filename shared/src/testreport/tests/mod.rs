//! testreport tests: real reports as fixtures and the helpers every room shares; `junit.rs`
//! (pytest and nextest JUnit, rejected documents), `libtest.rs`, `judge.rs` (`judge_pass`,
//! `judge_fail`, pytest's closing line), `flaky.rs` (runs combined, verdicts decided or left
//! to no one) and `fuzz.rs` (hostile input never panics).

mod flaky;
mod fuzz;
mod judge;
mod junit;
mod libtest;

use super::*;

// Real pytest 7.2.1 output (Debian bookworm's python3-pytest, default xunit2 family):
// passed, failed, fixture setup and teardown errors, skip, skipif, xfail, xpass (non-strict
// and strict), parametrized, class-based and a unicode/escaped message.
const PYTEST_STACK: &str = r##"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="2" failures="4" skipped="3" tests="15" time="0.092" timestamp="2026-11-22T05:38:12.185789" hostname="vm"><testcase classname="tests.test_stack" name="test_pass" time="0.001" /><testcase classname="tests.test_stack" name="test_fail" time="0.001"><failure message="assert [1, 2] == [1, 3]&#10;  At index 1 diff: 2 != 3&#10;  Use -v to get more diff">def test_fail():
&gt;       assert [1, 2] == [1, 3]
E       assert [1, 2] == [1, 3]
E         At index 1 diff: 2 != 3
E         Use -v to get more diff

tests/test_stack.py:8: AssertionError</failure></testcase><testcase classname="tests.test_stack" name="test_fixture_error" time="0.001"><error message="failed on setup with &quot;RuntimeError: fixture exploded&quot;">@pytest.fixture
    def broken():
&gt;       raise RuntimeError("fixture exploded")
E       RuntimeError: fixture exploded

tests/test_stack.py:12: RuntimeError</error></testcase><testcase classname="tests.test_stack" name="test_teardown_error" time="0.001"><error message="failed on teardown with &quot;ValueError: teardown boom&quot;">@pytest.fixture
    def bad_teardown():
        yield 1
&gt;       raise ValueError("teardown boom")
E       ValueError: teardown boom

tests/test_stack.py:20: ValueError</error></testcase><testcase classname="tests.test_stack" name="test_skip" time="0.001"><skipped type="pytest.skip" message="not today">/tmp/pt/tests/test_stack.py:26: not today</skipped></testcase><testcase classname="tests.test_stack" name="test_skipif" time="0.000"><skipped type="pytest.skip" message="py3 only skip">/tmp/pt/tests/test_stack.py:28: py3 only skip</skipped></testcase><testcase classname="tests.test_stack" name="test_xfail" time="0.001"><skipped type="pytest.xfail" message="known bug" /></testcase><testcase classname="tests.test_stack" name="test_xpass" time="0.000" /><testcase classname="tests.test_stack" name="test_xpass_strict" time="0.000"><failure message="[XPASS(strict)] must fail">[XPASS(strict)] must fail</failure></testcase><testcase classname="tests.test_stack" name="test_push[1]" time="0.001" /><testcase classname="tests.test_stack" name="test_push[2]" time="0.001"><failure message="assert 2 != 2">n = 2

    @pytest.mark.parametrize("n", [1, 2, "a b"])
    def test_push(n):
&gt;       assert n != 2
E       assert 2 != 2

tests/test_stack.py:46: AssertionError</failure></testcase><testcase classname="tests.test_stack" name="test_push[a b]" time="0.001" /><testcase classname="tests.test_stack.TestStack" name="test_in_class" time="0.001" /><testcase classname="tests.test_stack.TestStack" name="test_unicode" time="0.001"><failure message="assert 'héllo &lt;ünï&gt; &amp; &quot;q&quot;' == '✓ ☃ &lt;tag&gt;'&#10;  - ✓ ☃ &lt;tag&gt;&#10;  + héllo &lt;ünï&gt; &amp; &quot;q&quot;">self = &lt;tests.test_stack.TestStack object at 0x7feb2089f610&gt;

    def test_unicode(self):
&gt;       assert "héllo &lt;ünï&gt; &amp; \"q\"" == "✓ ☃ &lt;tag&gt;"
E       assert 'héllo &lt;ünï&gt; &amp; "q"' == '✓ ☃ &lt;tag&gt;'
E         - ✓ ☃ &lt;tag&gt;
E         + héllo &lt;ünï&gt; &amp; "q"

tests/test_stack.py:52: AssertionError</failure></testcase></testsuite></testsuites>"##;

// pytest 7.2.1, a test file with a syntax error: a collection error.
const PYTEST_COLLECTION_ERROR: &str = r##"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="0" skipped="0" tests="1" time="0.151" timestamp="2026-11-22T05:38:09.589664" hostname="vm"><testcase classname="" name="tests.test_broken" time="0.000"><error message="collection failure">/usr/lib/python3/dist-packages/_pytest/python.py:618: in _importtestmodule
    mod = import_path(self.path, mode=importmode, root=self.config.rootpath)
/usr/lib/python3/dist-packages/_pytest/pathlib.py:533: in import_path
    importlib.import_module(module_name)
/usr/lib/python3.11/importlib/__init__.py:126: in import_module
    return _bootstrap._gcd_import(name[level:], package, level)
&lt;frozen importlib._bootstrap&gt;:1206: in _gcd_import
    ???
&lt;frozen importlib._bootstrap&gt;:1178: in _find_and_load
    ???
&lt;frozen importlib._bootstrap&gt;:1149: in _find_and_load_unlocked
    ???
&lt;frozen importlib._bootstrap&gt;:690: in _load_unlocked
    ???
/usr/lib/python3/dist-packages/_pytest/assertion/rewrite.py:159: in exec_module
    source_stat, co = _rewrite_test(fn, self.config)
/usr/lib/python3/dist-packages/_pytest/assertion/rewrite.py:342: in _rewrite_test
    tree = ast.parse(source, filename=strfn)
/usr/lib/python3.11/ast.py:50: in parse
    return compile(source, filename, mode, flags,
E     File "/tmp/pt/tests/test_broken.py", line 1
E       def test_x(:
E                  ^
E   SyntaxError: invalid syntax</error></testcase></testsuite></testsuites>"##;

// pytest 7.2.1 with `-o junit_logging=all`: a failed call plus a teardown error (two
// `<testcase>` with one id), a module-level skip, xfail(run=False), imperative xfail.
const PYTEST_MORE: &str = r##"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1" skipped="3" tests="4" time="0.099" timestamp="2026-11-22T05:38:25.971103" hostname="vm"><testcase classname="" name="tests.test_modskip" time="0.000"><skipped message="collection skipped">('/tmp/pt2/tests/test_modskip.py', 2, 'Skipped: whole module')</skipped></testcase><testcase classname="tests.test_more" name="test_fail_and_teardown" time="0.001"><failure message="assert 1 == 2">bad_teardown = 1

    def test_fail_and_teardown(bad_teardown):
        print("captured out")
&gt;       assert bad_teardown == 2
E       assert 1 == 2

tests/test_more.py:10: AssertionError</failure></testcase><testcase classname="tests.test_more" name="test_fail_and_teardown" time="0.000"><error message="failed on teardown with &quot;ValueError: teardown boom&quot;">@pytest.fixture
    def bad_teardown():
        yield 1
&gt;       raise ValueError("teardown boom")
E       ValueError: teardown boom

tests/test_more.py:6: ValueError</error><system-out>--------------------------------- Captured Log ---------------------------------

--------------------------------- Captured Out ---------------------------------
captured out

</system-out><system-err>--------------------------------- Captured Err ---------------------------------

</system-err></testcase><testcase classname="tests.test_more" name="test_xfail_norun" time="0.001"><skipped type="pytest.xfail" message="[NOTRUN] known bug" /><system-out>--------------------------------- Captured Log ---------------------------------

--------------------------------- Captured Out ---------------------------------

</system-out><system-err>--------------------------------- Captured Err ---------------------------------

</system-err></testcase><testcase classname="tests.test_more" name="test_imperative_xfail" time="0.001"><skipped type="pytest.xfail" message="imperative" /><system-out>--------------------------------- Captured Log ---------------------------------

--------------------------------- Captured Out ---------------------------------

</system-out><system-err>--------------------------------- Captured Err ---------------------------------

</system-err></testcase></testsuite></testsuites>"##;

// pytest 7.2.1 with `-o junit_family=xunit1`.
const PYTEST_XUNIT1: &str = r##"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="3" time="0.042" timestamp="2026-11-22T05:49:48.435090" hostname="vm"><testcase classname="tests.test_small" name="test_ok" file="tests/test_small.py" line="1" time="0.001" /><testcase classname="tests.test_small" name="test_bad" file="tests/test_small.py" line="3" time="0.001"><failure message="assert 1 == 2">def test_bad():
&gt;       assert 1 == 2
E       assert 1 == 2

tests/test_small.py:5: AssertionError</failure></testcase><testcase classname="tests.test_small" name="test_later" file="tests/test_small.py" line="5" time="0.001"><skipped type="pytest.xfail" message="later" /></testcase></testsuite></testsuites>"##;

// cargo-nextest's JUnit shape (Jenkins flavour): a testsuite per binary, classname = binary
// id, reruns and flaky runs as extra children.
const NEXTEST: &str = r##"<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="nextest-run" tests="4" failures="1" errors="0" uuid="45c50042-482e-477e-88a2-60cfcc3eaf95" timestamp="2024-01-09T07:50:12.664+00:00" time="0.023">
    <testsuite name="nextest-tests::basic" tests="4" disabled="1" errors="0" failures="1">
        <testcase name="test_cwd" classname="nextest-tests::basic" timestamp="2024-01-09T07:50:12.665+00:00" time="0.004">
        </testcase>
        <testcase name="test_failure_assert" classname="nextest-tests::basic" timestamp="2024-01-09T07:50:12.665+00:00" time="0.004">
            <failure type="test failure">thread &apos;test_failure_assert&apos; panicked at tests/basic.rs:19:5:
assertion `left == right` failed: this is an assertion</failure>
            <rerunFailure timestamp="2024-01-09T07:50:12.670+00:00" time="0.004" type="test failure">thread &apos;test_failure_assert&apos; panicked
                <system-out>
running 1 test
test test_failure_assert ... FAILED
</system-out>
            </rerunFailure>
            <system-out><![CDATA[captured <out>]]></system-out>
        </testcase>
        <testcase name="test_flaky" classname="nextest-tests::basic" time="0.010">
            <flakyFailure type="test failure" time="0.002">first try failed</flakyFailure>
        </testcase>
        <testcase name="test_ignored" classname="nextest-tests::basic" time="0.000">
            <skipped/>
        </testcase>
    </testsuite>
</testsuites>
"##;

// Real `cargo test` output (RUST_BACKTRACE=1 was set), stdout only.
const LIBTEST_HUMAN: &str = r##"
running 6 tests
test tests::ignored_plain ... ignored
test tests::ignored_reason ... ignored, needs a database
test tests::panics - should panic ... ok
test tests::fails ... FAILED
test tests::passes ... ok
test tests::unicode_fail ... FAILED

failures:

---- tests::fails stdout ----

thread 'tests::fails' (18065) panicked at src/lib.rs:8:26:
assertion `left == right` failed: two is not three
  left: 2
 right: 3
stack backtrace:
   0: __rustc::rust_begin_unwind
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/panicking.rs:689:5
   1: core::panicking::panic_fmt
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/panicking.rs:80:14
   2: core::panicking::assert_failed_inner
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/panicking.rs:434:23
   3: core::panicking::assert_failed::<i32, i32>
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/panicking.rs:394:5
   4: lt::tests::fails
             at ./src/lib.rs:8:26
   5: lt::tests::fails::{{closure}}
             at ./src/lib.rs:8:23
   6: core::ops::function::FnOnce::call_once
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/ops/function.rs:250:5
   7: <fn() -> core::result::Result<(), alloc::string::String> as core::ops::function::FnOnce<()>>::call_once
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/ops/function.rs:250:5
note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.

---- tests::unicode_fail stdout ----
héllo ✓

thread 'tests::unicode_fail' (18068) panicked at src/lib.rs:12:54:
ünïcode ☃
stack backtrace:
   0: __rustc::rust_begin_unwind
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/std/src/panicking.rs:689:5
   1: core::panicking::panic_fmt
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/panicking.rs:80:14
   2: lt::tests::unicode_fail
             at ./src/lib.rs:12:57
   3: lt::tests::unicode_fail::{{closure}}
             at ./src/lib.rs:12:30
   4: core::ops::function::FnOnce::call_once
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/ops/function.rs:250:5
   5: <fn() -> core::result::Result<(), alloc::string::String> as core::ops::function::FnOnce<()>>::call_once
             at /rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/ops/function.rs:250:5
note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.


failures:
    tests::fails
    tests::unicode_fail

test result: FAILED. 2 passed; 2 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.16s

"##;

// Real libtest JSON (`-Z unstable-options --format json --report-time`), same tests.
const LIBTEST_JSON: &str = r##"{ "type": "suite", "event": "started", "test_count": 6 }
{ "type": "test", "event": "started", "name": "tests::fails" }
{ "type": "test", "event": "started", "name": "tests::ignored_plain" }
{ "type": "test", "name": "tests::ignored_plain", "event": "ignored" }
{ "type": "test", "event": "started", "name": "tests::ignored_reason" }
{ "type": "test", "name": "tests::ignored_reason", "event": "ignored", "message": "needs a database" }
{ "type": "test", "event": "started", "name": "tests::panics" }
{ "type": "test", "name": "tests::fails", "event": "failed", "exec_time": 0.000105567, "stdout": "\nthread 'tests::fails' (31319) panicked at src/lib.rs:8:26:\nassertion `left == right` failed: two is not three\n  left: 2\n right: 3\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n" }
{ "type": "test", "event": "started", "name": "tests::passes" }
{ "type": "test", "name": "tests::passes", "event": "ok", "exec_time": 0.000000391 }
{ "type": "test", "event": "started", "name": "tests::unicode_fail" }
{ "type": "test", "name": "tests::unicode_fail", "event": "failed", "exec_time": 0.000013295, "stdout": "héllo ✓\n\nthread 'tests::unicode_fail' (31322) panicked at src/lib.rs:12:54:\nünïcode ☃\n" }
{ "type": "test", "name": "tests::panics", "event": "ok", "exec_time": 0.000048881 }
{ "type": "suite", "event": "failed", "passed": 2, "failed": 2, "ignored": 2, "measured": 0, "filtered_out": 0, "exec_time": 0.003126387 }
"##;

// Real `cargo test --doc` output.
const LIBTEST_DOC: &str = r##"
running 1 test
test src/lib.rs - two (line 1) ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.12s

"##;

fn case<'a>(report: &'a TestRunReport, id: &str) -> &'a TestCase {
    report
        .cases
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no case {id} in {:?}", report.ids()))
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

fn report(cases: &[(&str, CaseOutcome)]) -> TestRunReport {
    TestRunReport {
        format: "junit".into(),
        cases: cases
            .iter()
            .map(|(id, outcome)| TestCase {
                id: id.to_string(),
                outcome: *outcome,
                message: String::new(),
                seconds: 0.0,
            })
            .collect(),
    }
}

use CaseOutcome::*;
