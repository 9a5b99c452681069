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
//!
//! Here: the `Mutator` (parse, walk, keep the candidates that still parse, stable ids);
//! `walker.rs`: which nodes are mutated and how; `literals.rs`: integer literals, spacing and
//! descriptions.

mod literals;
#[cfg(test)]
mod tests;
mod walker;

use super::{Mutant, MutationType, Mutator};
use std::collections::{HashMap, HashSet};
use tree_sitter::{InputEdit, Node, Parser, Point, Tree};
use walker::Walker;

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

/// A mutation found by the walk, before it is checked to parse and given its id.
struct Candidate {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) replacement: String,
    pub(super) kind: MutationType,
    /// Without the " in <function>" suffix.
    pub(super) description: String,
    /// Index into the walker's function names.
    pub(super) function: usize,
}
