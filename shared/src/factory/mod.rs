//! The factory seed's harness rules (SE → TR → PO): work-order validation, deterministic ids
//! (and the run identity of every submission, `identity.rs`),
//! the bounded FailureBrief and `run_summary.json`, and the
//! check that a local output directory lies outside the product repository. SWE-bench
//! instances become work orders (`swe.rs`) accepted by named tests (`named_tests.rs`); the
//! paths a patch names are read without git (`patch_paths.rs`).

mod brief;
mod identity;
mod named_tests;
mod out_dir;
mod patch_paths;
mod summary;
mod swe;
mod work_order;

pub use brief::strip_host_paths;
pub use brief::{
    brief_for_next_attempt, failure_brief_function, failure_brief_of, FailureBrief, EXCERPT_CHARS,
    EXCERPT_LINES, FAILURE_BRIEF_FUNCTION,
};
pub use identity::{factory_run_id, valid_run_id, RunIdentity};
pub use named_tests::{
    check_node_id, judge_named, junit_id, node_file, ListJudgement, NamedJudgement, NamedTests,
    NamedTestsError, NotPassing, MAX_NAMED_TESTS,
};
pub use out_dir::{check_out_dir, resolve_below, OutDirError};
pub use patch_paths::{patch_files, patch_paths, PatchError, PatchFile};
pub use summary::{summarize, AttemptRecord, CmdResult, RunSummary};
pub use swe::{is_swe_line, mirror_folder, swe_item, valid_mirror_name, SweError, SweItem};
pub use work_order::{
    config_hash, prepare, tree_excluded, tree_hash, FactoryMeta, FactoryOptions, Stage, TreeHasher,
    WorkOrder, WorkOrderError, MAX_CONTEXT_BYTES, MAX_CONTEXT_FILES, TREE_EXCLUDED_DIRS,
};

/// The reminder every FailureBrief carries back to the SE.
pub const CONSTRAINTS_REMINDER: &str = "Output JSON with keys unified_diff and summary only. \
Touch only the allowed files. The harness applies the diff with `git apply`, then runs global \
verification and the acceptance commands.";

/// The seed's global verification fallback when `scripts/verify.sh` is absent.
pub fn verify_commands(has_verify_script: bool) -> Vec<Vec<String>> {
    let argv = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    if has_verify_script {
        vec![argv(&["bash", "scripts/verify.sh"])]
    } else {
        vec![
            argv(&["python", "-m", "compileall", "-q", "."]),
            argv(&["python", "-m", "pip", "--version"]),
            argv(&["python", "-m", "pytest", "-q"]),
        ]
    }
}

/// Splits an acceptance command with POSIX shell rules (no shell ever runs it).
pub fn split_command(command: &str) -> Result<Vec<String>, String> {
    match shlex::split(command) {
        Some(argv) if !argv.is_empty() => Ok(argv),
        Some(_) => Err(format!("empty command `{command}`")),
        None => Err(format!("unbalanced quotes in `{command}`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_with_shell_rules() {
        assert_eq!(
            split_command(r#"python -c "print('a b')""#).unwrap(),
            vec!["python", "-c", "print('a b')"]
        );
        assert!(split_command("echo 'open").is_err());
        assert!(split_command("  ").is_err());
    }

    #[test]
    fn verify_fallback_is_the_seeds_list() {
        assert_eq!(
            verify_commands(true),
            vec![vec!["bash", "scripts/verify.sh"]]
        );
        let fallback = verify_commands(false);
        assert_eq!(fallback.len(), 3);
        assert_eq!(fallback[2], vec!["python", "-m", "pytest", "-q"]);
    }
}
