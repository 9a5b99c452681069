//! The checker on small graphs: what it accepts, and what it refuses with file, node and field.

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
    let errs =
        load(&(OK.to_string() + "  orphan:\n    kind: exit\n    status: 'true'\n")).unwrap_err();
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
        errs.iter()
            .any(|e| e.contains("node `meet`: field `wait_for`: `c` never routes to this join")),
        "{errs:?}"
    );
}

#[test]
fn refuses_unknown_fields_with_a_location() {
    let errs = load(&OK.replace("max_visits", "max_visit")).unwrap_err();
    assert!(errs[0].starts_with("g.yaml: malformed graph"), "{errs:?}");
}

#[test]
fn a_git_directory_holds_base_and_committing_nodes_only() {
    let with_git = |branches: &str| {
        OK.replace(
            "    max_visits: 3\n",
            &format!(
                "    max_visits: 3\n    worktree: {{from: base, mode: rw, commit: true, git: {branches}}}\n    writes: []\n"
            ),
        )
    };
    assert_eq!(load(&with_git("[base, a]")), Ok(()));
    let errs = load(&with_git("[base, nowhere]")).unwrap_err();
    assert!(
        errs.iter()
            .any(|e| e.contains("worktree.git") && e.contains("`nowhere` is neither")),
        "{errs:?}"
    );
    let errs = load(&with_git("[done]")).unwrap_err();
    assert!(
        errs.iter().any(|e| e.contains("does not commit")),
        "{errs:?}"
    );
    let many: Vec<String> = (0..17).map(|_| "a".to_string()).collect();
    let errs = load(&with_git(&format!("[{}]", many.join(", ")))).unwrap_err();
    assert!(
        errs.iter().any(|e| e.contains("at most 16 branches")),
        "{errs:?}"
    );
}

#[test]
fn a_tool_policy_names_a_known_profile_that_offers_the_tools_listed() {
    let with = |policy: &str, tools: &str| {
        OK.replace(
            "    max_visits: 3\n",
            &format!("    max_visits: 3\n    tools: {tools}\n    tool_policy: {policy}\n"),
        )
    };
    assert_eq!(load(&with("{profile: python_app}", "[browser]")), Ok(()));
    assert_eq!(load(&with("{profile: auto}", "[browser]")), Ok(()));
    let errs = load(&with("{profile: api_backend}", "[read_file, browser]")).unwrap_err();
    assert!(
        errs.iter()
            .any(|e| e.contains("tool_policy.profile") && e.contains("offers no browser")),
        "{errs:?}"
    );
    let errs = load(&with("{profile: rails_app}", "[read_file]")).unwrap_err();
    assert!(
        errs.iter()
            .any(|e| e.contains("unknown profile `rails_app`")),
        "{errs:?}"
    );
    let stalling = "{profile: cli_tool, retry: {max_attempts: 1000, backoff_seconds: [3600]}}";
    let errs = load(&with(stalling, "[read_file]")).unwrap_err();
    assert!(
        errs.iter().any(|e| e.contains("retry.max_attempts"))
            && errs.iter().any(|e| e.contains("retry.backoff_seconds")),
        "{errs:?}"
    );
    let errs = load(&OK.replace(
        "  done:\n    kind: exit\n",
        "  done:\n    kind: exit\n    tool_policy: {profile: web_app}\n",
    ))
    .unwrap_err();
    assert!(errs.iter().any(|e| e.contains("tool_policy")), "{errs:?}");
}

/// The bundle of `OK` with `s.json` holding `schema`.
fn bundle_with_schema(schema: &str) -> crate::graph::GraphBundle {
    let schema = schema.to_string();
    load_bundle("g.yaml", OK, move |p| match p {
        "t.md" => Ok("do {{ input.x }}".into()),
        "s.json" => Ok(schema.clone()),
        _ => Err("no such file".into()),
    })
    .expect("the graph itself is valid")
}

#[test]
fn an_output_schema_with_a_top_level_one_of_is_refused_for_anthropic_naming_the_rule() {
    use crate::providers::Provider;
    let b =
        bundle_with_schema(r#"{"type":"object","oneOf":[{"required":["a"]},{"required":["b"]}]}"#);
    let found = super::check_providers(&b, &[Provider::Anthropic]);
    let errs: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(errs.len(), 1, "{errs:?}");
    let e = &errs[0];
    for part in [
        "g.yaml",
        "node `a`",
        "field `output_schema`",
        "`s.json`",
        "anthropic",
        "input_schema does not support oneOf, allOf, or anyOf at the top level",
    ] {
        assert!(e.contains(part), "{part} missing from {e}");
    }
    // OpenAI documents no such rule for plain function calling: no warning for it either.
    assert!(found.warnings.is_empty(), "{:?}", found.warnings);
    // Submitted with OpenAI, the Anthropic rule is a warning, not an error.
    let found = super::check_providers(&b, &[Provider::Openai]);
    assert!(found.errors.is_empty(), "{:?}", found.errors);
    assert_eq!(found.warnings.len(), 1);
    assert!(found.warnings[0].to_string().contains("anthropic"));
}

#[test]
fn an_output_schema_that_is_no_object_is_refused_for_both_providers() {
    use crate::providers::Provider;
    let b = bundle_with_schema(r#"{"type":"array","items":{"type":"string"}}"#);
    let found = super::check_providers(&b, &Provider::ALL);
    let errs: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(errs.len(), 2, "{errs:?}");
    for p in ["anthropic", "openai"] {
        assert!(
            errs.iter()
                .any(|e| e.contains(p) && e.contains(crate::providers::RULE_OBJECT)),
            "{p}: {errs:?}"
        );
    }
    // A root if/then/else is what both accept.
    let b = bundle_with_schema(
        r#"{"type":"object","if":{"required":["a"]},"then":{"not":{"required":["b"]}},"else":{"required":["b"]}}"#,
    );
    let found = super::check_providers(&b, &Provider::ALL);
    assert!(
        found.errors.is_empty() && found.warnings.is_empty(),
        "{:?}",
        found.errors
    );
}
