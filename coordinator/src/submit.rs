//! Submission: checks the graph, the input, the agent and the repository before anything is
//! stored or enqueued, computes the deterministic run id (a hash over everything that changes
//! what runs: `shared::factory::RunIdentity`), and uploads the graph bundle and the repo pack.
//! An id that names an existing run returns it only when the contents are the same.

use crate::driver::{Coordinator, DriverError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use shared::engine::RunState;
use shared::factory::RunIdentity;
use shared::graph::{check, Graph, GraphBundle, NodeKind};
use shared::hashing::sha256_hex;
use shared::ids::RunId;
use shared::messages::{AgentConfig, RepoSnapshot, ScriptStep};
use std::collections::BTreeMap;
use std::path::Path;
use thiserror::Error;
use worker::git::{pack_commit, resolve_clean, GitError};

#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    #[schema(value_type = Object)]
    pub graph: GraphBundle,
    pub input: Value,
    /// A path the coordinator can open (the seed's product repo).
    pub repo: String,
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

/// A repository at a ref as a run starts from it: the commit, its pack's key and the seed's
/// tree hash, and the pack's bytes when they are not known to be stored yet.
struct Snapshot {
    commit: String,
    pack_key: String,
    tree_hash: String,
    pack: Option<Vec<u8>>,
}

/// The clean-tree preflight and the commit of `git_ref` every time; the pack and the tree
/// hash from the coordinator's memory when this repository's commit was packed before (a
/// batch's items share their repositories), else packed now.
async fn snapshot(coord: &Coordinator, repo: &str, git_ref: &str) -> Result<Snapshot, DriverError> {
    let (path, refname) = (Path::new(repo).to_path_buf(), git_ref.to_string());
    let commit = blocking_git(move || resolve_clean(&path, &refname)).await?;
    if let Some((pack_key, tree_hash)) = coord.known_snapshot(repo, &commit) {
        return Ok(Snapshot {
            commit,
            pack_key,
            tree_hash,
            pack: None,
        });
    }
    let path = Path::new(repo).to_path_buf();
    let packed = blocking_git(move || pack_commit(&path, &commit)).await?;
    let tree_hash =
        shared::factory::tree_hash(packed.files.iter().map(|(p, b)| (p.as_str(), b.as_slice())));
    Ok(Snapshot {
        commit: packed.commit,
        pack_key: format!("packs/{}.pack", sha256_hex(&packed.pack)),
        tree_hash,
        pack: Some(packed.pack),
    })
}

/// `f` (libgit2 work) on the blocking pool; its error a preflight error of the submission.
async fn blocking_git<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, GitError> + Send + 'static,
) -> Result<T, SubmitError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SubmitError::Preflight(e.to_string()))?
        .map_err(SubmitError::from)
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
    let bundle = req.graph;
    check(&bundle).map_err(|es| SubmitError::Graph(es.iter().map(|e| e.to_string()).collect()))?;
    // Before anything else touches the disk: a path this coordinator may open at all.
    coord
        .repo_roots
        .check(&req.repo, coord.open_api)
        .map_err(SubmitError::Input)?;
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
    }
    if let Some(why) = agent_exceeds(&req.agent, &bundle.graph) {
        return Err(SubmitError::Input(why).into());
    }
    if let Some(id) = &requested {
        if !shared::factory::valid_run_id(id) {
            return Err(SubmitError::Input(format!(
                "run id `{id}`: use 1 to 64 letters, digits, `-` or `_`"
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
    let packed = snapshot(coord, &req.repo, &req.git_ref).await?;
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
    if let Some(id) = &requested {
        if meta.get("run_id").is_some() {
            meta["run_id"] = json!(id);
        }
    }
    let team = req.team.clone();
    let run_id = RunId::new(
        requested.unwrap_or_else(|| shared::auth::team_run_id(&derived, team.as_deref())),
    );
    // An existing run (also one restored from object storage) is returned, not restarted, and
    // only when it is this submission's.
    match coord.load(&run_id).await {
        Ok(existing) => return same_run(&existing, &submission_hash, team.as_deref()),
        Err(DriverError::UnknownRun(_)) => {}
        Err(e) => return Err(e),
    }

    let graph_ref = format!("graphs/{graph_hash}.json");
    let bundle_bytes = serde_json::to_vec(&bundle).expect("a bundle serializes");
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
        url: req.repo.clone(),
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
        &bundle,
        coord.clock.now(),
    );
    state.budget = budget;
    state.webhook = req.webhook.clone();
    state.team = team.clone();
    match coord.create_run(state, &bundle).await {
        Ok(true) => Ok(SubmitResponse {
            run_id,
            created: true,
        }),
        // Created by another submission meanwhile: the same rule as above.
        Ok(false) => same_run(
            &coord.load(&run_id).await?,
            &submission_hash,
            team.as_deref(),
        ),
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

/// What is wrong with a command agent: no program, or budgets past `shared::limits`.
fn command_exceeds(c: &shared::messages::CommandAgent) -> Option<String> {
    use shared::limits::{MAX_COMMAND_CALLS, MAX_COMMAND_TOKENS};
    if c.argv.first().is_none_or(|p| p.trim().is_empty()) {
        return Some("the command agent has no program (`argv` is empty)".into());
    }
    if c.model.trim().is_empty() {
        return Some("the command agent has no model".into());
    }
    if c.max_calls == 0 || c.max_calls > MAX_COMMAND_CALLS {
        return Some(format!(
            "max_calls is {}; it must be between 1 and {MAX_COMMAND_CALLS}",
            c.max_calls
        ));
    }
    if c.max_tokens == 0 || c.max_tokens > MAX_COMMAND_TOKENS {
        return Some(format!(
            "max_tokens is {}; it must be between 1 and {MAX_COMMAND_TOKENS}",
            c.max_tokens
        ));
    }
    None
}

/// What is wrong with the submission's agent for this graph, as a message: budgets past
/// `shared::limits`, or a script that cannot drive the graph's agent nodes (empty, an empty
/// entry for an agent node, none for the start node, or steps only for nodes that are not
/// the graph's agents).
fn agent_exceeds(agent: &AgentConfig, graph: &Graph) -> Option<String> {
    use shared::limits::{MAX_TOKENS, MAX_TURNS};
    let agents: Vec<&str> = graph
        .nodes
        .iter()
        .filter(|(_, n)| n.kind() == NodeKind::Agent)
        .map(|(id, _)| id.as_str())
        .collect();
    let llm = match agent {
        AgentConfig::Anthropic(c) | AgentConfig::Openai(c) => c,
        AgentConfig::Scripted { script } => return script_misses(script, graph, &agents),
        AgentConfig::Command(c) => return command_exceeds(c),
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

/// A scripted agent for a graph with agent nodes: every entry it has for an agent node has
/// steps, the start node (when it is an agent) has an entry, and at least one agent node has
/// one. Nodes that may never run (a path the script does not take) need none.
fn script_misses(
    script: &BTreeMap<String, Vec<ScriptStep>>,
    graph: &Graph,
    agents: &[&str],
) -> Option<String> {
    if agents.is_empty() {
        return None;
    }
    let steps: usize = script.values().map(Vec::len).sum();
    if steps == 0 {
        return Some(format!(
            "the graph has agent nodes ({}) and the agent script has no steps",
            agents.join(", ")
        ));
    }
    if let Some(empty) = agents
        .iter()
        .find(|a| script.get(**a).is_some_and(Vec::is_empty))
    {
        return Some(format!(
            "the agent script's entry for node `{empty}` has no steps"
        ));
    }
    let start = graph.start.as_str();
    if agents.contains(&start) && !script.contains_key(start) {
        return Some(format!(
            "the graph starts with agent node `{start}` and the agent script has no steps for it"
        ));
    }
    if !agents.iter().any(|a| script.contains_key(*a)) {
        return Some(format!(
            "the agent script has steps for {} but none for the graph's agent nodes ({})",
            script
                .keys()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", "),
            agents.join(", ")
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

    fn graph(start: &str) -> Graph {
        serde_yaml::from_str(&format!(
            "name: g\nstart: {start}\nnodes:\n  \
             a: {{kind: agent, template: t.j2, output_schema: s.json}}\n  \
             b: {{kind: agent, template: t.j2, output_schema: s.json}}\n  \
             c: {{kind: command, commands: [x]}}\n"
        ))
        .expect("a graph")
    }

    fn no_agents() -> Graph {
        serde_yaml::from_str("name: g\nstart: c\nnodes:\n  c: {kind: command, commands: [x]}\n")
            .expect("a graph")
    }

    fn script(entries: &[(&str, usize)]) -> AgentConfig {
        AgentConfig::Scripted {
            script: entries
                .iter()
                .map(|(node, n)| (node.to_string(), vec![ScriptStep::default(); *n]))
                .collect(),
        }
    }

    #[test]
    fn agent_budgets_past_the_limits_are_refused() {
        let g = graph("a");
        assert_eq!(agent_exceeds(&llm(20, 4096), &g), None);
        assert!(agent_exceeds(&llm(4_000_000_000, 4096), &g)
            .unwrap()
            .contains("max_turns is 4000000000"));
        assert!(agent_exceeds(&llm(20, 0), &g)
            .unwrap()
            .contains("max_tokens"));
    }

    #[test]
    fn command_agents_without_a_program_or_past_their_limits_are_refused() {
        let g = graph("a");
        let command = |argv: &[&str], model: &str, calls: u32, tokens: u64| {
            AgentConfig::Command(shared::messages::CommandAgent {
                argv: argv.iter().map(|a| a.to_string()).collect(),
                api: shared::messages::LlmApi::Anthropic,
                model: model.into(),
                max_calls: calls,
                max_tokens: tokens,
            })
        };
        assert_eq!(agent_exceeds(&command(&["agent"], "m", 5, 100), &g), None);
        let why = |a| agent_exceeds(&a, &g).unwrap_or_default();
        assert!(why(command(&[], "m", 5, 100)).contains("no program"));
        assert!(why(command(&["  "], "m", 5, 100)).contains("no program"));
        assert!(why(command(&["agent"], " ", 5, 100)).contains("no model"));
        assert!(why(command(&["agent"], "m", 0, 100)).contains("max_calls is 0"));
        assert!(why(command(&["agent"], "m", 5, u64::MAX)).contains("max_tokens"));
    }

    #[test]
    fn scripts_that_cannot_drive_the_graph_are_refused() {
        let g = graph("a");
        let empty = script(&[]);
        assert!(agent_exceeds(&empty, &g).unwrap().contains("no steps"));
        assert_eq!(
            agent_exceeds(&empty, &no_agents()),
            None,
            "graphs without agents need none"
        );
        assert!(agent_exceeds(&script(&[("a", 0)]), &g)
            .unwrap()
            .contains("no steps"));
        let only_b_empty = agent_exceeds(&script(&[("a", 1), ("b", 0)]), &g).unwrap();
        assert!(
            only_b_empty.contains("node `b` has no steps"),
            "{only_b_empty}"
        );
        let no_start = agent_exceeds(&script(&[("b", 1)]), &g).unwrap();
        assert!(
            no_start.contains("starts with agent node `a`"),
            "{no_start}"
        );
        let elsewhere = agent_exceeds(&script(&[("se", 2)]), &graph("c")).unwrap();
        assert!(
            elsewhere.contains("steps for `se` but none for the graph's agent nodes (a, b)"),
            "{elsewhere}"
        );
        // A node the script's path never reaches may go without steps.
        assert_eq!(agent_exceeds(&script(&[("a", 1)]), &g), None);
        assert_eq!(agent_exceeds(&script(&[("b", 1)]), &graph("c")), None);
    }

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
