//! The walk over the syntax tree: what is never mutated (`SKIPPED`, outside a `def`, stubs), and
//! the candidates of each operator at each node.

use super::literals::{format_int, is_not_implemented, parse_int, snippet, unglued};
use super::Candidate;
use crate::mutants::MutationType;
use tree_sitter::Node;

/// Subtrees never mutated, wherever they are.
const SKIPPED: &[&str] = &[
    "comment",
    "string",
    "concatenated_string",
    "decorator",
    "import_statement",
    "import_from_statement",
    "future_import_statement",
    "global_statement",
    "nonlocal_statement",
    "parameters",
    "lambda_parameters",
    "type",
    "type_parameter",
    "type_alias_statement",
];

pub(super) struct Walker<'s> {
    pub(super) src: &'s str,
    pub(super) names: Vec<String>,
    pub(super) out: Vec<Candidate>,
}

impl<'s> Walker<'s> {
    fn text(&self, n: Node<'_>) -> &'s str {
        &self.src[n.byte_range()]
    }

    /// Iterative (an explicit stack): a deeply nested but valid file must not overflow ours.
    pub(super) fn walk(&mut self, root: Node<'_>) {
        let mut stack: Vec<(Node<'_>, Option<usize>)> = vec![(root, None)];
        while let Some((node, function)) = stack.pop() {
            match node.kind() {
                "function_definition" => {
                    let name = node
                        .child_by_field_name("name")
                        .map(|n| self.text(n))
                        .unwrap_or_default();
                    self.names.push(name.to_string());
                    if let Some(body) = node.child_by_field_name("body") {
                        stack.push((body, Some(self.names.len() - 1)));
                    }
                    continue;
                }
                "class_definition" => {
                    if let Some(body) = node.child_by_field_name("body") {
                        stack.push((body, function));
                    }
                    continue;
                }
                "decorated_definition" => {
                    if let Some(def) = node.child_by_field_name("definition") {
                        stack.push((def, function));
                    }
                    continue;
                }
                "raise_statement" if is_not_implemented(self.text(node)) => continue,
                kind if SKIPPED.contains(&kind) => continue,
                _ => {}
            }
            if let Some(f) = function {
                self.mutate(node, f);
            }
            let mut cursor = node.walk();
            let children: Vec<Node<'_>> = node.named_children(&mut cursor).collect();
            stack.extend(children.into_iter().rev().map(|c| (c, function)));
        }
    }

    fn push(
        &mut self,
        range: (usize, usize),
        replacement: String,
        kind: MutationType,
        description: String,
        function: usize,
    ) {
        let (start, end) = range;
        if self.src[start..end] == replacement {
            return;
        }
        let replacement = unglued(self.src, start, end, replacement);
        self.out.push(Candidate {
            start,
            end,
            replacement,
            kind,
            description,
            function,
        });
    }

    /// Replaces a whole node.
    fn replace(&mut self, n: Node<'_>, replacement: &str, kind: MutationType, f: usize) {
        let description = format!("`{}` -> `{}`", snippet(self.text(n)), snippet(replacement));
        self.push(
            (n.start_byte(), n.end_byte()),
            replacement.to_string(),
            kind,
            description,
            f,
        );
    }

    /// Replaces a statement with `pass`.
    fn remove(&mut self, n: Node<'_>, what: &str, shown: &str, kind: MutationType, f: usize) {
        let description = format!("removed {what}`{}`", snippet(shown));
        self.push(
            (n.start_byte(), n.end_byte()),
            "pass".to_string(),
            kind,
            description,
            f,
        );
    }

    fn mutate(&mut self, node: Node<'_>, f: usize) {
        use MutationType::*;
        match node.kind() {
            "if_statement" => {
                if self.is_guard(node) {
                    let first_line = self.text(node).lines().next().unwrap_or_default();
                    self.remove(node, "guard ", first_line, RemovedCheck, f);
                }
                self.flip_condition(node, f);
            }
            "elif_clause" | "while_statement" => self.flip_condition(node, f),
            "assert_statement" => self.remove(node, "", self.text(node), RemovedCheck, f),
            "comparison_operator" => {
                let mut cursor = node.walk();
                let ops: Vec<Node<'_>> = node
                    .children_by_field_name("operators", &mut cursor)
                    .collect();
                for op in ops {
                    let (to, kind) = match op.kind() {
                        "<" => ("<=", BoundaryMutation),
                        "<=" => ("<", BoundaryMutation),
                        ">" => (">=", BoundaryMutation),
                        ">=" => (">", BoundaryMutation),
                        "==" => ("!=", ConditionFlip),
                        "!=" => ("==", ConditionFlip),
                        "is" => ("is not", ConditionFlip),
                        "is not" => ("is", ConditionFlip),
                        "in" => ("not in", ConditionFlip),
                        "not in" => ("in", ConditionFlip),
                        _ => continue,
                    };
                    self.replace(op, to, kind, f);
                }
            }
            "boolean_operator" => {
                if let Some(op) = node.child_by_field_name("operator") {
                    let to = match op.kind() {
                        "and" => "or",
                        "or" => "and",
                        _ => return,
                    };
                    self.replace(op, to, ChangedOperator, f);
                }
            }
            "binary_operator" => {
                let is_str = |side: &str| {
                    node.child_by_field_name(side)
                        .is_some_and(|n| matches!(n.kind(), "string" | "concatenated_string"))
                };
                if is_str("left") || is_str("right") {
                    return;
                }
                if let Some(op) = node.child_by_field_name("operator") {
                    let to = match op.kind() {
                        "+" => "-",
                        "-" => "+",
                        "*" => "/",
                        "/" | "//" | "%" => "*",
                        _ => return,
                    };
                    self.replace(op, to, ChangedOperator, f);
                }
            }
            "augmented_assignment" => {
                if let Some(op) = node.child_by_field_name("operator") {
                    let to = match op.kind() {
                        "+=" => "-=",
                        "-=" => "+=",
                        _ => return,
                    };
                    self.replace(op, to, ChangedOperator, f);
                }
            }
            "not_operator" => {
                if let Some(arg) = node.child_by_field_name("argument") {
                    let to = self.text(arg);
                    self.replace(node, to, ChangedOperator, f);
                }
            }
            "unary_operator" => {
                let arg = node.child_by_field_name("argument");
                let op = node.child_by_field_name("operator");
                if let (Some(arg), Some(op)) = (arg, op) {
                    if op.kind() == "-" && arg.kind() == "integer" {
                        self.off_by_one(node, self.text(arg), true, f);
                    }
                }
            }
            "integer" => {
                let negated = node.parent().is_some_and(|p| {
                    p.kind() == "unary_operator"
                        && p.child_by_field_name("operator").map(|o| o.kind()) == Some("-")
                });
                if !negated {
                    self.off_by_one(node, self.text(node), false, f);
                }
            }
            "return_statement" => {
                let mut cursor = node.walk();
                let value = node
                    .named_children(&mut cursor)
                    .find(|c| c.kind() != "comment");
                if let Some(v) = value {
                    let to = match v.kind() {
                        "none" => return,
                        "true" => "False",
                        "false" => "True",
                        _ if self.text(v).trim_matches(['(', ')', ' ']) == "None" => return,
                        _ => "None",
                    };
                    let description =
                        format!("`return {}` -> `return {to}`", snippet(self.text(v)));
                    self.push(
                        (v.start_byte(), v.end_byte()),
                        to.to_string(),
                        ReplacedReturn,
                        description,
                        f,
                    );
                }
            }
            "expression_statement" => {
                let mut cursor = node.walk();
                let parts: Vec<Node<'_>> = node
                    .named_children(&mut cursor)
                    .filter(|c| c.kind() != "comment")
                    .collect();
                let removable = match parts.as_slice() {
                    [only] => match only.kind() {
                        "call" | "augmented_assignment" => true,
                        "assignment" => only.child_by_field_name("right").is_some(),
                        "await" => only.named_child(0).is_some_and(|c| c.kind() == "call"),
                        _ => false,
                    },
                    _ => false,
                };
                if removable {
                    self.remove(node, "", self.text(node), RemovedStatement, f);
                }
            }
            _ => {}
        }
    }

    /// `C` -> `not (C)` for an `if`, `elif` or `while` condition.
    fn flip_condition(&mut self, node: Node<'_>, f: usize) {
        if let Some(c) = node.child_by_field_name("condition") {
            let to = format!("not ({})", self.text(c));
            self.replace(c, &to, MutationType::ConditionFlip, f);
        }
    }

    /// An `if` with no `elif`/`else` whose block ends in `return` or `raise`, and that does not
    /// hold a `raise NotImplementedError`.
    fn is_guard(&self, node: Node<'_>) -> bool {
        if node.child_by_field_name("alternative").is_some() {
            return false;
        }
        let Some(block) = node.child_by_field_name("consequence") else {
            return false;
        };
        let mut cursor = block.walk();
        let statements: Vec<Node<'_>> = block
            .named_children(&mut cursor)
            .filter(|c| c.kind() != "comment")
            .collect();
        let ends_in_exit = statements
            .last()
            .is_some_and(|s| matches!(s.kind(), "return_statement" | "raise_statement"));
        let stub = statements
            .iter()
            .any(|s| s.kind() == "raise_statement" && is_not_implemented(self.text(*s)));
        ends_in_exit && !stub
    }

    /// `n` -> `n+1`, and `n-1` unless `n == 0`. `negated`: the node is `-<literal>`.
    fn off_by_one(&mut self, node: Node<'_>, literal: &str, negated: bool, f: usize) {
        let Some((magnitude, prefix, radix)) = parse_int(literal) else {
            return;
        };
        let Ok(magnitude) = i128::try_from(magnitude) else {
            return;
        };
        let n = if negated { -magnitude } else { magnitude };
        let mut targets = vec![n.checked_add(1)];
        if n != 0 {
            targets.push(n.checked_sub(1));
        }
        for to in targets.into_iter().flatten() {
            let text = format_int(to, prefix, radix);
            self.replace(node, &text, MutationType::OffByOne, f);
        }
    }
}
