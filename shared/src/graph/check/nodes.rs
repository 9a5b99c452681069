//! One node's checks: its routes and expressions, worktree and write scope, budgets, stuck
//! detection, observers, sessions and claims, and the fields each node kind requires or
//! forbids.

use super::{schema_check, HARNESS_OPS, RESERVED, WORKER_VARS};
use crate::expr;
use crate::graph::{GraphBundle, Node, NodeKind};
use crate::ids::NodeId;
use std::collections::BTreeSet;

pub(super) fn check_node(
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
        if w.commit && w.mode == crate::graph::WorktreeMode::Ro {
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
        if !crate::graph::claims_languages().contains(&claims.language.as_str()) {
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
                if !crate::builtins::is_assembler(r) {
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
