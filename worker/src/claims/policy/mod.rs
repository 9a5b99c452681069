//! What code written by agents may use, stated as what is allowed. For Python the code under
//! test runs inside the test runner's process, so anything it can reach (the test framework,
//! `sys`, frames, files, other modules' globals) can rewrite its own verdict. The harness
//! refuses, before anything runs it, code that goes beyond the allow-lists of `tables`:
//!
//! - imports: only the allowed modules (the pure standard library), the project's own modules
//!   and relative imports; inside allowed modules, no name that looks attributes up by a
//!   computed name or evaluates strings (`operator.attrgetter`, `typing.get_type_hints`...),
//!   no private name (`random._os`), no other module reached through one (`typing.sys`), no
//!   module passed around as a value;
//! - names: a referenced name must be an allowed builtin or bound somewhere in the file; a
//!   refused builtin (`eval`, `open`, `vars`...) or interpreter global (`__file__`) only when
//!   the file defines it itself (a module-level `def` or `class`);
//! - computed attribute access: `getattr`/`hasattr`/`setattr`/`delattr` only called directly
//!   with a literal name not starting with `_`; no dunder attribute outside the data model's
//!   (`__class__`, `__dict__`, `__globals__`... refused), no frame or code internals
//!   (`gi_frame`, `f_globals`), no string literal naming them (escapes decoded, concatenations
//!   read as one), `.format`/`.format_map` only on a string literal.
//!
//! Every refusal names its rule, the resolved name and the line. A spec or work order widens
//! the lists by name ([`Allowances::allow`]: an entry allows that name and everything under it,
//! `os` allows `os.environ`; `*` turns the policy off). A heuristic over the syntax tree (no
//! scopes: a name bound anywhere counts as bound), not a sandbox; the harness's runtime checks
//! stand behind it.

mod bind;
mod local;
mod scan;
pub mod tables;

pub use local::local_modules;

use std::collections::BTreeSet;
use tree_sitter::Parser;

/// An allowance that turns the policy off (runs testing the layers beneath it).
pub const PYTHON_ALLOW_ALL: &[&str] = &["*"];

/// One refusal: the name as resolved, the rule it broke, the line.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Forbidden {
    pub name: String,
    pub rule: String,
    pub line: usize,
}

/// What a run allows beyond the defaults.
#[derive(Clone, Debug, Default)]
pub struct Allowances {
    /// Names allowed by the spec or work order (modules, builtins, dunders, dotted names).
    pub allow: Vec<String>,
    /// Top-level modules of the project itself (its own code may be imported).
    pub local_modules: BTreeSet<String>,
}

impl Allowances {
    /// Is this refused name allowed after all? An entry allows itself and what is under it.
    pub fn allows(&self, name: &str) -> bool {
        self.allow.iter().any(|a| {
            a == "*"
                || a == name
                || name
                    .strip_prefix(a.as_str())
                    .is_some_and(|rest| rest.starts_with('.'))
        })
    }
}

/// [`python_refusals`] with `allow` and no project modules.
pub fn python_forbidden(source: &str, allow: &[String]) -> Result<Vec<Forbidden>, String> {
    let allowances = Allowances {
        allow: allow.to_vec(),
        local_modules: BTreeSet::new(),
    };
    python_refusals(source, &allowances)
}

/// What a Python source uses beyond what is allowed, in line order. An unparsable source is
/// an error.
pub fn python_refusals(source: &str, allowances: &Allowances) -> Result<Vec<Forbidden>, String> {
    let mut parser = Parser::new();
    parser
        .set_language(&tree_sitter_python::LANGUAGE.into())
        .map_err(|e| e.to_string())?;
    let tree = parser
        .parse(source, None)
        .ok_or_else(|| "the parser gave no tree".to_string())?;
    if tree.root_node().has_error() {
        return Err("the source does not parse".into());
    }
    let src = source.as_bytes();
    let bindings = bind::Bindings::collect(tree.root_node(), src);
    let mut scan = scan::Scan {
        src,
        b: &bindings,
        local: &allowances.local_modules,
        hits: Vec::new(),
    };
    scan.run(tree.root_node());
    let mut out: Vec<Forbidden> = scan
        .hits
        .into_iter()
        .filter(|h| !allowances.allows(&h.name))
        .collect();
    out.sort_by(|a, b| (a.line, &a.name, &a.rule).cmp(&(b.line, &b.name, &b.rule)));
    out.dedup();
    Ok(out)
}

/// The (rule, name) pairs of refusals, lines left out: what a file already did at a base.
pub fn refusal_kinds(found: &[Forbidden]) -> BTreeSet<(String, String)> {
    found
        .iter()
        .map(|f| (f.rule.clone(), f.name.clone()))
        .collect()
}

#[cfg(test)]
mod tests;
