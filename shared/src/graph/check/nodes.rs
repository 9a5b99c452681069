//! One node's checks against the rest of the graph and its bundle: routes and expressions,
//! worktree and write scope, budgets, stuck detection, observers, and what each kind's body
//! names (templates, schemas, sessions, claims, joins, fan-outs). Which fields a kind has, and
//! its ops, were settled when the graph was read (`graph::raw`).

use super::{schema_check, RESERVED, WORKER_VARS};
use crate::expr;
use crate::graph::{GraphBundle, Node, NodeBody, NodeKind, Tool, ToolPolicy};
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
            if from.as_str() == "event" {
                if w.from.nodes().len() > 1 || g.on_sibling.is_empty() {
                    err(
                        Some(id),
                        "worktree.from",
                        "`event` (the latest sibling event's commit) stands alone, in a graph with `on_sibling`".into(),
                    );
                }
                continue;
            }
            match g.nodes.get(from) {
                None => err(
                    Some(id),
                    "worktree.from",
                    format!("`{from}` is neither `base`, `event` nor a node"),
                ),
                Some(src) if !src.commits() => err(
                    Some(id),
                    "worktree.from",
                    format!("node `{from}` does not commit its worktree"),
                ),
                _ => {}
            }
        }
        for branch in w.git.iter().flatten() {
            match g.nodes.get(branch) {
                _ if branch.as_str() == "base" => {}
                None => err(
                    Some(id),
                    "worktree.git",
                    format!("`{branch}` is neither `base` nor a node"),
                ),
                Some(src) if !src.commits() => err(
                    Some(id),
                    "worktree.git",
                    format!("node `{branch}` does not commit its worktree"),
                ),
                _ => {}
            }
        }
        if w.git
            .as_ref()
            .is_some_and(|b| b.len() > crate::graph::MAX_GIT_BRANCHES)
        {
            err(
                Some(id),
                "worktree.git",
                format!("at most {} branches", crate::graph::MAX_GIT_BRANCHES),
            );
        }
        if w.commit && w.mode == crate::graph::WorktreeMode::Ro {
            err(
                Some(id),
                "worktree.commit",
                "a read-only worktree cannot commit".into(),
            );
        }
    }
    let commits = node.commits();
    let kind = node.kind();
    match &node.writes {
        None if commits && kind != NodeKind::Git => err(
            Some(id),
            "writes",
            "a node whose worktree commits needs a write scope (`writes`: the paths it may change; `[]` for none)".into(),
        ),
        Some(_) if !commits || kind == NodeKind::Git => err(
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
    if let Some(name) = &node.broadcast {
        if !valid_event_name(name) {
            err(
                Some(id),
                "broadcast",
                format!("`{name}`: event names are letters, digits and `_`"),
            );
        }
    }
    if let Some(a) = &node.artifacts {
        if let Err(e) = expr::template_variables("artifacts", a) {
            err(Some(id), "artifacts", e.to_string());
        }
    }

    let terminal = kind == NodeKind::Exit;
    if terminal && !node.routes.is_empty() {
        err(Some(id), "routes", "an exit node has no routes".into());
    }
    // A sibling event's handler is a path of its own: it may end without routing on.
    let handler = g.on_sibling.values().any(|t| t == id);
    let routeless_ok = !node.observes.is_empty()
        || (node.advisory && node.routes.is_empty())
        || (handler && node.routes.is_empty())
        || kind == NodeKind::Fanout;
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
    let mut e2 = |field: &str, msg: String| err(Some(id), field, msg);
    match &node.body {
        NodeBody::Agent(agent) => {
            let path = &agent.template;
            match bundle.file(path) {
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
            }
            if let Err(e) = schema_check(bundle, &agent.output_schema) {
                e2("output_schema", e);
            }
            if let Some(c) = &agent.context_files {
                if let Err(e) = expr::compile_check(c) {
                    e2("context_files", e.to_string());
                }
            }
            if let Some(c) = &agent.continues {
                match g.nodes.get(c) {
                    Some(n) if n.kind() == NodeKind::Agent => {}
                    Some(_) => e2("continues", format!("`{c}` is not an agent node")),
                    None => e2("continues", format!("unknown node `{c}`")),
                }
            }
            if let Some(inc) = &agent.incremental {
                if !(1..=crate::limits::MAX_INVOCATIONS).contains(&inc.max_invocations) {
                    e2(
                        "incremental.max_invocations",
                        format!(
                            "must be 1 to {}, not {}",
                            crate::limits::MAX_INVOCATIONS,
                            inc.max_invocations
                        ),
                    );
                }
                if inc.stuck_after == 0 {
                    e2("incremental.stuck_after", "must be at least 1".into());
                }
                let mut names = std::collections::BTreeSet::new();
                for c in &inc.checkpoints {
                    let word = c
                        .name
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-');
                    if c.name.is_empty() || !word || !names.insert(c.name.as_str()) {
                        e2(
                            "incremental.checkpoints",
                            format!(
                                "checkpoint names must be unique words (letters, digits, `_`, `-`): `{}`",
                                c.name
                            ),
                        );
                    }
                    if let Err(e) = expr::template_variables("checkpoint", &c.command) {
                        e2("incremental.checkpoints", e.to_string());
                    }
                }
            }
            for talk in &agent.crosstalk {
                match g.nodes.get(&talk.to) {
                    _ if talk.to == *id => e2("crosstalk", "a node cannot message itself".into()),
                    Some(n) if n.agent().is_some_and(|a| a.incremental.is_some()) => {}
                    Some(_) => e2(
                        "crosstalk",
                        format!("`{}` is not an incremental agent node", talk.to),
                    ),
                    None => e2("crosstalk", format!("unknown node `{}`", talk.to)),
                }
                if let Err(e) = expr::template_variables("crosstalk", &talk.message) {
                    e2("crosstalk", e.to_string());
                }
            }
            if let Some(Err(e)) = agent.evidence.as_deref().map(expr::compile_check) {
                e2("evidence", e.to_string());
            }
            if let Some(v) = &agent.verifier {
                let exprs = [Some(&v.steps), v.model.as_ref()];
                for e in exprs.into_iter().flatten() {
                    if let Err(e) = expr::compile_check(e) {
                        e2("verifier", e.to_string());
                    }
                }
                if v.setup.as_deref().is_some_and(|s| s.trim().is_empty()) {
                    e2("verifier", "`setup` is an empty command".into());
                }
            }
            if let Some(policy) = &agent.tool_policy {
                for (field, problem) in tool_policy_problems(policy, &agent.tools) {
                    e2(field, problem);
                }
            }
            if let Some(claims) = &agent.claims {
                if !crate::graph::claims_languages().contains(&claims.language.as_str()) {
                    e2(
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
                            e2(f, e.to_string());
                        }
                    }
                }
            }
        }
        NodeBody::Command { commands } => {
            for c in commands {
                if let Err(e) = expr::template_variables("command", c) {
                    e2("commands", e.to_string());
                }
            }
        }
        NodeBody::Harness { .. } => {}
        NodeBody::Approval { show, edits } => {
            if let Some(Err(e)) = show.as_deref().map(expr::compile_check) {
                err(Some(id), "show", e.to_string());
            }
            if let Some(Err(e)) = edits.as_deref().map(|p| schema_check(bundle, p)) {
                err(Some(id), "edits", e);
            }
        }
        NodeBody::Exit { status, .. } => {
            if let Err(e) = expr::compile_check(status) {
                e2("status", e.to_string());
            }
        }
        NodeBody::Join { wait_for } => {
            let fed_by_fanout = g
                .nodes
                .values()
                .any(|n| matches!(&n.body, NodeBody::Fanout { join, .. } if join == id));
            if wait_for.is_empty() && !fed_by_fanout {
                e2(
                    "wait_for",
                    "a join waits for at least one node (or is a fan-out's join)".into(),
                );
            }
            for w in wait_for {
                match g.nodes.get(w) {
                    None => e2("wait_for", format!("unknown node `{w}`")),
                    Some(n) if !n.routes.iter().any(|r| r.to.nodes().contains(&id)) => e2(
                        "wait_for",
                        format!("`{w}` never routes to this join, so the join could never fire"),
                    ),
                    _ => {}
                }
            }
        }
        NodeBody::Fanout { over, body, join } => {
            if let Err(e) = expr::compile_check(over) {
                e2("over", e.to_string());
            }
            if !g.nodes.contains_key(body) {
                e2("body", format!("unknown node `{body}`"));
            }
            match g.nodes.get(join) {
                Some(n) if n.kind() == NodeKind::Join => {}
                _ => e2("join", format!("`{join}` is not a join node")),
            }
        }
        NodeBody::Spawn(spawn) => {
            for (field, e) in [
                ("over", Some(&spawn.over)),
                ("input", spawn.input.as_ref()),
                ("base", spawn.base.as_ref()),
            ] {
                if let Some(Err(e)) = e.map(|e| expr::compile_check(e)) {
                    e2(field, e.to_string());
                }
            }
        }
        NodeBody::Git { .. } => {
            if !node.with.contains_key("commits") {
                e2("with.commits", "required: the commits to apply".into());
            }
            if !commits {
                e2(
                    "worktree",
                    "a git node needs a worktree with `commit: true`".into(),
                );
            }
        }
    }
}

/// An event name between sibling runs: 1 to 64 letters, digits and `_`.
pub(super) fn valid_event_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A tool policy names a known profile (or `auto`), does not offer the browser under a
/// profile without one, and bounds its retries (a retry strategy cannot stall a job).
fn tool_policy_problems(policy: &ToolPolicy, tools: &[Tool]) -> Vec<(&'static str, String)> {
    use crate::resilience::{profile, PROFILE_NAMES};
    let mut out = Vec::new();
    let name = policy.profile.as_str();
    if name != "auto" && !PROFILE_NAMES.contains(&name) {
        out.push((
            "tool_policy.profile",
            format!(
                "unknown profile `{name}` (one of {}, or auto)",
                PROFILE_NAMES.join(", ")
            ),
        ));
    } else if name != "auto" && tools.contains(&Tool::Browser) && !profile(name).browser {
        out.push((
            "tool_policy.profile",
            format!("profile `{name}` offers no browser, yet the node lists the browser tool"),
        ));
    }
    if let Some(retry) = &policy.retry {
        if !(1..=MAX_TOOL_ATTEMPTS).contains(&retry.max_attempts) {
            out.push((
                "tool_policy.retry.max_attempts",
                format!("must be from 1 to {MAX_TOOL_ATTEMPTS}"),
            ));
        }
        if retry.backoff_seconds.is_empty()
            || retry
                .backoff_seconds
                .iter()
                .any(|s| *s > MAX_TOOL_BACKOFF_SECONDS)
        {
            out.push((
                "tool_policy.retry.backoff_seconds",
                format!("one or more waits, each at most {MAX_TOOL_BACKOFF_SECONDS} seconds"),
            ));
        }
    }
    out
}

const MAX_TOOL_ATTEMPTS: u32 = 10;
const MAX_TOOL_BACKOFF_SECONDS: u64 = 60;
