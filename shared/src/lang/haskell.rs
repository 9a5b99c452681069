//! Haskell (QuickCheck): the harness's own runner module, compiled with ghc under pins and run
//! once; what is pinned and why is in the parent module's doc. Pure: builds argv and source,
//! never runs them. The test modules and their properties are found by the worker (tree-sitter
//! on the frozen test files) and handed in through [`RunLayout::test_modules`].

use super::{pinned_env, LangError, ReportSource, RunLayout, TestInvocation};

/// The runner's source, in the harness folder.
pub const RUNNER_FILE: &str = "hs/FleetRunner.hs";
/// The runner's module name (`-main-is`).
const RUNNER_MODULE: &str = "FleetRunner";
/// ghc's output folder (ghc makes it) and the runner's executable, inside the harness folder's
/// `out/` (the only part of it the sandbox user may write).
const OUTPUT_DIR: &str = "out/ghc";
const RUNNER_EXE: &str = "out/fleet-haskell-runner";
/// The report id's module part of the canary property.
const CANARY_MODULE: &str = "FleetCanary";
/// QuickCheck's replay seed and size: the same cases every run.
const SEED: u32 = 0;
/// Successful cases each property needs.
const MAX_SUCCESS: u32 = 100;
/// Packages the test run sees; every other package is hidden.
pub const PACKAGES: &[&str] = &["base", "QuickCheck", "containers"];

/// A frozen test module: its file (relative to the worktree), its module name and its
/// top-level `prop_*` bindings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestModule {
    pub path: String,
    pub module: String,
    pub properties: Vec<String>,
}

/// The canary property's name for `nonce`: the runner adds it, and it must be reported failing.
pub fn canary(nonce: &str) -> String {
    format!("prop_fleet_canary_{nonce}")
}

/// The report id of a property: `Module::prop_name`.
pub fn test_id(module: &str, property: &str) -> String {
    format!("{module}::{property}")
}

/// `Data.Stack`, `Spec`: dot-separated segments, each a capital then letters, digits, `_`, `'`.
pub fn is_module_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('.').all(|seg| {
            let mut chars = seg.chars();
            chars.next().is_some_and(|c| c.is_ascii_uppercase())
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '\'')
        })
}

/// `prop_lifo`: a variable name starting `prop_` (letters, digits, `_`, `'`).
pub fn is_property_name(name: &str) -> bool {
    name.strip_prefix("prop_").is_some_and(|rest| {
        rest.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '\'')
    })
}

/// A relative folder of the worktree, plain (no `..`, not absolute, no odd characters).
fn clean_root(dir: &str) -> Option<String> {
    let dir = dir.trim_end_matches('/');
    let plain = |s: &str| {
        !s.is_empty()
            && s != ".."
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    if dir.is_empty() || dir == "." {
        return Some(String::new());
    }
    let parts: Vec<&str> = dir.split('/').filter(|s| *s != ".").collect();
    (!dir.starts_with('/') && parts.iter().all(|s| plain(s))).then(|| parts.join("/"))
}

/// The source root a test file implies: `test/Data/StackSpec.hs` holding `Data.StackSpec`
/// lives under `test`.
fn root_of(m: &TestModule) -> Option<String> {
    let stem = m.path.strip_suffix(".hs")?;
    let tail = m.module.replace('.', "/");
    let root = stem.strip_suffix(&tail)?;
    clean_root(root.trim_end_matches('/'))
}

/// The command's source roots (`-isrc -itest`, `-isrc:test`); anything but `-i` options and
/// `.hs` files is refused: ghc's other flags can run programs (`-pgmF`, plugins) or change the
/// packages, and the harness sets its own.
fn command_roots(language: &str, command: &[String]) -> Result<Vec<String>, LangError> {
    let wrong = || LangError::WrongRunner {
        language: language.into(),
        runner: "ghc (`runghc -isrc -itest test/Spec.hs`: only `-i` roots and `.hs` files)",
        command: command.join(" "),
    };
    let (first, rest) = command.split_first().ok_or_else(wrong)?;
    let program = first.rsplit('/').next().unwrap_or(first);
    if !matches!(program, "ghc" | "runghc" | "runhaskell") {
        return Err(wrong());
    }
    let mut roots = Vec::new();
    for arg in rest {
        if let Some(dirs) = arg.strip_prefix("-i") {
            for dir in dirs.split(':').filter(|d| !d.is_empty()) {
                roots.push(clean_root(dir).ok_or_else(wrong)?);
            }
        } else if !arg.ends_with(".hs") || arg.starts_with('-') {
            return Err(wrong());
        }
    }
    Ok(roots)
}

fn absolute(work: &str, root: &str) -> String {
    let work = work.trim_end_matches('/');
    if root.is_empty() {
        work.to_string()
    } else {
        format!("{work}/{root}")
    }
}

/// The pinned ghc compile of the runner followed by its run.
pub(super) fn invocation(
    command: &[String],
    layout: &RunLayout,
) -> Result<TestInvocation, LangError> {
    let mut roots = command_roots("haskell", command)?;
    if layout.test_modules.is_empty() {
        return Err(LangError::BadTestModule(
            "no test module: the run names no haskell test file".into(),
        ));
    }
    for m in &layout.test_modules {
        if !is_module_name(&m.module) {
            return Err(LangError::BadTestModule(format!(
                "`{}` in {} is not a module name",
                m.module, m.path
            )));
        }
        if let Some(bad) = m.properties.iter().find(|p| !is_property_name(p)) {
            return Err(LangError::BadTestModule(format!(
                "`{bad}` in {} is not a property name",
                m.path
            )));
        }
        let root = root_of(m).ok_or_else(|| {
            LangError::BadTestModule(format!(
                "{} does not lie where module {} belongs",
                m.path, m.module
            ))
        })?;
        roots.push(root);
    }
    if roots.is_empty() {
        roots.push(String::new());
    }
    let mut seen = std::collections::BTreeSet::new();
    roots.retain(|r| seen.insert(r.clone()));
    let harness = layout.harness.trim_end_matches('/');
    let out = format!("{harness}/{OUTPUT_DIR}");
    let runner = format!("{harness}/{RUNNER_EXE}");
    let mut argv = pinned_env(&[("GHC_ENVIRONMENT", "-"), ("FLEET_RUNNER", &runner)]);
    // ghc's own chatter goes to stderr: standard output is the runner's alone.
    argv.extend(
        [
            "sh",
            "-c",
            "ghc \"$@\" >&2 || exit 2; exec \"$FLEET_RUNNER\"",
            "fleet-haskell",
        ]
        .map(String::from),
    );
    argv.extend(
        [
            "--make",
            "-v1",
            "-package-env",
            "-",
            "-no-user-package-db",
            "-hide-all-packages",
            "-XSafe",
        ]
        .map(String::from),
    );
    for p in PACKAGES {
        argv.extend(["-package".to_string(), p.to_string()]);
    }
    argv.push("-i".into());
    argv.extend(
        roots
            .iter()
            .map(|r| format!("-i{}", absolute(&layout.work, r))),
    );
    argv.extend([
        "-fforce-recomp".into(),
        "-outputdir".into(),
        out,
        "-o".into(),
        runner,
        "-main-is".into(),
        RUNNER_MODULE.into(),
        format!("{harness}/{RUNNER_FILE}"),
    ]);
    Ok(TestInvocation {
        argv,
        report: ReportSource::LibtestStdout,
        report_file: None,
        harness_files: vec![(
            RUNNER_FILE.into(),
            runner_source(&layout.test_modules, layout.canary.as_deref()),
        )],
    })
}

/// The runner module: every property of every test module under the fixed seed, chatty off,
/// exceptions caught per property, one libtest line each, the failures' messages indented
/// under libtest's `---- id stdout ----` headers (so no line of a message reads as a result),
/// then libtest's closing line with the runner's own counts.
fn runner_source(modules: &[TestModule], canary: Option<&str>) -> String {
    let mut s = String::from(
        "{-# LANGUAGE PackageImports #-}\n\
         -- written by the fleet harness: every property of the frozen test modules, seeded\n\
         module FleetRunner (main) where\n\n\
         import qualified \"base\" Control.Exception as E\n\
         import qualified \"base\" System.Exit as Exit\n\
         import qualified \"base\" System.IO as IO\n\
         import qualified \"QuickCheck\" Test.QuickCheck as QC\n\
         import qualified \"QuickCheck\" Test.QuickCheck.Random as QCR\n",
    );
    for (i, m) in modules.iter().enumerate() {
        s.push_str(&format!("import qualified {} as T{i}\n", m.module));
    }
    s.push_str(&format!(
        "\nargs :: QC.Args\n\
         args = QC.stdArgs {{ QC.replay = Just (QCR.mkQCGen {SEED}, 0), QC.chatty = False, QC.maxSuccess = {MAX_SUCCESS} }}\n\n\
         check :: QC.Testable p => String -> p -> IO (String, Bool, String)\n\
         check name p = do\n\
         \x20 r <- E.try (QC.quickCheckWithResult args p)\n\
         \x20 let (ok, msg) = case r of\n\
         \x20       Left e -> (False, \"exception: \" ++ show (e :: E.SomeException))\n\
         \x20       Right res -> (QC.isSuccess res, QC.output res)\n\
         \x20 settled <- E.try (E.evaluate (foldr seq ok msg))\n\
         \x20 let (passed, text) = case settled of\n\
         \x20       Left e -> const (False, \"the property's result could not be shown\") (e :: E.SomeException)\n\
         \x20       Right v -> (v, msg)\n\
         \x20 putStrLn (\"test \" ++ name ++ \" ... \" ++ (if passed then \"ok\" else \"FAILED\"))\n\
         \x20 IO.hFlush IO.stdout\n\
         \x20 return (name, passed, text)\n\n\
         indent :: String -> String\n\
         indent msg = unlines [\"    \" ++ l | l <- lines (take 4000 msg)]\n\n\
         main :: IO ()\n\
         main = do\n\
         \x20 IO.hSetBuffering IO.stdout IO.LineBuffering\n\
         \x20 putStrLn \"running {} tests\"\n\
         \x20 results <- sequence\n",
        modules.iter().map(|m| m.properties.len()).sum::<usize>() + usize::from(canary.is_some())
    ));
    let mut checks = Vec::new();
    for (i, m) in modules.iter().enumerate() {
        for p in &m.properties {
            checks.push(format!(
                "check \"{}\" (QC.property T{i}.{p})",
                test_id(&m.module, p)
            ));
        }
    }
    if let Some(c) = canary {
        checks.push(format!(
            "check \"{}\" (QC.property False)",
            test_id(CANARY_MODULE, c)
        ));
    }
    if checks.is_empty() {
        s.push_str("    []\n");
    }
    for (n, c) in checks.iter().enumerate() {
        let lead = if n == 0 { "[" } else { "," };
        s.push_str(&format!("    {lead} {c}\n"));
    }
    if !checks.is_empty() {
        s.push_str("    ]\n");
    }
    s.push_str(
        "  let failed = [(n, m) | (n, ok, m) <- results, not ok]\n\
         \x20     passed = length results - length failed\n\
         \x20 if null failed then return () else do\n\
         \x20   putStrLn \"\\nfailures:\\n\"\n\
         \x20   mapM_ (\\(n, m) -> putStr (\"---- \" ++ n ++ \" stdout ----\\n\" ++ indent m ++ \"\\n\")) failed\n\
         \x20   putStrLn \"failures:\"\n\
         \x20   mapM_ (\\(n, _) -> putStrLn (\"    \" ++ n)) failed\n\
         \x20 putStrLn (\"\\ntest result: \" ++ (if null failed then \"ok\" else \"FAILED\") ++ \". \"\n\
         \x20   ++ show passed ++ \" passed; \" ++ show (length failed) ++ \" failed; 0 ignored; 0 measured; 0 filtered out\")\n\
         \x20 IO.hFlush IO.stdout\n\
         \x20 if null failed then Exit.exitSuccess else Exit.exitWith (Exit.ExitFailure 1)\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(modules: Vec<TestModule>) -> RunLayout {
        RunLayout {
            work: "/work".into(),
            harness: "/fleet".into(),
            test_paths: modules.iter().map(|m| m.path.clone()).collect(),
            canary: Some(canary("ab12")),
            test_modules: modules,
            guard: None,
        }
    }

    fn spec() -> TestModule {
        TestModule {
            path: "test/Spec.hs".into(),
            module: "Spec".into(),
            properties: vec!["prop_lifo".into(), "prop_push_pop".into()],
        }
    }

    fn argv(c: &str) -> Vec<String> {
        c.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn ghc_is_pinned_and_the_roots_come_from_the_command_and_the_test_files() {
        let inv = invocation(&argv("runghc -isrc test/Spec.hs"), &layout(vec![spec()])).unwrap();
        let a = &inv.argv;
        assert_eq!(&a[..2], &["env", "-i"]);
        assert!(a.contains(&"GHC_ENVIRONMENT=-".to_string()));
        let at = |flag: &str| a.iter().position(|x| x == flag).unwrap();
        assert_eq!(a[at("-package-env") + 1], "-");
        assert!(a.contains(&"-no-user-package-db".to_string()));
        assert!(a.contains(&"-XSafe".to_string()));
        assert!(at("-hide-all-packages") < at("-package"));
        assert!(a.contains(&"QuickCheck".to_string()));
        // `-i` alone clears ghc's search path (the working folder) before the roots.
        assert!(at("-i") < at("-i/work/src") && at("-i/work/src") < at("-i/work/test"));
        assert_eq!(a[at("-outputdir") + 1], "/fleet/out/ghc");
        assert_eq!(a.last().unwrap(), "/fleet/hs/FleetRunner.hs");
        assert_eq!(inv.report, ReportSource::LibtestStdout);
        assert_eq!(inv.harness_files[0].0, RUNNER_FILE);
    }

    #[test]
    fn the_runner_checks_every_property_seeded_and_the_canary() {
        let src = runner_source(&[spec()], Some(&canary("ab12")));
        assert!(src.contains("import qualified Spec as T0"));
        assert!(src.contains("check \"Spec::prop_lifo\" (QC.property T0.prop_lifo)"));
        assert!(src.contains("check \"Spec::prop_push_pop\""));
        assert!(src.contains("FleetCanary::prop_fleet_canary_ab12\" (QC.property False)"));
        assert!(src.contains("QC.replay = Just (QCR.mkQCGen 0, 0)"));
        assert!(src.contains("QC.chatty = False"));
        assert!(src.contains("running 3 tests"));
        assert!(src.contains("import qualified \"QuickCheck\" Test.QuickCheck as QC"));
    }

    #[test]
    fn flags_that_are_not_roots_and_names_that_could_inject_code_are_refused() {
        for c in [
            "ghc -pgmF ./evil test/Spec.hs",
            "runghc -package-env ./env test/Spec.hs",
            "cabal test",
            "runghc -i/etc test/Spec.hs",
            "runghc -i../x test/Spec.hs",
            "sh -c runghc",
        ] {
            assert!(
                matches!(
                    invocation(&argv(c), &layout(vec![spec()])),
                    Err(LangError::WrongRunner { .. })
                ),
                "{c}"
            );
        }
        let mut evil = spec();
        evil.properties.push("prop_x) >> evil".into());
        assert!(matches!(
            invocation(&argv("runghc"), &layout(vec![evil])),
            Err(LangError::BadTestModule(_))
        ));
        let mut misplaced = spec();
        misplaced.module = "Data.Spec".into();
        assert!(invocation(&argv("runghc"), &layout(vec![misplaced])).is_err());
        assert!(invocation(&argv("runghc"), &layout(vec![])).is_err());
    }

    #[test]
    fn names_are_checked_strictly() {
        assert!(is_module_name("Data.Stack") && is_module_name("Spec'"));
        assert!(!is_module_name("data.Stack") && !is_module_name("A..B") && !is_module_name(""));
        assert!(is_property_name("prop_push_pop'") && !is_property_name("push"));
        assert!(!is_property_name("prop_x y"));
        let m = TestModule {
            path: "test/Data/StackSpec.hs".into(),
            module: "Data.StackSpec".into(),
            properties: vec![],
        };
        assert_eq!(root_of(&m).as_deref(), Some("test"));
        let top = TestModule {
            path: "Spec.hs".into(),
            module: "Spec".into(),
            properties: vec![],
        };
        assert_eq!(root_of(&top).as_deref(), Some(""));
    }
}
