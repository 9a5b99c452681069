//! JSON-schema validation of agent outputs and run inputs.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Validates `value` against `schema`; the error lists up to ten violations with their paths.
pub fn validate(schema: &Value, value: &Value) -> Result<(), String> {
    let validator = compile(schema).map_err(|e| format!("invalid schema: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{} at `{}`", e, e.instance_path))
        .take(10)
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("output breaks the schema: {}", errors.join("; ")))
    }
}

/// Compiles a schema. Graphs come from whoever submits them, so a schema the validator would
/// never finish on is refused first (`refuse_unbounded`).
pub fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    refuse_unbounded(schema)?;
    jsonschema::validator_for(schema).map_err(|e| e.to_string())
}

/// Keywords whose subschemas apply to the same place of the value as the schema holding them.
const IN_PLACE: &[&str] = &[
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "dependencies",
];
const REFS: &[&str] = &["$ref", "$dynamicRef", "$recursiveRef"];
/// Keywords holding one subschema, a list of them, or a map of them.
const ONE: &[&str] = &[
    "not",
    "if",
    "then",
    "else",
    "items",
    "additionalItems",
    "contains",
    "additionalProperties",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
];
const LISTS: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems", "items"];
const MAPS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];

/// How a schema uses one it holds or refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Use {
    /// On the same place of the value (`$ref`, `allOf`, `not`, ...).
    InPlace,
    /// On a part of the value (`properties`, `items`, ...).
    Descends,
    /// Not at all, unless referred to (`$defs`).
    Holds,
}

/// How many schemas a schema may stand for once its references are expanded (jsonschema 0.28
/// copies the target of each reference that is not recursive into the place of the reference).
pub const MAX_EXPANDED: u64 = 20_000;
/// How deep a schema may nest once its references are expanded (jsonschema 0.28 compiles a
/// chain of references recursively; some 600 overflow a 2 MiB stack).
pub const MAX_DEPTH: usize = 128;

/// Refuses what jsonschema 0.28 would never finish compiling or validating: references that
/// loop back to a schema without descending into the value (`{"allOf": [{"$ref": "#"}]}`: it
/// recurses until memory runs out), references that multiply (`a` is `allOf: [b, b]`, `b` is
/// `allOf: [c, c]`, ...: it copies each target, 2^n times) and long chains of references (it
/// recurses along them until the stack overflows). So that every reference is seen, references
/// must point inside the document (`#`, `#/json/pointer`) and only the root may set `$id`.
fn refuse_unbounded(root: &Value) -> Result<(), String> {
    // Every schema reachable from the root, by JSON pointer, with the schemas it holds or refers
    // to and how it uses each.
    let mut edges: BTreeMap<String, Vec<(String, Use)>> = BTreeMap::new();
    let mut todo = vec![String::new()];
    while let Some(at) = todo.pop() {
        if edges.contains_key(&at) {
            continue;
        }
        let mut next = Vec::new();
        if let Some(Value::Object(schema)) = root.pointer(&at) {
            if !at.is_empty() && schema.contains_key("$id") {
                return Err(format!("`$id` at `{at}`: only the root may set `$id`"));
            }
            for (key, value) in schema {
                let kind = key.as_str();
                let base = format!("{at}/{}", escape(key));
                let children: Vec<String> = match value {
                    Value::String(r) if REFS.contains(&kind) => {
                        vec![local_pointer(r).ok_or_else(|| {
                            format!("`{key}` `{r}` at `{at}`: only references inside the schema (`#` or `#/json/pointer`) are supported")
                        })?]
                    }
                    Value::Array(items) if LISTS.contains(&kind) => {
                        (0..items.len()).map(|i| format!("{base}/{i}")).collect()
                    }
                    Value::Object(map) if MAPS.contains(&kind) => map
                        .keys()
                        .map(|name| format!("{base}/{}", escape(name)))
                        .collect(),
                    Value::Object(_) | Value::Bool(_) if ONE.contains(&kind) => vec![base],
                    _ => continue,
                };
                let use_ = if REFS.contains(&kind) || IN_PLACE.contains(&kind) {
                    Use::InPlace
                } else if matches!(kind, "$defs" | "definitions") {
                    Use::Holds
                } else {
                    Use::Descends
                };
                todo.extend(children.iter().cloned());
                next.extend(children.into_iter().map(|c| (c, use_)));
            }
        }
        edges.insert(at, next);
    }
    let targets = |at: &str| edges.get(at).map_or(&[][..], Vec::as_slice);

    // A loop in place is what remains after peeling off, again and again, schemas nothing
    // applies in place.
    let mut incoming: BTreeMap<&str, usize> = edges.keys().map(|k| (k.as_str(), 0)).collect();
    for (t, _) in edges.values().flatten().filter(|(_, u)| *u == Use::InPlace) {
        *incoming.entry(t.as_str()).or_default() += 1;
    }
    let mut free: Vec<&str> = incoming
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(k, _)| *k)
        .collect();
    while let Some(k) = free.pop() {
        for (t, _) in targets(k).iter().filter(|(_, u)| *u == Use::InPlace) {
            if let Some(n) = incoming.get_mut(t.as_str()) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    free.push(t);
                }
            }
        }
        incoming.remove(k);
    }
    if !incoming.is_empty() {
        let stuck: Vec<String> = incoming.keys().take(3).map(|k| format!("`{k}`")).collect();
        return Err(format!(
            "a `$ref` loop applies the schemas at {} to the same value again and again, never descending into it (through allOf, anyOf, oneOf, not, if/then/else or dependentSchemas)",
            stuck.join(", ")
        ));
    }

    // The expanded size and depth: each schema counts itself and, once per path to it, what it
    // applies or refers to; a reference back to a schema being expanded (recursion) counts once.
    // Depth first without recursion, so a long chain of references cannot exhaust the stack.
    let mut done: BTreeMap<&str, (u64, usize)> = BTreeMap::new();
    let mut open: BTreeSet<&str> = BTreeSet::from([""]);
    // (schema, next edge, size so far, deepest child so far)
    let mut stack: Vec<(&str, usize, u64, usize)> = vec![("", 0, 1, 0)];
    while let Some((at, next, size, deepest)) = stack.last_mut() {
        if let Some((t, use_)) = targets(at).get(*next) {
            *next += 1;
            if *use_ == Use::Holds {
                continue;
            }
            match done.get(t.as_str()) {
                Some((n, d)) => {
                    *size = size.saturating_add(*n);
                    *deepest = (*deepest).max(*d);
                }
                None if open.contains(t.as_str()) => *size = size.saturating_add(1),
                None if stack.len() >= MAX_DEPTH => {
                    return Err(format!(
                        "its references nest the schema at `{t}` more than {MAX_DEPTH} deep"
                    ));
                }
                None => {
                    open.insert(t);
                    stack.push((t, 0, 1, 0));
                }
            }
            continue;
        }
        let (at, size, depth) = (*at, *size, *deepest + 1);
        if size > MAX_EXPANDED {
            return Err(format!(
                "its references expand the schema at `{at}` to more than {MAX_EXPANDED} schemas"
            ));
        }
        if depth > MAX_DEPTH {
            return Err(format!(
                "its references nest the schema at `{at}` more than {MAX_DEPTH} deep"
            ));
        }
        stack.pop();
        open.remove(at);
        done.insert(at, (size, depth));
        if let Some((_, _, parent_size, parent_deepest)) = stack.last_mut() {
            *parent_size = parent_size.saturating_add(size);
            *parent_deepest = (*parent_deepest).max(depth);
        }
    }
    Ok(())
}

/// A key as a JSON-pointer token.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The JSON pointer a same-document reference names: `#` or empty is the root, `#/a/b` a
/// pointer (percent-decoded); anything else is none.
fn local_pointer(reference: &str) -> Option<String> {
    let fragment = match reference {
        "" => "",
        r => r.strip_prefix('#')?,
    };
    if !fragment.is_empty() && !fragment.starts_with('/') {
        return None;
    }
    let bytes = fragment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::validate;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    pub(crate) use crate::proptest_support::{arb_json, arb_text, cases, timed, CASE_LIMIT};

    /// A schema: built from JSON-schema keywords (references and patterns included), or any
    /// JSON at all.
    pub(crate) fn arb_schema() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            prop::sample::select(vec![
                "object", "array", "string", "integer", "number", "boolean", "null"
            ])
            .prop_map(|t| json!({ "type": t })),
            Just(json!({"$ref": "#"})),
            Just(json!({"$ref": "#/definitions/x"})),
            Just(json!({"$ref": "https://example.com/s.json"})),
            "[a()*+?|^$.\\[\\]{}0-9]{0,12}".prop_map(|p| json!({ "pattern": p })),
            any::<f64>().prop_filter_map("finite", |f| {
                serde_json::Number::from_f64(f).map(|n| json!({ "multipleOf": n }))
            }),
            any::<i64>().prop_map(|n| json!({ "minimum": n, "maxLength": n })),
            arb_json().prop_map(|v| json!({ "const": v })),
            Just(json!(true)),
            Just(json!(false)),
        ];
        let shaped = leaf.prop_recursive(3, 24, 4, |inner| {
            (
                prop::sample::select(vec![
                    "properties",
                    "items",
                    "anyOf",
                    "allOf",
                    "oneOf",
                    "not",
                    "definitions",
                    "additionalProperties",
                    "if",
                ]),
                prop::collection::btree_map("[a-c]{1,2}", inner, 1..4),
            )
                .prop_map(|(k, subs)| {
                    let list: Vec<Value> = subs.values().cloned().collect();
                    let map = Value::Object(subs.into_iter().collect());
                    match k {
                        "properties" | "definitions" => json!({ k: map, "required": ["a"] }),
                        "anyOf" | "allOf" | "oneOf" => json!({ k: list }),
                        _ => json!({ k: list[0] }),
                    }
                })
        });
        prop_oneof![4 => shaped, 1 => arb_json()]
    }

    #[test]
    fn reference_loops_that_never_descend_are_refused() {
        // Each of these made jsonschema 0.28 allocate until the process died.
        for schema in [
            json!({"allOf": [{"$ref": "#"}]}),
            json!({"anyOf": [{"$ref": "#"}]}),
            json!({"not": {"$ref": "#"}}),
            json!({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"$ref": "#/$defs/a"}},
                   "$ref": "#/$defs/a"}),
            json!({"$ref": "#"}),
        ] {
            let err = validate(&schema, &json!(1)).unwrap_err();
            assert!(err.contains("loop"), "{schema}: {err}");
        }
        // What such a loop needs, to be seen: references inside the document, `$id` at the root.
        for schema in [
            json!({"$ref": "https://example.com/s.json"}),
            json!({"$ref": "#anchor"}),
            json!({"$defs": {"a": {"$id": "https://example.com/a", "allOf": [{"$ref": "#/allOf/0"}]}}}),
        ] {
            assert!(validate(&schema, &json!(1)).is_err(), "{schema}");
        }
        // Recursion that descends into the value is fine.
        let tree = json!({"properties": {"kids": {"items": {"$ref": "#"}}},
                          "allOf": [{"$ref": "#/$defs/x~0~1y"}, {"$ref": "#/$defs/a%20b"}],
                          "$defs": {"x~/y": {"type": "object"}, "a b": true}});
        assert_eq!(validate(&tree, &json!({"kids": [{"kids": []}]})), Ok(()));
        assert!(validate(&tree, &json!({"kids": [{"kids": [1]}]})).is_err());
    }

    /// `$defs` a0 .. a{n}, each referring to the next (twice, under `allOf`, when `fan`).
    fn chain(n: usize, fan: bool) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let next = json!({ "$ref": format!("#/$defs/a{}", i + 1) });
            let def = if fan {
                json!({ "allOf": [next.clone(), next] })
            } else {
                next
            };
            defs.insert(format!("a{i}"), def);
        }
        defs.insert(format!("a{n}"), json!({"type": "integer"}));
        json!({"$defs": defs, "$ref": "#/$defs/a0"})
    }

    #[test]
    fn references_that_multiply_or_chain_too_deep_are_refused() {
        // 2^20 copies ran jsonschema out of memory; a chain of 700 overflowed the stack.
        let err = validate(&chain(20, true), &json!(1)).unwrap_err();
        assert!(err.contains("more than 20000 schemas"), "{err}");
        let err = validate(&chain(700, false), &json!(1)).unwrap_err();
        assert!(err.contains("more than 128 deep"), "{err}");
        assert_eq!(validate(&chain(8, true), &json!(1)), Ok(()));
        assert_eq!(validate(&chain(100, false), &json!(1)), Ok(()));
        assert!(validate(&chain(100, false), &json!("x")).is_err());
    }

    #[test]
    fn the_graphs_schemas_compile() {
        for path in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../graphs"))
            .unwrap()
            .flat_map(|g| {
                std::fs::read_dir(g.unwrap().path().join("schemas"))
                    .into_iter()
                    .flatten()
            })
        {
            let path = path.unwrap().path();
            let schema: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            assert!(super::compile(&schema).is_ok(), "{}", path.display());
        }
    }

    /// The types agent of `graphs/types-first` answers what the harness's templates put into
    /// source files: nothing it says may become code of its own.
    #[test]
    fn the_types_schema_keeps_the_agents_text_out_of_the_skeletons_code() {
        let schema: Value =
            serde_json::from_str(include_str!("../../graphs/types-first/schemas/types.json"))
                .unwrap();
        let good = json!({
            "data_type_name": "Stack",
            "data_type": "A stack of values, the most recently pushed on top.",
            "type_params": ["a"],
            "constructors": [{"name": "Empty", "fields": []}, {"name": "Push", "fields": ["a", "(Stack a)"]}],
            "deriving": ["Show", "Eq"],
            "signatures": [{"name": "push", "type": "a -> Stack a -> Stack a", "doc": "puts a value on top"}],
            "test_priorities": [{"name": "lifo_order", "description": "xs pushed pop as reverse xs"}],
        });
        assert_eq!(validate(&schema, &good), Ok(()));
        let cheats: &[(&str, Value)] = &[
            ("/data_type", json!("a stack\nsize _ = 0")),
            ("/data_type", json!("a stack\rsize _ = 0")),
            (
                "/signatures/0/doc",
                json!("on top\" ++ show (unsafePerformIO x) ++ \""),
            ),
            ("/signatures/0/doc", json!("on top\\")),
            ("/signatures/0/type", json!("a -> Stack a\npush = Push")),
            ("/signatures/0/type", json!("a {- -} Stack a")),
            ("/signatures/0/name", json!("push = Push; x")),
            ("/test_priorities/0/description", json!("order\" ++ \"")),
            ("/type_params/0", json!("a = Int")),
            (
                "/constructors/0/name",
                json!("Empty deriving Show\ninstance"),
            ),
            ("/constructors/1/fields/0", json!("a = Push")),
            (
                "/constructors/1/fields/0",
                json!("{-# LANGUAGE TemplateHaskell #-}"),
            ),
            ("/constructors/1/fields/0", json!("a -- \n")),
            ("/deriving/0", json!("Generic")),
        ];
        for (pointer, bad) in cheats {
            let mut v = good.clone();
            *v.pointer_mut(pointer).unwrap() = bad.clone();
            assert!(
                validate(&schema, &v).is_err(),
                "{pointer} = {bad} was taken"
            );
        }
    }

    /// Seed 004's verifier: a verdict that disagrees with its own steps is not an answer.
    #[test]
    fn a_verifier_pass_with_a_failed_step_or_a_silent_failure_breaks_the_schema() {
        let schema: Value = serde_json::from_str(include_str!(
            "../../graphs/hardened-coder/schemas/verification.json"
        ))
        .unwrap();
        let step = |result: &str| {
            json!({"step_number": 1, "step_text": "s", "result": result,
                   "observation": "o", "reasoning": "r"})
        };
        let answer = |passes: bool, steps: Value, reason: Value| {
            json!({"test_passes": passes, "steps": steps,
                   "overall_reasoning": "r", "failure_reason": reason})
        };
        assert_eq!(
            validate(&schema, &answer(true, json!([step("pass")]), Value::Null)),
            Ok(())
        );
        assert_eq!(
            validate(
                &schema,
                &answer(false, json!([step("fail")]), json!("no button"))
            ),
            Ok(())
        );
        for cheat in [
            answer(true, json!([step("pass"), step("fail")]), Value::Null),
            answer(true, json!([]), Value::Null),
            answer(false, json!([step("fail")]), Value::Null),
            answer(false, json!([step("fail")]), json!("")),
        ] {
            assert!(validate(&schema, &cheat).is_err(), "{cheat} was taken");
        }
    }

    const SCHEMAS: &[&str] = &[
        include_str!("../../graphs/factory/schemas/factory_input.json"),
        include_str!("../../graphs/hybrid-tdd/schemas/input.json"),
    ];

    proptest! {
        #![proptest_config(cases(256))]

        /// Run inputs are the submitter's: any of them, against the graphs' input schemas.
        #[test]
        fn any_input_is_judged_against_the_input_schemas(
            which in 0..SCHEMAS.len(),
            input in prop_oneof![
                arb_json(),
                arb_json().prop_map(|v| json!({"work_order": v, "options": {}})),
            ],
        ) {
            let schema: Value = serde_json::from_str(SCHEMAS[which]).unwrap();
            let (verdict, took) = timed(|| validate(&schema, &input));
            prop_assert!(took < CASE_LIMIT);
            if let Err(e) = verdict {
                prop_assert!(e.starts_with("output breaks the schema"), "{e}");
            }
        }

        #[test]
        fn any_schema_and_value_give_a_verdict(schema in arb_schema(), value in arb_json()) {
            let (_, took) = timed(|| validate(&schema, &value));
            prop_assert!(took < CASE_LIMIT, "{schema} {value}: {took:?}");
        }
    }

    #[test]
    fn schema_violations_are_listed() {
        let schema =
            json!({"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}});
        assert!(validate(&schema, &json!({"a": "x"})).is_ok());
        let err = validate(&schema, &json!({"a": 1})).unwrap_err();
        assert!(err.contains("/a"), "{err}");
    }
}
