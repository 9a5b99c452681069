//! The static checker: rejects a bad graph before anything runs, naming file, node and field.

use super::{GraphBundle, Node, NodeKind};
use crate::expr;
use crate::ids::NodeId;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckError {
    pub source: String,
    pub node: Option<String>,
    pub field: String,
    pub message: String,
}

impl CheckError {
    pub fn new(source: &str, node: Option<&str>, field: &str, message: impl Into<String>) -> Self {
        Self {
            source: source.to_string(),
            node: node.filter(|n| !n.is_empty()).map(str::to_string),
            field: field.to_string(),
            message: message.into(),
        }
    }
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.source)?;
        if let Some(node) = &self.node {
            write!(f, ": node `{node}`")?;
        }
        if !self.field.is_empty() {
            write!(f, ": field `{}`", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for CheckError {}

/// Names the engine puts in the expression context beside the node names.
pub const RESERVED: &[&str] = &[
    "input",
    "visits",
    "last",
    "run",
    "params",
    "files",
    "loop",
    "item",
    "branch",
    "output",
    "derived",
    "approvals",
    "all",
];

/// Variables a worker adds when it renders an agent's prompt.
const WORKER_VARS: &[&str] = &[
    "params",
    "context_files",
    "tools",
    "output_schema",
    "item",
    "branch",
];

pub fn check(bundle: &GraphBundle) -> Result<(), Vec<CheckError>> {
    let g = &bundle.graph;
    let src = bundle.source.as_str();
    // Bounds first: nothing below runs on a graph too big to analyse quickly.
    if let Some(why) = crate::limits::graph_exceeds(g) {
        return Err(vec![CheckError::new(src, None, "", why)]);
    }
    let mut errs = Vec::new();
    let mut err = |node: Option<&NodeId>, field: &str, msg: String| {
        errs.push(CheckError::new(src, node.map(|n| n.as_str()), field, msg));
    };

    if !g.nodes.contains_key(&g.start) {
        err(None, "start", format!("unknown node `{}`", g.start));
    }
    if !g.nodes.values().any(|n| n.kind == NodeKind::Exit) {
        err(None, "nodes", "the graph has no exit node".to_string());
    }
    if let Some(prepare) = &g.prepare {
        if prepare != "factory" {
            err(None, "prepare", format!("unknown prepare hook `{prepare}`"));
        }
    }
    if let Some(path) = &g.input_schema {
        if let Err(e) = schema_check(bundle, path) {
            err(None, "input_schema", e);
        }
    }

    for (id, node) in &g.nodes {
        if RESERVED.contains(&id.as_str()) {
            err(Some(id), "", format!("`{id}` is a reserved name"));
        }
        if !id
            .as_str()
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            err(
                Some(id),
                "",
                "node names are letters, digits and `_`".into(),
            );
        }
        check_node(bundle, id, node, &mut err);
    }

    // Reachability from start; an observer is reachable when a node it watches is.
    let mut reachable = reachable_from(g, &g.start);
    for (id, n) in &g.nodes {
        if n.observes.iter().any(|o| reachable.contains(o)) {
            reachable.insert(id.clone());
        }
    }
    for id in g.nodes.keys() {
        if !reachable.contains(id) {
            err(Some(id), "", "unreachable from the start node".into());
        }
    }

    // Every cycle needs a budget: some node on it with max_visits.
    for scc in cycles(g) {
        if !scc.iter().any(|n| g.nodes[n].max_visits.is_some()) {
            let names: Vec<_> = scc.iter().map(|n| n.to_string()).collect();
            err(
                Some(&scc[0]),
                "max_visits",
                format!(
                    "loop through [{}] has no visit budget: set max_visits on one of them",
                    names.join(", ")
                ),
            );
        }
    }

    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

fn check_node(
    bundle: &GraphBundle,
    id: &NodeId,
    node: &Node,
    err: &mut impl FnMut(Option<&NodeId>, &str, String),
) {
    let g = &bundle.graph;
    let mut provided: BTreeSet<String> = RESERVED.iter().map(|s| s.to_string()).collect();
    provided.extend(g.nodes.keys().map(|n| n.to_string()));
    provided.extend(WORKER_VARS.iter().map(|s| s.to_string()));

    for route in &node.routes {
        for to in route.to.nodes() {
            if !g.nodes.contains_key(to) {
                err(Some(id), "routes", format!("route to unknown node `{to}`"));
            }
        }
        if let Some(when) = &route.when {
            if let Err(e) = expr::compile_check(when) {
                err(Some(id), "routes.when", e.to_string());
            }
        }
    }
    for (name, value) in &node.with {
        if let Err(e) = expr::compile_check(value) {
            err(Some(id), &format!("with.{name}"), e.to_string());
        }
    }
    if let Some(w) = &node.worktree {
        for from in w.from.nodes() {
            if from.as_str() == "base" {
                continue;
            }
            match g.nodes.get(from) {
                None => err(
                    Some(id),
                    "worktree.from",
                    format!("`{from}` is neither `base` nor a node"),
                ),
                Some(src) if !src.worktree.as_ref().is_some_and(|w| w.commit) => err(
                    Some(id),
                    "worktree.from",
                    format!("node `{from}` does not commit its worktree"),
                ),
                _ => {}
            }
        }
        if w.commit && w.mode == super::WorktreeMode::Ro {
            err(
                Some(id),
                "worktree.commit",
                "a read-only worktree cannot commit".into(),
            );
        }
    }
    let commits = node.worktree.as_ref().is_some_and(|w| w.commit);
    match &node.writes {
        None if commits && node.kind != NodeKind::Git => err(
            Some(id),
            "writes",
            "a node whose worktree commits needs a write scope (`writes`: the paths it may change; `[]` for none)".into(),
        ),
        Some(_) if !commits || node.kind == NodeKind::Git => err(
            Some(id),
            "writes",
            "only a node whose worktree commits has a write scope (git nodes pick commits already checked)".into(),
        ),
        Some(w) => {
            for e in &w.spec().paths {
                if let Err(e) = expr::compile_check(e) {
                    err(Some(id), "writes", e.to_string());
                }
            }
        }
        None => {}
    }
    if let Some(a) = &node.artifacts {
        if let Err(e) = expr::template_variables("artifacts", a) {
            err(Some(id), "artifacts", e.to_string());
        }
    }

    let terminal = node.kind == NodeKind::Exit;
    if terminal && !node.routes.is_empty() {
        err(Some(id), "routes", "an exit node has no routes".into());
    }
    let routeless_ok = !node.observes.is_empty()
        || (node.advisory && node.routes.is_empty())
        || node.kind == NodeKind::Fanout;
    if !terminal && !routeless_ok {
        match node.routes.last() {
            None => err(Some(id), "routes", "a node needs at least one route".into()),
            Some(r) if r.when.is_some() => err(
                Some(id),
                "routes",
                "the last route must have no `when`, so routing is total".into(),
            ),
            _ => {}
        }
    }

    for (name, e) in &node.derive {
        if let Err(e) = expr::compile_check(e) {
            err(Some(id), &format!("derive.{name}"), e.to_string());
        }
    }
    let exists = |n: &NodeId| g.nodes.contains_key(n);
    if let Some(b) = &node.budget_exit {
        if !exists(b) {
            err(Some(id), "budget_exit", format!("unknown node `{b}`"));
        }
        if node.max_visits.is_none() {
            err(Some(id), "budget_exit", "needs max_visits".into());
        }
    }
    if let Some(st) = &node.stuck {
        if !exists(&st.to) {
            err(Some(id), "stuck.to", format!("unknown node `{}`", st.to));
        }
        if let Err(e) = expr::compile_check(&st.signature) {
            err(Some(id), "stuck.signature", e.to_string());
        }
        if st.times < 2 {
            err(Some(id), "stuck.times", "must be at least 2".into());
        }
    }
    for o in &node.observes {
        if !exists(o) {
            err(Some(id), "observes", format!("unknown node `{o}`"));
        }
    }
    if let Some(c) = &node.continues {
        match g.nodes.get(c) {
            Some(n) if n.kind == NodeKind::Agent => {}
            Some(_) => err(Some(id), "continues", format!("`{c}` is not an agent node")),
            None => err(Some(id), "continues", format!("unknown node `{c}`")),
        }
        if node.kind != NodeKind::Agent {
            err(
                Some(id),
                "continues",
                "only agent nodes continue sessions".into(),
            );
        }
    }
    if let Some(claims) = &node.claims {
        if !super::claims_languages().contains(&claims.language.as_str()) {
            err(
                Some(id),
                "claims.language",
                format!("no claim checker for `{}`", claims.language),
            );
        }
        for (f, e) in [
            ("claims.defines", &claims.defines),
            ("claims.exercises", &claims.exercises),
        ] {
            if let Some(e) = e {
                if let Err(e) = expr::compile_check(e) {
                    err(Some(id), f, e.to_string());
                }
            }
        }
    }

    let forbid = |field: &str, present: bool, err: &mut dyn FnMut(&str, String)| {
        if present {
            err(
                field,
                format!("not allowed on a {:?} node", node.kind).to_lowercase(),
            );
        }
    };
    let mut e2 = |field: &str, msg: String| err(Some(id), field, msg);
    match node.kind {
        NodeKind::Agent => {
            match &node.template {
                None => e2("template", "required for an agent node".into()),
                Some(path) => match bundle.file(path) {
                    None => e2("template", format!("`{path}` not in the bundle")),
                    Some(text) => match expr::template_variables(path, text) {
                        Err(e) => e2("template", e.to_string()),
                        Ok(vars) => {
                            let unknown: Vec<_> = vars
                                .iter()
                                .filter(|v| !provided.contains(*v) && !node.with.contains_key(*v))
                                .cloned()
                                .collect();
                            if !unknown.is_empty() {
                                e2(
                                    "template",
                                    format!(
                                        "`{path}` uses variables nobody provides: {}",
                                        unknown.join(", ")
                                    ),
                                );
                            }
                        }
                    },
                },
            }
            match &node.output_schema {
                None => e2("output_schema", "required for an agent node".into()),
                Some(path) => {
                    if let Err(e) = schema_check(bundle, path) {
                        e2("output_schema", e);
                    }
                }
            }
            if let Some(c) = &node.context_files {
                if let Err(e) = expr::compile_check(c) {
                    e2("context_files", e.to_string());
                }
            }
            forbid("commands", !node.commands.is_empty(), &mut e2);
            forbid("op", node.op.is_some(), &mut e2);
        }
        NodeKind::Command => {
            if node.commands.is_empty() {
                e2(
                    "commands",
                    "a command node needs at least one command".into(),
                );
            }
            for c in &node.commands {
                if let Err(e) = expr::template_variables("command", c) {
                    e2("commands", e.to_string());
                }
            }
            forbid("template", node.template.is_some(), &mut e2);
        }
        NodeKind::Harness => match node.op.as_deref() {
            None => e2("op", "required for a harness node".into()),
            Some(op) if !HARNESS_OPS.contains(&op) => e2(
                "op",
                format!(
                    "unknown harness op `{op}` (known: {})",
                    HARNESS_OPS.join(", ")
                ),
            ),
            _ => {}
        },
        NodeKind::Exit => {
            if let Some(s) = &node.status {
                if let Err(e) = expr::compile_check(s) {
                    e2("status", e.to_string());
                }
            } else {
                e2("status", "an exit node needs a `status` expression".into());
            }
            if let Some(r) = &node.result {
                if !EXIT_ASSEMBLERS.contains(&r.as_str()) {
                    e2("result", format!("unknown result assembler `{r}`"));
                }
            }
            forbid("worktree", node.worktree.is_some(), &mut e2);
        }
        NodeKind::Join => {
            let fed_by_fanout = g
                .nodes
                .values()
                .any(|n| n.kind == NodeKind::Fanout && n.join.as_ref() == Some(id));
            if node.wait_for.is_empty() && !fed_by_fanout {
                e2(
                    "wait_for",
                    "a join waits for at least one node (or is a fan-out's join)".into(),
                );
            }
            for w in &node.wait_for {
                match g.nodes.get(w) {
                    None => e2("wait_for", format!("unknown node `{w}`")),
                    Some(n) if !n.routes.iter().any(|r| r.to.nodes().contains(&id)) => e2(
                        "wait_for",
                        format!("`{w}` never routes to this join, so the join could never fire"),
                    ),
                    _ => {}
                }
            }
            forbid("worktree", node.worktree.is_some(), &mut e2);
        }
        NodeKind::Fanout => {
            match &node.over {
                None => e2("over", "a fan-out needs the list expression `over`".into()),
                Some(o) => {
                    if let Err(e) = expr::compile_check(o) {
                        e2("over", e.to_string());
                    }
                }
            }
            match &node.body {
                None => e2("body", "a fan-out needs a `body` node".into()),
                Some(b) if !g.nodes.contains_key(b) => e2("body", format!("unknown node `{b}`")),
                _ => {}
            }
            match &node.join {
                None => e2(
                    "join",
                    "a fan-out needs the `join` where its branches meet".into(),
                ),
                Some(j) => match g.nodes.get(j) {
                    Some(n) if n.kind == NodeKind::Join => {}
                    _ => e2("join", format!("`{j}` is not a join node")),
                },
            }
        }
        NodeKind::Approval => {
            forbid("worktree", node.worktree.is_some(), &mut e2);
        }
        NodeKind::Git => {
            match node.op.as_deref() {
                Some("cherry_pick" | "squash_merge" | "rebase") => {}
                other => e2(
                    "op",
                    format!("git nodes run cherry_pick, squash_merge or rebase, not {other:?}"),
                ),
            }
            if !node.with.contains_key("commits") {
                e2("with.commits", "required: the commits to apply".into());
            }
            if !node.worktree.as_ref().is_some_and(|w| w.commit) {
                e2(
                    "worktree",
                    "a git node needs a worktree with `commit: true`".into(),
                );
            }
        }
    }
}

/// Harness steps a worker knows how to run.
pub const HARNESS_OPS: &[&str] = &[
    "apply_patch",
    "factory_verify",
    "noop",
    "run_tests",
    "check_skeleton",
    "check_build",
    "generate_mutants",
    "run_mutants",
    "tally_mutants",
];
/// Built-in result assemblers of exit nodes.
pub const EXIT_ASSEMBLERS: &[&str] = &["factory_summary", "hybrid_result"];

fn schema_check(bundle: &GraphBundle, path: &str) -> Result<(), String> {
    let text = bundle
        .file(path)
        .ok_or_else(|| format!("`{path}` not in the bundle"))?;
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("`{path}` is not JSON: {e}"))?;
    crate::schema::compile(&value)
        .map(|_| ())
        .map_err(|e| format!("`{path}` is not a valid JSON schema: {e}"))
}

/// Every node control can pass to from `node`: routes, fan-out bodies and joins, budget and
/// stuck exits.
fn successors(node: &Node) -> impl Iterator<Item = &NodeId> {
    node.routes
        .iter()
        .flat_map(|r| r.to.nodes())
        .chain(node.body.iter())
        .chain(node.join.iter())
        .chain(node.budget_exit.iter())
        .chain(node.stuck.iter().map(|s| &s.to))
}

fn reachable_from(g: &super::Graph, start: &NodeId) -> BTreeSet<NodeId> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![start.clone()];
    while let Some(n) = stack.pop() {
        if !seen.insert(n.clone()) {
            continue;
        }
        if let Some(node) = g.nodes.get(&n) {
            stack.extend(
                successors(node)
                    .filter(|s| g.nodes.contains_key(*s))
                    .cloned(),
            );
        }
    }
    seen
}

/// Strongly connected components that form a loop (more than one node, or a self route).
fn cycles(g: &super::Graph) -> Vec<Vec<NodeId>> {
    let ids: Vec<&NodeId> = g.nodes.keys().collect();
    let reach: BTreeMap<&NodeId, BTreeSet<NodeId>> = ids
        .iter()
        .map(|id| {
            let direct: Vec<NodeId> = successors(&g.nodes[*id])
                .filter(|s| g.nodes.contains_key(*s))
                .cloned()
                .collect();
            let mut all = BTreeSet::new();
            for d in direct {
                all.extend(reachable_from(g, &d));
            }
            (*id, all)
        })
        .collect();
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for id in &ids {
        if assigned.contains(*id) || !reach[id].contains(*id) {
            continue;
        }
        let scc: Vec<NodeId> = ids
            .iter()
            .filter(|o| reach[id].contains(**o) && reach[**o].contains(*id))
            .map(|o| (*o).clone())
            .collect();
        assigned.extend(scc.iter().cloned());
        out.push(scc);
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::graph::load_bundle;

    fn load(yaml: &str) -> Result<(), Vec<String>> {
        load_bundle("g.yaml", yaml, |p| match p {
            "t.md" => Ok("do {{ input.x }}".into()),
            "s.json" => Ok(r#"{"type":"object"}"#.into()),
            "bad.md" => Ok("{{ nobody }}".into()),
            _ => Err("no such file".into()),
        })
        .map(|_| ())
        .map_err(|es| es.iter().map(|e| e.to_string()).collect())
    }

    const OK: &str = r#"
name: g
start: a
nodes:
  a:
    kind: agent
    template: t.md
    output_schema: s.json
    max_visits: 3
    routes:
      - to: done
        when: a.ok
      - to: a
  done:
    kind: exit
    status: a.ok
"#;

    #[test]
    fn accepts_a_good_graph() {
        assert_eq!(load(OK), Ok(()));
    }

    #[test]
    fn a_node_that_commits_needs_a_write_scope_and_only_such_a_node_has_one() {
        let committing = OK.replace(
            "    max_visits: 3\n",
            "    max_visits: 3\n    worktree: {from: base, mode: rw, commit: true}\n",
        );
        let errs = load(&committing).unwrap_err();
        assert!(
            errs.iter()
                .any(|e| e.contains("field `writes`") && e.contains("needs a write scope")),
            "{errs:?}"
        );
        let scoped = committing.replace(
            "    max_visits: 3\n",
            "    max_visits: 3\n    writes: [input.impl, \"['a.py']\"]\n",
        );
        assert_eq!(load(&scoped), Ok(()));
        let full = committing.replace(
            "    max_visits: 3\n",
            "    max_visits: 3\n    writes: {paths: [input.impl], symlinks: true}\n",
        );
        assert_eq!(load(&full), Ok(()));
        let stray = OK.replace("    max_visits: 3\n", "    max_visits: 3\n    writes: []\n");
        let errs = load(&stray).unwrap_err();
        assert!(
            errs.iter()
                .any(|e| e.contains("only a node whose worktree commits")),
            "{errs:?}"
        );
        let bad = scoped.replace("input.impl", "input.(");
        assert!(load(&bad).is_err());
    }

    #[test]
    fn a_graph_past_the_limits_is_refused_before_it_is_analysed() {
        let mut yaml = String::from("name: big\nstart: n0\nnodes:\n");
        for i in 0..20_000 {
            yaml.push_str(&format!(
                "  n{i}:\n    kind: harness\n    op: noop\n    routes: [{{to: n{}}}]\n",
                i + 1
            ));
        }
        yaml.push_str("  n20000: {kind: exit, status: 'true'}\n");
        let errs = load(&yaml).unwrap_err();
        assert!(errs[0].contains("20001 nodes; at most 500"), "{errs:?}");
        let errs = load(&OK.replace("max_visits: 3", "max_visits: 4000000000")).unwrap_err();
        assert!(errs[0].contains("max_visits is above"), "{errs:?}");
    }

    #[test]
    fn names_file_node_and_field_of_an_unknown_route() {
        let errs = load(&OK.replace("- to: a\n", "- to: nowhere\n")).unwrap_err();
        assert!(
            errs.iter()
                .any(|e| e == "g.yaml: node `a`: field `routes`: route to unknown node `nowhere`"),
            "{errs:?}"
        );
    }

    #[test]
    fn refuses_a_loop_without_budget() {
        let errs = load(&OK.replace("    max_visits: 3\n", "")).unwrap_err();
        assert!(
            errs.iter().any(|e| e.contains("has no visit budget")),
            "{errs:?}"
        );
    }

    #[test]
    fn refuses_unreachable_nodes_and_missing_files() {
        let yaml = OK.replace("t.md", "missing.md").to_string()
            + "  orphan:\n    kind: exit\n    status: 'true'\n";
        let errs = load(&yaml).unwrap_err();
        assert!(
            errs.iter().any(|e| e.contains("cannot read `missing.md`")),
            "{errs:?}"
        );
        let errs = load(&(OK.to_string() + "  orphan:\n    kind: exit\n    status: 'true'\n"))
            .unwrap_err();
        assert!(errs
            .iter()
            .any(|e| e.contains("node `orphan`") && e.contains("unreachable")));
    }

    #[test]
    fn refuses_template_variables_nobody_provides() {
        let errs = load(&OK.replace("t.md", "bad.md")).unwrap_err();
        assert!(
            errs.iter()
                .any(|e| e.contains("variables nobody provides: nobody")),
            "{errs:?}"
        );
    }

    #[test]
    fn refuses_a_join_whose_inputs_cannot_all_arrive() {
        let yaml = r#"
name: j
start: a
nodes:
  a:
    kind: harness
    op: noop
    routes: [{to: [b, c]}]
  b:
    kind: harness
    op: noop
    routes: [{to: meet}]
  c:
    kind: harness
    op: noop
    routes: [{to: done}]
  meet:
    kind: join
    wait_for: [b, c]
    routes: [{to: done}]
  done:
    kind: exit
    status: "true"
"#;
        let errs = load(yaml).unwrap_err();
        assert!(
            errs.iter().any(|e| e.contains("node `meet`: field `wait_for`: `c` never routes to this join")),
            "{errs:?}"
        );
    }

    #[test]
    fn refuses_unknown_fields_with_a_location() {
        let errs = load(&OK.replace("max_visits", "max_visit")).unwrap_err();
        assert!(errs[0].starts_with("g.yaml: malformed graph"), "{errs:?}");
    }
}
