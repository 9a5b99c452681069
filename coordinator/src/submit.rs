//! Submission: checks the graph, the input and the repository before anything is stored or
//! enqueued, computes the deterministic run id, and uploads the graph bundle and the repo pack.

use crate::driver::{now, Coordinator, DriverError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use shared::engine::RunState;
use shared::graph::{check, GraphBundle};
use shared::hashing::{canonical_hash, sha256_hex};
use shared::ids::RunId;
use shared::messages::{AgentConfig, RepoSnapshot};
use std::path::Path;
use thiserror::Error;
use worker::git::{pack_repository, GitError};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    pub graph: GraphBundle,
    pub input: Value,
    /// A path the coordinator can open (the seed's product repo).
    pub repo: String,
    #[serde(default = "head")]
    pub git_ref: String,
    #[serde(default)]
    pub agent: AgentConfig,
}

fn head() -> String {
    "HEAD".to_string()
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SubmitResponse {
    pub run_id: RunId,
    /// False when the same inputs were submitted before: the existing run is returned.
    pub created: bool,
}

#[derive(Debug, Error)]
pub enum SubmitError {
    #[error("invalid graph: {}", .0.join("; "))]
    Graph(Vec<String>),
    #[error("invalid input: {0}")]
    Input(String),
    #[error("preflight: {0}")]
    Preflight(String),
}

impl From<GitError> for SubmitError {
    fn from(e: GitError) -> Self {
        SubmitError::Preflight(e.to_string())
    }
}

/// Validates a submission and creates the run. Nothing is stored or enqueued unless every
/// check passed.
pub async fn submit(
    coord: &Coordinator,
    req: SubmitRequest,
) -> Result<SubmitResponse, DriverError> {
    let bundle = req.graph;
    check(&bundle).map_err(|es| SubmitError::Graph(es.iter().map(|e| e.to_string()).collect()))?;
    let has_agents = bundle
        .graph
        .nodes
        .values()
        .any(|n| n.kind == shared::graph::NodeKind::Agent);
    if let Some(why) = agent_exceeds(&req.agent, has_agents) {
        return Err(SubmitError::Input(why).into());
    }
    if let Some(schema_path) = &bundle.graph.input_schema {
        let schema: Value = serde_json::from_str(bundle.file(schema_path).unwrap_or("{}"))
            .map_err(|e| SubmitError::Graph(vec![e.to_string()]))?;
        shared::schema::validate(&schema, &req.input)
            .map_err(|e| SubmitError::Input(e.replace("output breaks", "input breaks")))?;
    }
    let repo_path = Path::new(&req.repo).to_path_buf();
    let git_ref = req.git_ref.clone();
    let packed = tokio::task::spawn_blocking(move || pack_repository(&repo_path, &git_ref))
        .await
        .map_err(|e| SubmitError::Preflight(e.to_string()))?
        .map_err(SubmitError::from)?;
    let tree_hash =
        shared::factory::tree_hash(packed.files.iter().map(|(p, b)| (p.as_str(), b.as_slice())));

    let (input, meta, run_id) = match bundle.graph.prepare.as_deref() {
        Some("factory") => {
            let (input, meta) =
                shared::factory::prepare(&req.input, &req.agent.model_identity(), &tree_hash)
                    .map_err(|e| SubmitError::Input(e.to_string()))?;
            let run_id = meta.run_id.clone();
            (input, json!(meta), run_id)
        }
        _ => {
            let id = sha256_hex(
                format!(
                    "{}{}{}{}",
                    bundle.hash(),
                    canonical_hash(&req.input),
                    tree_hash,
                    canonical_hash(&req.agent)
                )
                .as_bytes(),
            )[..12]
                .to_string();
            (
                req.input.clone(),
                json!({"repo_tree_hash_before": tree_hash}),
                id,
            )
        }
    };
    let run_id = RunId::new(run_id);
    // An existing run (also one restored from object storage) is returned, not restarted.
    if coord.load(&run_id).await.is_ok() {
        return Ok(SubmitResponse {
            run_id,
            created: false,
        });
    }

    let graph_ref = format!("graphs/{}.json", bundle.hash());
    coord.blobs.put_json(&graph_ref, &bundle).await?;
    let pack_key = format!("packs/{}.pack", sha256_hex(&packed.pack));
    if !coord.blobs.exists(&pack_key).await? {
        coord.blobs.put(&pack_key, packed.pack).await?;
    }
    let repo = RepoSnapshot {
        url: req.repo.clone(),
        base_commit: packed.commit,
        packs: vec![pack_key],
    };
    let state = RunState::new(
        run_id.clone(),
        &bundle,
        graph_ref,
        input,
        meta,
        repo,
        req.agent,
        &now(),
    );
    let created = coord.create_run(state, &bundle).await?;
    Ok(SubmitResponse { run_id, created })
}

/// The agent's budgets past `shared::limits`, as a message.
fn agent_exceeds(agent: &AgentConfig, has_agents: bool) -> Option<String> {
    use shared::limits::{MAX_TOKENS, MAX_TURNS};
    let llm = match agent {
        AgentConfig::Anthropic(c) | AgentConfig::Openai(c) => c,
        AgentConfig::Scripted { script } => {
            let steps: usize = script.values().map(Vec::len).sum();
            return (has_agents && steps == 0).then(|| {
                "the graph has agent nodes and the agent script has no steps".to_string()
            });
        }
    };
    if llm.max_turns == 0 || llm.max_turns > MAX_TURNS {
        return Some(format!(
            "max_turns is {}; it must be between 1 and {MAX_TURNS}",
            llm.max_turns
        ));
    }
    if llm.max_tokens == 0 || llm.max_tokens > MAX_TOKENS {
        return Some(format!(
            "max_tokens is {}; it must be between 1 and {MAX_TOKENS}",
            llm.max_tokens
        ));
    }
    if !llm.temperature.is_finite() || !(0.0..=2.0).contains(&llm.temperature) {
        return Some(format!(
            "temperature is {}; it must be between 0 and 2",
            llm.temperature
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::messages::LlmConfig;

    fn llm(turns: u32, tokens: u32) -> AgentConfig {
        AgentConfig::Anthropic(LlmConfig {
            model: "m".into(),
            temperature: 0.0,
            max_tokens: tokens,
            max_turns: turns,
        })
    }

    #[test]
    fn agent_budgets_past_the_limits_are_refused() {
        assert_eq!(agent_exceeds(&llm(20, 4096), true), None);
        assert!(agent_exceeds(&llm(4_000_000_000, 4096), true)
            .unwrap()
            .contains("max_turns is 4000000000"));
        assert!(agent_exceeds(&llm(20, 0), true)
            .unwrap()
            .contains("max_tokens"));
        let empty = AgentConfig::Scripted {
            script: Default::default(),
        };
        assert!(agent_exceeds(&empty, true).unwrap().contains("no steps"));
        assert_eq!(
            agent_exceeds(&empty, false),
            None,
            "graphs without agents need none"
        );
    }
}
