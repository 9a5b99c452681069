//! Mutation testing executed by the harness: `generate_mutants` makes mutants of the merged
//! implementation mechanically (tree-sitter, `crate::mutants`), selected deterministically with
//! a seed and a cap and cut into batches for a fan-out; `run_mutants` runs the frozen tests
//! against each mutant of a batch in one container; `tally_mutants` counts what the runs showed
//! and derives the verdict (`shared::mutation`). No agent's count enters. Reading, mutating,
//! parsing and writing sources run on the blocking pool (`generate` is called there).

use crate::harness::{Artifacts, StepOutcome};
use crate::mutants::{self, Mutant};
use crate::safe_fs;
use crate::verify::{self, bad_params, RunPlace, TestRunParams};
use serde::Deserialize;
use serde_json::{json, Value};
use shared::messages::JobStatus;
use shared::mutation::{MutantResult, MutantStatus};
use shared::testreport;
use std::collections::BTreeSet;
use std::path::Path;

/// Source files above this size are not mutated.
const SOURCE_CAP: usize = 1024 * 1024;

fn ok(output: Value) -> StepOutcome {
    StepOutcome {
        status: JobStatus::Ok,
        output,
        error: None,
    }
}

fn error(msg: String) -> StepOutcome {
    StepOutcome {
        status: JobStatus::Error,
        output: Value::Null,
        error: Some(msg),
    }
}

#[derive(Deserialize)]
struct GenerateParams {
    #[serde(default = "python")]
    language: String,
    impl_paths: Vec<String>,
    #[serde(default)]
    seed: u64,
    #[serde(default = "default_cap")]
    cap: usize,
    #[serde(default = "default_per_job")]
    per_job: usize,
}

fn python() -> String {
    "python".into()
}
fn default_cap() -> usize {
    40
}
fn default_per_job() -> usize {
    4
}

/// `generate_mutants`: reads the implementation from the worktree (never following a link),
/// makes every mutant, keeps `cap` of them chosen by `seed`, and cuts them into batches.
pub fn generate(params: &Value, root: &Path) -> StepOutcome {
    let p: GenerateParams = match serde_json::from_value(params.clone()) {
        Ok(p) => p,
        Err(e) => return bad_params(e),
    };
    let Some(mutator) = mutants::mutator(&p.language) else {
        return error(format!("no mutant generator for `{}`", p.language));
    };
    let mut all = Vec::new();
    let mut skipped = Vec::new();
    for path in &p.impl_paths {
        if !mutator.handles(path) {
            skipped.push(json!({"path": path, "why": "not a source file of the language"}));
            continue;
        }
        let source = match safe_fs::read_text_within(root, path, SOURCE_CAP) {
            Ok(s) => s,
            Err(e) => {
                return StepOutcome {
                    status: JobStatus::Failed,
                    output: json!({"path": path}),
                    error: Some(format!("cannot read the implementation: {e}")),
                }
            }
        };
        match mutator.mutants(path, &source) {
            Ok(m) => all.extend(m),
            Err(e) => {
                return StepOutcome {
                    status: JobStatus::Failed,
                    output: json!({"path": path}),
                    error: Some(format!("the implementation does not parse: {e}")),
                }
            }
        }
    }
    let generated = all.len();
    let mut by_type = std::collections::BTreeMap::<String, usize>::new();
    for m in &all {
        *by_type.entry(m.mutation_type.to_string()).or_default() += 1;
    }
    let chosen = mutants::select(all, p.seed, p.cap);
    let batches = mutants::batches(&chosen, p.per_job.max(1));
    ok(json!({
        "generated": generated,
        "selected": chosen.len(),
        "seed": p.seed,
        "cap": p.cap,
        "by_type": by_type,
        "skipped": skipped,
        "batches": batches,
    }))
}

#[derive(Deserialize)]
struct RunParams {
    mutants: Vec<Mutant>,
    tests: TestRunParams,
    /// Seconds the unmutated tests took (validate's run): sets each mutant's time limit.
    #[serde(default)]
    baseline_seconds: f64,
}

/// `run_mutants`: the frozen tests against each mutant of the batch, one after another in this
/// job's container. The worktree is restored after every mutant.
pub async fn run(
    params: &Value,
    place: &RunPlace<'_>,
    seed: &str,
    art: &mut Artifacts<'_>,
) -> Result<StepOutcome, crate::blobs::BlobError> {
    let mut p: RunParams = match serde_json::from_value(params.clone()) {
        Ok(p) => p,
        Err(e) => return Ok(bad_params(e)),
    };
    let Some(frozen) = p.tests.frozen.clone() else {
        return Ok(bad_params("run_mutants needs the frozen tests"));
    };
    if let Err(e) = verify::lay_down_frozen(place.wt, &frozen, &p.tests.test_paths).await {
        return Ok(error(e));
    }
    // A mutant gets four times the baseline plus slack, within [10 s, 300 s].
    p.tests.timeout_seconds = ((p.baseline_seconds * 4.0 + 10.0).clamp(10.0, 300.0)) as u64;
    // The tests are laid down once; each run below is judged against the frozen set.
    let frozen_ids: BTreeSet<String> = frozen.tests.iter().cloned().collect();
    p.tests.frozen = None;
    // The implementation was validated by a guarded run with twins; a mutant run keeps the
    // guard's start and end (a tampering mutant only makes mutants survive, never a pass).
    p.tests.twins = false;
    let root = &place.wt.dir;
    let mut results = Vec::new();
    for m in &p.mutants {
        let started = std::time::Instant::now();
        let laid = {
            let (root, m, language) = (root.clone(), m.clone(), p.tests.language.clone());
            safe_fs::blocking(move || lay_mutant(&root, &m, &language)).await
        };
        let status = match laid {
            Err(e) => return Ok(error(e)),
            Ok(None) => MutantStatus::Unviable,
            Ok(Some(original)) => {
                let obs = verify::observe(place, &p.tests, &format!("{seed}:{}", m.id)).await;
                let restored = {
                    let (root, path) = (root.clone(), m.path.clone());
                    safe_fs::blocking(move || {
                        safe_fs::write_beneath(&root, &path, original.as_bytes())
                    })
                    .await
                };
                if let Err(e) = restored {
                    return Ok(error(format!("cannot restore `{}`: {e}", m.path)));
                }
                match obs {
                    Err(e) => return Ok(error(e)),
                    Ok(o) if o.timed_out => MutantStatus::TimedOut,
                    Ok(o) => match &o.report {
                        Ok(r) => {
                            let judged = testreport::judge_pass(
                                r,
                                o.exit_code,
                                Some(&frozen_ids),
                                &Default::default(),
                            );
                            if judged.ok {
                                MutantStatus::Survived
                            } else {
                                MutantStatus::Killed
                            }
                        }
                        // A broken run (no report, import error) detected the mutant.
                        Err(_) => MutantStatus::Killed,
                    },
                }
            }
        };
        results.push(MutantResult {
            id: m.id.clone(),
            mutation_type: m.mutation_type.to_string(),
            function: m.function.clone(),
            path: m.path.clone(),
            line: m.line,
            description: m.description.clone(),
            status,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    let output = json!({"results": results});
    art.put_json("mutants.json", &output).await?;
    Ok(ok(output))
}

/// Writes the mutant `m` over its file; returns the original source to restore, `None` when the
/// mutant is unviable (it does not apply or does not parse), `Err` when the file cannot be read
/// or written.
fn lay_mutant(root: &Path, m: &Mutant, language: &str) -> Result<Option<String>, String> {
    let original = safe_fs::read_text_within(root, &m.path, SOURCE_CAP)
        .map_err(|e| format!("cannot read `{}`: {e}", m.path))?;
    let mutator = mutants::mutator(language);
    let Some(mutated) = mutants::apply(&original, m)
        .ok()
        .filter(|src| mutator.as_ref().is_some_and(|l| l.parses(src)))
    else {
        return Ok(None);
    };
    safe_fs::write_beneath(root, &m.path, mutated.as_bytes())
        .map_err(|e| format!("cannot write the mutant: {e}"))?;
    Ok(Some(original))
}

/// `tally_mutants`: the fan-out's arrivals (branch -> `run_mutants` output) counted.
pub fn tally(params: &Value) -> StepOutcome {
    let mut results: Vec<MutantResult> = Vec::new();
    let arrivals = params.get("arrivals").cloned().unwrap_or(Value::Null);
    let outputs: Vec<Value> = match arrivals {
        Value::Object(m) => m.into_iter().map(|(_, v)| v).collect(),
        Value::Array(a) => a,
        _ => Vec::new(),
    };
    let mut missing_batches = 0;
    for out in outputs {
        match out
            .get("results")
            .cloned()
            .map(serde_json::from_value::<Vec<MutantResult>>)
        {
            Some(Ok(r)) => results.extend(r),
            _ => missing_batches += 1,
        }
    }
    results.sort_by(|a, b| a.id.cmp(&b.id));
    let t = shared::mutation::tally(&results);
    let mut output = json!(t);
    output["results"] = json!(results);
    output["missing_batches"] = json!(missing_batches);
    if missing_batches > 0 {
        return StepOutcome {
            status: JobStatus::Failed,
            error: Some(format!(
                "{missing_batches} batch(es) of mutants have no results"
            )),
            output,
        };
    }
    ok(output)
}
