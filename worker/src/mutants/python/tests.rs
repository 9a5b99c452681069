//! Mutants of real modules (a stack, arithmetic), what is never mutated, stable ids, unicode
//! offsets, and property tests: nothing panics and every mutant parses.

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
    assert!(ms
        .iter()
        .any(|m| m.function.as_deref() == Some("push")
            && m.mutation_type == MutationType::RemovedCheck));
    assert!(ms
        .iter()
        .any(|m| m.function.as_deref() == Some("peek")
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
