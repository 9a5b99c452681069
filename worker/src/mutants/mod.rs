//! Mechanical mutation testing: a per-language mutant generator (Python: tree-sitter), applying
//! a mutant to a source, a deterministic seeded selection under a cap, and batching.
//!
//! Pure: no I/O. Whoever runs the mutants (a sandbox) writes `apply`'s output over the file,
//! runs the tests and records which mutants survived.
//!
//! A mutant is one byte-range replacement in one file. Generators only emit mutants whose
//! mutated file still parses, and never two with the same `(start_byte, end_byte, replacement)`.

mod python;

use serde::{Deserialize, Serialize};

/// The kind of a mutation. Serialises as the variant name (`"RemovedCheck"`, ...), as seed
/// 000's `mutation_type` does; `ReplacedReturn` and `RemovedStatement` are ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum MutationType {
    /// A guard (`if` with no `else`/`elif` whose body raises or returns) or an `assert`
    /// replaced by `pass`.
    RemovedCheck,
    /// A condition negated (`C` -> `not (C)`), or `==`/`!=`, `is`/`is not`, `in`/`not in`.
    ConditionFlip,
    /// `<` <-> `<=`, `>` <-> `>=`.
    BoundaryMutation,
    /// An integer literal moved by one.
    OffByOne,
    /// An arithmetic or boolean operator swapped, or a `not` dropped.
    ChangedOperator,
    /// `return X` -> `return None`; `return True` <-> `return False`.
    ReplacedReturn,
    /// A call or an assignment statement replaced by `pass`.
    RemovedStatement,
}

impl MutationType {
    pub const ALL: [MutationType; 7] = [
        MutationType::RemovedCheck,
        MutationType::ConditionFlip,
        MutationType::BoundaryMutation,
        MutationType::OffByOne,
        MutationType::ChangedOperator,
        MutationType::ReplacedReturn,
        MutationType::RemovedStatement,
    ];

    /// The serialised name.
    pub fn as_str(self) -> &'static str {
        match self {
            MutationType::RemovedCheck => "RemovedCheck",
            MutationType::ConditionFlip => "ConditionFlip",
            MutationType::BoundaryMutation => "BoundaryMutation",
            MutationType::OffByOne => "OffByOne",
            MutationType::ChangedOperator => "ChangedOperator",
            MutationType::ReplacedReturn => "ReplacedReturn",
            MutationType::RemovedStatement => "RemovedStatement",
        }
    }
}

impl std::fmt::Display for MutationType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One mutation of one file: replace `source[start_byte..end_byte]` with `replacement`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mutant {
    /// `"<path>:<line>:<col>:<type>:<n>"`: `line` and `col` 1-based (`col` counted in
    /// characters), `n` the 0-based rank among the file's mutants of that type starting at the
    /// same place, ordered by `(end_byte, replacement)`. Stable for the same path and source.
    pub id: String,
    pub path: String,
    /// The innermost enclosing `def`.
    pub function: Option<String>,
    /// 1-based line of `start_byte`.
    pub line: usize,
    pub mutation_type: MutationType,
    /// Prose, e.g. "`<` -> `<=` in pop".
    pub description: String,
    pub start_byte: usize,
    pub end_byte: usize,
    pub replacement: String,
}

pub trait Mutator: Send + Sync {
    /// Does this language own the file?
    fn handles(&self, path: &str) -> bool;
    /// Every mutant of the file, sorted by `(start_byte, end_byte, replacement)`. An error if
    /// the source itself does not parse cleanly.
    fn mutants(&self, path: &str, source: &str) -> Result<Vec<Mutant>, String>;
    /// Does the source parse without ERROR or MISSING nodes?
    fn parses(&self, source: &str) -> bool;
}

/// The generator for a language: `"python"` (or `"py"`), case-insensitive.
pub fn mutator(language: &str) -> Option<Box<dyn Mutator>> {
    let l = language.trim();
    if l.eq_ignore_ascii_case("python") || l.eq_ignore_ascii_case("py") {
        Some(Box::new(python::Python))
    } else {
        None
    }
}

/// The source with the mutant applied. Errors (never panics) when the byte range is out of
/// bounds, reversed, or not on char boundaries.
pub fn apply(source: &str, m: &Mutant) -> Result<String, String> {
    let (start, end) = (m.start_byte, m.end_byte);
    if start > end {
        return Err(format!("mutant {}: start {start} after end {end}", m.id));
    }
    if end > source.len() {
        return Err(format!(
            "mutant {}: end {end} past the source's {} bytes",
            m.id,
            source.len()
        ));
    }
    if !source.is_char_boundary(start) || !source.is_char_boundary(end) {
        return Err(format!(
            "mutant {}: {start}..{end} is not on char boundaries",
            m.id
        ));
    }
    let mut out = String::with_capacity(source.len() - (end - start) + m.replacement.len());
    out.push_str(&source[..start]);
    out.push_str(&m.replacement);
    out.push_str(&source[end..]);
    Ok(out)
}

/// splitmix64 (Steele, Lea, Flood 2014): tiny, seedable, good enough to shuffle.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-enough in `0..n` (`n >= 1`): the high half of a 64x64 multiply (Lemire; the bias
    /// is below 2^-40 for any list we will ever shuffle).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// Deterministic selection: sort by `(path, start_byte, id)`, Fisher-Yates shuffle with a
/// splitmix64 seeded by `seed`, take `cap`, then sort the chosen by `(path, start_byte, id)`.
/// The same mutants and seed always give the same answer, whatever order they came in.
pub fn select(mut all: Vec<Mutant>, seed: u64, cap: usize) -> Vec<Mutant> {
    let key = |m: &Mutant| (m.path.clone(), m.start_byte, m.id.clone());
    all.sort_by_cached_key(key);
    let mut rng = SplitMix64(seed);
    for i in (1..all.len()).rev() {
        let j = rng.below(i + 1);
        all.swap(i, j);
    }
    all.truncate(cap);
    all.sort_by_cached_key(key);
    all
}

/// Consecutive batches of at most `per_batch` mutants (`0` counts as 1), order preserved.
pub fn batches(m: &[Mutant], per_batch: usize) -> Vec<Vec<Mutant>> {
    m.chunks(per_batch.max(1)).map(<[Mutant]>::to_vec).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk(path: &str, start: usize, n: usize) -> Mutant {
        Mutant {
            id: format!("{path}:1:{start}:OffByOne:{n}"),
            path: path.into(),
            function: Some("f".into()),
            line: 1,
            mutation_type: MutationType::OffByOne,
            description: "`1` -> `2` in f".into(),
            start_byte: start,
            end_byte: start + 1,
            replacement: "2".into(),
        }
    }

    fn many(k: usize) -> Vec<Mutant> {
        (0..k)
            .map(|i| mk(if i % 3 == 0 { "b.py" } else { "a.py" }, i, i % 2))
            .collect()
    }

    #[test]
    fn mutation_types_serialise_as_their_pascal_case_names() {
        for t in MutationType::ALL {
            let json = serde_json::to_string(&t).unwrap();
            assert_eq!(json, format!("\"{}\"", t.as_str()));
            let back: MutationType = serde_json::from_str(&json).unwrap();
            assert_eq!(back, t);
        }
        let m = mk("a.py", 3, 0);
        let back: Mutant = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn mutator_knows_python_only() {
        assert!(mutator("python").is_some());
        assert!(mutator("Python").is_some());
        assert!(mutator("py").is_some());
        assert!(mutator("rust").is_none());
        assert!(mutator("python").unwrap().handles("pkg/stack.py"));
        assert!(!mutator("python").unwrap().handles("pkg/stack.rs"));
    }

    #[test]
    fn apply_replaces_the_range_and_rejects_bad_ranges() {
        let mut m = mk("a.py", 4, 0);
        assert_eq!(apply("x = 1\n", &m).unwrap(), "x = 2\n");
        m.start_byte = 5;
        m.end_byte = 4;
        assert!(apply("x = 1\n", &m).is_err());
        m.start_byte = 4;
        m.end_byte = 99;
        assert!(apply("x = 1\n", &m).is_err());
        // "é" is two bytes: 5 is inside it.
        m.start_byte = 5;
        m.end_byte = 6;
        assert!(apply("x = 'é'\n", &m).is_err());
        m.start_byte = 4;
        m.end_byte = 4;
        assert_eq!(apply("x = 1\n", &m).unwrap(), "x = 21\n");
    }

    #[test]
    fn select_is_deterministic_and_order_independent() {
        let all = many(200);
        let a = select(all.clone(), 7, 20);
        let mut reversed = all.clone();
        reversed.reverse();
        let b = select(reversed, 7, 20);
        assert_eq!(a, b);
        assert_eq!(a.len(), 20);
        // Sorted by (path, start).
        let keys: Vec<_> = a.iter().map(|m| (m.path.clone(), m.start_byte)).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn select_differs_across_seeds_and_respects_the_cap() {
        let all = many(500);
        let a = select(all.clone(), 1, 25);
        let b = select(all.clone(), 2, 25);
        assert_ne!(a, b);
        assert_eq!(select(all.clone(), 3, 0).len(), 0);
        assert_eq!(select(all.clone(), 3, 10_000).len(), 500);
        assert!(select(Vec::new(), 3, 5).is_empty());
        // A cap at least the size keeps everything, sorted.
        let mut everything = all.clone();
        everything.sort_by_key(|m| (m.path.clone(), m.start_byte, m.id.clone()));
        assert_eq!(select(all, 9, 500), everything);
    }

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // Reference values for seed 1234567 (from the C reference implementation).
        let mut r = SplitMix64(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
        let mut r = SplitMix64(0);
        for _ in 0..1000 {
            assert!(r.below(7) < 7);
        }
    }

    #[test]
    fn batches_split_in_order() {
        let all = many(10);
        let b = batches(&all, 3);
        assert_eq!(b.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 3, 3, 1]);
        assert_eq!(b.concat(), all);
        assert_eq!(batches(&all, 0).len(), 10);
        assert_eq!(batches(&all, 100).len(), 1);
        assert!(batches(&[], 4).is_empty());
    }
}
