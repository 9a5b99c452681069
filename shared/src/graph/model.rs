use super::CheckError;
use crate::ids::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A graph as written in YAML. Unknown fields are errors, so a typo never silently changes
/// behaviour.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Graph {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub start: NodeId,
    /// A harness hook run at submission (input validation and run id); `factory` is built in.
    #[serde(default)]
    pub prepare: Option<String>,
    #[serde(default)]
    pub defaults: Defaults,
    /// JSON schema file the run input must satisfy.
    #[serde(default)]
    pub input_schema: Option<String>,
    pub nodes: BTreeMap<NodeId, Node>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u64,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            image: None,
            timeout_seconds: default_timeout(),
        }
    }
}

fn default_timeout() -> u64 {
    600
}

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
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Tool {
    ReadFile,
    ListDir,
    WriteFile,
    EditFile,
    RunCommand,
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
}

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

/// One node. Fields that belong to one kind only are checked by the static checker, which names
/// the node and field of each mistake.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub kind: NodeKind,
    #[serde(default)]
    pub description: String,
    /// Named expressions evaluated by the engine when the job starts; the job's parameters.
    #[serde(default)]
    pub with: BTreeMap<String, String>,
    #[serde(default)]
    pub worktree: Option<WorktreeUse>,
    /// Hard budget of visits; exceeding it ends the run with `budget_exhausted`.
    #[serde(default)]
    pub max_visits: Option<u32>,
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    #[serde(default)]
    pub image: Option<String>,
    /// Template for the folder of this job's artifacts under the run's prefix.
    #[serde(default)]
    pub artifacts: Option<String>,
    #[serde(default)]
    pub routes: Vec<Route>,
    /// What the node's commit may change, checked by the harness on git's own deltas before
    /// the commit is handed on. Required on every node whose worktree commits (but git nodes).
    #[serde(default)]
    pub writes: Option<Writes>,

    // agent
    #[serde(default)]
    pub template: Option<String>,
    #[serde(default)]
    pub output_schema: Option<String>,
    #[serde(default)]
    pub tools: Vec<Tool>,
    /// Expression giving the list of worktree files whose contents the prompt receives.
    #[serde(default)]
    pub context_files: Option<String>,

    // command
    #[serde(default)]
    pub commands: Vec<String>,

    // harness
    #[serde(default)]
    pub op: Option<String>,

    /// Harness-derived fields: name → expression over the finished job's `output` (and the run
    /// context); stored with the outcome as `derived` and used by routes. Verdicts live here.
    #[serde(default)]
    pub derive: BTreeMap<String, String>,
    /// Where to go when `max_visits` is exhausted (instead of failing the run).
    #[serde(default)]
    pub budget_exit: Option<NodeId>,
    /// Stuck detection: the same `signature` seen `times` times routes to `to`.
    #[serde(default)]
    pub stuck: Option<Stuck>,
    /// The run may end without waiting for this node; its output is attached when it arrives.
    #[serde(default)]
    pub advisory: bool,
    /// An observer: started after each finished visit of these nodes, with that outcome as
    /// `params.observed`; never routes, its latest output is attached to the result.
    #[serde(default)]
    pub observes: Vec<NodeId>,
    /// Continue the agent session (transcript) of this node instead of starting a new one.
    #[serde(default)]
    pub continues: Option<NodeId>,
    /// Seconds after which the agent is told to finish (a nudge), before the hard timeout.
    #[serde(default)]
    pub nudge_after_seconds: Option<u64>,
    /// Claims of the agent's output checked against the files it changed.
    #[serde(default)]
    pub claims: Option<Claims>,

    // join
    #[serde(default)]
    pub wait_for: Vec<NodeId>,

    // fanout
    #[serde(default)]
    pub over: Option<String>,
    #[serde(default)]
    pub body: Option<NodeId>,
    #[serde(default)]
    pub join: Option<NodeId>,

    // exit
    #[serde(default)]
    pub status: Option<String>,
    /// Exit: a built-in result assembler (`factory_summary`) or absent for the generic result.
    #[serde(default)]
    pub result: Option<String>,
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

impl Graph {
    /// Every file the graph references, as (node, field, path).
    pub fn referenced_files(&self) -> Vec<(String, &'static str, String)> {
        let mut out = Vec::new();
        if let Some(schema) = &self.input_schema {
            out.push((String::new(), "input_schema", schema.clone()));
        }
        for (id, node) in &self.nodes {
            if let Some(t) = &node.template {
                out.push((id.to_string(), "template", t.clone()));
            }
            if let Some(s) = &node.output_schema {
                out.push((id.to_string(), "output_schema", s.clone()));
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

pub(crate) fn parse(source: &str, yaml: &str) -> Result<Graph, Vec<CheckError>> {
    serde_yaml::from_str::<Graph>(yaml).map_err(|e| {
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(yaml: &str) -> Result<Node, String> {
        serde_yaml::from_str::<Node>(yaml).map_err(|e| e.to_string())
    }

    #[test]
    fn a_misspelt_field_of_a_write_scope_is_named() {
        let e = node("kind: agent\nwrites: {paths: [a], symlink: true}\n").unwrap_err();
        assert!(e.contains("unknown field `symlink`"), "{e}");
        let e = serde_json::from_str::<Writes>(r#"{"paths": [], "mode_change": true}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `mode_change`"), "{e}");
        let e = node("kind: agent\nwrites: 3\n").unwrap_err();
        assert!(e.contains("a list of glob expressions"), "{e}");
    }

    #[test]
    fn both_forms_of_a_write_scope_read_as_before() {
        let short = node("kind: agent\nwrites: [a, \"b ~ '/**'\"]\n").unwrap();
        assert_eq!(
            short.writes,
            Some(Writes::Paths(vec!["a".into(), "b ~ '/**'".into()]))
        );
        let full = node("kind: agent\nwrites: {paths: [a], symlinks: true}\n").unwrap();
        let spec = full.writes.unwrap().spec();
        assert_eq!(spec.paths, vec!["a".to_string()]);
        assert!(spec.symlinks && !spec.submodules && !spec.mode_changes);
        // Round trip through JSON (how a bundle travels).
        let w = Writes::Full(spec);
        let back: Writes = serde_json::from_value(serde_json::to_value(&w).unwrap()).unwrap();
        assert_eq!(back, w);
        let w = Writes::Paths(vec![]);
        let back: Writes = serde_json::from_value(serde_json::to_value(&w).unwrap()).unwrap();
        assert_eq!(back, w);
    }

    #[test]
    fn a_bundle_with_an_unknown_field_is_refused_naming_it() {
        let graph =
            serde_json::json!({"name": "g", "start": "a", "nodes": {"a": {"kind": "exit"}}});
        let ok = serde_json::json!({"source": "g.yaml", "graph": graph, "files": {}});
        assert!(serde_json::from_value::<crate::graph::GraphBundle>(ok.clone()).is_ok());
        let mut bad = ok.clone();
        bad["signature"] = serde_json::json!("x");
        let e = serde_json::from_value::<crate::graph::GraphBundle>(bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `signature`"), "{e}");
        let mut bad = ok;
        bad["graph"]["nodes"]["a"]["timeout"] = serde_json::json!(5);
        let e = serde_json::from_value::<crate::graph::GraphBundle>(bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `timeout`"), "{e}");
    }

    #[test]
    fn unknown_fields_anywhere_in_a_graph_are_named() {
        let cases = [
            ("name: g\nstart: a\nnodes: {}\nversion: 2\n", "version"),
            ("name: g\nstart: a\ndefaults: {imag: x}\nnodes: {}\n", "imag"),
            ("name: g\nstart: a\nnodes: {a: {kind: exit, retries: 1}}\n", "retries"),
            (
                "name: g\nstart: a\nnodes: {a: {kind: exit, routes: [{to: a, wen: x}]}}\n",
                "wen",
            ),
            (
                "name: g\nstart: a\nnodes: {a: {kind: agent, worktree: {from: base, comit: true}}}\n",
                "comit",
            ),
            (
                "name: g\nstart: a\nnodes: {a: {kind: agent, stuck: {signature: x, times: 2, to: a, after: 1}}}\n",
                "after",
            ),
            (
                "name: g\nstart: a\nnodes: {a: {kind: agent, claims: {language: python, define: x}}}\n",
                "define",
            ),
        ];
        for (yaml, field) in cases {
            let e = parse("g.yaml", yaml).unwrap_err();
            let text = e[0].to_string();
            assert!(text.contains(&format!("unknown field `{field}`")), "{text}");
        }
    }
}
