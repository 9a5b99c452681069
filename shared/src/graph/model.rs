//! The typed graph the engine, checker and workers run: a node's kind is the variant of its
//! body, each with the fields only that kind has, and the ops of harness and git nodes are
//! enums. It is read from (and written as) the YAML form in `raw.rs`, so a field on the wrong
//! kind, a missing required field or an unknown op is refused when the graph is read.

use super::raw::RawGraph;
use super::CheckError;
use super::{
    Claims, Crosstalk, Incremental, QuarantineDef, Route, Stuck, Tool, ToolPolicy, VerifierPolicy,
    WorktreeUse, Writes,
};
use crate::ids::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A graph. Unknown fields are errors, so a typo never silently changes behaviour.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(try_from = "RawGraph", into = "RawGraph")]
pub struct Graph {
    pub name: String,
    pub description: String,
    pub start: NodeId,
    /// A harness hook run at submission (input validation and run id); `factory` is built in.
    pub prepare: Option<String>,
    pub defaults: Defaults,
    /// JSON schema file the run input must satisfy.
    pub input_schema: Option<String>,
    /// In a child run: the node entered when a sibling run broadcasts this event name.
    pub on_sibling: BTreeMap<String, NodeId>,
    /// Bundle files no node names itself (templates a `render_files` node picks by input).
    pub files: Vec<String>,
    /// Items put on hold for people (seed 004's quarantine).
    pub quarantine: Option<QuarantineDef>,
    pub nodes: BTreeMap<NodeId, Node>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u64,
    /// Agent steps reuse the result of an earlier step with the same inputs (model, prompt
    /// context, seed, worktree...) like harness and command steps always do (`shared::step_cache`).
    #[serde(default)]
    pub cache_agent_steps: bool,
    /// Bounds on the tree of child runs started from this graph's `spawn` nodes.
    #[serde(default, skip_serializing_if = "TreeLimits::is_default")]
    pub tree: TreeLimits,
}

/// How deep and how large a tree of child runs may grow (the root is depth 0 and counts as
/// one run). A run hands each child a share of the runs it may still start, so the whole
/// tree stays within `max_runs` without any shared counter.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TreeLimits {
    #[serde(default = "default_tree_depth")]
    pub max_depth: u32,
    #[serde(default = "default_tree_runs")]
    pub max_runs: u32,
}

impl TreeLimits {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl Default for TreeLimits {
    fn default() -> Self {
        Self {
            max_depth: default_tree_depth(),
            max_runs: default_tree_runs(),
        }
    }
}

fn default_tree_depth() -> u32 {
    3
}

fn default_tree_runs() -> u32 {
    40
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            image: None,
            timeout_seconds: default_timeout(),
            cache_agent_steps: false,
            tree: TreeLimits::default(),
        }
    }
}

fn default_timeout() -> u64 {
    600
}

/// The kind of a node, as jobs carry it on the wire.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    /// An agent (LLM loop, command agent or scripted) in a container.
    Agent,
    /// Argv commands run in a container; the node is ok when every command exits 0.
    Command,
    /// A step of the harness itself (`op`), e.g. applying a patch or the factory's verification.
    Harness,
    /// Ends the run; `status` decides success, `result` assembles the result.
    Exit,
    /// Waits for every node in `wait_for` (or every branch of a fan-out) to arrive, then fires
    /// once; held in the run state, which only changes by compare-and-set.
    Join,
    /// Starts `body` once per item of the list `over`, each in its own branch with its own
    /// worktree; the branches meet at `join`, whose expected count is set here.
    Fanout,
    /// Pauses this path of the run until a human approves or rejects through the API or CLI.
    Approval,
    /// A git step run by the harness: `cherry_pick`, `squash_merge` or `rebase` of the commits
    /// given in `with.commits` onto the worktree's base; conflicts are structured output.
    Git,
    /// Starts one child run of this graph per item of `over` (each a real run with its own
    /// id, linked to this one), waits for them and routes on their results.
    Spawn,
}

/// One node: what every kind has, and the body of its kind.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub description: String,
    /// Named expressions evaluated by the engine when the job starts; the job's parameters.
    pub with: BTreeMap<String, String>,
    pub worktree: Option<WorktreeUse>,
    /// Hard budget of visits; exceeding it ends the run with `budget_exhausted`.
    pub max_visits: Option<u32>,
    pub timeout_seconds: Option<u64>,
    pub image: Option<String>,
    /// Template for the folder of this job's artifacts under the run's prefix.
    pub artifacts: Option<String>,
    pub routes: Vec<Route>,
    /// What the node's commit may change, checked by the harness on git's own deltas before
    /// the commit is handed on. Required on every node whose worktree commits (but git nodes).
    pub writes: Option<Writes>,
    /// Harness-derived fields: name → expression over the finished job's `output` (and the run
    /// context); stored with the outcome as `derived` and used by routes. Verdicts live here.
    pub derive: BTreeMap<String, String>,
    /// Where to go when `max_visits` is exhausted (instead of failing the run).
    pub budget_exit: Option<NodeId>,
    /// Stuck detection: the same `signature` seen `times` times routes to `to`.
    pub stuck: Option<Stuck>,
    /// The run may end without waiting for this node; its output is attached when it arrives.
    pub advisory: bool,
    /// An observer: started after each finished visit of these nodes, with that outcome as
    /// `params.observed`; never routes, its latest output is attached to the result.
    pub observes: Vec<NodeId>,
    /// In a child run: each ok visit is sent, as an event of this name, to the sibling runs
    /// still running (their `on_sibling` handler starts).
    pub broadcast: Option<String>,
    pub body: NodeBody,
}

/// What one kind of node has that no other kind has.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeBody {
    Agent(Box<AgentBody>),
    /// Argv command templates, split with shell rules, never run by a shell.
    Command {
        commands: Vec<String>,
    },
    Harness {
        op: HarnessOp,
    },
    /// Applies `with.commits` onto the worktree's base.
    Git {
        op: GitOp,
    },
    /// Static arrivals; empty for the join of a fan-out (its count is set at fan-out time).
    Join {
        wait_for: Vec<NodeId>,
    },
    Fanout {
        /// Expression giving the list of items, one branch each.
        over: String,
        body: NodeId,
        join: NodeId,
    },
    Approval {
        /// An expression whose value the person deciding is shown (in the run's status, the
        /// API and `fleet approve`): e.g. the review's statistics and warnings.
        show: Option<String>,
        /// A JSON schema (a bundle file) for edits the person may send with an approval (the
        /// decision's `edits`, refused unless they fit it); none: an approval takes no edits.
        edits: Option<String>,
    },
    Spawn(SpawnBody),
    Exit {
        /// Expression deciding whether the run succeeded.
        status: String,
        /// A built-in result assembler (`factory_summary`, ...) or the generic outputs.
        result: Option<String>,
    },
}

impl NodeBody {
    /// Whether the step runs in a container (agents, commands, harness ops that run the
    /// repository's code); the others run in the worker itself.
    pub fn needs_container(&self) -> bool {
        match self {
            NodeBody::Agent(_) | NodeBody::Command { .. } => true,
            NodeBody::Harness { op } => op.runs_in_container(),
            _ => false,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct AgentBody {
    pub template: String,
    /// The `submit` tool's JSON schema (a bundle file).
    pub output_schema: String,
    pub tools: Vec<Tool>,
    /// Expression giving the list of worktree files whose contents the prompt receives.
    pub context_files: Option<String>,
    /// Continue the agent session (transcript) of this node instead of starting a new one.
    pub continues: Option<NodeId>,
    /// Seconds after which the agent is told to finish (a nudge), before the hard timeout.
    pub nudge_after_seconds: Option<u64>,
    /// Claims of the agent's output checked against the files it changed.
    pub claims: Option<Claims>,
    /// One session invoked in increments with checkpoints between them (seed 003).
    pub incremental: Option<Incremental>,
    /// Messages to other agents' sessions after each invocation that committed something.
    pub crosstalk: Vec<Crosstalk>,
    /// Seed 004's tool profile and retry strategy (none: every tool offered, the seed's
    /// strategies).
    pub tool_policy: Option<ToolPolicy>,
    /// Expression over `output` giving the screenshots the answer cites as evidence: each
    /// must be one this job took, or the answer is invalid (`output_invalid`).
    pub evidence: Option<String>,
    /// Seed 004's independent verifier: the harness's setup, the answer's steps matched against
    /// the feature's with the job's screenshots, its own model.
    pub verifier: Option<VerifierPolicy>,
}

/// A spawn node: child runs of the same graph, one per item.
#[derive(Clone, Debug, PartialEq)]
pub struct SpawnBody {
    /// Expression giving the list of items, one child run each.
    pub over: String,
    /// Expression giving a child's input from `item` and `index` (default: the item itself);
    /// checked against the graph's input schema.
    pub input: Option<String>,
    /// Expression giving the commit the children start from (default: this run's base).
    pub base: Option<String>,
    pub wait: SpawnWait,
}

/// When a spawn node stops waiting for its children.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SpawnWait {
    /// Every child finished.
    #[default]
    All,
    /// Every child succeeded, or the first one that did not (the others are cancelled).
    FirstFailure,
}

/// Harness steps a worker knows how to run.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum HarnessOp {
    /// The factory's TR: scope-check and `git apply` the SE's diff.
    ApplyPatch,
    /// The factory's PO: verification, then the acceptance commands.
    FactoryVerify,
    Noop,
    /// The pinned test runner, its report judged per test.
    RunTests,
    CheckSkeleton,
    CheckBuild,
    GenerateMutants,
    RunMutants,
    TallyMutants,
    /// Seed 001's Rebaser restriction: the worktree's changes since `with.since` make only
    /// edits the sibling's change (`with.sibling_from` → `with.sibling_to`) made
    /// (`shared::mechanical`).
    CheckMechanical,
    /// Seed 003's skeleton generation: `with.files` (a list of `{path, template}`) written
    /// into the worktree from the bundle's templates, rendered over `with` (the semantic types
    /// an agent gave; never code it wrote).
    RenderFiles,
    /// Seed 004's review: `feature_list.json` read from disk, its statistics and warnings; an
    /// initializer's claims (`passes: true`) are set back to false.
    ReviewFeatures,
    /// Seed 004's claims, read from disk: the list a coder session left judged against
    /// `with.accepted` (the run state's list); every edit but a clean claim is refused and the
    /// accepted list, with the claims, is written back.
    ExtractClaims,
    /// Seed 004's quality gates: `with.gates` (`{name, command, blocking}`) run in the
    /// container, each judged; a failed blocking gate fails the step.
    RunGates,
    /// Seed 004's settling: the verifiers' votes on `with.claims` become verdicts on disk and
    /// per-feature state.
    SettleClaims,
    /// Its parameters as its output (to carry a branch's findings to its join).
    Collect,
}

impl HarnessOp {
    pub const ALL: &'static [HarnessOp] = &[
        HarnessOp::ApplyPatch,
        HarnessOp::FactoryVerify,
        HarnessOp::Noop,
        HarnessOp::RunTests,
        HarnessOp::CheckSkeleton,
        HarnessOp::CheckBuild,
        HarnessOp::GenerateMutants,
        HarnessOp::RunMutants,
        HarnessOp::TallyMutants,
        HarnessOp::CheckMechanical,
        HarnessOp::RenderFiles,
        HarnessOp::ReviewFeatures,
        HarnessOp::ExtractClaims,
        HarnessOp::RunGates,
        HarnessOp::SettleClaims,
        HarnessOp::Collect,
    ];

    pub fn name(self) -> &'static str {
        match self {
            HarnessOp::ApplyPatch => "apply_patch",
            HarnessOp::FactoryVerify => "factory_verify",
            HarnessOp::Noop => "noop",
            HarnessOp::RunTests => "run_tests",
            HarnessOp::CheckSkeleton => "check_skeleton",
            HarnessOp::CheckBuild => "check_build",
            HarnessOp::GenerateMutants => "generate_mutants",
            HarnessOp::RunMutants => "run_mutants",
            HarnessOp::TallyMutants => "tally_mutants",
            HarnessOp::CheckMechanical => "check_mechanical",
            HarnessOp::RenderFiles => "render_files",
            HarnessOp::ReviewFeatures => "review_features",
            HarnessOp::ExtractClaims => "extract_claims",
            HarnessOp::RunGates => "run_gates",
            HarnessOp::SettleClaims => "settle_claims",
            HarnessOp::Collect => "collect",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|op| op.name() == name)
    }

    /// Runs commands in the job's container (and so needs an image and a sandbox).
    pub fn runs_in_container(self) -> bool {
        matches!(
            self,
            HarnessOp::FactoryVerify
                | HarnessOp::RunTests
                | HarnessOp::CheckSkeleton
                | HarnessOp::CheckBuild
                | HarnessOp::RunMutants
                | HarnessOp::RunGates
        )
    }

    /// May run long, so the worker announces its start (a hung worker can be superseded).
    pub fn announces_start(self) -> bool {
        !matches!(
            self,
            HarnessOp::Noop
                | HarnessOp::ApplyPatch
                | HarnessOp::CheckMechanical
                | HarnessOp::RenderFiles
                | HarnessOp::ReviewFeatures
                | HarnessOp::ExtractClaims
                | HarnessOp::SettleClaims
                | HarnessOp::Collect
        )
    }
}

/// What a git node does with `with.commits`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum GitOp {
    CherryPick,
    /// Applies the commits, then squashes them into one commit.
    SquashMerge,
    Rebase,
}

impl GitOp {
    pub const ALL: &'static [GitOp] = &[GitOp::CherryPick, GitOp::SquashMerge, GitOp::Rebase];

    pub fn name(self) -> &'static str {
        match self {
            GitOp::CherryPick => "cherry_pick",
            GitOp::SquashMerge => "squash_merge",
            GitOp::Rebase => "rebase",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|op| op.name() == name)
    }
}

impl Node {
    pub fn kind(&self) -> NodeKind {
        match &self.body {
            NodeBody::Agent(_) => NodeKind::Agent,
            NodeBody::Command { .. } => NodeKind::Command,
            NodeBody::Harness { .. } => NodeKind::Harness,
            NodeBody::Git { .. } => NodeKind::Git,
            NodeBody::Join { .. } => NodeKind::Join,
            NodeBody::Fanout { .. } => NodeKind::Fanout,
            NodeBody::Approval { .. } => NodeKind::Approval,
            NodeBody::Spawn(_) => NodeKind::Spawn,
            NodeBody::Exit { .. } => NodeKind::Exit,
        }
    }

    pub fn agent(&self) -> Option<&AgentBody> {
        match &self.body {
            NodeBody::Agent(a) => Some(a),
            _ => None,
        }
    }

    /// The static arrivals of a join (none for any other kind).
    pub fn wait_for(&self) -> &[NodeId] {
        match &self.body {
            NodeBody::Join { wait_for } => wait_for,
            _ => &[],
        }
    }

    /// The command templates of a command node (none for any other kind).
    pub fn commands(&self) -> &[String] {
        match &self.body {
            NodeBody::Command { commands } => commands,
            _ => &[],
        }
    }

    /// Whether the worktree's changes become a commit.
    pub fn commits(&self) -> bool {
        self.worktree.as_ref().is_some_and(|w| w.commit)
    }

    /// Whether the node's step runs in a container (`NodeBody::needs_container`).
    pub fn needs_container(&self) -> bool {
        self.body.needs_container()
    }

    /// The op's name, for harness and git nodes.
    pub fn op_name(&self) -> Option<&'static str> {
        match &self.body {
            NodeBody::Harness { op } => Some(op.name()),
            NodeBody::Git { op } => Some(op.name()),
            _ => None,
        }
    }
}

impl Graph {
    /// Every file the graph references, as (node, field, path).
    pub fn referenced_files(&self) -> Vec<(String, &'static str, String)> {
        let mut out = Vec::new();
        if let Some(schema) = &self.input_schema {
            out.push((String::new(), "input_schema", schema.clone()));
        }
        for f in &self.files {
            out.push((String::new(), "files", f.clone()));
        }
        for (id, node) in &self.nodes {
            if let Some(a) = node.agent() {
                out.push((id.to_string(), "template", a.template.clone()));
                out.push((id.to_string(), "output_schema", a.output_schema.clone()));
            }
            if let NodeBody::Approval {
                edits: Some(schema),
                ..
            } = &node.body
            {
                out.push((id.to_string(), "edits", schema.clone()));
            }
        }
        out
    }

    pub fn node(&self, id: &NodeId) -> Option<&Node> {
        self.nodes.get(id)
    }

    pub fn timeout_for(&self, node: &Node) -> u64 {
        node.timeout_seconds
            .unwrap_or(self.defaults.timeout_seconds)
    }

    pub fn image_for(&self, node: &Node) -> Option<String> {
        node.image.clone().or_else(|| self.defaults.image.clone())
    }
}

/// Reads a graph from YAML: the YAML form first (unknown fields refused), then the typed form,
/// each mistake named with its node and field.
pub(crate) fn parse(source: &str, yaml: &str) -> Result<Graph, Vec<CheckError>> {
    let raw = serde_yaml::from_str::<RawGraph>(yaml).map_err(|e| {
        let location = e
            .location()
            .map(|l| format!(" (line {}, column {})", l.line(), l.column()))
            .unwrap_or_default();
        vec![CheckError::new(
            source,
            None,
            "",
            format!("malformed graph{location}: {e}"),
        )]
    })?;
    raw.into_graph().map_err(|errs| {
        errs.into_iter()
            .map(|e| {
                CheckError::new(
                    source,
                    e.node.as_ref().map(|n| n.as_str()),
                    &e.field,
                    e.message,
                )
            })
            .collect()
    })
}
