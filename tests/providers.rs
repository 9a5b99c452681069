//! The fleet against the LLM providers' rules: a graph whose agent schema a provider would
//! refuse is refused by `fleet graph check` (and at submission), naming the rule; the
//! repository's graphs pass both providers.

use fleet_tests::stack::{run_cli, workspace_root};

const GRAPH: &str = r#"
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

/// A graph folder whose agent's output schema is `schema`; returns the graph file's path.
fn graph_with_schema(dir: &std::path::Path, schema: &str) -> anyhow::Result<String> {
    std::fs::write(dir.join("t.md"), "do {{ input.x }}")?;
    std::fs::write(dir.join("s.json"), schema)?;
    let path = dir.join("graph.yaml");
    std::fs::write(&path, GRAPH)?;
    Ok(path.display().to_string())
}

#[test]
fn graph_check_refuses_a_top_level_one_of_naming_the_provider_rule() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = graph_with_schema(
        dir.path(),
        r#"{"type":"object","oneOf":[{"required":["a"]},{"required":["b"]}]}"#,
    )?;
    let out = run_cli(&["graph", "check", &path], &[])?;
    assert_ne!(out.code, 0, "{}", out.stdout);
    for part in [
        "node `a`",
        "`s.json`",
        "anthropic",
        "input_schema does not support oneOf, allOf, or anyOf at the top level",
    ] {
        assert!(out.stderr.contains(part), "{part}: {}", out.stderr);
    }
    let out = run_cli(&["graph", "check", &path, "--llm-api", "anthropic"], &[])?;
    assert_ne!(out.code, 0, "{}", out.stdout);
    // For a run on OpenAI the Anthropic rule is a warning: the check passes and says so.
    let out = run_cli(&["graph", "check", &path, "--llm-api", "openai"], &[])?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("warning") && out.stderr.contains("anthropic"),
        "{}",
        out.stderr
    );
    // A schema that is no object is refused for OpenAI too.
    let path = graph_with_schema(dir.path(), r#"{"type":"array"}"#)?;
    let out = run_cli(&["graph", "check", &path, "--llm-api", "openai"], &[])?;
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(
        out.stderr.contains("openai") && out.stderr.contains("`type: \"object\"`"),
        "{}",
        out.stderr
    );
    Ok(())
}

#[test]
fn the_repository_graphs_pass_both_providers() -> anyhow::Result<()> {
    for g in [
        "factory",
        "hybrid-tdd",
        "v3-tree",
        "types-first",
        "hardened-coder",
    ] {
        let path = workspace_root().join("graphs").join(g).join("graph.yaml");
        let out = run_cli(&["graph", "check", &path.display().to_string()], &[])?;
        assert_eq!(out.code, 0, "{g}: {}", out.stderr);
        assert!(!out.stderr.contains("warning"), "{g}: {}", out.stderr);
    }
    Ok(())
}

#[path = "providers/refusals.rs"]
mod refusals;

#[path = "providers/fleet_requests.rs"]
mod fleet_requests;

#[path = "providers/e2e.rs"]
mod e2e;

#[path = "providers/graphs.rs"]
mod graphs;

#[path = "providers/team_budget.rs"]
mod team_budget;

#[path = "providers/gateway_sdk.rs"]
mod gateway_sdk;

#[path = "providers/retries.rs"]
mod retries;
