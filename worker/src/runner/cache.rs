//! The step cache's I/O (the rules are `shared::step_cache`): a job's key from its spec, its
//! node, the worktree's commit or tree, the run's baseline tree, the image's id and this
//! worker's build; a kept result reused (its artifacts copied into this execution's folder, so
//! the run still points only under its own job's prefix); a new verdict kept. Any trouble here
//! (a store error, an unreadable entry) only means the step runs: the cache never decides a
//! result it cannot prove.

use super::execution::Execution;
use super::{RunError, Runner};
use serde_json::Value;
use shared::graph::{GraphBundle, Node, RawNode};
use shared::messages::{JobResult, JobSpec, Usage, WIRE_VERSION};
use shared::step_cache::{
    cacheable, entry_key, relocate_artifacts, step_key, worth_a_lookup, CacheEntry, StepInputs,
};
use std::sync::OnceLock;
use tracing::{debug, info, warn};

/// `FLEET_STEP_CACHE=off` turns the cache off for this worker (no lookups, nothing kept).
pub const STEP_CACHE_ENV: &str = "FLEET_STEP_CACHE";

/// Whether this worker uses the step cache (`FLEET_STEP_CACHE`, on unless `off`).
pub fn enabled_from_env() -> bool {
    std::env::var(STEP_CACHE_ENV).map_or(true, |v| v != "off")
}

/// This worker's build: its version and its executable's size and modification time, so a
/// rebuilt worker never reuses what an older build's harness decided.
fn build_id() -> &'static str {
    static BUILD: OnceLock<String> = OnceLock::new();
    BUILD.get_or_init(|| {
        let exe = std::env::current_exe()
            .and_then(std::fs::metadata)
            .map(|m| {
                use std::os::unix::fs::MetadataExt;
                format!("{}-{}.{}", m.len(), m.mtime(), m.mtime_nsec())
            })
            .unwrap_or_else(|_| "unknown".into());
        format!("{}+{exe}", env!("CARGO_PKG_VERSION"))
    })
}

impl Runner {
    /// The job's key, when its step may be cached here; none otherwise (cache off, a kind the
    /// graph does not cache, a step cheaper than a lookup, a container step on a sandbox that cannot name its image).
    pub(super) async fn step_key(&self, spec: &JobSpec) -> Result<Option<String>, RunError> {
        if !self.cache_enabled {
            return Ok(None);
        }
        let bundle: std::sync::Arc<GraphBundle> = self.bundle(&spec.graph_ref).await?;
        let Some(node) = bundle.graph.node(&spec.node) else {
            return Ok(None);
        };
        if !cacheable(node.kind(), bundle.graph.defaults.cache_agent_steps)
            || !worth_a_lookup(node.kind(), spec.worktree.is_some(), node.needs_container())
        {
            return Ok(None);
        }
        // A session that hears from other sessions while it runs is not a function of its
        // inputs: never reused.
        if spec.incremental.is_some() || !spec.inbox.is_empty() {
            return Ok(None);
        }
        let image_id = match (&spec.image, node.needs_container()) {
            (Some(image), true) => match self.sandbox.image_id(image).await {
                Ok(Some(id)) => Some(id),
                // Host processes, or an image the step will fail to find: run it.
                Ok(None) | Err(_) => return Ok(None),
            },
            (None, true) => return Ok(None),
            (_, false) => None,
        };
        let (worktree, run_base_tree) = match &spec.worktree {
            Some(w) => {
                let _reading = self.git.hold().await;
                self.git.ensure_packs(&self.blobs, &w.packs).await?;
                let at = if w.commit_out {
                    w.commit.clone()
                } else {
                    self.git.tree_of(&w.commit).await?
                };
                let base = match &w.run_base {
                    Some(b) => Some(self.git.tree_of(b).await?),
                    None => None,
                };
                (Some(at), base)
            }
            None => (None, None),
        };
        let node_json = node_definition(node);
        Ok(Some(step_key(&StepInputs {
            spec,
            node: &node_json,
            build: build_id(),
            worktree,
            run_base_tree,
            image_id,
        })))
    }

    /// The kept result of `key` as this execution's result, its artifacts copied under the
    /// execution's folder; none on a miss or an entry that cannot be used.
    pub(super) async fn reuse(
        &self,
        spec: &JobSpec,
        exec: &Execution,
        key: &str,
    ) -> Option<JobResult> {
        let started_at = self.clock.now();
        let entry: CacheEntry = match self.blobs.get_json(&entry_key(key)).await {
            Ok(e) => e,
            Err(e) if e.is_not_found() => return None,
            Err(e) => {
                warn!(job = %spec.job_id, key, error = %e, "cannot read the step cache; running the step");
                return None;
            }
        };
        if !entry.usable_for(key) {
            warn!(job = %spec.job_id, key, "a step cache entry does not match its key; running the step");
            return None;
        }
        let folder = exec.artifact_prefix(spec);
        let moves = relocate_artifacts(&entry.artifacts, &entry.artifact_folder, &folder)?;
        let mut artifacts = std::collections::BTreeMap::new();
        for (name, (from, to)) in moves {
            if let Err(e) = self.blobs.copy(&from, &to).await {
                warn!(job = %spec.job_id, key, artifact = %from, error = %e, "cannot copy a cached artifact; running the step");
                return None;
            }
            artifacts.insert(name, to);
        }
        self.metrics.step_cache(true);
        info!(job = %spec.job_id, key, from_run = %entry.from.run_id, from_job = %entry.from.job_id, "step cache hit: the kept result is reused");
        Some(JobResult {
            v: WIRE_VERSION,
            job_id: spec.job_id.clone(),
            run_id: spec.run_id.clone(),
            attempt: spec.attempt,
            status: entry.status,
            output: entry.output,
            error: entry.error,
            commit: entry.commit,
            pack: entry.pack,
            artifacts,
            // Nothing was spent again.
            usage: Usage::default(),
            worker: self.config.id.clone(),
            execution: exec.tag.clone(),
            started_at,
            finished_at: self.clock.now(),
            container_seconds: 0.0,
            cached_from: Some(entry.from),
            events: Vec::new(),
        })
    }

    /// Keeps `result` under `key` when it is a verdict.
    pub(super) async fn keep(
        &self,
        spec: &JobSpec,
        exec: &Execution,
        key: &str,
        result: &JobResult,
    ) {
        self.metrics.step_cache(false);
        let Some(entry) = CacheEntry::of(key, result, &exec.artifact_prefix(spec)) else {
            debug!(job = %spec.job_id, status = ?result.status, "not a verdict: not kept in the step cache");
            return;
        };
        if let Err(e) = self.blobs.put_json(&entry_key(key), &entry).await {
            warn!(job = %spec.job_id, key, error = %e, "cannot keep the step's result in the cache");
        }
    }
}

/// The node as its bundle defines it (the key's `node`).
fn node_definition(node: &Node) -> Value {
    serde_json::to_value(RawNode::from(node.clone())).unwrap_or(Value::Null)
}
