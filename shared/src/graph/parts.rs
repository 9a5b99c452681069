//! The parts a node is made of, shared by the YAML form and the typed form: tools, worktree
//! use, route targets, write scopes, stuck detection and claims.

use crate::ids::NodeId;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Tool {
    ReadFile,
    ListDir,
    WriteFile,
    EditFile,
    RunCommand,
    /// A headless browser on the container's loopback (`fleet-browser` in the image).
    Browser,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WorktreeMode {
    #[default]
    Ro,
    Rw,
}

/// Which commit a node's worktree starts from, and whether its changes become a new commit.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorktreeUse {
    /// `base` (the run's baseline commit), the name of a node whose commit to start from, or a
    /// list of nodes: the one that finished last wins (a loop's latest commit).
    #[serde(default = "base")]
    pub from: Targets,
    #[serde(default)]
    pub mode: WorktreeMode,
    /// Commit the worktree's changes after the job and hand the commit to later nodes.
    #[serde(default)]
    pub commit: bool,
    /// A git directory in the worktree for agents that merge or rebase with git: it holds the
    /// latest commits of these nodes (and `base`) as branches and nothing else of the run or
    /// of the worker. Without it the worktree has no git directory at all. What the job hands
    /// on is still the harness's commit of the files, never the agent's history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<Vec<NodeId>>,
}

/// At most this many branches in a job's git directory.
pub const MAX_GIT_BRANCHES: usize = 16;

fn base() -> Targets {
    Targets::One(NodeId::new("base"))
}

/// One target or several (a fork: every target starts, in parallel).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Targets {
    One(NodeId),
    Many(Vec<NodeId>),
}

impl Targets {
    pub fn nodes(&self) -> Vec<&NodeId> {
        match self {
            Targets::One(n) => vec![n],
            Targets::Many(ns) => ns.iter().collect(),
        }
    }
}

impl std::fmt::Display for Targets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.nodes().iter().map(|n| n.to_string()).collect();
        f.write_str(&names.join(", "))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub to: Targets,
    /// Expression over the run context; absent means always.
    #[serde(default)]
    pub when: Option<String>,
}

/// A write scope as written in the graph: expressions over the run context, each giving one glob
/// or a list of globs (`input.spec.impl_path`, `input.work_order.allowed_files`), either as a
/// bare list or with the special kinds of change the node may also make. Read by hand rather
/// than as an untagged enum, so a misspelt field of the long form is named in the error.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(untagged)]
pub enum Writes {
    Paths(Vec<String>),
    Full(WritesSpec),
}

impl<'de> Deserialize<'de> for Writes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
        struct Shape;
        impl<'de> serde::de::Visitor<'de> for Shape {
            type Value = Writes;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a list of glob expressions, or {paths, symlinks, submodules, mode_changes}",
                )
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Writes, A::Error> {
                Vec::<String>::deserialize(SeqAccessDeserializer::new(seq)).map(Writes::Paths)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Writes, A::Error> {
                WritesSpec::deserialize(MapAccessDeserializer::new(map)).map(Writes::Full)
            }
        }
        d.deserialize_any(Shape)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WritesSpec {
    pub paths: Vec<String>,
    #[serde(default)]
    pub symlinks: bool,
    #[serde(default)]
    pub submodules: bool,
    #[serde(default)]
    pub mode_changes: bool,
}

impl Writes {
    pub fn spec(&self) -> WritesSpec {
        match self {
            Writes::Paths(paths) => WritesSpec {
                paths: paths.clone(),
                symlinks: false,
                submodules: false,
                mode_changes: false,
            },
            Writes::Full(s) => s.clone(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Stuck {
    /// Expression over the outcome context giving the failure signature (null: no signature).
    pub signature: String,
    pub times: u32,
    pub to: NodeId,
}

/// What an agent claims it wrote, checked against the files it changed (tree-sitter).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    /// Language of the files to parse (`python`).
    pub language: String,
    /// Expression over `output` giving names that must be defined in the changed files.
    #[serde(default)]
    pub defines: Option<String>,
    /// Expression over `output` giving a list of objects naming a test and the functions it
    /// claims to exercise: each test must call each function.
    #[serde(default)]
    pub exercises: Option<String>,
    /// Field of an `exercises` item holding the test name.
    #[serde(default = "test_field")]
    pub test_field: String,
    /// Field of an `exercises` item holding the list of function names.
    #[serde(default = "calls_field")]
    pub calls_field: String,
}

fn test_field() -> String {
    "test".into()
}
fn calls_field() -> String {
    "calls".into()
}

/// An agent node that works in increments (seed 003): one session invoked again and again,
/// each invocation answering with an `IncrementalProgress`, the harness's checkpoint commands
/// run between invocations and their failures put into the next one.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Incremental {
    /// Invocations at most (the loop's budget).
    pub max_invocations: u32,
    /// Invocations in a row that commit nothing and leave `remaining` as it was: stuck.
    #[serde(default = "stuck_after")]
    pub stuck_after: u32,
    /// Commands run in the container after each invocation (templates over the run context,
    /// split with shell rules, never run by a shell).
    #[serde(default)]
    pub checkpoints: Vec<CheckpointCommand>,
}

fn stuck_after() -> u32 {
    2
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckpointCommand {
    pub name: String,
    pub command: String,
}

/// After each invocation of this node that committed something, a message for the session of
/// node `to` (a template over `progress`, `invocation`, `node` and `commit`), delivered at its
/// next turn boundary, or to its next job if none runs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Crosstalk {
    pub to: NodeId,
    pub message: String,
}

/// Items a run puts on hold for people (seed 004's quarantine): `pending` is an expression over
/// the run context giving the items (ids) waiting now; a person's decision on one of them is
/// recorded in the run state (`quarantine` in expressions: item → decisions in order) and, when
/// the run waits at the approval node `hold`, releases it so the decision is applied at once.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QuarantineDef {
    pub pending: String,
    /// An expression giving a map of item to what a person should see about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<NodeId>,
}

/// Seed 004's tool policy of an agent node: its tool profile (checked in the container before
/// the agent starts; `auto` detects it from the spec: the node's `spec` parameter, else the
/// run input's `spec`, else the node's prompt) and, optionally, a retry
/// strategy replacing the seed's for the retriable error classes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolPolicy {
    /// One of the seed's profiles (`web_app`, `api_backend`, `cli_tool`, `static_site`,
    /// `python_app`) or `auto`.
    pub profile: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<crate::resilience::RetryConfig>,
}

impl ToolPolicy {
    /// The profile, `auto` detected from `spec`.
    pub fn resolve(&self, spec: &str) -> &'static crate::resilience::ToolProfile {
        let name = match self.profile.as_str() {
            "auto" => crate::resilience::detect_project_type(spec),
            name => name,
        };
        crate::resilience::profile(name)
    }
}

/// Seed 004's independent verifier on an agent node: the harness starts what it checks
/// (`setup`, run in its container before the agent, its output kept as `setup.log`; a failure
/// fails the job), its answer is matched against the feature's steps (`steps`, an expression
/// over `params`: every step answered one to one, a pass only with a screenshot the job took
/// for each, `shared::features::check_answer`; otherwise the answer is invalid), and it may
/// run on a model of its own (`model`, an expression over `params`; empty: the run's).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VerifierPolicy {
    pub steps: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}
