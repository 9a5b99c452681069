use super::identity::{factory_run_id, RunIdentity};
use super::named_tests::NamedTests;
use crate::hashing::{canonical_hash, sha256_hex};
use crate::paths::normalize_relative;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use thiserror::Error;

pub const MAX_CONTEXT_FILES: usize = 10;
pub const MAX_CONTEXT_BYTES: usize = 200 * 1024;

/// Directories the stable tree hash leaves out (the seed's list).
pub const TREE_EXCLUDED_DIRS: &[&str] = &[
    ".git",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".venv",
    "venv",
    "env",
    "node_modules",
];

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Preflight,
    LlmOutputInvalid,
    PatchScopeViolation,
    PatchApplyFailed,
    /// The patch uses what code written by agents may not (the policy's allow-lists).
    PolicyRefused,
    VerifyFailed,
    AcceptanceFailed,
    /// The guard saw the code under test reach the test runner, or a must-fail twin passed.
    RunnerTampered,
    /// The spec's checks passed under the test runner and failed outside it, or the reverse.
    RunnerDiffers,
    /// The acceptance tests passed over code that fails the work order's own checks.
    TestsMissSpec,
    Exception,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkOrder {
    pub id: String,
    pub title: String,
    pub intent: String,
    pub allowed_files: Vec<String>,
    pub forbidden: Vec<String>,
    pub acceptance_commands: Vec<String>,
    pub context_files: Vec<String>,
    #[serde(default)]
    pub notes: Option<String>,
    /// Acceptance by named tests (SWE-bench items): the harness applies their test patch after
    /// the agent's patch and judges each named test; `acceptance_commands` may then be empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tests: Option<NamedTests>,
    /// The intent as executable examples and properties, checked by the harness itself
    /// (`shared::speccheck`): planted among the acceptance tests and run outside the runner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<crate::speccheck::SpecChecks>,
    /// Names the policy for code written by agents allows beyond its defaults (modules,
    /// builtins, dotted names: `os`, `open`, `sys.maxsize`), checked on the patch by TR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_allow: Option<Vec<String>>,
    /// Examples of the intent (any JSON); their literals feed the special-casing signals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub examples: Option<Value>,
}

/// Entries of `policy_allow`, at most, and their length.
pub const MAX_POLICY_ALLOW: usize = 100;
const MAX_POLICY_NAME: usize = 200;

/// A name the policy can allow: dotted identifiers, or `*` (the policy off).
fn valid_policy_name(name: &str) -> bool {
    name == "*"
        || (!name.is_empty()
            && name.len() <= MAX_POLICY_NAME
            && name.split('.').all(|seg| {
                !seg.is_empty()
                    && !seg.starts_with(|c: char| c.is_ascii_digit())
                    && seg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            }))
}

#[derive(Debug, Error, PartialEq)]
pub enum WorkOrderError {
    #[error("work order is malformed: {0}")]
    Malformed(String),
    #[error("work order field `{field}`: {message}")]
    Field { field: String, message: String },
}

fn field(field: &str, message: impl Into<String>) -> WorkOrderError {
    WorkOrderError::Field {
        field: field.to_string(),
        message: message.into(),
    }
}

impl WorkOrder {
    pub fn from_value(value: &Value) -> Result<Self, WorkOrderError> {
        let wo: WorkOrder = serde_json::from_value(value.clone())
            .map_err(|e| WorkOrderError::Malformed(e.to_string()))?;
        wo.validate()?;
        Ok(wo)
    }

    /// The seed's rules: relative paths without drive letters or `..`, non-empty acceptance
    /// commands (unless the order names its tests), at most 10 context files, all of them
    /// allowed; named tests well-formed and out of the write scope's reach
    /// ([`NamedTests::check`]).
    pub fn validate(&self) -> Result<(), WorkOrderError> {
        for (name, paths) in [
            ("allowed_files", &self.allowed_files),
            ("context_files", &self.context_files),
        ] {
            for (i, p) in paths.iter().enumerate() {
                normalize_relative(p).map_err(|e| field(&format!("{name}[{i}]"), e.to_string()))?;
            }
        }
        if let Some(tests) = &self.tests {
            tests
                .check(&self.allowed_files)
                .map_err(|e| field(&format!("tests.{}", e.field), e.message))?;
        } else if self.acceptance_commands.is_empty() {
            return Err(field("acceptance_commands", "must not be empty"));
        }
        for (i, c) in self.acceptance_commands.iter().enumerate() {
            super::split_command(c).map_err(|e| field(&format!("acceptance_commands[{i}]"), e))?;
        }
        let allow = self.policy_allow.as_deref().unwrap_or_default();
        if allow.len() > MAX_POLICY_ALLOW {
            return Err(field(
                "policy_allow",
                format!("at most {MAX_POLICY_ALLOW} names, got {}", allow.len()),
            ));
        }
        for (i, name) in allow.iter().enumerate() {
            if !valid_policy_name(name) {
                return Err(field(
                    &format!("policy_allow[{i}]"),
                    format!(
                        "`{}` is not a dotted name (or `*`)",
                        crate::text::head(name, 60)
                    ),
                ));
            }
        }
        if let Some(c) = &self.checks {
            c.validate().map_err(|e| field("checks", e))?;
        }
        if self.context_files.len() > MAX_CONTEXT_FILES {
            return Err(field(
                "context_files",
                format!(
                    "at most {MAX_CONTEXT_FILES} files, got {}",
                    self.context_files.len()
                ),
            ));
        }
        let allowed: Vec<String> = self
            .allowed_files
            .iter()
            .filter_map(|p| normalize_relative(p).ok())
            .collect();
        for c in &self.context_files {
            let n = normalize_relative(c).unwrap_or_default();
            if !allowed.contains(&n) {
                return Err(field(
                    "context_files",
                    format!("`{c}` is not in allowed_files (context_files must be a subset)"),
                ));
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FactoryOptions {
    #[serde(default = "two")]
    pub max_attempts: u32,
    #[serde(default)]
    pub temperature: f64,
    #[serde(default = "six_hundred")]
    pub timeout_seconds: u64,
}

fn two() -> u32 {
    2
}
fn six_hundred() -> u64 {
    600
}

impl Default for FactoryOptions {
    fn default() -> Self {
        Self {
            max_attempts: 2,
            temperature: 0.0,
            timeout_seconds: 600,
        }
    }
}

/// What `prepare` computes at submission; stored as the run's `meta`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FactoryMeta {
    pub run_id: String,
    pub work_order_hash: String,
    pub config_hash: String,
    pub repo_tree_hash_before: String,
    pub model: String,
    /// The hash over everything the submission runs (`RunIdentity::submission_hash`); a
    /// submission naming this run with other contents is refused. Empty for runs submitted
    /// before it was recorded.
    #[serde(default)]
    pub submission_hash: String,
}

/// `sha256("{model}|{temperature}|{max_attempts}|{timeout_seconds}")`. Temperature is written
/// the way Python's `str(float)` writes it (`0.0`, `0.7`).
pub fn config_hash(model: &str, temperature: f64, max_attempts: u32, timeout: u64) -> String {
    let temp = if temperature.fract() == 0.0 {
        format!("{temperature:.1}")
    } else {
        format!("{temperature}")
    };
    sha256_hex(format!("{model}|{temp}|{max_attempts}|{timeout}").as_bytes())
}

/// The seed's stable tree hash over (relative path, bytes) of regular files: directories in
/// `TREE_EXCLUDED_DIRS` are skipped, paths sorted, each file hashed as `path \0 bytes \0`.
pub fn tree_hash<'a>(files: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut kept: Vec<(&str, &[u8])> = files
        .into_iter()
        .filter(|(p, _)| !tree_excluded(p))
        .collect();
    kept.sort_by(|a, b| a.0.cmp(b.0));
    let mut h = TreeHasher::default();
    for (path, bytes) in kept {
        h.add(path, bytes);
    }
    h.finish()
}

/// Whether the tree hash leaves `path` out (a directory in `TREE_EXCLUDED_DIRS` above it).
pub fn tree_excluded(path: &str) -> bool {
    path.split('/')
        .rev()
        .skip(1)
        .any(|dir| TREE_EXCLUDED_DIRS.contains(&dir))
}

/// [`tree_hash`] one file at a time, so no more than one file's bytes are held: the caller
/// adds the files [`tree_excluded`] keeps, sorted by path.
#[derive(Default)]
pub struct TreeHasher {
    h: Sha256,
}

impl TreeHasher {
    pub fn add(&mut self, path: &str, bytes: &[u8]) {
        self.begin(path);
        self.update(bytes);
        self.end();
    }

    /// A file added in parts: `begin`, its bytes in any number of `update`s, `end`.
    pub fn begin(&mut self, path: &str) {
        self.h.update(path.as_bytes());
        self.h.update([0u8]);
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.h.update(bytes);
    }

    pub fn end(&mut self) {
        self.h.update([0u8]);
    }

    pub fn finish(self) -> String {
        hex::encode(self.h.finalize())
    }
}

/// Validates a factory run's input, fills option defaults and computes the deterministic run id:
/// the seed's `sha256(work_order_hash + repo_tree_hash_before + config_hash)`, extended by the
/// submission hash over the graph, the whole agent, the commit and the normalized input
/// (`factory_run_id`), first 12 hex digits.
pub fn prepare(
    input: &Value,
    identity: &RunIdentity<'_>,
) -> Result<(Value, FactoryMeta), WorkOrderError> {
    let model = identity.agent.model_identity();
    let repo_tree_hash_before = identity.repo_tree_hash;
    let obj = input
        .as_object()
        .ok_or_else(|| WorkOrderError::Malformed("the input must be an object".into()))?;
    let wo_value = obj
        .get("work_order")
        .ok_or_else(|| field("work_order", "missing"))?;
    WorkOrder::from_value(wo_value)?;
    let options: FactoryOptions = match obj.get("options") {
        None | Some(Value::Null) => FactoryOptions::default(),
        Some(v) => {
            serde_json::from_value(v.clone()).map_err(|e| field("options", e.to_string()))?
        }
    };
    if options.max_attempts == 0 {
        return Err(field("options.max_attempts", "must be at least 1"));
    }
    let work_order_hash = canonical_hash(wo_value);
    let config_hash = config_hash(
        &model,
        options.temperature,
        options.max_attempts,
        options.timeout_seconds,
    );
    let mut normalized = input.clone();
    normalized["options"] = json!(options);
    if normalized.get("work_order_path").is_none() {
        normalized["work_order_path"] = json!("");
    }
    let submission_hash = identity.submission_hash(&normalized);
    let run_id = factory_run_id(
        &work_order_hash,
        repo_tree_hash_before,
        &config_hash,
        &submission_hash,
    );
    Ok((
        normalized,
        FactoryMeta {
            run_id,
            work_order_hash,
            config_hash,
            repo_tree_hash_before: repo_tree_hash_before.to_string(),
            model,
            submission_hash,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::tests::{arb_json, arb_text, cases, timed, CASE_LIMIT};
    use proptest::prelude::*;

    /// Paths as people and agents write them, good and bad.
    fn arb_path() -> impl Strategy<Value = String> {
        prop_oneof![
            8 => "[a-c][a-c./]{0,8}",
            1 => "[a-c./\\\\:C ]{0,10}",
            1 => arb_text(),
            1 => prop::sample::select(vec!["calc.py", "../x", "/abs", "C:/x", "a/../b", "."])
                .prop_map(str::to_string),
        ]
    }

    /// A command line with quotes, escapes and blanks in any balance.
    fn arb_command() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => "[a-c]{1,5}( [a-c-]{1,4}){0,3}",
            1 => "[a-c '\"\\\\$`;|&\n-]{0,16}",
            1 => arb_text(),
        ]
    }

    /// A factory input: a work order with the right fields (each sometimes any JSON), options.
    fn arb_input() -> impl Strategy<Value = Value> {
        let or_any = |good: BoxedStrategy<Value>| prop_oneof![9 => good, 1 => arb_json()];
        let paths = || {
            prop::collection::vec(arb_path(), 0..5)
                .prop_map(|p| json!(p))
                .boxed()
        };
        let commands = prop::collection::vec(arb_command(), 0..3).prop_map(|c| json!(c));
        let order = (
            or_any(arb_text().prop_map(Value::from).boxed()),
            or_any(paths()),
            prop::option::weighted(0.3, or_any(paths())),
            any::<prop::sample::Index>(),
            or_any(commands.boxed()),
            prop::option::weighted(0.05, arb_json()),
        )
            .prop_map(|(text, allowed, context, cut, commands, extra)| {
                // Mostly, the context files are some of the allowed ones.
                let context = context.unwrap_or_else(|| match allowed.as_array() {
                    Some(a) => json!(a[..cut.index(a.len() + 1)]),
                    None => json!([]),
                });
                let mut wo = json!({"id": text, "title": text, "intent": text, "forbidden": [],
                    "allowed_files": allowed, "context_files": context,
                    "acceptance_commands": commands});
                if let Some(extra) = extra {
                    wo["extra"] = extra;
                }
                wo
            });
        let options = prop_oneof![
            Just(Value::Null),
            (any::<u32>(), any::<f64>(), any::<u64>()).prop_map(|(a, t, s)| {
                json!({"max_attempts": a, "temperature": serde_json::Number::from_f64(t),
                       "timeout_seconds": s})
            }),
            arb_json(),
        ];
        prop_oneof![
            4 => (order, options).prop_map(|(wo, o)| json!({"work_order": wo, "options": o})),
            1 => arb_json(),
        ]
    }

    proptest! {
        #![proptest_config(cases(256))]

        /// Work orders are the submitter's: any input is prepared or refused, quickly, and a
        /// prepared one keeps to the seed's rules.
        #[test]
        fn any_factory_input_is_prepared_or_refused(input in arb_input(), model in arb_text()) {
            let agent = llm(&model);
            let identity = at(&agent, "g", "tree");
            let (prepared, took) = timed(|| prepare(&input, &identity));
            prop_assert!(took < CASE_LIMIT);
            if let Ok((normalized, meta)) = prepared {
                prop_assert_eq!(meta.run_id.len(), 12);
                let wo = WorkOrder::from_value(&normalized["work_order"]).unwrap();
                prop_assert!(wo.context_files.len() <= MAX_CONTEXT_FILES);
                for p in wo.allowed_files.iter().chain(&wo.context_files) {
                    let n = normalize_relative(p).unwrap();
                    prop_assert!(!n.starts_with('/') && !n.split('/').any(|c| c == ".."));
                }
                prop_assert!(!wo.acceptance_commands.is_empty());
            }
        }
    }

    fn order() -> Value {
        json!({
            "id": "wo-1", "title": "t", "intent": "i",
            "allowed_files": ["calc.py", "tests/test_calc.py"],
            "forbidden": [], "acceptance_commands": ["python -m pytest -q"],
            "context_files": ["calc.py"]
        })
    }

    #[test]
    fn accepts_a_good_work_order() {
        assert!(WorkOrder::from_value(&order()).is_ok());
    }

    #[test]
    fn refuses_the_seeds_bad_cases() {
        let cases = [
            ("allowed_files", json!(["../x.py"])),
            ("allowed_files", json!(["/abs.py"])),
            ("allowed_files", json!(["C:/x.py"])),
            ("acceptance_commands", json!([])),
            ("context_files", json!(["other.py"])),
        ];
        for (key, value) in cases {
            let mut wo = order();
            wo[key] = value;
            let err = WorkOrder::from_value(&wo).unwrap_err().to_string();
            assert!(err.contains(key), "{key}: {err}");
        }
        let mut wo = order();
        wo["context_files"] = json!((0..11).map(|i| format!("f{i}.py")).collect::<Vec<_>>());
        wo["allowed_files"] = wo["context_files"].clone();
        assert!(WorkOrder::from_value(&wo)
            .unwrap_err()
            .to_string()
            .contains("at most 10"));
        for bad in [
            json!(["os", ""]),
            json!(["os path"]),
            json!(["a..b"]),
            json!("os"),
        ] {
            let mut wo = order();
            wo["policy_allow"] = bad.clone();
            let err = WorkOrder::from_value(&wo).unwrap_err().to_string();
            assert!(
                err.contains("policy_allow") || err.contains("malformed"),
                "{bad}: {err}"
            );
        }
        let mut wo = order();
        wo["policy_allow"] = json!(["os", "sys.maxsize", "open", "*"]);
        wo["examples"] = json!([{"input": [3, 4], "expected": 12}]);
        let parsed = WorkOrder::from_value(&wo).unwrap();
        assert_eq!(parsed.policy_allow.unwrap().len(), 4);
        let mut wo = order();
        wo.as_object_mut().unwrap().remove("intent");
        assert!(matches!(
            WorkOrder::from_value(&wo),
            Err(WorkOrderError::Malformed(_))
        ));
    }

    fn llm(model: &str) -> crate::messages::AgentConfig {
        crate::messages::AgentConfig::Anthropic(crate::messages::LlmConfig {
            model: model.into(),
            temperature: 0.0,
            max_tokens: 4096,
            max_turns: 20,
        })
    }

    fn at<'a>(
        agent: &'a crate::messages::AgentConfig,
        graph: &'a str,
        tree: &'a str,
    ) -> RunIdentity<'a> {
        RunIdentity {
            graph_hash: graph,
            agent,
            base_commit: "commit",
            repo_tree_hash: tree,
        }
    }

    #[test]
    fn run_id_is_deterministic_and_input_sensitive() {
        let input = json!({"work_order": order()});
        let (m, m2) = (llm("m"), llm("m2"));
        let (_, a) = prepare(&input, &at(&m, "g", "tree")).unwrap();
        let (_, b) = prepare(&input, &at(&m, "g", "tree")).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.run_id.len(), 12);
        assert_eq!(a.model, "anthropic:m");
        let (_, c) = prepare(&input, &at(&m, "g", "tree2")).unwrap();
        assert_ne!(a.run_id, c.run_id);
        let (_, d) = prepare(&input, &at(&m2, "g", "tree")).unwrap();
        assert_ne!(a.run_id, d.run_id);
        // The graph bundle is part of the run: an edited graph is a new run.
        let (_, e) = prepare(&input, &at(&m, "g2", "tree")).unwrap();
        assert_ne!(a.run_id, e.run_id);
        assert_ne!(a.submission_hash, e.submission_hash);
        // So is every parameter of the agent, not only its model.
        let mut turns = llm("m");
        if let crate::messages::AgentConfig::Anthropic(c) = &mut turns {
            c.max_turns = 5;
        }
        let (_, f) = prepare(&input, &at(&turns, "g", "tree")).unwrap();
        assert_ne!(a.run_id, f.run_id);
        // Where the work order was read from is not.
        let moved = json!({"work_order": order(), "work_order_path": "/elsewhere/wo.json"});
        let (_, g) = prepare(&moved, &at(&m, "g", "tree")).unwrap();
        assert_eq!(a.run_id, g.run_id);
    }

    #[test]
    fn config_hash_matches_pythons_formatting() {
        // sha256(b"m|0.0|2|600") as Python computes it.
        assert_eq!(config_hash("m", 0.0, 2, 600), sha256_hex(b"m|0.0|2|600"));
        assert_eq!(config_hash("m", 0.5, 2, 600), sha256_hex(b"m|0.5|2|600"));
    }

    #[test]
    fn tree_hash_skips_excluded_dirs_and_sorts() {
        let a = tree_hash([("b.py", &b"2"[..]), ("a.py", &b"1"[..])]);
        let b = tree_hash([
            ("a.py", &b"1"[..]),
            ("__pycache__/a.pyc", &b"x"[..]),
            ("b.py", &b"2"[..]),
        ]);
        assert_eq!(a, b);
        let c = tree_hash([("a.py", &b"1"[..]), ("b.py", &b"3"[..])]);
        assert_ne!(a, c);
    }
}
