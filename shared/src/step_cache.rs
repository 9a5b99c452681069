//! The content-addressed step cache: a job whose inputs are the same as an earlier job's
//! reuses that job's result instead of running again. Pure: what a step's key covers
//! ([`StepInputs`], [`step_key`]), which steps may be cached ([`cacheable`]) and
//! are worth a lookup ([`worth_a_lookup`]), which results may
//! be kept ([`keepable`]), and where a kept result's artifacts go in the job that reuses it
//! ([`relocate_artifacts`]). The worker looks keys up and stores entries
//! (`worker::runner::cache`).
//!
//! The key covers everything a step's result depends on: the worker's build, the node's
//! definition, its evaluated parameters and commands, the files it is given, its timeout and
//! write scope, the worktree (its commit when the node commits, so a reused commit is a child
//! of exactly this worktree's commit; else its tree: the same files give the same answer) and
//! the run's baseline tree, and the image's id (not its tag). Agent steps are cached only when
//! their graph asks (`defaults.cache_agent_steps`), and then their agent configuration (model,
//! scripted steps, seed), context and continued conversation are in the key too.
//!
//! Never kept: results of infrastructure failures (`error`, `timed_out`, `dead`), and results
//! whose test runs disagreed (`output.flaky`: a rerun is exactly what a flaky verdict needs):
//! a later job with the same inputs runs again. A verdict (`ok`, `failed`, `output_invalid`)
//! is kept.

use crate::graph::NodeKind;
use crate::hashing::canonical_hash;
use crate::messages::{JobResult, JobSpec, JobStatus, Usage};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The version of the key's form and of [`CacheEntry`]; a change makes every old entry a miss.
pub const STEP_CACHE_VERSION: u32 = 1;

/// Everything a step's key covers beyond the job spec, found by the worker.
#[derive(Clone, Debug, PartialEq)]
pub struct StepInputs<'a> {
    pub spec: &'a JobSpec,
    /// The node's definition in the graph bundle.
    pub node: &'a Value,
    /// The worker's build (its executable's identity): new harness code never reuses old
    /// results.
    pub build: &'a str,
    /// The worktree's commit when the node commits, its tree otherwise; none without one.
    pub worktree: Option<String>,
    /// The tree of the run's baseline (claims are checked against it).
    pub run_base_tree: Option<String>,
    /// The image's content id (`sha256:...`), when the step runs in a container.
    pub image_id: Option<String>,
}

/// Whether a step of this kind may be looked up at all: harness, command and git steps
/// always, agent steps when the graph opts in.
pub fn cacheable(kind: NodeKind, agent_steps: bool) -> bool {
    match kind {
        NodeKind::Harness | NodeKind::Command | NodeKind::Git => true,
        NodeKind::Agent => agent_steps,
        _ => false,
    }
}

/// Whether a lookup can pay for itself: a step that reads no worktree and runs no container
/// (a harness op over its parameters, such as `noop`) is computed in the worker's own process
/// faster than the store answers a lookup, and keeping it is one more write; it just runs.
/// Agent steps always can (a model's answer is the cost the cache saves).
pub fn worth_a_lookup(kind: NodeKind, has_worktree: bool, needs_container: bool) -> bool {
    kind == NodeKind::Agent || has_worktree || needs_container
}

/// Whether a result may be kept: a verdict, never an infrastructure failure.
pub fn keepable(status: JobStatus) -> bool {
    matches!(
        status,
        JobStatus::Ok | JobStatus::Failed | JobStatus::OutputInvalid
    )
}

/// The step's key: the sha256 of the canonical JSON of what it covers (64 hex digits).
pub fn step_key(inputs: &StepInputs<'_>) -> String {
    let spec = inputs.spec;
    let mut covered = json!({
        "v": STEP_CACHE_VERSION,
        "build": inputs.build,
        "node": inputs.node,
        "kind": spec.kind,
        "params": spec.params,
        "commands": spec.commands,
        "context_files": spec.context_files,
        "timeout_seconds": spec.timeout_seconds,
        "write_scope": spec.write_scope,
        "image": spec.image,
        "image_id": inputs.image_id,
        "worktree": spec.worktree.as_ref().map(|w| json!({
            "at": inputs.worktree,
            "run_base_tree": inputs.run_base_tree,
            "mode": w.mode,
            "commit_out": w.commit_out,
            "git": w.git,
        })),
    });
    if spec.kind == NodeKind::Agent {
        covered["agent"] = json!({
            "config": spec.agent,
            "vars": spec.vars,
            "continues": spec.continues,
            "branch": spec.branch,
        });
    }
    canonical_hash(&covered)
}

/// The object key of a step's entry.
pub fn entry_key(key: &str) -> String {
    format!("cache/steps/{key}.json")
}

/// Where a reused result came from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct CachedFrom {
    /// The step's key.
    pub key: String,
    #[schema(value_type = String)]
    pub run_id: crate::ids::RunId,
    #[schema(value_type = String)]
    pub job_id: crate::ids::JobId,
    pub execution: String,
}

/// A kept result: what a job with the same key reports instead of running.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CacheEntry {
    pub v: u32,
    pub key: String,
    pub status: JobStatus,
    pub output: Value,
    pub error: Option<String>,
    pub commit: Option<String>,
    pub pack: Option<String>,
    /// Artifact name → object key, in the job that made the result.
    pub artifacts: BTreeMap<String, String>,
    /// The folder of that job's execution the artifact keys lie under (`.../exec-<tag>/`).
    pub artifact_folder: String,
    /// What the result cost when it was made (a reuse costs nothing).
    pub usage: Usage,
    pub from: CachedFrom,
    pub created_at: DateTime<Utc>,
}

impl CacheEntry {
    /// The entry of a result made under `artifact_folder`, when it may be kept.
    pub fn of(key: &str, result: &JobResult, artifact_folder: &str) -> Option<Self> {
        if !keepable(result.status) || result.output["flaky"] == Value::Bool(true) {
            return None;
        }
        Some(CacheEntry {
            v: STEP_CACHE_VERSION,
            key: key.to_string(),
            status: result.status,
            output: result.output.clone(),
            error: result.error.clone(),
            commit: result.commit.clone(),
            pack: result.pack.clone(),
            artifacts: result.artifacts.clone(),
            artifact_folder: artifact_folder.to_string(),
            usage: result.usage,
            from: CachedFrom {
                key: key.to_string(),
                run_id: result.run_id.clone(),
                job_id: result.job_id.clone(),
                execution: result.execution.clone(),
            },
            created_at: result.finished_at,
        })
    }

    /// Whether the entry can be used for `key`: of this version, of this key, a verdict, and
    /// with every artifact under its own folder.
    pub fn usable_for(&self, key: &str) -> bool {
        self.v == STEP_CACHE_VERSION
            && self.key == key
            && keepable(self.status)
            && relocate_artifacts(&self.artifacts, &self.artifact_folder, "x/").is_some()
    }
}

/// Each artifact's move from the folder of the job that made it to `new_folder`: name →
/// (from, to). None when an artifact's key does not lie under `folder` (or climbs out of it):
/// such an entry is not used.
pub fn relocate_artifacts(
    artifacts: &BTreeMap<String, String>,
    folder: &str,
    new_folder: &str,
) -> Option<BTreeMap<String, (String, String)>> {
    if !folder.ends_with('/') || !new_folder.ends_with('/') {
        return None;
    }
    let mut out = BTreeMap::new();
    for (name, key) in artifacts {
        let rest = key.strip_prefix(folder)?;
        if rest.is_empty()
            || rest
                .split('/')
                .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return None;
        }
        out.insert(name.clone(), (key.clone(), format!("{new_folder}{rest}")));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::WorktreeMode;
    use crate::ids::{JobId, NodeId, RunId};
    use crate::messages::{AgentConfig, WorktreeSpec, WIRE_VERSION};

    fn spec(kind: NodeKind) -> JobSpec {
        JobSpec {
            v: WIRE_VERSION,
            job_id: JobId::new("r1.po.1"),
            run_id: RunId::new("r1"),
            node: NodeId::new("po"),
            visit: 1,
            attempt: 1,
            kind,
            graph_ref: "graphs/g.json".into(),
            image: Some("fleet-agent-py:1".into()),
            timeout_seconds: 60,
            params: json!({"acceptance_commands": ["pytest -q"]}),
            context_files: vec![],
            commands: vec![],
            worktree: Some(WorktreeSpec {
                commit: "c1".into(),
                run_base: Some("b1".into()),
                packs: vec!["packs/a.pack".into()],
                mode: WorktreeMode::Rw,
                commit_out: false,
                git: None,
            }),
            artifact_prefix: "runs/r1/po-1/".into(),
            agent: AgentConfig::default(),
            vars: json!({"input": {"x": 1}}),
            branch: None,
            continues: None,
            nudge_after_seconds: None,
            notify_start: false,
            write_scope: None,
            llm_budget: None,
            llm_usd_left: None,
            incremental: None,
            inbox: Vec::new(),
            team: None,
        }
    }

    fn key_of(spec: &JobSpec) -> String {
        step_key(&StepInputs {
            spec,
            node: &json!({"kind": "harness", "op": "factory_verify"}),
            build: "b",
            worktree: Some("t1".into()),
            run_base_tree: Some("t0".into()),
            image_id: Some("sha256:i".into()),
        })
    }

    #[test]
    fn the_key_ignores_what_names_the_run_and_covers_what_decides_the_step() {
        let a = spec(NodeKind::Harness);
        let base = key_of(&a);
        assert_eq!(base.len(), 64);
        // Another run, job, attempt, artifact folder or pack list: the same step.
        let mut other = a.clone();
        other.run_id = RunId::new("r2");
        other.job_id = JobId::new("r2.po.1");
        other.attempt = 3;
        other.artifact_prefix = "runs/r2/po-1/".into();
        other.worktree.as_mut().unwrap().packs = vec!["packs/b.pack".into()];
        other.notify_start = true;
        assert_eq!(key_of(&other), base);
        // A harness step's key does not see the run's context (agents only).
        other.vars = json!({"input": {"x": 2}});
        assert_eq!(key_of(&other), base);

        let changed: [fn(&mut JobSpec); 10] = [
            |s| s.params = json!({"acceptance_commands": ["pytest -x"]}),
            |s| s.commands = vec!["make".into()],
            |s| s.context_files = vec!["a.py".into()],
            |s| s.timeout_seconds = 61,
            |s| s.image = Some("other:1".into()),
            |s| s.kind = NodeKind::Command,
            |s| s.worktree.as_mut().unwrap().mode = WorktreeMode::Ro,
            |s| s.worktree.as_mut().unwrap().commit_out = true,
            |s| s.worktree.as_mut().unwrap().git = Some([("base".into(), "b1".into())].into()),
            |s| s.worktree = None,
        ];
        for (i, change) in changed.iter().enumerate() {
            let mut s = a.clone();
            change(&mut s);
            assert_ne!(key_of(&s), base, "change {i} kept the key");
        }
    }

    #[test]
    fn the_found_inputs_are_in_the_key() {
        let s = spec(NodeKind::Harness);
        let base = key_of(&s);
        let inputs = StepInputs {
            spec: &s,
            node: &json!({"kind": "harness", "op": "factory_verify"}),
            build: "b",
            worktree: Some("t1".into()),
            run_base_tree: Some("t0".into()),
            image_id: Some("sha256:i".into()),
        };
        assert_eq!(step_key(&inputs), base);
        let variants = [
            StepInputs {
                build: "b2",
                ..inputs.clone()
            },
            StepInputs {
                node: &json!({"kind": "harness", "op": "run_tests"}),
                ..inputs.clone()
            },
            StepInputs {
                worktree: Some("t2".into()),
                ..inputs.clone()
            },
            StepInputs {
                run_base_tree: Some("t9".into()),
                ..inputs.clone()
            },
            StepInputs {
                image_id: Some("sha256:j".into()),
                ..inputs.clone()
            },
        ];
        for v in variants {
            assert_ne!(step_key(&v), base, "{v:?}");
        }
    }

    #[test]
    fn an_agent_steps_key_covers_its_agent_and_context() {
        let a = spec(NodeKind::Agent);
        let base = key_of(&a);
        let mut s = a.clone();
        s.vars = json!({"input": {"x": 2}});
        assert_ne!(key_of(&s), base);
        let mut s = a.clone();
        s.continues = Some("runs/r1/t.json".into());
        assert_ne!(key_of(&s), base);
        let mut s = a.clone();
        s.agent = AgentConfig::Scripted {
            script: [("po".to_string(), vec![Default::default()])].into(),
        };
        assert_ne!(key_of(&s), base);
    }

    #[test]
    fn only_worker_steps_are_cached_and_agents_only_on_request() {
        for kind in [NodeKind::Harness, NodeKind::Command, NodeKind::Git] {
            assert!(cacheable(kind, false));
        }
        assert!(!cacheable(NodeKind::Agent, false));
        assert!(cacheable(NodeKind::Agent, true));
    }

    #[test]
    fn a_step_over_its_parameters_alone_is_never_looked_up() {
        assert!(!worth_a_lookup(NodeKind::Harness, false, false));
        assert!(!worth_a_lookup(NodeKind::Git, false, false));
        assert!(worth_a_lookup(NodeKind::Harness, true, false));
        assert!(worth_a_lookup(NodeKind::Harness, false, true));
        assert!(worth_a_lookup(NodeKind::Command, false, true));
        assert!(worth_a_lookup(NodeKind::Agent, false, false));
    }

    fn result(status: JobStatus, artifacts: &[(&str, &str)]) -> JobResult {
        JobResult {
            v: WIRE_VERSION,
            job_id: JobId::new("r1.po.1"),
            run_id: RunId::new("r1"),
            attempt: 1,
            status,
            output: json!({"ok": true}),
            error: None,
            commit: None,
            pack: None,
            artifacts: artifacts
                .iter()
                .map(|(n, k)| (n.to_string(), k.to_string()))
                .collect(),
            usage: Usage::default(),
            worker: "w".into(),
            execution: "e1-x".into(),
            started_at: Utc::now(),
            finished_at: Utc::now(),
            container_seconds: 0.0,
            cached_from: None,
            events: Vec::new(),
        }
    }

    #[test]
    fn infrastructure_failures_are_never_kept() {
        for status in [JobStatus::Error, JobStatus::TimedOut, JobStatus::Dead] {
            assert!(CacheEntry::of("k", &result(status, &[]), "f/").is_none());
        }
        for status in [JobStatus::Ok, JobStatus::Failed, JobStatus::OutputInvalid] {
            let e = CacheEntry::of("k", &result(status, &[]), "f/").unwrap();
            assert!(e.usable_for("k"));
            assert!(!e.usable_for("other"));
        }
    }

    #[test]
    fn a_flaky_verdict_is_never_kept() {
        let mut r = result(JobStatus::Failed, &[]);
        r.output = json!({"flaky": true, "flaky_tests": ["t::a"]});
        assert!(CacheEntry::of("k", &r, "f/").is_none());
        r.output = json!({"flaky": false});
        assert!(CacheEntry::of("k", &r, "f/").is_some());
    }

    #[test]
    fn artifacts_move_to_the_new_folder_and_nowhere_else() {
        let folder = "runs/r1/po-1/exec-e1-x/";
        let r = result(
            JobStatus::Ok,
            &[
                ("verify.json", "runs/r1/po-1/exec-e1-x/verify.json"),
                ("log", "runs/r1/po-1/exec-e1-x/attempt_1/log.txt"),
            ],
        );
        let e = CacheEntry::of("k", &r, folder).unwrap();
        let moved = relocate_artifacts(&e.artifacts, folder, "runs/r2/po-1/exec-e7-y/").unwrap();
        assert_eq!(
            moved["log"],
            (
                "runs/r1/po-1/exec-e1-x/attempt_1/log.txt".to_string(),
                "runs/r2/po-1/exec-e7-y/attempt_1/log.txt".to_string()
            )
        );
        // An entry naming a key outside its folder (or climbing out) is not used.
        for bad in [
            "runs/r9/secret.json",
            "runs/r1/po-1/exec-e1-x/../../../r9/x",
            "runs/r1/po-1/exec-e1-x/",
            "runs/r1/po-1/exec-e1-x//x",
        ] {
            let r = result(JobStatus::Ok, &[("x", bad)]);
            let e = CacheEntry::of("k", &r, folder).unwrap();
            assert!(!e.usable_for("k"), "{bad}");
        }
        assert!(relocate_artifacts(&BTreeMap::new(), "no-slash", "x/").is_none());
    }
}
