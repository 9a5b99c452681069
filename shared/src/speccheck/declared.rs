//! Checks declared by a design step: the hybrid graph's types agent gives, for every function,
//! examples and property sketches, each with executable Python (`check`) beside its prose.
//! They stay semantic metadata for the agents (both see them), and the harness runs them as
//! its own checks: examples exactly as written, properties over inputs it draws (never the
//! agents' choice). Read here from the step's output; parsed by the worker.

use super::{Check, SpecChecks, MAX_CHECKS, MAX_CHECK_BYTES};
use serde::Deserialize;
use serde_json::Value;

/// The parameter a run gives: the module under test (a dotted import path) and the design
/// step's output (`types.output`: `type_name`, `constructors`, `functions`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Declared {
    #[serde(default)]
    pub module: String,
    #[serde(default)]
    pub design: Value,
}

#[derive(Deserialize)]
struct Function {
    name: String,
    #[serde(default)]
    examples: Vec<Item>,
    #[serde(default)]
    properties: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    check: Option<String>,
}

/// `word` as a plain check name: letters, digits and `_`, at most 48 characters.
fn plain(word: &str) -> String {
    let mut out: String = word
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(48)
        .collect();
    if out.is_empty() {
        out.push('x');
    }
    out
}

impl Declared {
    /// The declared checks as the harness runs them. An example or property without code, a
    /// property that is not a function `prop`, or more than `MAX_CHECKS` of a kind is refused
    /// with the function's and the item's names: the design step's output is hostile too.
    pub fn checks(&self) -> Result<SpecChecks, String> {
        if self.design.is_null() {
            return Ok(SpecChecks::default());
        }
        let functions: Vec<Function> = serde_json::from_value(self.design["functions"].clone())
            .map_err(|e| format!("the declared functions cannot be read: {e}"))?;
        let mut out = SpecChecks {
            setup: self.setup(&functions)?,
            ..SpecChecks::default()
        };
        for f in &functions {
            for (i, e) in f.examples.iter().enumerate() {
                let code = item_code(&f.name, "example", i, e)?;
                out.examples.push(Check {
                    name: format!("{}_example_{}", plain(&f.name), i + 1),
                    check: code,
                    description: e.description.clone(),
                });
            }
            for (i, p) in f.properties.iter().enumerate() {
                let code = item_code(&f.name, "property", i, p)?;
                let name = p
                    .name
                    .as_deref()
                    .map(plain)
                    .unwrap_or_else(|| format!("{}_property_{}", plain(&f.name), i + 1));
                out.properties.push(Check {
                    name,
                    check: code,
                    description: p.description.clone(),
                });
            }
        }
        if out.examples.len() > MAX_CHECKS || out.properties.len() > MAX_CHECKS {
            return Err(format!(
                "the design declares more than {MAX_CHECKS} examples or properties"
            ));
        }
        out.validate()?;
        Ok(out)
    }
}

impl Declared {
    /// Statements that bind the design's names (the type, its constructors, its functions) from
    /// the module, inside a check's function: `import *` is not allowed there. A name the
    /// module lacks (a method, say) is bound to `None`.
    fn setup(&self, functions: &[Function]) -> Result<String, String> {
        let dotted = !self.module.is_empty()
            && self.module.split('.').all(|part| {
                !part.is_empty()
                    && !part.starts_with(|c: char| c.is_ascii_digit())
                    && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
        if !dotted {
            return Err(format!(
                "the module under test `{}` is not a dotted Python name",
                self.module
            ));
        }
        let mut names: Vec<String> = Vec::new();
        let mut add = |n: &str| {
            let ident = !n.is_empty()
                && !n.starts_with(|c: char| c.is_ascii_digit())
                && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if ident && !names.iter().any(|m| m == n) {
                names.push(n.to_string());
            }
        };
        add(self.design["type_name"].as_str().unwrap_or_default());
        for c in self.design["constructors"].as_array().into_iter().flatten() {
            add(c.as_str().unwrap_or_default());
        }
        for f in functions {
            add(&f.name);
        }
        let mut setup = format!("import {} as _fleet_module", self.module);
        for n in names {
            setup.push_str(&format!("\n{n} = getattr(_fleet_module, {n:?}, None)"));
        }
        Ok(setup)
    }
}

fn item_code(function: &str, kind: &str, index: usize, item: &Item) -> Result<String, String> {
    let code = item.check.as_deref().unwrap_or_default();
    if code.trim().is_empty() {
        return Err(format!(
            "{kind} {} of `{function}` has no executable check",
            index + 1
        ));
    }
    if code.len() > MAX_CHECK_BYTES {
        return Err(format!(
            "{kind} {} of `{function}` is longer than {MAX_CHECK_BYTES} bytes",
            index + 1
        ));
    }
    Ok(code.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn functions() -> Value {
        json!({"type_name": "Stack", "constructors": ["Stack", "bad name"], "functions": [{
            "name": "pop",
            "examples": [{"description": "last in", "check": "s = Stack()\ns.push(1)\nassert s.pop() == 1"}],
            "properties": [{"name": "lifo.order", "description": "d",
                "check": "def prop(a: int, b: int):\n    s = Stack()\n    s.push(a)\n    s.push(b)\n    assert s.pop() == b"}]
        }]})
    }

    fn declared(design: Value) -> Declared {
        Declared {
            module: "pkg.stack".into(),
            design,
        }
    }

    #[test]
    fn examples_and_properties_become_named_checks() {
        let c = declared(functions()).checks().unwrap();
        assert_eq!(
            c.setup,
            "import pkg.stack as _fleet_module\nStack = getattr(_fleet_module, \"Stack\", None)\npop = getattr(_fleet_module, \"pop\", None)"
        );
        assert_eq!(c.examples[0].name, "pop_example_1");
        assert!(c.examples[0].check.contains("s.pop() == 1"));
        assert_eq!(c.properties[0].name, "lifo_order");
    }

    #[test]
    fn items_without_code_or_with_a_property_that_is_no_function_are_refused() {
        let mut f = functions();
        f["functions"][0]["examples"][0]["check"] = json!("  ");
        let e = declared(f).checks().unwrap_err();
        assert!(e.contains("example 1 of `pop`"), "{e}");
        let mut f = functions();
        f["functions"][0]["properties"][0]["check"] = json!("assert True");
        let e = declared(f).checks().unwrap_err();
        assert!(e.contains("lifo_order"), "{e}");
        let e = declared(json!({"functions": {"no": "list"}}))
            .checks()
            .unwrap_err();
        assert!(e.contains("cannot be read"), "{e}");
        let mut d = declared(functions());
        d.module = "os; import sys".into();
        assert!(d.checks().unwrap_err().contains("not a dotted Python name"));
    }

    #[test]
    fn no_design_step_no_checks() {
        assert!(Declared::default().checks().unwrap().is_empty());
    }
}
