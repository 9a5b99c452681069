//! Python definitions and calls, from tree-sitter's syntax tree.

use super::{FileIndex, LanguageIndex};
use tree_sitter::{Node, Parser};

pub struct Python;

impl LanguageIndex for Python {
    fn handles(&self, path: &str) -> bool {
        path.ends_with(".py")
    }

    fn index(&self, source: &str) -> Result<FileIndex, String> {
        let tree = parse(source)?;
        let mut index = FileIndex::default();
        visit(tree.root_node(), source.as_bytes(), &mut index);
        Ok(index)
    }

    fn not_stubbed(&self, source: &str) -> Result<Vec<String>, String> {
        let tree = parse(source)?;
        let mut out = Vec::new();
        find_real_bodies(tree.root_node(), source.as_bytes(), &mut out);
        Ok(out)
    }
}

fn parse(source: &str) -> Result<tree_sitter::Tree, String> {
    let mut parser = Parser::new();
    parser
        .set_language(&tree_sitter_python::LANGUAGE.into())
        .map_err(|e| e.to_string())?;
    parser
        .parse(source, None)
        .ok_or_else(|| "the parser gave no tree".to_string())
}

fn find_real_bodies(node: Node<'_>, src: &[u8], out: &mut Vec<String>) {
    if node.kind() == "function_definition" {
        let name = node
            .child_by_field_name("name")
            .map(|n| text(n, src).to_string())
            .unwrap_or_default();
        let special = name.starts_with("__") && name.ends_with("__");
        if !special
            && !node
                .child_by_field_name("body")
                .is_some_and(|b| is_stub(b, src))
        {
            out.push(name);
        }
    }
    let mut cursor = node.walk();
    for child in node.children(&mut cursor) {
        find_real_bodies(child, src, out);
    }
}

/// A block holding only an optional docstring and `raise NotImplementedError[(...)]`.
fn is_stub(block: Node<'_>, src: &[u8]) -> bool {
    let mut cursor = block.walk();
    let statements: Vec<Node<'_>> = block
        .named_children(&mut cursor)
        .filter(|n| n.kind() != "comment")
        .collect();
    let rest = match statements.first() {
        Some(first)
            if first.kind() == "expression_statement"
                && first.named_child(0).is_some_and(|c| c.kind() == "string") =>
        {
            &statements[1..]
        }
        _ => &statements[..],
    };
    match rest {
        [only] if only.kind() == "raise_statement" => {
            text(*only, src).contains("NotImplementedError")
        }
        _ => false,
    }
}

fn text<'a>(node: Node<'_>, src: &'a [u8]) -> &'a str {
    node.utf8_text(src).unwrap_or_default()
}

fn visit(node: Node<'_>, src: &[u8], index: &mut FileIndex) {
    match node.kind() {
        "function_definition" | "class_definition" => {
            if let Some(name) = node.child_by_field_name("name") {
                let mut calls = Default::default();
                collect_calls(node, src, &mut calls);
                index
                    .definitions
                    .entry(text(name, src).to_string())
                    .or_default()
                    .extend(calls);
            }
        }
        _ => {}
    }
    let mut cursor = node.walk();
    for child in node.children(&mut cursor) {
        visit(child, src, index);
    }
}

/// Names called anywhere inside `node`: `f(...)` gives `f`, `obj.m(...)` gives `m`.
fn collect_calls(node: Node<'_>, src: &[u8], out: &mut std::collections::BTreeSet<String>) {
    if node.kind() == "call" {
        if let Some(f) = node.child_by_field_name("function") {
            let name = match f.kind() {
                "attribute" => f.child_by_field_name("attribute").map(|a| text(a, src)),
                "identifier" => Some(text(f, src)),
                _ => None,
            };
            if let Some(n) = name {
                out.insert(n.to_string());
            }
        }
    }
    let mut cursor = node.walk();
    for child in node.children(&mut cursor) {
        collect_calls(child, src, out);
    }
}
