//! The second pass: every import, reference, attribute and string of the file against the
//! allow-lists (`tables`), with the names resolved through the first pass's import aliases.

use super::bind::{children, is_name, text, Bindings};
use super::tables::{
    self, ATTRIBUTE_BUILTINS, INTERNAL_ATTRIBUTES, REFUSED_BUILTINS, REFUSED_NAMES,
};
use super::Forbidden;
use std::collections::BTreeSet;
use tree_sitter::Node;

pub struct Scan<'a> {
    pub src: &'a [u8],
    pub b: &'a Bindings,
    pub local: &'a BTreeSet<String>,
    pub hits: Vec<Forbidden>,
}

fn line(node: Node<'_>) -> usize {
    node.start_position().row + 1
}

fn is_field(parent: Node<'_>, field: &str, node: Node<'_>) -> bool {
    parent
        .child_by_field_name(field)
        .is_some_and(|n| n.id() == node.id())
}

impl Scan<'_> {
    fn hit(&mut self, rule: &str, name: impl Into<String>, line: usize) {
        self.hits.push(Forbidden {
            name: name.into(),
            rule: rule.into(),
            line,
        });
    }

    pub fn run(&mut self, root: Node<'_>) {
        let mut stack = vec![root];
        while let Some(node) = stack.pop() {
            let parent = node.parent();
            match node.kind() {
                "import_statement" => {
                    self.import(node);
                    continue;
                }
                "import_from_statement" => {
                    self.import_from(node);
                    continue;
                }
                "future_import_statement" => continue,
                "attribute" => self.attribute(node),
                "concatenated_string" => self.string(&children(node), line(node)),
                "string" if parent.is_none_or(|p| p.kind() != "concatenated_string") => {
                    self.string(&[node], line(node))
                }
                _ if is_name(node) => self.identifier(node, parent),
                _ => {}
            }
            stack.extend(children(node));
        }
    }

    fn identifier(&mut self, node: Node<'_>, parent: Option<Node<'_>>) {
        let (name, at) = (text(node, self.src), line(node));
        if let Some(p) = parent {
            let attribute_name = match p.kind() {
                "attribute" => is_field(p, "attribute", node),
                "keyword_argument" => {
                    if is_field(p, "name", node) {
                        return;
                    }
                    false
                }
                "function_definition" | "class_definition" => return,
                // `case P(name=...)` reads the attribute `name`; a dotted value's later parts
                // are attributes too.
                "keyword_pattern" => true,
                "dotted_name" => children(p).first().is_some_and(|f| f.id() != node.id()),
                _ => false,
            };
            if attribute_name {
                if p.kind() != "attribute" {
                    self.attr_name(name, at);
                }
                return;
            }
        }
        if let Some(imp) = self.b.imports.get(name) {
            let chained = parent.is_some_and(|p| {
                (p.kind() == "attribute" && is_field(p, "object", node))
                    || (p.kind() == "dotted_name" && children(p).len() > 1)
            });
            if chained {
                if let Some(p) = parent.filter(|p| p.kind() == "dotted_name") {
                    let rest = text(p, self.src).split_once('.').map(|x| x.1).unwrap_or("");
                    self.resolved(&format!("{}.{rest}", imp.target), at);
                }
            } else if imp.module {
                self.hit("module_as_value", imp.target.clone(), at);
            } else {
                self.resolved(&imp.target.clone(), at);
            }
            return;
        }
        let attribute_builtin = ATTRIBUTE_BUILTINS.contains(&name);
        if tables::allowed_builtin(name) && !attribute_builtin {
            return;
        }
        let refused_builtin = REFUSED_BUILTINS.contains(&name);
        let dunder = tables::is_dunder(name) && !tables::allowed_dunder(name);
        if refused_builtin || attribute_builtin || dunder {
            if self.b.defined.contains(name) {
                return;
            }
            if attribute_builtin {
                if !self.literal_name_call(node, parent) {
                    self.hit("computed_attribute", name, at);
                }
            } else if refused_builtin {
                self.hit("builtin_not_allowed", name, at);
            } else {
                self.hit("dunder_name", name, at);
            }
            return;
        }
        if !self.b.bound.contains(name) {
            self.hit("unbound_name", name, at);
        }
    }

    /// `getattr(x, "name")`: called directly, its name a plain string literal that is no
    /// private name and no interpreter internal.
    fn literal_name_call(&self, node: Node<'_>, parent: Option<Node<'_>>) -> bool {
        let Some(call) = parent.filter(|p| p.kind() == "call" && is_field(*p, "function", node))
        else {
            return false;
        };
        let args: Vec<Node<'_>> = call
            .child_by_field_name("arguments")
            .map(children)
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a.kind() != "comment")
            .collect();
        let Some(arg) = args.get(1).filter(|a| a.kind() == "string") else {
            return false;
        };
        match string_value(*arg, self.src) {
            Some((name, false)) => {
                !name.is_empty()
                    && !name.starts_with('_')
                    && !INTERNAL_ATTRIBUTES.contains(&name.as_str())
            }
            _ => false,
        }
    }

    fn attr_name(&mut self, name: &str, at: usize) {
        if tables::is_dunder(name) && !tables::allowed_dunder(name) {
            self.hit("dunder_attribute", name, at);
        } else if INTERNAL_ATTRIBUTES.contains(&name) {
            self.hit("internal_attribute", name, at);
        }
    }

    fn attribute(&mut self, node: Node<'_>) {
        let (Some(attr), Some(object)) = (
            node.child_by_field_name("attribute"),
            node.child_by_field_name("object"),
        ) else {
            return;
        };
        let (name, at) = (text(attr, self.src), line(attr));
        self.attr_name(name, at);
        if matches!(name, "format" | "format_map")
            && !matches!(object.kind(), "string" | "concatenated_string")
        {
            self.hit("format_on_non_literal", name, at);
        }
        let outermost = !node
            .parent()
            .is_some_and(|p| p.kind() == "attribute" && is_field(p, "object", node));
        if !outermost {
            return;
        }
        if let Some(segs) = dotted(node, self.src) {
            if let Some(imp) = self.b.imports.get(segs[0]) {
                let full = format!("{}.{}", imp.target, segs[1..].join("."));
                self.resolved(&full, line(node));
            }
        }
    }

    /// A dotted name reached through an import: its module allowed (or the project's own),
    /// no private segment, no refused name, no other module reached through an allowed one.
    fn resolved(&mut self, full: &str, at: usize) {
        let dots = full.len() - full.trim_start_matches('.').len();
        let segs: Vec<&str> = full[dots..].split('.').collect();
        let local = dots > 0 || self.local.contains(segs[0]);
        if !local && !tables::allowed_module(segs[0]) {
            self.hit("module_not_allowed", full, at);
            return;
        }
        for i in 1..segs.len() {
            let prefix = format!("{}{}", &full[..dots], segs[..=i].join("."));
            let seg = segs[i];
            if !local && seg.starts_with('_') && !tables::is_dunder(seg) {
                return self.hit("private_name", prefix, at);
            }
            if REFUSED_NAMES.contains(&prefix.as_str()) {
                return self.hit("name_not_allowed", prefix, at);
            }
            if tables::known_module(seg) {
                return self.hit("module_not_allowed", prefix, at);
            }
        }
    }

    fn import(&mut self, node: Node<'_>) {
        for child in children(node) {
            let module = match child.kind() {
                "aliased_import" => child.child_by_field_name("name"),
                "dotted_name" => Some(child),
                _ => None,
            };
            let Some(m) = module.map(|m| text(m, self.src)) else {
                continue;
            };
            let top = m.split('.').next().unwrap_or(m);
            if !self.local.contains(top) && !tables::allowed_module(m) {
                self.hit("module_not_allowed", m, line(child));
            }
        }
    }

    fn import_from(&mut self, node: Node<'_>) {
        let at = line(node);
        let module = node
            .child_by_field_name("module_name")
            .map(|n| text(n, self.src).to_string())
            .unwrap_or_default();
        if children(node).iter().any(|c| c.kind() == "wildcard_import") {
            return self.hit("star_import", format!("{module}.*"), at);
        }
        let top = module.split('.').next().unwrap_or(&module);
        let local = module.starts_with('.') || self.local.contains(top);
        let mut c = node.walk();
        let names: Vec<Node<'_>> = node.children_by_field_name("name", &mut c).collect();
        for child in names {
            let name = match child.kind() {
                "aliased_import" => child.child_by_field_name("name"),
                _ => Some(child),
            };
            let Some(n) = name.map(|n| text(n, self.src)) else {
                continue;
            };
            let full = if module.ends_with('.') {
                format!("{module}{n}")
            } else {
                format!("{module}.{n}")
            };
            if !local && !tables::allowed_module(&module) {
                self.hit("module_not_allowed", full, line(child));
            } else {
                self.resolved(&full, line(child));
            }
        }
    }

    /// String literals (a concatenation read as one) naming a dunder outside the allowed set
    /// or an interpreter internal, after their escapes are decoded.
    fn string(&mut self, parts: &[Node<'_>], at: usize) {
        let mut content = String::new();
        for part in parts.iter().filter(|p| p.kind() == "string") {
            let (value, named_escape) = decoded(*part, self.src);
            if named_escape {
                self.hit("named_escape_in_string", "\\N{...}", at);
            }
            content.push_str(&value);
        }
        let runs = content.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        let mut seen = BTreeSet::new();
        for run in runs.filter(|r| seen.insert(r.to_string())) {
            if tables::is_dunder(run) && !tables::allowed_dunder(run) {
                self.hit("dunder_in_string", run, at);
            } else if INTERNAL_ATTRIBUTES.contains(&run) {
                self.hit("internal_name_in_string", run, at);
            }
        }
    }
}

/// `a.b.c` as its segments, when the chain is names all the way down.
fn dotted<'a>(node: Node<'_>, src: &'a [u8]) -> Option<Vec<&'a str>> {
    match node.kind() {
        "identifier" | "keyword_identifier" => Some(vec![text(node, src)]),
        "attribute" => {
            let mut segs = dotted(node.child_by_field_name("object")?, src)?;
            segs.push(text(node.child_by_field_name("attribute")?, src));
            Some(segs)
        }
        _ => None,
    }
}

/// A string literal's value (interpolations left out) and whether it has a `\N{...}` escape.
fn decoded(node: Node<'_>, src: &[u8]) -> (String, bool) {
    let raw = children(node)
        .iter()
        .find(|c| c.kind() == "string_start")
        .is_some_and(|s| text(*s, src).contains(['r', 'R']));
    let mut out = String::new();
    let mut named = false;
    for c in children(node) {
        match c.kind() {
            "string_content" if raw => out.push_str(text(c, src)),
            "string_content" => named |= unescape(text(c, src), &mut out),
            "interpolation" => out.push('\0'),
            _ => {}
        }
    }
    (out, named)
}

/// A plain string literal's value, with whether it interpolates (`None`: it is no plain
/// literal, or has a named escape).
fn string_value(node: Node<'_>, src: &[u8]) -> Option<(String, bool)> {
    let interpolates = children(node).iter().any(|c| c.kind() == "interpolation");
    match decoded(node, src) {
        (_, true) => None,
        (value, false) => Some((value, interpolates)),
    }
}

/// Python's escapes decoded into `out`; true when a `\N{...}` escape was seen (its character
/// is not decoded).
fn unescape(s: &str, out: &mut String) -> bool {
    let c: Vec<char> = s.chars().collect();
    let mut named = false;
    let mut i = 0;
    while i < c.len() {
        if c[i] != '\\' || i + 1 == c.len() {
            out.push(c[i]);
            i += 1;
            continue;
        }
        let hex = |from: usize, n: usize| -> Option<char> {
            let h: String = c.get(from..from + n)?.iter().collect();
            char::from_u32(u32::from_str_radix(&h, 16).ok()?)
        };
        let (ch, used) = match c[i + 1] {
            'x' => (hex(i + 2, 2), 4),
            'u' => (hex(i + 2, 4), 6),
            'U' => (hex(i + 2, 8), 10),
            '0'..='7' => {
                let n = c[i + 1..]
                    .iter()
                    .take(3)
                    .take_while(|d| d.is_digit(8))
                    .count();
                let o: String = c[i + 1..i + 1 + n].iter().collect();
                (
                    u32::from_str_radix(&o, 8).ok().and_then(char::from_u32),
                    1 + n,
                )
            }
            'N' => {
                named = true;
                let end = c[i..]
                    .iter()
                    .position(|&x| x == '}')
                    .map_or(c.len(), |p| i + p + 1);
                (Some(' '), end - i)
            }
            '\n' => (None, 2),
            other => (
                Some(if other.is_ascii_alphanumeric() {
                    ' '
                } else {
                    other
                }),
                2,
            ),
        };
        out.extend(ch);
        i += used;
    }
    named
}
