//! Graph tools: loading a graph file with its templates and schemas (the static checker runs on
//! it), the Mermaid rendering and a run's node states on it.

use anyhow::{anyhow, Context};
use serde_json::Value;
use shared::graph::{load_bundle, GraphBundle, NodeKind};
use std::path::Path;

/// Loads a graph file with its templates and schemas and runs the static checker.
pub fn load_graph(path: &Path) -> anyhow::Result<GraphBundle> {
    let yaml = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read graph `{}`", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    load_bundle(&path.display().to_string(), &yaml, |rel| {
        std::fs::read_to_string(dir.join(rel)).map_err(|e| e.to_string())
    })
    .map_err(|errs| {
        anyhow!(
            "the graph is invalid:\n{}",
            errs.iter()
                .map(|e| format!("  {e}"))
                .collect::<Vec<_>>()
                .join("\n")
        )
    })
}

/// The providers' rules on the graph's agent schemas: a breach of a provider in `providers`
/// fails, naming node, file, rule and provider; one of another provider is printed as a
/// warning on stderr.
pub fn check_for_providers(
    b: &GraphBundle,
    providers: &[shared::providers::Provider],
) -> anyhow::Result<()> {
    let found = shared::graph::check_providers(b, providers);
    for w in &found.warnings {
        eprintln!("warning: {w}");
    }
    if found.errors.is_empty() {
        return Ok(());
    }
    Err(anyhow!(
        "the graph is invalid for its provider:\n{}",
        found
            .errors
            .iter()
            .map(|e| format!("  {e}"))
            .collect::<Vec<_>>()
            .join("\n")
    ))
}

/// The graph as a Mermaid flowchart.
pub fn mermaid(b: &GraphBundle) -> String {
    let mut out = String::from("flowchart TD\n");
    for (id, n) in &b.graph.nodes {
        let op = n.op_name().unwrap_or("");
        let shape = match n.kind() {
            NodeKind::Exit => format!("{id}((\"{id}\"))"),
            NodeKind::Agent => format!("{id}[\"{id} (agent)\"]"),
            NodeKind::Harness => {
                format!("{id}{{{{\"{id} ({op})\"}}}}")
            }
            NodeKind::Command => format!("{id}[/\"{id} (command)\"/]"),
            NodeKind::Join => format!("{id}{{\"{id} (join)\"}}"),
            NodeKind::Fanout => format!("{id}[[\"{id} (fan-out)\"]]"),
            NodeKind::Approval => format!("{id}>\"{id} (approval)\"]"),
            NodeKind::Git => format!("{id}[(\"{id} (git {op})\")]"),
            NodeKind::Spawn => format!("{id}[[\"{id} (child runs)\"]]"),
        };
        out.push_str(&format!("  {shape}\n"));
        for r in &n.routes {
            match &r.when {
                Some(w) => out.push_str(&format!(
                    "  {id} -->|\"{}\"| {}\n",
                    w.replace('"', "'"),
                    r.to
                )),
                None => out.push_str(&format!("  {id} --> {}\n", r.to)),
            }
        }
    }
    out
}

/// Mermaid classes for a run's node states (from the status view): done, failed, running,
/// waiting, not reached; a spawn node's child runs in a box beside it.
pub fn live_states(b: &GraphBundle, status: &Value) -> String {
    let mut out = String::from(
        "  classDef done fill:#c8f7c5,stroke:#2e7d32\n  classDef failed fill:#f7c5c5,stroke:#c62828\n  \
         classDef running fill:#fff3b0,stroke:#f9a825\n  classDef waiting fill:#d0e0ff,stroke:#1565c0\n",
    );
    let jobs = status["jobs"].as_array().cloned().unwrap_or_default();
    let awaiting: Vec<String> = status["awaiting_approval"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for id in b.graph.nodes.keys() {
        let mine: Vec<&Value> = jobs.iter().filter(|j| j["node"] == id.as_str()).collect();
        let class = if awaiting.contains(&id.to_string()) {
            Some("waiting")
        } else if mine.iter().any(|j| j["state"] == "pending") {
            Some("running")
        } else if let Some(last) = mine.last() {
            Some(if last["status"] == "ok" {
                "done"
            } else {
                "failed"
            })
        } else if status["visits"][id.as_str()].as_u64().unwrap_or(0) > 0 {
            Some("done")
        } else {
            None
        };
        let children: Vec<&Value> = status["children"]
            .as_array()
            .map(|c| c.iter().filter(|c| c["node"] == id.as_str()).collect())
            .unwrap_or_default();
        let class = if children.iter().any(|c| c["status"].is_null()) {
            Some("running")
        } else {
            class
        };
        if let Some(c) = class {
            out.push_str(&format!("  class {id} {c}\n"));
        }
        if !children.is_empty() {
            // The child runs beside their spawn node, one line each.
            let lines: Vec<String> = children
                .iter()
                .map(|c| {
                    let status = c["status"].as_str().unwrap_or("running");
                    format!("{} {status}", c["run_id"].as_str().unwrap_or_default())
                })
                .collect();
            out.push_str(&format!(
                "  {id}__children[\"{}\"]\n  {id} -.->|child runs| {id}__children\n",
                lines.join("<br/>")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bundle() -> GraphBundle {
        let yaml = r#"
name: t
start: a
nodes:
  a:
    kind: approval
    routes: [{to: b}]
  b:
    kind: command
    commands: ["true"]
    image: img
    worktree: {from: base, mode: ro}
    routes: [{to: done, when: "b.ok"}, {to: done}]
  done: {kind: exit, status: "true"}
"#;
        load_bundle("t.yaml", yaml, |_| Err("no files".into())).unwrap()
    }

    #[test]
    fn the_chart_has_every_node_and_route() {
        let chart = mermaid(&bundle());
        assert!(chart.starts_with("flowchart TD\n"));
        assert!(chart.contains("a>\"a (approval)\"]"), "{chart}");
        assert!(chart.contains("b -->|\"b.ok\"| done"), "{chart}");
        assert!(chart.contains("done((\"done\"))"), "{chart}");
    }

    #[test]
    fn node_states_come_from_the_status_view() {
        let status = json!({
            "awaiting_approval": [],
            "visits": {"a": 1, "b": 1},
            "jobs": [{"node": "b", "state": "pending", "status": null}],
        });
        let s = live_states(&bundle(), &status);
        assert!(s.contains("class a done"), "{s}");
        assert!(s.contains("class b running"), "{s}");
        assert!(!s.contains("class done"), "{s}");
        let waiting = live_states(&bundle(), &json!({"awaiting_approval": ["a"]}));
        assert!(waiting.contains("class a waiting"), "{waiting}");
    }

    #[test]
    fn child_runs_are_drawn_beside_their_spawn_node_and_keep_it_running() {
        let status = json!({
            "visits": {"a": 1},
            "children": [
                {"run_id": "r-a-1-0", "node": "a", "visit": 1, "index": 0, "status": "succeeded"},
                {"run_id": "r-a-1-1", "node": "a", "visit": 1, "index": 1, "status": null},
            ],
        });
        let s = live_states(&bundle(), &status);
        assert!(s.contains("class a running"), "{s}");
        assert!(s.contains("r-a-1-0 succeeded<br/>r-a-1-1 running"), "{s}");
        assert!(s.contains("a -.->|child runs| a__children"), "{s}");
    }
}
