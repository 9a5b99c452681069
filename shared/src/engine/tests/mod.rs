//! Engine tests: the helpers every room of tests shares (bundles, runs, results), and
//! - `factory_runs.rs`: runs of the shipped factory graph (happy path, attempts and briefs,
//!   duplicates and stale attempts, dead jobs, cancel, visit budgets);
//! - `graphs.rs`: parallel paths and node kinds (fork and join, fan-out, approvals, advisory and
//!   observer nodes, stuck detection, write scopes);
//! - `children.rs`: child runs: a tree played through by an in-memory driver in any order,
//!   its bounds, cancels cascading, first failures, reports that must not count;
//! - `siblings.rs`: events between sibling runs: delivered once to the running siblings only;
//! - `deadlines.rs`: started and queued deadlines, re-issues and restores (fencing);
//! - `stalls.rs`: a run that waits for nothing ended `run_stalled`, and the runs left alone;
//! - `join_order.rs`: property test: joins fire once and the run ends once whatever the order,
//!   duplicates and stale attempts of the branch results;
//! - `stored.rs`: run states of the previous version (times as text) read; what is written reads
//!   back.

use super::*;
use crate::factory;
use crate::graph::load_bundle;
use crate::ids::{Attempt, JobId, NodeId, RunId};
use crate::messages::{AgentConfig, JobResult, JobSpec, JobStatus, RepoSnapshot, Usage};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use std::collections::BTreeMap;

mod budget;
mod children;
mod deadlines;
mod factory_runs;
mod graph_view;
mod graphs;
mod join_order;
mod quarantine;
mod sessions;
mod siblings;
mod stalls;
mod stored;

fn factory_bundle() -> GraphBundle {
    load_bundle(
        "graphs/factory/graph.yaml",
        include_str!("../../../../graphs/factory/graph.yaml"),
        |p| match p {
            "templates/se.md.j2" => {
                Ok(include_str!("../../../../graphs/factory/templates/se.md.j2").into())
            }
            "schemas/patch_proposal.json" => {
                Ok(include_str!("../../../../graphs/factory/schemas/patch_proposal.json").into())
            }
            "schemas/factory_input.json" => {
                Ok(include_str!("../../../../graphs/factory/schemas/factory_input.json").into())
            }
            other => Err(format!("unexpected {other}")),
        },
    )
    .expect("the shipped factory graph passes the checker")
}

fn assembler(name: &str) -> Option<Assembler> {
    (name == "factory_summary").then_some(factory::summarize as Assembler)
}

fn new_run(bundle: &GraphBundle, max_attempts: u32) -> RunState {
    let input = json!({"work_order": {}, "options": {"max_attempts": max_attempts}});
    RunState::new(
        super::NewRun {
            run_id: RunId::new("r1"),
            graph_ref: "graph-ref".into(),
            input,
            meta: json!({"repo_tree_hash_before": "t0"}),
            repo: RepoSnapshot {
                url: "repo".into(),
                base_commit: "c0".into(),
                packs: vec!["p0".into()],
            },
            agent: AgentConfig::default(),
        },
        bundle,
        time(0),
    )
}

/// A fixed time: `n` seconds after the tests' epoch.
fn time(n: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_795_341_600 + n, 0).expect("a time in range")
}

fn step(bundle: &GraphBundle, state: &RunState, event: Event) -> Transition {
    apply(bundle, state, &event, &assembler).expect("event applies")
}

fn result(job: &JobId, attempt: Attempt, status: JobStatus, output: Value) -> Event {
    Event::JobFinished {
        result: Box::new(JobResult {
            v: 1,
            job_id: job.clone(),
            run_id: RunId::new("r1"),
            attempt,
            status,
            output,
            error: (status != JobStatus::Ok).then(|| "boom".to_string()),
            commit: Some(format!("commit-of-{job}")),
            pack: Some(format!("pack-of-{job}")),
            artifacts: BTreeMap::new(),
            usage: Usage::default(),
            worker: "w".into(),
            execution: "e1-test".into(),
            started_at: time(0),
            finished_at: time(1),
            container_seconds: 0.0,
            cached_from: None,
            events: Vec::new(),
        }),
        at: time(0),
    }
}

fn published(t: &Transition) -> &JobSpec {
    match t.effects.as_slice() {
        [Effect::Publish(spec)] => spec,
        other => panic!("expected one publish, got {other:?}"),
    }
}

fn bundle(yaml: &str) -> GraphBundle {
    load_bundle("t.yaml", yaml, |p| match p {
        "t.md" => Ok("go".into()),
        "s.json" => Ok(r#"{"type":"object"}"#.into()),
        other => Err(format!("unexpected {other}")),
    })
    .unwrap_or_else(|e| panic!("{e:?}"))
}

fn jobs_of(t: &Transition) -> Vec<JobSpec> {
    t.effects
        .iter()
        .filter_map(|e| match e {
            Effect::Publish(s) => Some((**s).clone()),
            _ => None,
        })
        .collect()
}

fn ok(job: &JobId, output: Value) -> Event {
    result(job, 1, JobStatus::Ok, output)
}

const FORK_JOIN: &str = r#"
name: fj
start: skel
nodes:
  skel:
    kind: harness
    op: noop
    routes: [{to: [tests, impl]}]
  tests:
    kind: harness
    op: noop
    routes: [{to: meet}]
  impl:
    kind: harness
    op: noop
    routes: [{to: meet}]
  meet:
    kind: join
    wait_for: [tests, impl]
    routes: [{to: done}]
  done:
    kind: exit
    status: meet.ok
"#;
