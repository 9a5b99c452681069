//! The graph as written in YAML (and as a bundle carries it): one flat node with every field
//! of every kind, unknown fields refused. [`RawGraph::into_graph`] turns it into the typed
//! [`Graph`], refusing a field on a kind that has no such field, a missing required field and
//! an unknown op, each named with its node and field.

use super::{
    AgentBody, Claims, Crosstalk, Defaults, GitOp, Graph, HarnessOp, Incremental, Node, NodeBody,
    NodeKind, QuarantineDef, Route, SpawnBody, SpawnWait, Stuck, Tool, ToolPolicy, VerifierPolicy,
    WorktreeUse, Writes,
};
use crate::ids::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// At most this many mistakes are reported for one graph.
const MAX_ERRORS: usize = 100;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawGraph {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub start: NodeId,
    #[serde(default)]
    pub prepare: Option<String>,
    #[serde(default)]
    pub defaults: Defaults,
    #[serde(default)]
    pub input_schema: Option<String>,
    /// In a child run: the node entered when a sibling run broadcasts this event name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub on_sibling: BTreeMap<String, NodeId>,
    /// Bundle files no node names itself (templates a `render_files` node picks by input).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// Items put on hold for people, and the approval node that waits for their decisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<QuarantineDef>,
    pub nodes: BTreeMap<NodeId, RawNode>,
}

/// One node as written: the fields of every kind; `into_node` keeps those of its kind.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawNode {
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
    /// In a child run: each ok visit is sent as this event to the running sibling runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broadcast: Option<String>,
    /// Continue the agent session (transcript) of this node instead of starting a new one.
    #[serde(default)]
    pub continues: Option<NodeId>,
    /// Seconds after which the agent is told to finish (a nudge), before the hard timeout.
    #[serde(default)]
    pub nudge_after_seconds: Option<u64>,
    /// Claims of the agent's output checked against the files it changed.
    #[serde(default)]
    pub claims: Option<Claims>,
    /// One session invoked in increments with checkpoints between them (seed 003).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incremental: Option<Incremental>,
    /// Messages to other agents' sessions after each invocation that committed something.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub crosstalk: Vec<Crosstalk>,
    /// Seed 004's tool profile and retry strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_policy: Option<ToolPolicy>,
    /// Screenshots the answer cites, each one this job must have taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
    /// Seed 004's independent verifier: its setup, steps matched, model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verifier: Option<VerifierPolicy>,

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

    // spawn (and `over` above)
    /// Expression giving a child run's input from `item` and `index`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// Expression giving the commit child runs start from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<SpawnWait>,

    // approval
    /// What the person deciding is shown (an expression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show: Option<String>,
    /// The schema of edits a person may send with an approval (a bundle file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edits: Option<String>,

    // exit
    #[serde(default)]
    pub status: Option<String>,
    /// Exit: a built-in result assembler (`factory_summary`) or absent for the generic result.
    #[serde(default)]
    pub result: Option<String>,
}

/// A mistake in the YAML form: its node (none for the graph's own fields), field and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub node: Option<NodeId>,
    pub field: String,
    pub message: String,
}

impl RawGraph {
    /// The typed graph, or every mistake found (at most [`MAX_ERRORS`]).
    pub fn into_graph(self) -> Result<Graph, Vec<FieldError>> {
        let mut errors = Vec::new();
        let mut nodes = BTreeMap::new();
        for (id, raw) in self.nodes {
            match raw.into_node() {
                Ok(node) => {
                    nodes.insert(id, node);
                }
                Err(errs) => {
                    for (field, message) in errs {
                        if errors.len() < MAX_ERRORS {
                            errors.push(FieldError {
                                node: Some(id.clone()),
                                field,
                                message,
                            });
                        }
                    }
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Graph {
            name: self.name,
            description: self.description,
            start: self.start,
            prepare: self.prepare,
            defaults: self.defaults,
            input_schema: self.input_schema,
            on_sibling: self.on_sibling,
            files: self.files,
            quarantine: self.quarantine,
            nodes,
        })
    }
}

impl TryFrom<RawGraph> for Graph {
    type Error = String;

    fn try_from(raw: RawGraph) -> Result<Self, String> {
        raw.into_graph().map_err(|errs| {
            let parts: Vec<String> = errs
                .iter()
                .map(|e| match &e.node {
                    Some(n) => format!("node `{n}`: field `{}`: {}", e.field, e.message),
                    None => format!("field `{}`: {}", e.field, e.message),
                })
                .collect();
            parts.join("; ")
        })
    }
}

impl From<Graph> for RawGraph {
    fn from(g: Graph) -> Self {
        RawGraph {
            name: g.name,
            description: g.description,
            start: g.start,
            prepare: g.prepare,
            defaults: g.defaults,
            input_schema: g.input_schema,
            on_sibling: g.on_sibling,
            files: g.files,
            quarantine: g.quarantine,
            nodes: g.nodes.into_iter().map(|(id, n)| (id, n.into())).collect(),
        }
    }
}

/// The kinds that have a field of their own.
fn owners(field: &str) -> &'static [NodeKind] {
    use NodeKind::*;
    match field {
        "template"
        | "output_schema"
        | "tools"
        | "context_files"
        | "continues"
        | "nudge_after_seconds"
        | "claims"
        | "incremental"
        | "crosstalk"
        | "tool_policy"
        | "evidence"
        | "verifier" => &[Agent],
        "commands" => &[Command],
        "op" => &[Harness, Git],
        "wait_for" => &[Join],
        "over" => &[Fanout, Spawn],
        "body" | "join" => &[Fanout],
        "input" | "base" | "wait" => &[Spawn],
        "show" | "edits" => &[Approval],
        "status" | "result" => &[Exit],
        // A worktree belongs to the kinds that run in one.
        "worktree" => &[Agent, Command, Harness, Git, Fanout],
        _ => &[
            Agent, Command, Harness, Git, Join, Fanout, Approval, Spawn, Exit,
        ],
    }
}

/// `v`, or an empty string and the error `why` on `field` when it is missing.
fn need(errs: &mut Vec<(String, String)>, field: &str, v: Option<String>, why: &str) -> String {
    v.unwrap_or_else(|| {
        errs.push((field.to_string(), why.to_string()));
        String::new()
    })
}

fn kind_name(kind: NodeKind) -> String {
    format!("{kind:?}").to_lowercase()
}

impl RawNode {
    /// The fields present, by name.
    fn present(&self) -> Vec<&'static str> {
        let fields = [
            ("template", self.template.is_some()),
            ("output_schema", self.output_schema.is_some()),
            ("tools", !self.tools.is_empty()),
            ("context_files", self.context_files.is_some()),
            ("continues", self.continues.is_some()),
            ("nudge_after_seconds", self.nudge_after_seconds.is_some()),
            ("claims", self.claims.is_some()),
            ("incremental", self.incremental.is_some()),
            ("crosstalk", !self.crosstalk.is_empty()),
            ("tool_policy", self.tool_policy.is_some()),
            ("evidence", self.evidence.is_some()),
            ("verifier", self.verifier.is_some()),
            ("commands", !self.commands.is_empty()),
            ("op", self.op.is_some()),
            ("wait_for", !self.wait_for.is_empty()),
            ("over", self.over.is_some()),
            ("body", self.body.is_some()),
            ("join", self.join.is_some()),
            ("input", self.input.is_some()),
            ("base", self.base.is_some()),
            ("wait", self.wait.is_some()),
            ("show", self.show.is_some()),
            ("edits", self.edits.is_some()),
            ("status", self.status.is_some()),
            ("result", self.result.is_some()),
            ("worktree", self.worktree.is_some()),
        ];
        fields
            .into_iter()
            .filter(|(_, present)| *present)
            .map(|(f, _)| f)
            .collect()
    }

    /// The typed node, or every mistake as (field, message).
    pub fn into_node(self) -> Result<Node, Vec<(String, String)>> {
        let kind = self.kind;
        let mut errs: Vec<(String, String)> = self
            .present()
            .into_iter()
            .filter(|f| !owners(f).contains(&kind))
            .map(|f| {
                (
                    f.to_string(),
                    format!("not allowed on a {} node", kind_name(kind)),
                )
            })
            .collect();
        let body = match kind {
            NodeKind::Agent => NodeBody::Agent(Box::new(AgentBody {
                template: need(
                    &mut errs,
                    "template",
                    self.template,
                    "required for an agent node",
                ),
                output_schema: need(
                    &mut errs,
                    "output_schema",
                    self.output_schema,
                    "required for an agent node",
                ),
                tools: self.tools,
                context_files: self.context_files,
                continues: self.continues,
                nudge_after_seconds: self.nudge_after_seconds,
                claims: self.claims,
                incremental: self.incremental,
                crosstalk: self.crosstalk,
                tool_policy: self.tool_policy,
                evidence: self.evidence,
                verifier: self.verifier,
            })),
            NodeKind::Command => {
                if self.commands.is_empty() {
                    errs.push((
                        "commands".into(),
                        "a command node needs at least one command".into(),
                    ));
                }
                NodeBody::Command {
                    commands: self.commands,
                }
            }
            NodeKind::Harness => {
                let op = need(&mut errs, "op", self.op, "required for a harness node");
                let known: Vec<&str> = HarnessOp::ALL.iter().map(|o| o.name()).collect();
                match HarnessOp::from_name(&op) {
                    Some(op) => NodeBody::Harness { op },
                    None => {
                        if !op.is_empty() {
                            errs.push((
                                "op".into(),
                                format!("unknown harness op `{op}` (known: {})", known.join(", ")),
                            ));
                        }
                        NodeBody::Approval {
                            show: None,
                            edits: None,
                        }
                    }
                }
            }
            NodeKind::Git => match self.op.as_deref().and_then(GitOp::from_name) {
                Some(op) => NodeBody::Git { op },
                None => {
                    errs.push((
                        "op".into(),
                        format!(
                            "git nodes run cherry_pick, squash_merge or rebase, not {:?}",
                            self.op
                        ),
                    ));
                    NodeBody::Approval {
                        show: None,
                        edits: None,
                    }
                }
            },
            NodeKind::Join => NodeBody::Join {
                wait_for: self.wait_for,
            },
            NodeKind::Fanout => NodeBody::Fanout {
                over: need(
                    &mut errs,
                    "over",
                    self.over,
                    "a fan-out needs the list expression `over`",
                ),
                body: NodeId::new(need(
                    &mut errs,
                    "body",
                    self.body.map(|b| b.to_string()),
                    "a fan-out needs a `body` node",
                )),
                join: NodeId::new(need(
                    &mut errs,
                    "join",
                    self.join.map(|j| j.to_string()),
                    "a fan-out needs the `join` where its branches meet",
                )),
            },
            NodeKind::Approval => NodeBody::Approval {
                show: self.show,
                edits: self.edits,
            },
            NodeKind::Spawn => NodeBody::Spawn(SpawnBody {
                over: need(
                    &mut errs,
                    "over",
                    self.over,
                    "a spawn node needs the list expression `over`",
                ),
                input: self.input,
                base: self.base,
                wait: self.wait.unwrap_or_default(),
            }),
            NodeKind::Exit => {
                if let Some(r) = &self.result {
                    if !crate::builtins::is_assembler(r) {
                        errs.push(("result".into(), format!("unknown result assembler `{r}`")));
                    }
                }
                NodeBody::Exit {
                    status: need(
                        &mut errs,
                        "status",
                        self.status,
                        "an exit node needs a `status` expression",
                    ),
                    result: self.result,
                }
            }
        };
        if !errs.is_empty() {
            return Err(errs);
        }
        Ok(Node {
            description: self.description,
            with: self.with,
            worktree: self.worktree,
            max_visits: self.max_visits,
            timeout_seconds: self.timeout_seconds,
            image: self.image,
            artifacts: self.artifacts,
            routes: self.routes,
            writes: self.writes,
            derive: self.derive,
            budget_exit: self.budget_exit,
            stuck: self.stuck,
            advisory: self.advisory,
            observes: self.observes,
            broadcast: self.broadcast,
            body,
        })
    }
}

impl From<Node> for RawNode {
    fn from(n: Node) -> Self {
        let mut raw = RawNode {
            kind: n.kind(),
            description: n.description,
            with: n.with,
            worktree: n.worktree,
            max_visits: n.max_visits,
            timeout_seconds: n.timeout_seconds,
            image: n.image,
            artifacts: n.artifacts,
            routes: n.routes,
            writes: n.writes,
            template: None,
            output_schema: None,
            tools: Vec::new(),
            context_files: None,
            commands: Vec::new(),
            op: None,
            derive: n.derive,
            budget_exit: n.budget_exit,
            stuck: n.stuck,
            advisory: n.advisory,
            observes: n.observes,
            broadcast: n.broadcast,
            continues: None,
            nudge_after_seconds: None,
            claims: None,
            incremental: None,
            crosstalk: Vec::new(),
            tool_policy: None,
            evidence: None,
            verifier: None,
            wait_for: Vec::new(),
            over: None,
            body: None,
            join: None,
            input: None,
            base: None,
            wait: None,
            show: None,
            edits: None,
            status: None,
            result: None,
        };
        match n.body {
            NodeBody::Agent(a) => {
                raw.template = Some(a.template);
                raw.output_schema = Some(a.output_schema);
                raw.tools = a.tools;
                raw.context_files = a.context_files;
                raw.continues = a.continues;
                raw.nudge_after_seconds = a.nudge_after_seconds;
                raw.claims = a.claims;
                raw.incremental = a.incremental;
                raw.crosstalk = a.crosstalk;
                raw.tool_policy = a.tool_policy;
                raw.evidence = a.evidence;
                raw.verifier = a.verifier;
            }
            NodeBody::Command { commands } => raw.commands = commands,
            NodeBody::Harness { op } => raw.op = Some(op.name().to_string()),
            NodeBody::Git { op } => raw.op = Some(op.name().to_string()),
            NodeBody::Join { wait_for } => raw.wait_for = wait_for,
            NodeBody::Fanout { over, body, join } => {
                raw.over = Some(over);
                raw.body = Some(body);
                raw.join = Some(join);
            }
            NodeBody::Approval { show, edits } => {
                raw.show = show;
                raw.edits = edits;
            }
            NodeBody::Spawn(s) => {
                raw.over = Some(s.over);
                raw.input = s.input;
                raw.base = s.base;
                raw.wait = Some(s.wait);
            }
            NodeBody::Exit { status, result } => {
                raw.status = Some(status);
                raw.result = result;
            }
        }
        raw
    }
}

#[cfg(test)]
mod tests;
