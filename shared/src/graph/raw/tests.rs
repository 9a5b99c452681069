//! The YAML form: unknown fields named, write scopes in both forms, and the typed form's
//! refusals (a field on the wrong kind, a missing required field, an unknown op).

use super::*;

fn node(yaml: &str) -> Result<RawNode, String> {
    serde_yaml::from_str::<RawNode>(yaml).map_err(|e| e.to_string())
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
    let graph = serde_json::json!({"name": "g", "start": "a", "nodes": {"a": {"kind": "exit", "status": "true"}}});
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
        let e = crate::graph::model::parse("g.yaml", yaml).unwrap_err();
        let text = e[0].to_string();
        assert!(text.contains(&format!("unknown field `{field}`")), "{text}");
    }
}

fn typed(yaml: &str) -> Result<Node, Vec<(String, String)>> {
    node(yaml).expect("yaml form").into_node()
}

#[test]
fn a_field_of_another_kind_is_refused_on_every_kind() {
    let cases = [
        (
            "kind: command\ncommands: [x]\ntemplate: t.md\n",
            "template",
            "command",
        ),
        ("kind: join\nop: noop\n", "op", "join"),
        (
            "kind: exit\nstatus: 'true'\nclaims: {language: python}\n",
            "claims",
            "exit",
        ),
        (
            "kind: harness\nop: noop\ncontinues: a\n",
            "continues",
            "harness",
        ),
        (
            "kind: approval\nworktree: {from: base}\n",
            "worktree",
            "approval",
        ),
        (
            "kind: fanout\nover: x\nbody: b\njoin: j\nstatus: 'true'\n",
            "status",
            "fanout",
        ),
        (
            "kind: git\nop: rebase\nnudge_after_seconds: 3\n",
            "nudge_after_seconds",
            "git",
        ),
    ];
    for (yaml, field, kind) in cases {
        let errs = typed(yaml).unwrap_err();
        assert!(
            errs.iter()
                .any(|(f, m)| f == field && m == &format!("not allowed on a {kind} node")),
            "{yaml}: {errs:?}"
        );
    }
}

#[test]
fn required_fields_and_ops_are_checked_when_the_graph_is_read() {
    let errs = typed("kind: agent\ntemplate: t.md\n").unwrap_err();
    assert_eq!(
        errs,
        vec![(
            "output_schema".to_string(),
            "required for an agent node".to_string()
        )]
    );
    let errs = typed("kind: harness\nop: run_test\n").unwrap_err();
    assert!(
        errs[0].1.contains("unknown harness op `run_test`"),
        "{errs:?}"
    );
    let errs = typed("kind: git\nop: merge\n").unwrap_err();
    assert!(errs[0].1.contains("not Some(\"merge\")"), "{errs:?}");
    let errs = typed("kind: fanout\nover: x\n").unwrap_err();
    let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(fields, vec!["body", "join"]);
    let errs = typed("kind: exit\nstatus: 'true'\nresult: bogus\n").unwrap_err();
    assert_eq!(errs[0].1, "unknown result assembler `bogus`");
}

#[test]
fn every_op_reads_as_its_variant_and_writes_back_as_written() {
    for op in HarnessOp::ALL {
        let n = typed(&format!("kind: harness\nop: {}\n", op.name())).unwrap();
        assert_eq!(n.body, NodeBody::Harness { op: *op });
        assert_eq!(RawNode::from(n).op.as_deref(), Some(op.name()));
    }
    for op in GitOp::ALL {
        let n = typed(&format!("kind: git\nop: {}\n", op.name())).unwrap();
        assert_eq!(n.kind(), NodeKind::Git);
        assert_eq!(n.op_name(), Some(op.name()));
    }
}

#[test]
fn the_typed_graph_round_trips_through_the_yaml_form_unchanged() {
    let yaml = "kind: agent\ntemplate: t.md\noutput_schema: s.json\ntools: [read_file]\ncontinues: a\nnudge_after_seconds: 5\nmax_visits: 2\nroutes: [{to: done}]\n";
    let raw = node(yaml).unwrap();
    let back = RawNode::from(raw.clone().into_node().unwrap());
    assert_eq!(back, raw);
    // A bundle's graph reads back from its JSON as it was (the bundle hash depends on it).
    let g: Graph = serde_json::from_value(serde_json::json!({
        "name": "g", "start": "a",
        "nodes": {"a": {"kind": "exit", "status": "true"}}
    }))
    .unwrap();
    let again: Graph = serde_json::from_value(serde_json::to_value(&g).unwrap()).unwrap();
    assert_eq!(again, g);
}
