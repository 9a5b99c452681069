//! Python mutants from tree-sitter's syntax tree.
//!
//! Only code inside a `def` body is mutated (module level and class bodies are not), and never:
//! docstrings or any other string literal (f-string interpolations included), decorators,
//! imports, `global`/`nonlocal`, type annotations and type parameters, parameter lists (so no
//! default values, in `lambda`s either), a class's bases, or a `raise NotImplementedError`
//! (nor a guard whose body holds one).
//!
//! Choices the brief left open:
//! - `OffByOne` does mutate literals in subscripts and slices (`xs[-1]`, `xs[1:]`): an
//!   off-by-one index is the bug the operator exists for. A negative literal (`-1`) is mutated
//!   as a whole (`-1` -> `0`, `-1` -> `-2`); every literal `n` gives `n+1`, and `n-1` unless
//!   `n == 0` (no new negative numbers from zero). Hex, octal and binary keep their base;
//!   complex (`1j`) and Python 2 long (`1L`) literals are left alone.
//! - `ChangedOperator` skips a binary operator with a string-literal operand (`"%s" % x`,
//!   `"-" * 3`, `"a" + b`): the swap is a guaranteed `TypeError`, a mutant no test can miss.
//! - `return True`/`return False` only flip; `return None` for them would be the same as
//!   `False` to every caller that tests truthiness.
//! - A guard is an `if` with no `elif`/`else` whose block ends with `return` or `raise`.
//!
//! Every candidate is applied and re-parsed (incrementally, from the original tree); those
//! that no longer parse are dropped. A replacement that would glue two words together (`if(x):`
//! flipped) gets a space.

use super::{Mutant, MutationType, Mutator};
use std::collections::{HashMap, HashSet};
use tree_sitter::{InputEdit, Node, Parser, Point, Tree};

pub struct Python;

impl Mutator for Python {
    fn handles(&self, path: &str) -> bool {
        path.ends_with(".py")
    }

    fn mutants(&self, path: &str, source: &str) -> Result<Vec<Mutant>, String> {
        let mut parser = parser()?;
        let tree = parser
            .parse(source, None)
            .ok_or_else(|| format!("{path}: the parser gave no tree"))?;
        if let Some(p) = first_error(tree.root_node()) {
            return Err(format!(
                "{path}: does not parse (syntax error at line {}, column {})",
                p.row + 1,
                p.column + 1
            ));
        }
        let lines = LineIndex::new(source);
        let mut walker = Walker {
            src: source,
            names: Vec::new(),
            out: Vec::new(),
        };
        walker.walk(tree.root_node());
        let Walker { names, out, .. } = walker;

        let mut seen = HashSet::new();
        let mut kept: Vec<Candidate> = out
            .into_iter()
            .filter(|c| seen.insert((c.start, c.end, c.replacement.clone())))
            .filter(|c| still_parses(&mut parser, &tree, source, &lines, c))
            .collect();
        kept.sort_by(|a, b| {
            (a.start, a.end, &a.replacement).cmp(&(b.start, b.end, &b.replacement))
        });

        let mut rank: HashMap<(usize, MutationType), usize> = HashMap::new();
        Ok(kept
            .into_iter()
            .map(|c| {
                let (line, col) = lines.line_col(source, c.start);
                let n = rank.entry((c.start, c.kind)).or_insert(0);
                let id = format!("{path}:{line}:{col}:{}:{n}", c.kind);
                *n += 1;
                let function = names[c.function].clone();
                Mutant {
                    id,
                    path: path.to_string(),
                    description: format!("{} in {function}", c.description),
                    function: Some(function),
                    line,
                    mutation_type: c.kind,
                    start_byte: c.start,
                    end_byte: c.end,
                    replacement: c.replacement,
                }
            })
            .collect())
    }

    fn parses(&self, source: &str) -> bool {
        parser()
            .ok()
            .and_then(|mut p| p.parse(source, None))
            .is_some_and(|t| first_error(t.root_node()).is_none())
    }
}

fn parser() -> Result<Parser, String> {
    let mut parser = Parser::new();
    parser
        .set_language(&tree_sitter_python::LANGUAGE.into())
        .map_err(|e| e.to_string())?;
    Ok(parser)
}

/// Where the first ERROR or MISSING node is, if any.
fn first_error(root: Node<'_>) -> Option<Point> {
    if !root.has_error() && !root.is_missing() {
        return None;
    }
    let mut node = root;
    loop {
        if node.is_error() || node.is_missing() {
            return Some(node.start_position());
        }
        let mut cursor = node.walk();
        let next = node
            .children(&mut cursor)
            .find(|c| c.has_error() || c.is_missing());
        match next {
            Some(c) => node = c,
            None => return Some(node.start_position()),
        }
    }
}

/// Byte offsets where lines start, for rows and columns without rescanning.
struct LineIndex(Vec<usize>);

impl LineIndex {
    fn new(src: &str) -> Self {
        let mut starts = vec![0];
        starts.extend(src.match_indices('\n').map(|(i, _)| i + 1));
        LineIndex(starts)
    }

    /// 0-based row and the byte offset its line starts at.
    fn row(&self, byte: usize) -> (usize, usize) {
        let row = self.0.partition_point(|&s| s <= byte) - 1;
        (row, self.0[row])
    }

    fn point(&self, byte: usize) -> Point {
        let (row, start) = self.row(byte);
        Point::new(row, byte - start)
    }

    /// 1-based line and 1-based column in characters.
    fn line_col(&self, src: &str, byte: usize) -> (usize, usize) {
        let (row, start) = self.row(byte);
        (row + 1, src[start..byte].chars().count() + 1)
    }
}

/// Re-parses the mutated source from an edited copy of the original tree.
fn still_parses(
    parser: &mut Parser,
    tree: &Tree,
    src: &str,
    lines: &LineIndex,
    c: &Candidate,
) -> bool {
    let mutated = format!("{}{}{}", &src[..c.start], c.replacement, &src[c.end..]);
    let start_position = lines.point(c.start);
    let new_end_position = match c.replacement.rfind('\n') {
        None => Point::new(
            start_position.row,
            start_position.column + c.replacement.len(),
        ),
        Some(i) => Point::new(
            start_position.row + c.replacement.matches('\n').count(),
            c.replacement.len() - i - 1,
        ),
    };
    let mut old = tree.clone();
    old.edit(&InputEdit {
        start_byte: c.start,
        old_end_byte: c.end,
        new_end_byte: c.start + c.replacement.len(),
        start_position,
        old_end_position: lines.point(c.end),
        new_end_position,
    });
    parser
        .parse(&mutated, Some(&old))
        .is_some_and(|t| first_error(t.root_node()).is_none())
}

struct Candidate {
    start: usize,
    end: usize,
    replacement: String,
    kind: MutationType,
    /// Without the " in <function>" suffix.
    description: String,
    /// Index into the walker's function names.
    function: usize,
}

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

struct Walker<'s> {
    src: &'s str,
    names: Vec<String>,
    out: Vec<Candidate>,
}

impl<'s> Walker<'s> {
    fn text(&self, n: Node<'_>) -> &'s str {
        &self.src[n.byte_range()]
    }

    /// Iterative (an explicit stack): a deeply nested but valid file must not overflow ours.
    fn walk(&mut self, root: Node<'_>) {
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

fn is_not_implemented(raise: &str) -> bool {
    raise.contains("NotImplementedError")
}

/// A Python integer literal: its magnitude, its base prefix as written (`""`, `"0x"`, `"0X"`,
/// ...) and its radix. `None` for complex and long literals and for overflow.
fn parse_int(literal: &str) -> Option<(u128, &str, u32)> {
    let t = literal.trim();
    let (prefix, digits, radix) = match t.get(..2).map(str::to_ascii_lowercase).as_deref() {
        Some("0x") => (&t[..2], &t[2..], 16),
        Some("0o") => (&t[..2], &t[2..], 8),
        Some("0b") => (&t[..2], &t[2..], 2),
        _ => ("", t, 10),
    };
    let digits: String = digits.chars().filter(|&c| c != '_').collect();
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u128::from_str_radix(&digits, radix)
        .ok()
        .map(|v| (v, prefix, radix))
}

fn format_int(v: i128, prefix: &str, radix: u32) -> String {
    let sign = if v < 0 { "-" } else { "" };
    let m = v.unsigned_abs();
    match radix {
        16 => format!("{sign}{prefix}{m:x}"),
        8 => format!("{sign}{prefix}{m:o}"),
        2 => format!("{sign}{prefix}{m:b}"),
        _ => format!("{sign}{m}"),
    }
}

fn is_word(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Adds a space where the replacement would run into a neighbouring word (`if(x):` flipped is
/// `if not ((x)):`, not `ifnot ((x)):`).
fn unglued(src: &str, start: usize, end: usize, replacement: String) -> String {
    let before = src[..start].chars().next_back().is_some_and(is_word);
    let after = src[end..].chars().next().is_some_and(is_word);
    let lead = before && replacement.chars().next().is_some_and(is_word);
    let trail = after && replacement.chars().next_back().is_some_and(is_word);
    match (lead, trail) {
        (false, false) => replacement,
        (l, t) => format!(
            "{}{replacement}{}",
            if l { " " } else { "" },
            if t { " " } else { "" }
        ),
    }
}

/// One line, whitespace collapsed, at most 60 characters.
fn snippet(s: &str) -> String {
    const MAX: usize = 60;
    let one_line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= MAX {
        one_line
    } else {
        let mut cut: String = one_line.chars().take(MAX - 1).collect();
        cut.push('…');
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::super::{apply, select};
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const STACK: &str = r#""""A bounded LIFO stack — ünïcödé in the module docstring."""

from typing import Generic, List, Optional, TypeVar

T = TypeVar("T")
MAX_DEFAULT = 10


class Stack(Generic[T]):
    """A stack with a capacity. Ω ≤ ∞."""

    def __init__(self, capacity: int = 10) -> None:
        """Make an empty stack."""
        self._items: List[T] = []
        self._capacity = capacity

    def push(self, item: T) -> None:
        """Push an item — fails when full ✗."""
        if len(self._items) >= self._capacity:
            raise OverflowError("stack full ✗")  # 🚫 full
        self._items.append(item)

    def pop(self) -> T:
        """Remove and return the top item."""
        if not self._items:
            raise IndexError("pop from empty stack 🥞")
        return self._items.pop()

    def peek(self) -> Optional[T]:
        """The top item, or None."""
        if self.is_empty():
            return None
        return self._items[-1]

    def size(self) -> int:
        return len(self._items)

    def is_empty(self) -> bool:
        return len(self._items) == 0
"#;

    const ARITH: &str = r#"import math


def add(a: int, b: int = 1) -> int:
    return a + b


def clamp(x, lo=0, hi=100):
    if x < lo:
        return lo
    elif x > hi:
        return hi
    return x


def mean(xs):
    assert len(xs) > 0, "empty"
    total = 0
    for x in xs:
        total += x
    return total / len(xs)


def is_even(n):
    return n % 2 == 0 and n is not None


def label(n):
    return "%d items" % n
"#;

    const STUBS: &str = r#""""Stubs: nothing to mutate."""


class Queue:
    """A queue, to be written."""

    def enqueue(self, item: int = 3) -> None:
        """Add an item at the back."""
        raise NotImplementedError

    def dequeue(self) -> int:
        """Remove the front item."""
        raise NotImplementedError("dequeue")


@decorator(1 + 2)
def helper(x: int = 5, *, y: "list[int]" = [1, 2]) -> "int":
    """Docstring with 42 and a < b."""
    raise NotImplementedError()
"#;

    fn gen(path: &str, src: &str) -> Vec<Mutant> {
        Python.mutants(path, src).unwrap()
    }

    fn find<'a>(
        ms: &'a [Mutant],
        function: &str,
        kind: MutationType,
        original: &str,
        replacement: &str,
        src: &str,
    ) -> Option<&'a Mutant> {
        ms.iter().find(|m| {
            m.function.as_deref() == Some(function)
                && m.mutation_type == kind
                && &src[m.start_byte..m.end_byte] == original
                && m.replacement == replacement
        })
    }

    fn per_type(ms: &[Mutant]) -> BTreeMap<MutationType, usize> {
        let mut out = BTreeMap::new();
        for m in ms {
            *out.entry(m.mutation_type).or_insert(0) += 1;
        }
        out
    }

    fn assert_all_apply_and_parse(src: &str, ms: &[Mutant]) {
        let mut seen = HashSet::new();
        for m in ms {
            let mutated = apply(src, m).unwrap();
            assert_ne!(mutated, src, "{m:?}");
            assert!(Python.parses(&mutated), "{m:?} gives\n{mutated}");
            assert!(
                seen.insert((m.start_byte, m.end_byte, m.replacement.clone())),
                "duplicate {m:?}"
            );
        }
        let ids: HashSet<_> = ms.iter().map(|m| m.id.clone()).collect();
        assert_eq!(ids.len(), ms.len(), "ids are unique");
    }

    #[test]
    fn stack_guard_removal_is_a_removed_check_in_pop() {
        let ms = gen("stack.py", STACK);
        let guard_src =
            "if not self._items:\n            raise IndexError(\"pop from empty stack 🥞\")";
        let m = find(
            &ms,
            "pop",
            MutationType::RemovedCheck,
            guard_src,
            "pass",
            STACK,
        )
        .expect("guard removal in pop");
        assert_eq!(m.line, 25);
        assert_eq!(m.id, "stack.py:25:9:RemovedCheck:0");
        assert_eq!(m.description, "removed guard `if not self._items:` in pop");
        let mutated = apply(STACK, m).unwrap();
        assert!(mutated.contains("        pass\n        return self._items.pop()"));
        // push's capacity guard too, and peek's `return None` guard.
        assert!(ms.iter().any(|m| m.function.as_deref() == Some("push")
            && m.mutation_type == MutationType::RemovedCheck));
        assert!(ms.iter().any(|m| m.function.as_deref() == Some("peek")
            && m.mutation_type == MutationType::RemovedCheck));
    }

    #[test]
    fn stack_has_the_expected_flips_and_operators() {
        let ms = gen("stack.py", STACK);
        use MutationType::*;
        let expect = [
            ("is_empty", ConditionFlip, "==", "!="),
            ("is_empty", OffByOne, "0", "1"),
            ("is_empty", ReplacedReturn, "len(self._items) == 0", "None"),
            (
                "pop",
                ConditionFlip,
                "not self._items",
                "not (not self._items)",
            ),
            ("pop", ChangedOperator, "not self._items", "self._items"),
            ("pop", ReplacedReturn, "self._items.pop()", "None"),
            ("push", BoundaryMutation, ">=", ">"),
            ("push", RemovedStatement, "self._items.append(item)", "pass"),
            ("peek", OffByOne, "-1", "0"),
            ("peek", OffByOne, "-1", "-2"),
            (
                "peek",
                ConditionFlip,
                "self.is_empty()",
                "not (self.is_empty())",
            ),
            ("size", ReplacedReturn, "len(self._items)", "None"),
            (
                "__init__",
                RemovedStatement,
                "self._capacity = capacity",
                "pass",
            ),
        ];
        for (function, kind, original, replacement) in expect {
            assert!(
                find(&ms, function, kind, original, replacement, STACK).is_some(),
                "missing {kind} `{original}` -> `{replacement}` in {function}; have {ms:#?}"
            );
        }
        let flip = find(&ms, "is_empty", ConditionFlip, "==", "!=", STACK).unwrap();
        assert_eq!(flip.description, "`==` -> `!=` in is_empty");
        // `return None` is never replaced by itself, and the default `capacity: int = 10` and
        // the class-level / module-level code are untouched.
        assert!(ms.iter().all(|m| m.function.is_some()));
        let init_line = STACK
            .lines()
            .position(|l| l.contains("def __init__"))
            .unwrap()
            + 1;
        assert!(ms.iter().all(|m| m.line != init_line));
        let first_def = STACK.find("    def __init__").unwrap();
        assert!(ms.iter().all(|m| m.start_byte > first_def));
        assert_all_apply_and_parse(STACK, &ms);
    }

    #[test]
    fn stack_mutant_counts_per_type() {
        let ms = gen("stack.py", STACK);
        let counts = per_type(&ms);
        use MutationType::*;
        let expected: BTreeMap<MutationType, usize> = [
            (RemovedCheck, 3),
            (ConditionFlip, 4),
            (BoundaryMutation, 1),
            (OffByOne, 3),
            (ChangedOperator, 1),
            (ReplacedReturn, 4),
            (RemovedStatement, 3),
        ]
        .into_iter()
        .collect();
        assert_eq!(counts, expected, "{ms:#?}");
    }

    #[test]
    fn arithmetic_module_mutants() {
        let ms = gen("arith.py", ARITH);
        use MutationType::*;
        let expect = [
            ("add", ChangedOperator, "+", "-"),
            ("add", ReplacedReturn, "a + b", "None"),
            ("clamp", BoundaryMutation, "<", "<="),
            ("clamp", BoundaryMutation, ">", ">="),
            ("clamp", ConditionFlip, "x < lo", "not (x < lo)"),
            ("clamp", ConditionFlip, "x > hi", "not (x > hi)"),
            (
                "mean",
                RemovedCheck,
                "assert len(xs) > 0, \"empty\"",
                "pass",
            ),
            ("mean", OffByOne, "0", "1"),
            ("mean", ChangedOperator, "+=", "-="),
            ("mean", ChangedOperator, "/", "*"),
            ("mean", RemovedStatement, "total += x", "pass"),
            ("mean", RemovedStatement, "total = 0", "pass"),
            ("is_even", ChangedOperator, "%", "*"),
            ("is_even", ChangedOperator, "and", "or"),
            ("is_even", ConditionFlip, "is not", "is"),
            ("is_even", OffByOne, "2", "3"),
            ("is_even", OffByOne, "2", "1"),
        ];
        for (function, kind, original, replacement) in expect {
            assert!(
                find(&ms, function, kind, original, replacement, ARITH).is_some(),
                "missing {kind} `{original}` -> `{replacement}` in {function}"
            );
        }
        // An `if` with an `elif` is not a guard; zero has no `n-1`; parameter defaults and the
        // string-formatting `%` are left alone.
        assert!(!ms
            .iter()
            .any(|m| m.function.as_deref() == Some("clamp") && m.mutation_type == RemovedCheck));
        assert!(find(&ms, "mean", OffByOne, "0", "-1", ARITH).is_none());
        assert!(!ms
            .iter()
            .any(|m| m.function.as_deref() == Some("clamp") && m.mutation_type == OffByOne));
        assert!(!ms
            .iter()
            .any(|m| m.function.as_deref() == Some("label") && m.mutation_type == ChangedOperator));
        assert!(!ms
            .iter()
            .any(|m| m.function.as_deref() == Some("add") && m.mutation_type == OffByOne));
        assert_all_apply_and_parse(ARITH, &ms);
    }

    #[test]
    fn docstrings_decorators_annotations_and_stubs_give_nothing() {
        assert_eq!(gen("stubs.py", STUBS), Vec::new());
        let guard_stub = "def f(x):\n    if x:\n        raise NotImplementedError\n    return 1\n";
        let ms = gen("g.py", guard_stub);
        assert!(!ms
            .iter()
            .any(|m| m.mutation_type == MutationType::RemovedCheck));
        assert!(ms
            .iter()
            .any(|m| m.mutation_type == MutationType::ConditionFlip));
        // Module-level and class-level code is not mutated.
        let module = "X = 1 + 2\nif X > 2:\n    print(X)\nclass A:\n    y = 3 * 4\n";
        assert_eq!(gen("m.py", module), Vec::new());
        // Nor is an f-string's interpolation, nor an annotated local's type.
        let f = "def f(n):\n    s: \"list[int]\" = []\n    return f\"{n + 1}\"\n";
        let ms = gen("f.py", f);
        assert!(
            ms.iter().all(|m| matches!(
                m.mutation_type,
                MutationType::ReplacedReturn | MutationType::RemovedStatement
            )),
            "{ms:#?}"
        );
    }

    #[test]
    fn ids_are_stable_and_output_is_sorted() {
        let a = gen("pkg/stack.py", STACK);
        let b = gen("pkg/stack.py", STACK);
        assert_eq!(a, b);
        assert!(a
            .iter()
            .all(|m| m.id.starts_with(&format!("pkg/stack.py:{}:", m.line))));
        let keys: Vec<_> = a.iter().map(|m| m.start_byte).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        // Two OffByOne mutants of `-1` share a place; ranks tell them apart.
        let peek: Vec<_> = a
            .iter()
            .filter(|m| {
                m.mutation_type == MutationType::OffByOne && m.function.as_deref() == Some("peek")
            })
            .map(|m| m.id.rsplit(':').next().unwrap().to_string())
            .collect();
        assert_eq!(peek, vec!["0", "1"]);
    }

    #[test]
    fn unicode_does_not_break_offsets() {
        let src = "def f(s):\n    t = \"ünï ✗ 🥞\"  # çømment ∞\n    if s == \"é\": return 1  # ✓\n    return len(s) + 2  # ½\n";
        let ms = gen("u.py", src);
        assert!(!ms.is_empty());
        for m in &ms {
            assert!(src.is_char_boundary(m.start_byte) && src.is_char_boundary(m.end_byte));
        }
        let plus = find(&ms, "f", MutationType::ChangedOperator, "+", "-", src).unwrap();
        // Column counts characters: "    return len(s) " is 18 of them.
        assert_eq!(plus.line, 4);
        assert!(plus.id.starts_with("u.py:4:19:"), "{}", plus.id);
        let eq = find(&ms, "f", MutationType::ConditionFlip, "==", "!=", src).unwrap();
        assert_eq!(eq.line, 3);
        assert_all_apply_and_parse(src, &ms);
    }

    #[test]
    fn odd_corners() {
        // Words are not glued together, other bases survive, and `True` flips.
        let src = "def f(x):\n    if(x):return-1\n    while x>0x1F: x -= 0b10\n    return True\n";
        let ms = gen("c.py", src);
        assert!(find(
            &ms,
            "f",
            MutationType::ConditionFlip,
            "(x)",
            " not ((x))",
            src
        )
        .is_some());
        assert!(find(&ms, "f", MutationType::OffByOne, "-1", " 0", src).is_some());
        assert!(find(&ms, "f", MutationType::OffByOne, "0x1F", "0x20", src).is_some());
        assert!(find(&ms, "f", MutationType::OffByOne, "0b10", "0b1", src).is_some());
        assert!(find(&ms, "f", MutationType::ChangedOperator, "-=", "+=", src).is_some());
        assert!(find(&ms, "f", MutationType::ReplacedReturn, "True", "False", src).is_some());
        assert_all_apply_and_parse(src, &ms);
        // Nested functions are named by the innermost def; `in` flips.
        let src = "def outer(xs):\n    def inner(y):\n        return y in xs\n    return inner\n";
        let ms = gen("n.py", src);
        let m = find(
            &ms,
            "inner",
            MutationType::ConditionFlip,
            "in",
            "not in",
            src,
        )
        .unwrap();
        assert_eq!(m.description, "`in` -> `not in` in inner");
    }

    #[test]
    fn unparseable_source_is_an_error() {
        assert!(Python.mutants("bad.py", "def f(:\n  return 1\n").is_err());
        assert!(!Python.parses("def f(:\n"));
        assert!(!Python.parses("x = (1 + \n"));
        assert!(Python.parses(STACK));
        assert!(Python.parses(""));
    }

    #[test]
    fn select_over_real_mutants() {
        let mut all = gen("stack.py", STACK);
        all.extend(gen("arith.py", ARITH));
        let n = all.len();
        assert!(n > 30, "{n}");
        let a = select(all.clone(), 42, 10);
        assert_eq!(a, select(all.clone(), 42, 10));
        assert_eq!(a.len(), 10);
        assert_ne!(a, select(all.clone(), 43, 10));
        assert_eq!(select(all, 42, n + 5).len(), n);
    }

    /// Lines of Python-ish code, indented at random: sometimes valid, often not.
    fn pythonish() -> impl Strategy<Value = String> {
        let fragments = prop::sample::select(vec![
            "def f(x, y=1):",
            "async def g(a: int = 2) -> int:",
            "class A(B, metaclass=M):",
            "@dec(3)",
            "if x < 1:",
            "if(x):return-1",
            "elif x == 2 or y is not None:",
            "else:",
            "while not x:",
            "for i in range(10):",
            "try:",
            "except ValueError as e:",
            "with open(p) as fh:",
            "return x + 1",
            "return True",
            "return",
            "return (None)",
            "raise ValueError('é ✗')",
            "raise NotImplementedError",
            "assert x >= 0, 'neg'",
            "x += 2",
            "y = xs[-1] // 3 % 2",
            "self.items.append(x)",
            "await self.flush()",
            "pass",
            "'''doc ünï'''",
            "# comment 🥞",
            "z = a and b or not c",
            "w = 0x1F - -0b11 * 1_000",
            "k = lambda q=3: q * 2",
            "import os",
            "s: int = 5",
            "t = f\"{x + 1}\"",
            "yield x",
            "x = y = 1j",
            "break",
            "global g",
            "(",
            "é = 1",
        ]);
        prop::collection::vec((0usize..4, fragments), 0..14).prop_map(|lines| {
            lines
                .into_iter()
                .map(|(indent, l)| format!("{}{l}\n", "    ".repeat(indent)))
                .collect()
        })
    }

    fn check_all(src: &str, ms: &[Mutant]) {
        let mut seen = HashSet::new();
        for m in ms {
            assert!(m.start_byte <= m.end_byte && m.end_byte <= src.len());
            let mutated = apply(src, m).unwrap();
            assert!(Python.parses(&mutated), "{m:?}\n{mutated}");
            assert!(seen.insert((m.start_byte, m.end_byte, m.replacement.clone())));
        }
    }

    /// The Python-ish generator is not vacuous: a fair share of its files parse and mutate.
    #[test]
    fn pythonish_sources_often_give_mutants() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let strategy = pythonish();
        let mut mutated = 0;
        for _ in 0..300 {
            let src = strategy.new_tree(&mut runner).unwrap().current();
            if Python.mutants("p.py", &src).is_ok_and(|ms| !ms.is_empty()) {
                mutated += 1;
            }
        }
        assert!(mutated >= 10, "only {mutated} of 300 gave mutants");
    }

    proptest! {
        #[test]
        fn arbitrary_strings_never_panic(src in any::<String>()) {
            let _ = Python.parses(&src);
            if let Ok(ms) = Python.mutants("p.py", &src) {
                check_all(&src, &ms);
            }
        }

        #[test]
        fn pythonish_sources_never_panic_and_every_mutant_parses(src in pythonish()) {
            if let Ok(ms) = Python.mutants("p.py", &src) {
                check_all(&src, &ms);
                prop_assert_eq!(&ms, &Python.mutants("p.py", &src).unwrap());
            }
        }

        #[test]
        fn apply_never_panics(src in any::<String>(), start in 0usize..64, len in 0usize..64) {
            let m = Mutant {
                id: "x".into(),
                path: "p.py".into(),
                function: None,
                line: 1,
                mutation_type: MutationType::OffByOne,
                description: String::new(),
                start_byte: start,
                end_byte: start + len,
                replacement: "é".into(),
            };
            let _ = apply(&src, &m);
        }
    }
}
