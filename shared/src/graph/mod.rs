//! Graph definitions: the YAML model, the typed model the engine runs, and the bundle that
//! carries a graph with its templates and schemas (content-addressed, so a job names the exact
//! graph it belongs to).

mod check;
mod model;
mod parts;
mod raw;

pub use check::{check, check_providers, CheckError, ProviderFindings};
pub use model::*;
pub use parts::*;
pub use raw::{FieldError, RawGraph, RawNode};

use crate::hashing::{canonical_hash, sha256_hex};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A graph plus every file it references (templates, schemas), keyed by path relative to the
/// graph file. This is what travels: it is stored once under its hash. Unknown fields are
/// refused, as in the graph itself.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GraphBundle {
    pub source: String,
    pub graph: Graph,
    pub files: BTreeMap<String, String>,
}

impl GraphBundle {
    pub fn hash(&self) -> String {
        canonical_hash(self)
    }

    pub fn file(&self, path: &str) -> Option<&str> {
        self.files.get(path).map(String::as_str)
    }
}

/// Parses a graph file and gathers the files it references through `read`, then runs the static
/// checker. `read` is the only I/O and is supplied by the caller.
pub fn load_bundle(
    source: &str,
    yaml: &str,
    mut read: impl FnMut(&str) -> Result<String, String>,
) -> Result<GraphBundle, Vec<CheckError>> {
    let graph = parse(source, yaml)?;
    if let Some(why) = crate::limits::graph_exceeds(&graph) {
        return Err(vec![CheckError::new(source, None, "", why)]);
    }
    let mut files = BTreeMap::new();
    let mut errors = Vec::new();
    for (node, field, path) in graph.referenced_files() {
        if files.contains_key(&path) {
            continue;
        }
        match read(&path) {
            Ok(text) => {
                files.insert(path, text);
            }
            Err(e) => errors.push(CheckError::new(
                source,
                Some(&node),
                field,
                format!("cannot read `{path}`: {e}"),
            )),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let bundle = GraphBundle {
        source: source.to_string(),
        graph,
        files,
    };
    check(&bundle)?;
    Ok(bundle)
}

/// Languages the claim checker can parse.
pub fn claims_languages() -> &'static [&'static str] {
    &["python"]
}

/// Content key of any file text, used in error messages and caches.
pub fn text_hash(text: &str) -> String {
    sha256_hex(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::tests::{arb_expr, arb_template};
    use crate::schema::tests::{arb_schema, arb_text, cases, timed, CASE_LIMIT};
    use proptest::prelude::*;
    use serde_json::{json, Value};

    const NAMES: &[&str] = &["a", "b", "c", "done", "input", "x-y"];
    const KINDS: &[&str] = &[
        "agent", "command", "harness", "exit", "join", "fanout", "approval", "git", "bogus",
    ];

    fn name() -> impl Strategy<Value = Value> {
        prop::sample::select(NAMES).prop_map(Value::from)
    }

    fn targets() -> impl Strategy<Value = Value> {
        prop_oneof![
            3 => name(),
            1 => prop::collection::vec(name(), 0..3).prop_map(Value::Array),
        ]
    }

    fn expr() -> impl Strategy<Value = Value> {
        arb_expr().prop_map(Value::from)
    }

    fn some<T: std::fmt::Debug>(s: impl Strategy<Value = T>) -> impl Strategy<Value = Option<T>> {
        prop::option::weighted(0.3, s)
    }

    /// A node: a kind and, each now and then, every field a node may have.
    fn arb_node() -> impl Strategy<Value = Value> {
        let routes =
            prop::collection::vec((targets(), prop::option::of(expr())), 0..3).prop_map(|rs| {
                json!(rs
                    .into_iter()
                    .map(|(to, when)| json!({"to": to, "when": when}))
                    .collect::<Vec<_>>())
            });
        let worktree = (
            prop_oneof![Just(json!("base")), targets()],
            prop::sample::select(vec!["ro", "rw"]),
            any::<bool>(),
        )
            .prop_map(|(from, mode, commit)| json!({"from": from, "mode": mode, "commit": commit}));
        let names = || prop::collection::vec(name(), 0..3).prop_map(Value::Array);
        let exprs = || prop::collection::vec(expr(), 0..3).prop_map(Value::Array);
        let map_of_exprs = || {
            prop::collection::btree_map(
                prop::sample::select(vec!["a", "commits", "x"]).prop_map(str::to_string),
                expr(),
                0..3,
            )
            .prop_map(|m| json!(m))
        };
        let first = (
            prop::sample::select(KINDS),
            some(routes),
            some(map_of_exprs()),
            some(worktree),
            some(0u32..4),
            some(prop::sample::select(vec!["t.j2", "missing.j2"])),
            some(prop::sample::select(vec!["s.json", "missing.json"])),
            some(prop::collection::vec(arb_template(), 0..2)),
        );
        let ops = prop::sample::select(vec![
            "apply_patch",
            "noop",
            "run_tests",
            "cherry_pick",
            "rebase",
            "bogus",
        ]);
        let second = (
            some(ops),
            some(expr()),
            some(names()),
            some((expr(), name(), name())),
            some(prop_oneof![
                exprs(),
                (exprs(), any::<bool>()).prop_map(|(p, s)| json!({"paths": p, "symlinks": s})),
            ]),
            some((expr(), 0u32..4, name())),
            some(names()),
            some(name()),
        );
        let third = (
            some((prop::sample::select(vec!["python", "rust"]), expr(), expr())),
            some(arb_template()),
            some(map_of_exprs()),
            some(name()),
            some(any::<bool>()),
            some(expr()),
            some(prop::sample::subsequence(
                vec![
                    "read_file",
                    "list_dir",
                    "write_file",
                    "edit_file",
                    "run_command",
                ],
                0..3,
            )),
            some(any::<u64>()),
        );
        (first, second, third).prop_map(
            |(
                (kind, routes, with, worktree, max_visits, template, output_schema, commands),
                (op, status, wait_for, fanout, writes, stuck, observes, continues),
                (claims, artifacts, derive, budget_exit, advisory, context_files, tools, nudge),
            )| {
                let mut node = json!({ "kind": kind });
                let fields = [
                    ("routes", routes),
                    ("with", with),
                    ("worktree", worktree),
                    ("max_visits", max_visits.map(Value::from)),
                    ("template", template.map(Value::from)),
                    ("output_schema", output_schema.map(Value::from)),
                    ("commands", commands.map(|c| json!(c))),
                    ("op", op.map(Value::from)),
                    ("status", status),
                    ("wait_for", wait_for),
                    ("over", fanout.as_ref().map(|f| f.0.clone())),
                    ("body", fanout.as_ref().map(|f| f.1.clone())),
                    ("join", fanout.map(|f| f.2)),
                    ("writes", writes),
                    (
                        "stuck",
                        stuck.map(|(signature, times, to)| {
                            json!({"signature": signature, "times": times, "to": to})
                        }),
                    ),
                    ("observes", observes),
                    ("continues", continues),
                    (
                        "claims",
                        claims.map(|(language, defines, exercises)| {
                            json!({"language": language, "defines": defines, "exercises": exercises})
                        }),
                    ),
                    ("artifacts", artifacts.map(Value::from)),
                    ("derive", derive),
                    ("budget_exit", budget_exit),
                    ("advisory", advisory.map(Value::from)),
                    ("context_files", context_files),
                    ("tools", tools.map(|t| json!(t))),
                    ("nudge_after_seconds", nudge.map(Value::from)),
                ];
                for (k, v) in fields {
                    if let Some(v) = v {
                        node[k] = v;
                    }
                }
                node
            },
        )
    }

    /// A graph file: mostly a graph's shape with nodes of any kind and fields, as YAML, now
    /// and then with a line broken; sometimes any text at all.
    fn arb_graph() -> impl Strategy<Value = String> {
        let graph = (
            arb_text(),
            name(),
            prop::collection::btree_map(
                prop::sample::select(NAMES).prop_map(str::to_string),
                arb_node(),
                1..5,
            ),
            some(Just("s.json")),
            some(prop::sample::select(vec!["factory", "bogus"])),
            some(any::<u64>()),
        )
            .prop_map(|(name, start, nodes, input_schema, prepare, timeout)| {
                let mut g = json!({"name": name, "start": start, "nodes": nodes});
                if let Some(s) = input_schema {
                    g["input_schema"] = json!(s);
                }
                if let Some(p) = prepare {
                    g["prepare"] = json!(p);
                }
                if let Some(t) = timeout {
                    g["defaults"] = json!({ "timeout_seconds": t });
                }
                serde_yaml::to_string(&g).unwrap_or_default()
            })
            .boxed();
        let broken = (
            graph.clone(),
            any::<prop::sample::Index>(),
            prop_oneof![arb_text(), Just(String::new()), Just("  - *a".to_string())],
        )
            .prop_map(|(yaml, at, line)| {
                let mut lines: Vec<&str> = yaml.lines().collect();
                let i = at.index(lines.len().max(1));
                if i < lines.len() {
                    lines[i] = &line;
                }
                lines.join("\n")
            });
        prop_oneof![6 => graph, 2 => broken, 1 => arb_text()]
    }

    /// The files a graph may name: a template and a schema of any kind.
    fn arb_files() -> impl Strategy<Value = (String, String)> {
        (
            arb_template(),
            prop_oneof![
                3 => arb_schema().prop_map(|s| s.to_string()),
                1 => arb_text(),
            ],
        )
    }

    /// The repository's graphs, each with its folder (templates and schemas are read there).
    fn real_graphs() -> Vec<(std::path::PathBuf, String)> {
        ["factory", "hybrid-tdd", "review"]
            .iter()
            .map(|g| {
                let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../graphs")
                    .join(g);
                let yaml = std::fs::read_to_string(dir.join("graph.yaml")).unwrap();
                (dir, yaml)
            })
            .collect()
    }

    #[test]
    fn the_repositorys_graphs_load() {
        for (dir, yaml) in real_graphs() {
            let read =
                |path: &str| std::fs::read_to_string(dir.join(path)).map_err(|e| e.to_string());
            assert!(
                load_bundle("graph.yaml", &yaml, read).is_ok(),
                "{}",
                dir.display()
            );
        }
    }

    proptest! {
        #![proptest_config(cases(64))]

        /// The repository's graphs load; with any one line changed or dropped, they load or
        /// are refused, quickly.
        #[test]
        fn a_real_graph_with_a_line_changed_loads_or_is_refused(
            which in any::<prop::sample::Index>(),
            at in any::<prop::sample::Index>(),
            line in prop_oneof![
                Just(None),
                Just(Some(String::new())),
                arb_text().prop_map(Some),
                arb_expr().prop_map(|e| Some(format!("    when: {e:?}"))),
            ],
        ) {
            let graphs = real_graphs();
            let (dir, yaml) = which.get(&graphs);
            let mut lines: Vec<&str> = yaml.lines().collect();
            let i = at.index(lines.len());
            if let Some(l) = &line {
                lines[i] = l;
            }
            let yaml = lines.join("\n");
            let read = |path: &str| std::fs::read_to_string(dir.join(path)).map_err(|e| e.to_string());
            let (loaded, took) = timed(|| load_bundle("graph.yaml", &yaml, read));
            prop_assert!(took < CASE_LIMIT, "{took:?}");
            if line.is_none() {
                prop_assert!(loaded.is_ok(), "{:?}", loaded.err());
            }
        }
    }

    proptest! {
        #![proptest_config(cases(256))]

        /// Graphs are the submitter's: any graph file loads or is refused with errors, quickly,
        /// and a loaded bundle passes the checker again.
        #[test]
        fn any_graph_file_loads_or_is_refused(yaml in arb_graph(), files in arb_files()) {
            let (template, schema) = files;
            let read = |path: &str| match path {
                "t.j2" => Ok(template.clone()),
                "s.json" => Ok(schema.clone()),
                _ => Err("no such file".to_string()),
            };
            let (loaded, took) = timed(|| load_bundle("g.yaml", &yaml, read));
            prop_assert!(took < CASE_LIMIT, "{yaml}: {took:?}");
            match loaded {
                Ok(bundle) => {
                    prop_assert!(check(&bundle).is_ok());
                    prop_assert_eq!(bundle.hash().len(), 64);
                }
                Err(errors) => prop_assert!(!errors.is_empty()),
            }
        }
    }
}
