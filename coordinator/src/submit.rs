//! Submission: checks the graph, the input, the agent and the repository before anything is
//! stored or enqueued, computes the deterministic run id (a hash over everything that changes
//! what runs: `shared::factory::RunIdentity`), and uploads the graph bundle and the repo pack.
//! An id that names an existing run returns it only when the contents are the same.

use crate::driver::{Coordinator, DriverError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use shared::engine::RunState;
use shared::factory::RunIdentity;
use shared::graph::{check, GraphBundle};
use shared::ids::RunId;
use shared::messages::{AgentConfig, RepoSnapshot};
use thiserror::Error;
use worker::git::GitError;

#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    #[schema(value_type = Object)]
    pub graph: GraphBundle,
    pub input: Value,
    /// A path the coordinator can open (beneath a root an admin allows, or any with the open
    /// API); empty with `upload`.
    #[serde(default)]
    pub repo: String,
    /// The repository uploaded by the submitter (`POST /v1/uploads`): the pack and the commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<shared::http::RepoUpload>,
    #[serde(default = "head")]
    pub git_ref: String,
    #[serde(default)]
    pub agent: AgentConfig,
    /// The run's budget in dollars: a warning at 80%, paused at 100% until raised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_usd: Option<f64>,
    /// Where the run's notices go (budget marks, approvals asked for, quarantines, its end),
    /// signed with the coordinator's `FLEET_WEBHOOK_SECRET`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
    /// The team the run belongs to: the caller's token's, set by the server, never read from
    /// a request body.
    #[serde(skip)]
    pub team: Option<String>,
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
    /// A team's quota refuses the run now (its runs under way).
    #[error("quota: {0}")]
    Quota(String),
    /// The run id names a run whose contents differ from this submission's.
    #[error(
        "run `{0}` exists with different contents (graph bundle, input, agent or repository): \
         it is not this submission's run and is not returned; submit without a run id, or \
         under another one"
    )]
    Conflict(RunId),
}

impl From<GitError> for SubmitError {
    fn from(e: GitError) -> Self {
        SubmitError::Preflight(e.to_string())
    }
}

/// Validates a submission and creates the run under its derived id. Nothing is stored or
/// enqueued unless every check passed.
pub async fn submit(
    coord: &Coordinator,
    req: SubmitRequest,
) -> Result<SubmitResponse, DriverError> {
    submit_as(coord, req, None).await
}

/// Like `submit`, under the run id the submitter chose when `requested` is given (the API's
/// `run_id` field). Either way a run that exists under the id is returned only when its
/// contents are this submission's (`meta.submission_hash`); otherwise `SubmitError::Conflict`.
pub async fn submit_as(
    coord: &Coordinator,
    req: SubmitRequest,
    requested: Option<String>,
) -> Result<SubmitResponse, DriverError> {
    let bundle = req.graph.clone();
    check(&bundle).map_err(|es| SubmitError::Graph(es.iter().map(|e| e.to_string()).collect()))?;
    // Before anything else touches the disk: a path this caller may open at all; from here
    // on the repository is its canonical path, the one checked.
    let mut req = req;
    match (&req.upload, req.repo.is_empty()) {
        (Some(_), false) => {
            return Err(SubmitError::Input(
                "name the repository by `repo` or by `upload`, not both".into(),
            )
            .into())
        }
        (Some(upload), true) => {
            upload.shown().map_err(SubmitError::Input)?;
        }
        (None, _) => {
            let real = coord
                .repo_roots
                .check(&req.repo, req.team.as_deref(), coord.open_api)
                .map_err(SubmitError::Input)?;
            req.repo = real.display().to_string();
        }
    }
    let budget = match req.budget_usd.map(shared::tracking::RunBudget::new) {
        None => None,
        Some(Ok(b)) => Some(b),
        Some(Err(e)) => return Err(SubmitError::Input(e.to_string()).into()),
    };
    if let Some(url) = &req.webhook {
        let Some(secret) = coord.webhook_secret.clone() else {
            return Err(SubmitError::Input(
                "the run names a webhook but this coordinator has no FLEET_WEBHOOK_SECRET to sign its notices".into(),
            )
            .into());
        };
        let hook = shared::schedule::Webhook {
            url: url.clone(),
            secret,
        };
        hook.check()
            .map_err(|e| SubmitError::Input(format!("webhook: {e}")))?;
        coord
            .http
            .policy
            .check_url(url)
            .await
            .map_err(|e| SubmitError::Input(format!("webhook: {e}")))?;
    }
    if let Some(why) = crate::agent_checks::agent_exceeds(&req.agent, &bundle.graph) {
        return Err(SubmitError::Input(why).into());
    }
    if let Some(why) = crate::agent_checks::unpriced(&req.agent, &coord.prices) {
        return Err(SubmitError::Input(why).into());
    }
    if let Some(team) = &req.team {
        crate::team_api::check_model(coord, team, &req.agent).await?;
    }
    let refused = crate::agent_checks::provider_refusals(&req.agent, &bundle);
    if !refused.is_empty() {
        return Err(SubmitError::Graph(refused).into());
    }
    if let Some(id) = &requested {
        if !shared::factory::valid_run_id(id) {
            return Err(SubmitError::Input(format!(
                "run id `{id}`: use 1 to 64 letters, digits, `-` or `_`"
            ))
            .into());
        }
        let marked = req
            .team
            .as_deref()
            .is_none_or(|t| id.ends_with(&shared::auth::team_mark(t)));
        if !marked && id.len() > shared::auth::TEAM_CHOSEN_RUN_ID_MAX {
            return Err(SubmitError::Input(format!(
                "run id `{id}`: a team's run id is at most {} characters (its team's mark is added)",
                shared::auth::TEAM_CHOSEN_RUN_ID_MAX
            ))
            .into());
        }
    }
    if let Some(schema_path) = &bundle.graph.input_schema {
        let schema: Value = serde_json::from_str(bundle.file(schema_path).unwrap_or("{}"))
            .map_err(|e| SubmitError::Graph(vec![e.to_string()]))?;
        shared::schema::validate(&schema, &req.input)
            .map_err(|e| SubmitError::Input(e.replace("output breaks", "input breaks")))?;
    }
    let packed = match &req.upload {
        Some(upload) => crate::snapshot::of_upload(coord, req.team.as_deref(), upload).await?,
        None => crate::snapshot::of_path(coord, &req.repo, &req.git_ref).await?,
    };
    let tree_hash = packed.tree_hash.clone();

    let graph_hash = bundle.hash();
    let identity = RunIdentity {
        graph_hash: &graph_hash,
        agent: &req.agent,
        base_commit: &packed.commit,
        repo_tree_hash: &tree_hash,
    };
    let prepared = match bundle.graph.prepare.as_deref() {
        Some(name) => {
            let hook = shared::builtins::prepare_hook(name)
                .ok_or_else(|| SubmitError::Input(format!("unknown prepare hook `{name}`")))?;
            (hook.prepare)(&req.input, &identity).map_err(SubmitError::Input)?
        }
        None => shared::builtins::prepare_plain(&req.input, &identity),
    };
    let shared::builtins::Prepared {
        input,
        mut meta,
        run_id: derived,
        submission_hash,
    } = prepared;
    let team = req.team.clone();
    // Chosen or derived, a team's run id carries its team's mark: no team takes or probes
    // another's ids.
    if let Some(id) = &requested {
        if meta.get("run_id").is_some() {
            meta["run_id"] = json!(shared::auth::team_run_id(id, team.as_deref()));
        }
    }
    let run_id = RunId::new(shared::auth::team_run_id(
        requested.as_deref().unwrap_or(&derived),
        team.as_deref(),
    ));
    // An existing run (also one restored from object storage) is returned, not restarted, and
    // only when it is this submission's.
    match coord.load_existing(&run_id).await {
        Ok(existing) => return same_run(&existing, &submission_hash, team.as_deref()),
        Err(DriverError::UnknownRun(_)) => {}
        Err(e) => return Err(e),
    }

    // A team's runs under way count against its limit; the run is counted before it exists,
    // and given back if it is not made.
    if let Some(team) = &team {
        crate::team_api::admit_run(coord, team, &run_id).await?;
    }
    let run = PreparedRun {
        input,
        meta,
        run_id: run_id.clone(),
        budget,
    };
    let made = make_run(coord, &bundle, req, packed, run).await;
    if let (Err(_), Some(team)) = (&made, &team) {
        let _ = coord.ledger.run_ended(team, run_id.as_str()).await;
    }
    let made = made?;
    match made {
        true => Ok(SubmitResponse {
            run_id,
            created: true,
        }),
        // Created by another submission meanwhile: the same rule as above.
        false => same_run(
            &coord.load(&run_id).await?,
            &submission_hash,
            team.as_deref(),
        ),
    }
}

/// What the run starts with besides its graph, repository and agent.
struct PreparedRun {
    input: Value,
    meta: Value,
    run_id: RunId,
    budget: Option<shared::tracking::RunBudget>,
}

/// Stores the bundle and the pack and creates the run; false when a run with its id exists.
async fn make_run(
    coord: &Coordinator,
    bundle: &GraphBundle,
    req: SubmitRequest,
    packed: crate::snapshot::Snapshot,
    run: PreparedRun,
) -> Result<bool, DriverError> {
    let PreparedRun {
        input,
        meta,
        run_id,
        budget,
    } = run;
    let team = req.team.clone();
    let tree_hash = packed.tree_hash.clone();
    let graph_hash = bundle.hash();
    let graph_ref = format!("graphs/{graph_hash}.json");
    let bundle_bytes = serde_json::to_vec(bundle).expect("a bundle serializes");
    coord.put_content_once(&graph_ref, bundle_bytes).await?;
    if let Some(pack) = packed.pack {
        coord.put_content_once(&packed.pack_key, pack).await?;
        coord.remember_snapshot(
            &req.repo,
            &packed.commit,
            (packed.pack_key.clone(), tree_hash.clone()),
        );
    }
    let repo = RepoSnapshot {
        url: match &req.upload {
            Some(u) => u.shown().unwrap_or_else(|_| format!("upload:{}", u.pack)),
            None => req.repo.clone(),
        },
        base_commit: packed.commit,
        packs: vec![packed.pack_key],
    };
    let mut state = RunState::new(
        shared::engine::NewRun {
            run_id: run_id.clone(),
            graph_ref,
            input,
            meta,
            repo,
            agent: req.agent,
        },
        bundle,
        coord.clock.now(),
    );
    state.budget = budget;
    // A run that names no webhook of its own notifies its team's, if the team has one.
    state.webhook = match (&req.webhook, &team) {
        (Some(url), _) => Some(url.clone()),
        (None, Some(team)) => coord
            .ledger
            .webhook(team)
            .await
            .map_err(|e| SubmitError::Preflight(e.to_string()))?,
        (None, None) => None,
    };
    state.team = team.clone();
    match coord.create_run(state, bundle).await {
        Ok(created) => Ok(created),
        // The graph fails on its first step (an expression or template that cannot be
        // evaluated within its bounds): the submission's fault, said as such.
        Err(DriverError::Engine(e)) => {
            Err(SubmitError::Input(format!("the run cannot start: {e}")).into())
        }
        Err(e) => Err(e),
    }
}

/// The existing run, when its contents are the submission's; a conflict otherwise.
fn same_run(
    existing: &RunState,
    submission_hash: &str,
    team: Option<&str>,
) -> Result<SubmitResponse, DriverError> {
    // Another team's run under the id is never this submission's (nor said to exist).
    if existing.team.as_deref() != team {
        return Err(SubmitError::Conflict(existing.run_id.clone()).into());
    }
    if stored_submission_hash(existing) == submission_hash {
        Ok(SubmitResponse {
            run_id: existing.run_id.clone(),
            created: false,
        })
    } else {
        Err(SubmitError::Conflict(existing.run_id.clone()).into())
    }
}

/// The submission hash a run was created with: `meta.submission_hash`, or, for a run created
/// before it was recorded, recomputed from the run's own graph, input, agent and repository.
fn stored_submission_hash(state: &RunState) -> String {
    let recorded = state
        .meta
        .get("submission_hash")
        .and_then(Value::as_str)
        .filter(|h| !h.is_empty());
    if let Some(h) = recorded {
        return h.to_string();
    }
    let graph_hash = state
        .graph_ref
        .strip_prefix("graphs/")
        .and_then(|r| r.strip_suffix(".json"))
        .unwrap_or(&state.graph_ref);
    let tree_hash = state
        .meta
        .get("repo_tree_hash_before")
        .and_then(Value::as_str)
        .unwrap_or_default();
    RunIdentity {
        graph_hash,
        agent: &state.agent,
        base_commit: &state.repo.base_commit,
        repo_tree_hash: tree_hash,
    }
    .submission_hash(&state.input)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_checks::tests::{no_agents, script};
    fn state(meta: Value) -> RunState {
        let bundle = GraphBundle {
            source: "g.yaml".into(),
            graph: no_agents(),
            files: Default::default(),
        };
        RunState::new(
            shared::engine::NewRun {
                run_id: RunId::new("r1"),
                graph_ref: "graphs/gh.json".into(),
                input: json!({"x": 1}),
                meta,
                repo: RepoSnapshot {
                    url: "/repo".into(),
                    base_commit: "c".into(),
                    packs: vec![],
                },
                agent: script(&[("a", 1)]),
            },
            &bundle,
            "2024-01-01T00:00:00Z".parse().unwrap(),
        )
    }

    #[test]
    fn an_existing_run_is_returned_only_for_the_same_contents() {
        let same = same_run(&state(json!({"submission_hash": "h1"})), "h1", None).unwrap();
        assert_eq!(same.run_id, RunId::new("r1"));
        assert!(!same.created);
        let other = same_run(&state(json!({"submission_hash": "h1"})), "h2", None).unwrap_err();
        let msg = other.to_string();
        assert!(
            msg.contains("run `r1` exists with different contents"),
            "{msg}"
        );
        assert!(matches!(
            other,
            DriverError::Submit(SubmitError::Conflict(ref r)) if r.as_str() == "r1"
        ));
    }

    #[test]
    fn runs_without_a_recorded_hash_are_compared_by_their_contents() {
        let old = state(json!({"repo_tree_hash_before": "t"}));
        let agent = script(&[("a", 1)]);
        let identity = RunIdentity {
            graph_hash: "gh",
            agent: &agent,
            base_commit: "c",
            repo_tree_hash: "t",
        };
        let hash = identity.submission_hash(&json!({"x": 1}));
        assert_eq!(stored_submission_hash(&old), hash);
        assert!(same_run(&old, &hash, None).is_ok());
        // Another team's run under the id is never this submission's.
        assert!(same_run(&old, &hash, Some("team-b")).is_err());
        let edited = RunIdentity {
            graph_hash: "gh2",
            ..identity
        };
        assert!(same_run(&old, &edited.submission_hash(&json!({"x": 1})), None).is_err());
    }
}
