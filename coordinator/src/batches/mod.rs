//! Batches: a dataset expanded into one run per item and trial, at most `max_running` at once,
//! driven by every coordinator (`drive.rs`) through the batch's compare-and-set state, so any
//! of them may stop and the batch goes on. A run's id is the batch's choice for the item, trial
//! and attempt, so two coordinators starting the same item start one run.
//!
//! What a batch was asked for (graph, dataset, agent, options) is kept in object storage under
//! `batches/<id>/request.json`; its state in the run store (header and items apart), mirrored
//! whole to `batches/<id>/state.json` every few seconds while it runs and when it ends.

pub mod api;
mod drive;

use crate::driver::{Coordinator, DriverError};
use crate::submit::{SubmitError, SubmitRequest};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use shared::batch::{BatchSpec, BatchState, DatasetItem};
use shared::graph::GraphBundle;
use shared::hashing::canonical_hash;
use shared::ids::BatchId;
use shared::messages::{AgentConfig, ScriptStep};
use std::collections::BTreeMap;
use std::path::Path;

pub use drive::drive;

/// `POST /v1/batches`: a graph, a dataset and how to run it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    #[schema(value_type = Object)]
    pub graph: GraphBundle,
    /// The dataset as JSONL (one item per line: `id`, `repo`, `ref`, `input` or
    /// `work_order`, `script`), checked by the coordinator.
    pub dataset: String,
    /// The agent of items without a `script` of their own.
    #[serde(default)]
    pub agent: AgentConfig,
    /// Factory graphs: the `options` of every item's input (`max_attempts`, ...).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub options: Value,
    #[schema(value_type = Object)]
    pub spec: BatchSpec,
    /// Where items with `mirror` (SWE-bench lines: `repo` is `owner/name`) are read from:
    /// `<mirror_dir>/owner__name`, a git repository the coordinator can open (an absolute path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_dir: Option<String>,
    /// The team the batch and its runs belong to: set by the server from the caller's token
    /// (whatever a request body says), kept with the stored request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

/// What `POST /v1/batches` answers.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct BatchSubmitted {
    #[schema(value_type = String)]
    pub batch_id: BatchId,
    /// False when the same batch was submitted before: the existing one is returned.
    pub created: bool,
    /// Runs the batch will make (items × trials).
    pub runs: usize,
}

pub(crate) fn request_key(id: &BatchId) -> String {
    format!("batches/{id}/request.json")
}

pub fn state_key(id: &BatchId) -> String {
    format!("batches/{id}/state.json")
}

/// Checks a batch and creates it; nothing is stored unless every check passed. The same batch
/// (graph, dataset, agent, options, spec) submitted again returns the existing one.
pub async fn submit_batch(
    coord: &Coordinator,
    req: BatchRequest,
) -> Result<BatchSubmitted, DriverError> {
    submit_batch_as(coord, req, None).await
}

/// [`submit_batch`] under an id the caller chose (a schedule's firing: fixed by the schedule's
/// name and tick) instead of the one derived from the batch's content.
pub async fn submit_batch_as(
    coord: &Coordinator,
    req: BatchRequest,
    chosen: Option<BatchId>,
) -> Result<BatchSubmitted, DriverError> {
    shared::graph::check(&req.graph)
        .map_err(|es| SubmitError::Graph(es.iter().map(|e| e.to_string()).collect::<Vec<_>>()))?;
    req.spec.validate().map_err(SubmitError::Input)?;
    if let Some(team) = &req.team {
        let limits = coord
            .ledger
            .limits(team)
            .await
            .map_err(|e| SubmitError::Preflight(e.to_string()))?;
        if let Some(max) = limits.batch_weight.filter(|max| req.spec.weight > *max) {
            return Err(SubmitError::Input(format!(
                "weight is {}, above team `{team}`'s batch_weight of {max}",
                req.spec.weight
            ))
            .into());
        }
    }
    let items = shared::batch::parse_dataset(&req.dataset)
        .map_err(|e| SubmitError::Input(e.to_string()))?;
    let runs = items.len().saturating_mul(req.spec.trials as usize);
    if runs > shared::batch::MAX_BATCH_RUNS {
        return Err(SubmitError::Input(format!(
            "{} items × {} trials is {runs} runs; a batch makes at most {}",
            items.len(),
            req.spec.trials,
            shared::batch::MAX_BATCH_RUNS
        ))
        .into());
    }
    if !req.options.is_null() && !req.options.is_object() {
        return Err(SubmitError::Input("`options` is an object".into()).into());
    }
    for item in &items {
        item_agent(item, &req.agent).map_err(SubmitError::Input)?;
    }
    shared::batch::dataset::check_mirror_dir(&items, req.mirror_dir.as_deref())
        .map_err(SubmitError::Input)?;
    // Everything that changes what runs is in the id.
    let mut identity = json!({
        "graph": req.graph.hash(), "agent": req.agent, "options": req.options,
    });
    if let Some(dir) = &req.mirror_dir {
        identity["mirror_dir"] = json!(dir);
    }
    // Two teams' batches of the same content are two batches.
    if let Some(team) = &req.team {
        identity["team"] = json!(team);
    }
    let config = canonical_hash(&identity);
    let batch_id = chosen.unwrap_or_else(|| shared::batch::batch_id(&config, &items, &req.spec));
    let graph_ref = format!("graphs/{}.json", req.graph.hash());
    if let Some((existing, _)) = coord.store.batch_header(&batch_id).await? {
        return Ok(BatchSubmitted {
            runs: existing.counts.total,
            batch_id,
            created: false,
        });
    }
    coord.blobs.put_json(&graph_ref, &req.graph).await?;
    coord.blobs.put_json(&request_key(&batch_id), &req).await?;
    let state = BatchState::new(
        batch_id.clone(),
        req.graph.graph.name.clone(),
        graph_ref,
        req.spec.clone(),
        &items,
        coord.clock.now(),
    )
    .with_team(req.team.clone());
    let runs = state.items.len();
    let created = coord.store.create_batch(&state).await?;
    if created {
        coord.blobs.put_json(&state_key(&batch_id), &state).await?;
    }
    Ok(BatchSubmitted {
        batch_id,
        created,
        runs,
    })
}

/// The agent of one item: its own script, or the batch's agent.
fn item_agent(item: &DatasetItem, base: &AgentConfig) -> Result<AgentConfig, String> {
    match &item.script {
        None => Ok(base.clone()),
        Some(script) => serde_json::from_value::<BTreeMap<String, Vec<ScriptStep>>>(script.clone())
            .map(|script| AgentConfig::Scripted { script })
            .map_err(|e| format!("item `{}`: the script is malformed: {e}", item.id)),
    }
}

/// The repository of an item: its `repo`, or for an item read from the mirror
/// `<mirror_dir>/owner__name`, which must be there (else the item errs, never a verdict).
fn item_repo(req: &BatchRequest, item: &DatasetItem) -> Result<String, String> {
    if !item.mirror {
        return Ok(item.repo.clone());
    }
    let dir = req.mirror_dir.as_deref().ok_or_else(|| {
        format!(
            "item `{}` is read from a mirror directory, and the batch has none",
            item.id
        )
    })?;
    let path = Path::new(dir).join(shared::factory::mirror_folder(&item.repo));
    if !path.is_dir() {
        return Err(format!(
            "item `{}`: no mirror of `{}` at {}",
            item.id,
            item.repo,
            path.display()
        ));
    }
    Ok(path.display().to_string())
}

/// The run request of one item of the batch.
fn item_request(req: &BatchRequest, item: &DatasetItem) -> Result<SubmitRequest, String> {
    let input = match (&item.input, &item.work_order) {
        (Some(input), None) => input.clone(),
        (None, Some(order)) => json!({
            "work_order": order,
            "work_order_path": format!("{}.work_order.json", item.id),
            "options": if req.options.is_null() { json!({}) } else { req.options.clone() },
        }),
        (None, None) => json!({}),
        (Some(_), Some(_)) => {
            return Err(format!(
                "item `{}` has both `input` and `work_order`",
                item.id
            ))
        }
    };
    Ok(SubmitRequest {
        graph: req.graph.clone(),
        input,
        repo: item_repo(req, item)?,
        git_ref: item.git_ref.clone().unwrap_or_else(|| "HEAD".into()),
        agent: item_agent(item, &req.agent)?,
        budget_usd: None,
        webhook: None,
        team: req.team.clone(),
        upload: None,
    })
}
