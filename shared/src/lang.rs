//! The language configuration of test runs: how the harness starts a project's test runner so
//! that nothing an agent planted in the worktree decides what runs or what counts, and where
//! the machine-readable report comes from. Pure: builds argv, never runs it.
//!
//! What is pinned, per language, and why:
//!
//! - **python (pytest)**: the interpreter runs with `-s` (no user site), `-P` (the working
//!   folder is not put on `sys.path`, so a planted `pytest.py` or `_pytest/` cannot shadow the
//!   real runner) and `-B` (no bytecode written, so no `.pyc` can be planted for later runs);
//!   pytest gets a harness-owned config file (`-c`, so the repo's `pytest.ini`, `tox.ini`,
//!   `setup.cfg` and `pyproject.toml` are never read and their `addopts` never apply), a fixed
//!   `--rootdir`, `--confcutdir` at the tests' folder (a `conftest.py` above it, e.g. in the repo
//!   root, is never loaded), `-p no:cacheprovider` (no `--lf` state), and writes JUnit XML to a
//!   path in the harness folder, outside the worktree. The harness's options come after the
//!   command's own, so they win. The environment is rebuilt from nothing (`env -i`): fixed
//!   `PATH`, `HOME`, `TZ=UTC`, `LC_ALL=C.UTF-8`, `LANG=C.UTF-8`, `PYTHONHASHSEED=0`, no
//!   `PYTEST_ADDOPTS`, no `PYTEST_PLUGINS`, and `PYTHONPATH` only the harness's own `pins/`
//!   folder. Seeds are pinned so that two runs of the same code run the same test: a
//!   harness-owned plugin (`-p fleet_pins`, from that folder) seeds `random` with 0 before every
//!   test and, when Hypothesis is installed, loads a profile with `derandomize=True` and no
//!   example database; `-p no:randomly` keeps pytest-randomly (if installed) from shuffling the
//!   order or reseeding. What is left to chance after that (time, threads, the network, files
//!   left in `/tmp`) is what the harness's reruns catch as flaky (`testreport::flaky`).
//! - **rust (cargo test)**: `--offline` and `--locked`, the environment rebuilt the same way
//!   (`RUSTFLAGS`, `CARGO_*` cleared; `TZ`, `LC_ALL`, `LANG` as above; `PROPTEST_RNG_SEED=0`, so
//!   proptest draws the same cases every run), one test thread, results read per test from
//!   libtest's lines. A planted `.cargo/config.toml` or `build.rs` is kept out by write scopes,
//!   not here.
//! - **haskell (QuickCheck, `haskell.rs`)**: the test command only names the source roots
//!   (`runghc -isrc -itest test/Spec.hs`; any other ghc flag is refused, since flags such as
//!   `-pgmF` or `-fplugin` run programs and `-package-env` changes packages). The harness writes
//!   its own runner module into its folder (`/fleet/hs/FleetRunner.hs`, outside the worktree):
//!   it imports each frozen test module, runs each of its top-level `prop_*` bindings (found on
//!   the host with tree-sitter, never by running the tests' own `main`, which the runner
//!   replaces through `-main-is`) with `quickCheckWithResult` under a fixed replay seed and size
//!   (`mkQCGen 0`, 100 cases) with chatty off, catches every exception per property, and prints
//!   one libtest line per property (`test Spec::prop_x ... ok|FAILED`), the failures' output
//!   indented under libtest's headers (so a message line never reads as a result) and libtest's
//!   closing line with its own counts, which must agree with the lines (a line printed by code
//!   under test adds to the lines but not to the runner's count). A canary property (fresh name
//!   per run, always false) must be reported failing. ghc runs under `env -i` (as above, and
//!   `GHC_ENVIRONMENT=-`) with `-package-env -` (a planted `.ghc.environment.*` file is never
//!   read), `-no-user-package-db` (nothing under `$HOME`), `-hide-all-packages` and only
//!   `base`, `QuickCheck` and `containers` exposed, a bare `-i` first (the working folder is
//!   not a source root) and then the roots of the command and of the test files, `-outputdir`
//!   and `-o` in the harness folder's `out/`, `-fforce-recomp` (nothing compiled earlier is
//!   reused) and `-XSafe` for every module: Safe Haskell refuses `unsafePerformIO`, Template
//!   Haskell, FFI imports outside `IO` and a module's own `Trustworthy` claim, so pure code under
//!   test cannot print a result line or end the process. The runner's own imports are
//!   package-qualified, so a module planted under a source root cannot stand in for QuickCheck
//!   or base in the runner. Not pinned here: an `OPTIONS_GHC` pragma in a source file still
//!   applies (ghc has no switch to ignore it, and `-F -pgmF` runs a program at compile time);
//!   the implementation policy (`check_build`) refuses such pragmas in the implementation and
//!   write scopes keep the tests' files out of its reach.

mod haskell;

pub use haskell::{
    canary as haskell_canary, is_module_name, is_property_name, test_id as haskell_test_id,
    TestModule, PACKAGES as HASKELL_PACKAGES,
};

use crate::speccheck;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The `PATH` every pinned run gets.
pub const PINNED_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ReportSource {
    /// JUnit XML written by the runner to the harness folder.
    JunitFile,
    /// libtest's per-test lines on standard output.
    LibtestStdout,
}

/// Where things are as the test process sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunLayout {
    /// The worktree's mount (`/work` in a container).
    pub work: String,
    /// The harness folder's mount (`/fleet`), outside the worktree.
    pub harness: String,
    /// Test files, relative to the worktree (from the run's input).
    pub test_paths: Vec<String>,
    /// The harness-owned canary, if any: python, a test file (absolute, in the harness
    /// folder); haskell, a property name the runner adds.
    pub canary: Option<String>,
    /// Haskell: the frozen test modules and their properties, as the worker found them.
    pub test_modules: Vec<TestModule>,
    /// Python: the runner guard's settings (`None`: no guard, the Haskell and Rust runs).
    pub guard: Option<PythonGuard>,
}

/// The Python runner guard of one run (`python_guard.py`): loaded by pytest before any code of
/// the project, it refuses and records what code under test does to reach the runner, and
/// compares the runner's modules and classes before and after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonGuard {
    pub nonce: String,
    /// Test folders as the test process sees them: code there is not under test.
    pub tests: Vec<String>,
    /// Test files (absolute) outside those folders.
    pub test_files: Vec<String>,
    /// The files agents wrote (absolute): when given, only code in them is judged; else
    /// every file of the worktree outside the tests.
    pub code_under_test: Vec<String>,
    /// Modules code under test may import beyond the project's own.
    pub allowed_modules: Vec<String>,
    /// The runner's hot state compared after every test (else after collection and at the
    /// end only: mutant runs, whose implementation a guarded run already validated).
    pub per_test: bool,
}

/// Modules Python code under test may import by default: the pure part of the standard
/// library (numbers, text, data structures, dates, encodings). Nothing that reaches files,
/// processes, the network, the interpreter (`sys`, `inspect`, `types`, `gc`, `importlib`), the
/// test framework or the process's global output. A dotted module (`collections.abc`) is
/// allowed only when listed itself. One list for the static policy (`worker::claims::policy`)
/// and the runner guard; a spec or work order widens it by name.
pub const PYTHON_ALLOWED_MODULES: &[&str] = &[
    "__future__",
    "abc",
    "array",
    "base64",
    "binascii",
    "bisect",
    "calendar",
    "cmath",
    "collections",
    "collections.abc",
    "colorsys",
    "contextlib",
    "copy",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "enum",
    "fractions",
    "functools",
    "graphlib",
    "hashlib",
    "heapq",
    "html",
    "ipaddress",
    "itertools",
    "json",
    "keyword",
    "math",
    "numbers",
    "operator",
    "random",
    "re",
    "reprlib",
    "statistics",
    "string",
    "struct",
    "textwrap",
    "time",
    "typing",
    "unicodedata",
    "zlib",
];

/// The guard's record, in the harness folder.
pub const GUARD_RECORD: &str = "out/guard.log";
/// The record of the run outside the test runner.
pub const SOLO_GUARD_RECORD: &str = "out/guard-solo.log";
/// The spec checks the outside run reads, and what it writes.
pub const SPEC_CHECKS_FILE: &str = "spec/checks.json";
pub const SPEC_RESULTS_FILE: &str = "out/speccheck.json";
const GUARD_SOURCE: &str = include_str!("lang/python_guard.py");
const GEN_SOURCE: &str = include_str!("lang/python_gen.py");
const SOLO_SOURCE: &str = include_str!("lang/python_speccheck.py");

/// The guard's source with its settings for this run (`record`: where it writes).
fn guard_source(work: &str, harness: &str, guard: &PythonGuard, record: &str) -> String {
    let conf = serde_json::json!({
        "record": format!("{harness}/{record}"),
        "nonce": guard.nonce,
        "work": work,
        "tests": guard.tests,
        "test_files": guard.test_files,
        "code_under_test": guard.code_under_test,
        "per_test": guard.per_test,
        "allowed_modules": guard.allowed_modules,
    });
    let conf = serde_json::to_string(&conf.to_string()).unwrap_or_default();
    format!("import json as _j\n_CONF = _j.loads({conf})\ndel _j\n{GUARD_SOURCE}")
}

/// The harness's files for a guarded Python run: the guard and the property generator.
fn guard_files(work: &str, harness: &str, guard: &PythonGuard) -> Vec<(String, String)> {
    vec![
        (
            format!("{PINS_DIR}/fleet_guard.py"),
            guard_source(work, harness, guard, GUARD_RECORD),
        ),
        (format!("{PINS_DIR}/fleet_gen.py"), GEN_SOURCE.to_string()),
    ]
}

/// The spec's checks run once more outside the test runner, under the same guard: a plain
/// interpreter with the same pins, reading `SPEC_CHECKS_FILE`, writing `SPEC_RESULTS_FILE`.
pub fn python_solo_invocation(layout: &RunLayout, guard: &PythonGuard) -> TestInvocation {
    let harness = layout.harness.trim_end_matches('/');
    let pins = format!("{harness}/{PINS_DIR}");
    let mut argv = pinned_env(&[
        ("PYTHONHASHSEED", "0"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("PYTHONPATH", &pins),
    ]);
    argv.extend(["python3", "-s", "-P", "-B"].map(String::from));
    argv.push(format!("{pins}/fleet_speccheck.py"));
    let script = format!(
        "{}\n_SOLO = {{\"work\": {}, \"checks\": {}, \"results\": {}}}\n{SOLO_SOURCE}",
        guard_source(&layout.work, harness, guard, SOLO_GUARD_RECORD),
        speccheck::py_str(&layout.work),
        speccheck::py_str(&format!("{harness}/{SPEC_CHECKS_FILE}")),
        speccheck::py_str(&format!("{harness}/{SPEC_RESULTS_FILE}")),
    );
    let mut harness_files = guard_files(&layout.work, harness, guard);
    harness_files.push((format!("{PINS_DIR}/fleet_speccheck.py"), script));
    TestInvocation {
        argv,
        report: ReportSource::JunitFile,
        report_file: Some(SPEC_RESULTS_FILE.into()),
        harness_files,
    }
}

/// A pinned test run: the argv and where its report comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestInvocation {
    pub argv: Vec<String>,
    pub report: ReportSource,
    /// The report file, inside the harness folder, relative to it (JUnit only).
    pub report_file: Option<String>,
    /// Files the harness writes into its folder before the run (name, contents).
    pub harness_files: Vec<(String, String)>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LangError {
    #[error("no test configuration for language `{0}` (known: python, rust, haskell)")]
    Unknown(String),
    #[error("the {language} test command must run {runner}: `{command}`")]
    WrongRunner {
        language: String,
        runner: &'static str,
        command: String,
    },
    #[error("bad test module: {0}")]
    BadTestModule(String),
}

/// Languages with a pinned test configuration.
pub const LANGUAGES: &[&str] = &["python", "rust", "haskell"];

const JUNIT_FILE: &str = "out/report.xml";
const INI_FILE: &str = "pytest.ini";
/// The harness's pytest plugin pinning seeds, in a folder of its own (on `PYTHONPATH`).
const PINS_DIR: &str = "pins";
const PINS_PLUGIN: &str = "fleet_pins";
const PINS_SOURCE: &str = r#"# written by the fleet harness: seeds pinned, the same for every run and every test
import random

import pytest

SEED = 0


def pytest_configure(config):
    try:
        from hypothesis import settings
    except ImportError:
        return
    settings.register_profile("fleet-pinned", derandomize=True, database=None)
    settings.load_profile("fleet-pinned")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    random.seed(SEED)
"#;

fn pinned_env(extra: &[(&str, &str)]) -> Vec<String> {
    let mut argv = vec![
        "env".to_string(),
        "-i".into(),
        format!("PATH={PINNED_PATH}"),
        "HOME=/tmp".into(),
        "TZ=UTC".into(),
        "LC_ALL=C.UTF-8".into(),
        "LANG=C.UTF-8".into(),
    ];
    argv.extend(extra.iter().map(|(k, v)| format!("{k}={v}")));
    argv
}

/// The folder holding the tests (the `--confcutdir`): the common parent of the test paths.
fn tests_folder(work: &str, test_paths: &[String]) -> String {
    let dirs: Vec<Vec<&str>> = test_paths
        .iter()
        .map(|p| {
            let mut parts: Vec<&str> = p.split('/').filter(|s| !s.is_empty()).collect();
            parts.pop();
            parts
        })
        .collect();
    let mut common: Vec<&str> = dirs.first().cloned().unwrap_or_default();
    for d in dirs.iter().skip(1) {
        let n = common.iter().zip(d).take_while(|(a, b)| a == b).count();
        common.truncate(n);
    }
    if common.is_empty() {
        work.to_string()
    } else {
        format!("{}/{}", work.trim_end_matches('/'), common.join("/"))
    }
}

/// The pinned invocation of `command` (already split into argv) for `language`.
pub fn test_invocation(
    language: &str,
    command: &[String],
    layout: &RunLayout,
) -> Result<TestInvocation, LangError> {
    let shown = command.join(" ");
    match language {
        "python" => {
            let args: &[String] = match command {
                [py, m, pytest, rest @ ..]
                    if py.starts_with("python") && m == "-m" && pytest == "pytest" =>
                {
                    rest
                }
                [pytest, rest @ ..] if pytest == "pytest" || pytest.ends_with("/pytest") => rest,
                _ => {
                    return Err(LangError::WrongRunner {
                        language: language.into(),
                        runner: "pytest (`python -m pytest ...` or `pytest ...`)",
                        command: shown,
                    })
                }
            };
            let harness = layout.harness.trim_end_matches('/');
            let pins = format!("{harness}/{PINS_DIR}");
            let mut argv = pinned_env(&[
                ("PYTHONHASHSEED", "0"),
                ("PYTHONDONTWRITEBYTECODE", "1"),
                ("PYTHONPATH", &pins),
            ]);
            argv.extend(
                ["python3", "-s", "-P", "-B", "-m", "pytest"]
                    .iter()
                    .map(|s| s.to_string()),
            );
            argv.extend(args.iter().cloned());
            argv.extend([
                "-c".into(),
                format!("{harness}/{INI_FILE}"),
                format!("--rootdir={}", layout.work),
                format!(
                    "--confcutdir={}",
                    tests_folder(&layout.work, &layout.test_paths)
                ),
                "-p".into(),
                "no:cacheprovider".into(),
                "-p".into(),
                "no:randomly".into(),
                "-p".into(),
                PINS_PLUGIN.into(),
            ]);
            if layout.guard.is_some() {
                argv.extend(["-p".to_string(), "fleet_guard".into()]);
            }
            argv.extend([
                format!("--junitxml={harness}/{JUNIT_FILE}"),
                "-o".into(),
                "junit_family=xunit2".into(),
            ]);
            if let Some(canary) = &layout.canary {
                argv.push(canary.clone());
            }
            let ini = format!(
                "# written by the fleet harness: the repository's own pytest configuration is not read\n\
                 [pytest]\npythonpath = {}\naddopts =\nxfail_strict = true\n",
                layout.work
            );
            let mut harness_files = vec![
                (INI_FILE.into(), ini),
                (
                    format!("{PINS_DIR}/{PINS_PLUGIN}.py"),
                    PINS_SOURCE.to_string(),
                ),
            ];
            if let Some(guard) = &layout.guard {
                harness_files.extend(guard_files(&layout.work, harness, guard));
            }
            Ok(TestInvocation {
                argv,
                report: ReportSource::JunitFile,
                report_file: Some(JUNIT_FILE.into()),
                harness_files,
            })
        }
        "rust" => {
            let args: &[String] = match command {
                [cargo, test, rest @ ..] if cargo == "cargo" && test == "test" => rest,
                _ => {
                    return Err(LangError::WrongRunner {
                        language: language.into(),
                        runner: "cargo test",
                        command: shown,
                    })
                }
            };
            let (cargo_args, test_args) = match args.iter().position(|a| a == "--") {
                Some(i) => (&args[..i], &args[i + 1..]),
                None => (args, &[][..]),
            };
            let mut argv = pinned_env(&[
                ("CARGO_TERM_COLOR", "never"),
                ("CARGO_HOME", "/tmp/cargo"),
                ("PROPTEST_RNG_SEED", "0"),
            ]);
            argv.extend(["cargo", "test", "--offline", "--locked"].map(String::from));
            argv.extend(cargo_args.iter().cloned());
            argv.push("--".into());
            argv.extend(test_args.iter().cloned());
            argv.extend(["--test-threads=1", "--color=never"].map(String::from));
            Ok(TestInvocation {
                argv,
                report: ReportSource::LibtestStdout,
                report_file: None,
                harness_files: Vec::new(),
            })
        }
        "haskell" => haskell::invocation(command, layout),
        other => Err(LangError::Unknown(other.into())),
    }
}

/// The canary: a harness-owned test that must fail. A report claiming it passed (or lacking it)
/// was not written by an honest runner. `nonce` makes its name unguessable per run.
pub fn python_canary(nonce: &str) -> (String, String) {
    let file = format!("test_fleet_canary_{nonce}.py");
    let body = format!(
        "# written by the fleet harness\n\ndef test_fleet_canary_{nonce}():\n    assert False, \"fleet canary: this test must fail\"\n"
    );
    (file, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> RunLayout {
        RunLayout {
            work: "/work".into(),
            harness: "/fleet".into(),
            test_paths: vec!["tests/test_stack.py".into()],
            canary: Some("/fleet/canary/test_fleet_canary_ab.py".into()),
            test_modules: Vec::new(),
            guard: None,
        }
    }

    fn argv(c: &str) -> Vec<String> {
        c.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn pytest_gets_its_pins_after_the_commands_own_options() {
        let inv = test_invocation(
            "python",
            &argv("python -m pytest -q -c evil.ini tests"),
            &layout(),
        )
        .unwrap();
        let a = inv.argv;
        assert_eq!(&a[..2], &["env", "-i"]);
        let py = a.iter().position(|x| x == "python3").unwrap();
        assert_eq!(
            &a[py..py + 6],
            &["python3", "-s", "-P", "-B", "-m", "pytest"]
        );
        let ours = a.iter().rposition(|x| x == "-c").unwrap();
        let theirs = a.iter().position(|x| x == "-c").unwrap();
        assert!(ours > theirs, "the harness's -c comes last and wins");
        assert_eq!(a[ours + 1], "/fleet/pytest.ini");
        assert!(a.contains(&"--confcutdir=/work/tests".to_string()));
        assert!(a.contains(&"--rootdir=/work".to_string()));
        assert!(a.contains(&"--junitxml=/fleet/out/report.xml".to_string()));
        assert_eq!(a.last().unwrap(), "/fleet/canary/test_fleet_canary_ab.py");
        assert!(inv.harness_files[0].1.contains("pythonpath = /work"));
    }

    #[test]
    fn seeds_timezone_and_locale_are_pinned() {
        let inv = test_invocation("python", &argv("python -m pytest tests"), &layout()).unwrap();
        let a = inv.argv;
        for pin in [
            "TZ=UTC",
            "LC_ALL=C.UTF-8",
            "LANG=C.UTF-8",
            "PYTHONHASHSEED=0",
            "PYTHONPATH=/fleet/pins",
        ] {
            assert!(a.contains(&pin.to_string()), "{pin} not in {a:?}");
        }
        let py = a.iter().position(|x| x == "python3").unwrap();
        assert!(a[..py].iter().all(|x| !x.starts_with("PYTEST")));
        let plugins: Vec<&str> = a
            .windows(2)
            .filter(|w| w[0] == "-p")
            .map(|w| w[1].as_str())
            .collect();
        assert!(plugins.contains(&"no:randomly") && plugins.contains(&"fleet_pins"));
        let (file, body) = &inv.harness_files[1];
        assert_eq!(file, "pins/fleet_pins.py");
        assert!(body.contains("random.seed(SEED)") && body.contains("derandomize=True"));
        let rust = test_invocation("rust", &argv("cargo test"), &layout()).unwrap();
        for pin in ["TZ=UTC", "LC_ALL=C.UTF-8", "PROPTEST_RNG_SEED=0"] {
            assert!(rust.argv.contains(&pin.to_string()), "{pin}");
        }
    }

    #[test]
    fn a_test_command_that_is_not_the_languages_runner_is_refused() {
        for c in ["sh -c pytest", "python run_tests.py", "true"] {
            assert!(matches!(
                test_invocation("python", &argv(c), &layout()),
                Err(LangError::WrongRunner { .. })
            ));
        }
        assert!(matches!(
            test_invocation("cobol", &argv("make test"), &layout()),
            Err(LangError::Unknown(_))
        ));
    }

    #[test]
    fn cargo_is_pinned_offline_and_single_threaded() {
        let inv =
            test_invocation("rust", &argv("cargo test -p x -- --nocapture"), &layout()).unwrap();
        let a = inv.argv;
        let cargo = a.iter().position(|x| x == "cargo").unwrap();
        assert_eq!(
            &a[cargo..cargo + 4],
            &["cargo", "test", "--offline", "--locked"]
        );
        let sep = a.iter().position(|x| x == "--").unwrap();
        assert!(a[sep..].contains(&"--test-threads=1".to_string()));
        assert!(a[sep..].contains(&"--nocapture".to_string()));
        assert_eq!(inv.report, ReportSource::LibtestStdout);
    }

    #[test]
    fn the_tests_folder_is_the_common_parent() {
        assert_eq!(tests_folder("/work", &["test_a.py".into()]), "/work");
        assert_eq!(
            tests_folder("/work", &["t/a/x.py".into(), "t/b/y.py".into()]),
            "/work/t"
        );
    }
}
