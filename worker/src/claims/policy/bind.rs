//! The first pass: every name the file binds (assignment, `def`, `class`, parameter, import,
//! `for`/`with`/`except`/comprehension target, `global`, walrus, match capture), and the
//! import aliases with what they resolve to.

use super::tables;
use std::collections::{BTreeMap, BTreeSet};
use tree_sitter::Node;

/// What an import alias stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Import {
    /// The dotted name it resolves to (`os._exit` for `from os import _exit as e`; relative
    /// imports keep their dots: `.util.f`).
    pub target: String,
    /// Bound to a module (`import x`, `from collections import abc`), not a name in one.
    pub module: bool,
}

#[derive(Default)]
pub struct Bindings {
    pub imports: BTreeMap<String, Import>,
    /// Names bound anywhere in the file, by any construct.
    pub bound: BTreeSet<String>,
    /// Names bound by a module-level `def` or `class`: the only bindings trusted to shadow a
    /// refused builtin or an interpreter global (an assignment `open = open` keeps the builtin).
    pub defined: BTreeSet<String>,
}

pub fn text<'a>(node: Node<'_>, src: &'a [u8]) -> &'a str {
    node.utf8_text(src).unwrap_or_default()
}

pub fn is_name(node: Node<'_>) -> bool {
    matches!(node.kind(), "identifier" | "keyword_identifier")
}

/// Named children of a node.
pub fn children(node: Node<'_>) -> Vec<Node<'_>> {
    let mut c = node.walk();
    node.named_children(&mut c).collect()
}

impl Bindings {
    pub fn collect(root: Node<'_>, src: &[u8]) -> Bindings {
        let mut b = Bindings::default();
        let mut stack = vec![root];
        while let Some(node) = stack.pop() {
            b.visit(node, src);
            stack.extend(children(node));
        }
        b
    }

    fn visit(&mut self, node: Node<'_>, src: &[u8]) {
        let field = |f: &str| node.child_by_field_name(f);
        match node.kind() {
            "import_statement" => self.import(node, src),
            "import_from_statement" => self.import_from(node, src),
            "function_definition" | "class_definition" => {
                if let Some(n) = field("name") {
                    let name = text(n, src).to_string();
                    let top = node.parent().is_some_and(|p| {
                        p.kind() == "module"
                            || (p.kind() == "decorated_definition"
                                && p.parent().is_some_and(|g| g.kind() == "module"))
                    });
                    if top {
                        self.defined.insert(name.clone());
                    }
                    self.bound.insert(name);
                }
            }
            "parameters" | "lambda_parameters" => {
                for p in children(node) {
                    let target = match p.kind() {
                        "default_parameter" | "typed_default_parameter" => {
                            p.child_by_field_name("name")
                        }
                        "typed_parameter" => children(p).into_iter().next(),
                        _ => Some(p),
                    };
                    if let Some(t) = target {
                        self.target(t, src);
                    }
                }
            }
            "assignment" | "augmented_assignment" | "for_statement" | "for_in_clause" => {
                if let Some(t) = field("left") {
                    self.target(t, src);
                }
            }
            "except_clause" | "as_pattern" => {
                if let Some(t) = field("alias") {
                    self.target(t, src);
                }
            }
            "named_expression" => {
                if let Some(t) = field("name") {
                    self.target(t, src);
                }
            }
            "global_statement" | "nonlocal_statement" => {
                for n in children(node).into_iter().filter(|n| is_name(*n)) {
                    self.bound.insert(text(n, src).to_string());
                }
            }
            "case_pattern" => self.capture(node, src),
            _ => {}
        }
    }

    /// Names an assignment-like target binds; attributes and subscripts bind none.
    fn target(&mut self, node: Node<'_>, src: &[u8]) {
        if is_name(node) {
            self.bound.insert(text(node, src).to_string());
        } else if !matches!(node.kind(), "attribute" | "subscript") {
            for c in children(node) {
                self.target(c, src);
            }
        }
    }

    /// Capture names of a match pattern: a lone name, `as x`, `*rest`; not a class pattern's
    /// class, a dotted value or a keyword pattern's attribute name.
    fn capture(&mut self, node: Node<'_>, src: &[u8]) {
        for c in children(node) {
            match c.kind() {
                "dotted_name" if node.kind() != "class_pattern" => {
                    let parts = children(c);
                    if parts.len() == 1 {
                        self.bound.insert(text(parts[0], src).to_string());
                    }
                }
                "dotted_name" => {} // a class pattern's class: a reference
                "identifier" if node.kind() != "keyword_pattern" => {
                    self.bound.insert(text(c, src).to_string());
                }
                "case_pattern" => {} // visited on its own
                _ => self.capture(c, src),
            }
        }
    }

    fn import(&mut self, node: Node<'_>, src: &[u8]) {
        for child in children(node) {
            let (module, alias) = match child.kind() {
                "aliased_import" => (
                    child.child_by_field_name("name").map(|n| text(n, src)),
                    child.child_by_field_name("alias").map(|n| text(n, src)),
                ),
                "dotted_name" => (Some(text(child, src)), None),
                _ => (None, None),
            };
            let Some(m) = module else { continue };
            let head = m.split('.').next().unwrap_or(m);
            let (bound, target) = match alias {
                Some(a) => (a, m),
                None => (head, head),
            };
            self.bind_import(bound, target.to_string(), true);
        }
    }

    fn import_from(&mut self, node: Node<'_>, src: &[u8]) {
        let module = node
            .child_by_field_name("module_name")
            .map(|n| text(n, src).to_string())
            .unwrap_or_default();
        let mut c = node.walk();
        for child in node.children_by_field_name("name", &mut c) {
            let (name, alias) = match child.kind() {
                "aliased_import" => (
                    child.child_by_field_name("name").map(|n| text(n, src)),
                    child.child_by_field_name("alias").map(|n| text(n, src)),
                ),
                _ => (Some(text(child, src)), None),
            };
            let Some(n) = name else { continue };
            let full = if module.ends_with('.') {
                format!("{module}{n}")
            } else {
                format!("{module}.{n}")
            };
            let is_module = tables::allowed_module(&full)
                || tables::allowed_module(n)
                || tables::known_module(n);
            self.bind_import(alias.unwrap_or(n), full, is_module);
        }
    }

    fn bind_import(&mut self, bound: &str, target: String, module: bool) {
        self.bound.insert(bound.to_string());
        self.defined.insert(bound.to_string());
        self.imports
            .insert(bound.to_string(), Import { target, module });
    }
}
