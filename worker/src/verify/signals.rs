//! Special-casing signals of a test run that must pass (the hybrid graph's validate and
//! recheck): every line of the files agents wrote (`code_under_test`; they wrote them whole)
//! that compares, branches on, keys a dict by or returns a literal of the tests or of the
//! spec's checks (`shared::special_case`). Reported on the run, never a verdict: the harness's
//! own checks over drawn inputs are what turn a suspicion into a failure.

use super::{plant, TestRunParams};
use crate::safe_fs;
use shared::special_case::{self, AddedLine, SuspectedSpecialCase};
use std::collections::BTreeSet;
use std::path::Path;

/// The largest code or test file read for the signals.
const MAX_FILE: usize = 1 << 20;

/// The signals of the worktree at `root` (read after the run, the planted tests taken out).
pub fn special_cases(root: &Path, params: &TestRunParams) -> Vec<SuspectedSpecialCase> {
    let mut known = BTreeSet::new();
    for file in plant::test_files(root, &params.test_paths) {
        if let Ok(text) = safe_fs::read_text_within(root, &file, MAX_FILE) {
            known.extend(special_case::literals(&text));
        }
    }
    if let Ok(Some(checks)) = params.all_checks() {
        for (_, c) in checks.each() {
            known.extend(special_case::literals(&c.check));
        }
    }
    let mut lines = Vec::new();
    for path in &params.code_under_test {
        let Ok(text) = safe_fs::read_text_within(root, path, MAX_FILE) else {
            continue;
        };
        lines.extend(text.lines().enumerate().map(|(i, l)| AddedLine {
            path: path.clone(),
            line: i + 1,
            text: l.to_string(),
        }));
    }
    special_case::suspected(&lines, &known)
}
