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
    /// `base` (the run's baseline commit) or the name of a node whose commit to start from.
    #[serde(default = "base")]
    pub from: String,
    #[serde(default)]
    pub mode: WorktreeMode,
    /// Commit the worktree's changes after the job and hand the commit to later nodes.
    #[serde(default)]
    pub commit: bool,
}

fn base() -> String {
    "base".to_string()
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub to: NodeId,
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

    // exit
    #[serde(default)]
    pub status: Option<String>,
    /// Exit: a built-in result assembler (`factory_summary`) or absent for the generic result.
    #[serde(default)]
    pub result: Option<String>,
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
