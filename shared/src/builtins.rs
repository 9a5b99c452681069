//! The graph-specific code the platform runs, in one registry: result assemblers of exit
//! nodes (with the extra result files each writes) and prepare hooks of submissions. The
//! checker reads the names from here, the driver and the submission path call through here,
//! and nothing else in the platform names a graph. Adding a builtin is one entry below.

use crate::engine::{Assembler, RunState};
use crate::factory::RunIdentity;
use crate::graph::GraphBundle;
use serde_json::{json, Value};

/// A result assembler of exit nodes (`result: <name>`).
pub struct ResultAssembler {
    pub name: &'static str,
    pub assemble: Assembler,
    /// Files written next to `result.json` (under `runs/<run>/`) with the same content, when
    /// the result has a `verdict`.
    pub also_writes: &'static [&'static str],
}

/// Every result assembler.
pub const ASSEMBLERS: &[ResultAssembler] = &[
    ResultAssembler {
        name: "factory_summary",
        assemble: crate::factory::summarize,
        also_writes: &["run_summary.json"],
    },
    ResultAssembler {
        name: "hybrid_result",
        assemble: crate::hybrid::assemble,
        also_writes: &[],
    },
];

/// What a prepare hook makes of a submission's input: the input the run sees, its `meta`, and
/// the run id and submission hash it derives.
pub struct Prepared {
    pub input: Value,
    pub meta: Value,
    pub run_id: String,
    pub submission_hash: String,
}

type PrepareFn = fn(&Value, &RunIdentity<'_>) -> Result<Prepared, String>;

/// A graph's `prepare:` hook, run on its input at submission.
pub struct PrepareHook {
    pub name: &'static str,
    pub prepare: PrepareFn,
}

fn prepare_factory(input: &Value, identity: &RunIdentity<'_>) -> Result<Prepared, String> {
    let (input, meta) = crate::factory::prepare(input, identity).map_err(|e| e.to_string())?;
    Ok(Prepared {
        run_id: meta.run_id.clone(),
        submission_hash: meta.submission_hash.clone(),
        meta: json!(meta),
        input,
    })
}

/// Every prepare hook.
pub const PREPARE_HOOKS: &[PrepareHook] = &[PrepareHook {
    name: "factory",
    prepare: prepare_factory,
}];

/// The assembler called `name`, in the shape the engine takes.
pub fn assembler(name: &str) -> Option<Assembler> {
    ASSEMBLERS
        .iter()
        .find(|a| a.name == name)
        .map(|a| a.assemble)
}

pub fn is_assembler(name: &str) -> bool {
    ASSEMBLERS.iter().any(|a| a.name == name)
}

pub fn prepare_hook(name: &str) -> Option<&'static PrepareHook> {
    PREPARE_HOOKS.iter().find(|h| h.name == name)
}

/// A graph without a hook: the input as given, the run id and hash from the identity.
pub fn prepare_plain(input: &Value, identity: &RunIdentity<'_>) -> Prepared {
    let (run_id, submission_hash) = identity.run_id(input);
    Prepared {
        input: input.clone(),
        meta: json!({"repo_tree_hash_before": identity.repo_tree_hash, "submission_hash": submission_hash}),
        run_id,
        submission_hash,
    }
}

/// The result files of a finished run: `result.json`, and the files its graph's exit
/// assemblers also write (when the result carries a verdict).
pub fn result_files(bundle: &GraphBundle, state: &RunState) -> Vec<(String, Value)> {
    let Some(result) = &state.result else {
        return Vec::new();
    };
    let prefix = format!("runs/{}/", state.run_id);
    let mut files = vec![(format!("{prefix}result.json"), result.clone())];
    if result.get("verdict").is_some() {
        let used = bundle.graph.nodes.values().filter_map(|n| match &n.body {
            crate::graph::NodeBody::Exit { result, .. } => result.as_deref(),
            _ => None,
        });
        let mut extra: Vec<&str> = used
            .filter_map(|name| ASSEMBLERS.iter().find(|a| a.name == name))
            .flat_map(|a| a.also_writes.iter().copied())
            .collect();
        extra.sort_unstable();
        extra.dedup();
        files.extend(
            extra
                .into_iter()
                .map(|f| (format!("{prefix}{f}"), result.clone())),
        );
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_is_found_by_its_name_and_names_are_unique() {
        for a in ASSEMBLERS {
            assert!(assembler(a.name).is_some(), "{}", a.name);
            assert_eq!(ASSEMBLERS.iter().filter(|b| b.name == a.name).count(), 1);
        }
        for h in PREPARE_HOOKS {
            assert!(prepare_hook(h.name).is_some(), "{}", h.name);
        }
        assert!(assembler("bogus").is_none());
        assert!(prepare_hook("bogus").is_none());
    }
}
