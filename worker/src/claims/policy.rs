//! What implementation code may reference. For Python the code under test runs inside the test
//! runner's process, so an implementation that imports the test framework, reads `sys.argv`,
//! forks, registers `atexit` hooks, opens files or reaches interpreter internals can rewrite its
//! own verdict. The harness refuses such code before its tests run (a build check). A
//! heuristic over the syntax tree, not a sandbox: names are resolved through import aliases,
//! not through `getattr` on computed strings (which is why `getattr` itself is refused).

use std::collections::BTreeMap;
use tree_sitter::{Node, Parser};

/// What Python implementation code may not reference, by default (dotted prefixes; a trailing
/// `*` matches any continuation of the last segment).
pub const PYTHON_FORBIDDEN: &[&str] = &[
    // the test framework and the process around it
    "pytest",
    "_pytest",
    "py",
    "unittest",
    "doctest",
    "atexit",
    "signal",
    "faulthandler",
    "subprocess",
    "multiprocessing",
    "threading",
    "_thread",
    "concurrent",
    "asyncio.subprocess",
    "pty",
    "socket",
    "ctypes",
    "gc",
    "inspect",
    "importlib",
    "builtins",
    "runpy",
    "site",
    "sysconfig",
    "code",
    "codeop",
    "pdb",
    "trace",
    "tracemalloc",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "glob",
    "fcntl",
    "mmap",
    "xml",
    "marshal",
    "pickle",
    // process and interpreter state
    "sys.argv",
    "sys.orig_argv",
    "sys.modules",
    "sys.meta_path",
    "sys.path",
    "sys.path_hooks",
    "sys._getframe",
    "sys.settrace",
    "sys.setprofile",
    "sys.addaudithook",
    "sys.exit",
    "sys.stdout",
    "sys.stderr",
    "sys.__stdout__",
    "sys.__stderr__",
    "sys.excepthook",
    "os._exit",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.killpg",
    "os.system",
    "os.popen",
    "os.exec*",
    "os.spawn*",
    "os.posix_spawn*",
    "os.environ",
    "os.getenv",
    "os.putenv",
    "os.open",
    "os.write",
    "os.remove",
    "os.unlink",
    "os.rename",
    "os.replace",
    "os.chdir",
    "os.getppid",
    "os.setsid",
    "os.dup2",
    "os.fdopen",
    "os.walk",
    "os.listdir",
    "os.scandir",
    // builtins that read files or reach around names
    "open",
    "__import__",
    "eval",
    "exec",
    "compile",
    "globals",
    "locals",
    "vars",
    "getattr",
    "setattr",
    "delattr",
    "breakpoint",
    "input",
    "__builtins__",
];

/// Attribute names that reach interpreter internals whatever object they hang off.
const DUNDER_ESCAPES: &[&str] = &[
    "__subclasses__",
    "__globals__",
    "__code__",
    "__builtins__",
    "__import__",
    "__loader__",
    "__spec__",
    "__dict__",
    "__class__",
    "__bases__",
    "__mro__",
    "f_globals",
    "f_locals",
    "f_back",
    "gi_frame",
    "tb_frame",
    "cr_frame",
];

/// One forbidden reference: the name as resolved, the entry it matched, the line.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Forbidden {
    pub name: String,
    pub rule: String,
    pub line: usize,
}

fn matches(rule: &str, name: &str) -> bool {
    match rule.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == rule || name.starts_with(&format!("{rule}.")),
    }
}

/// Forbidden references in a Python source (resolved through `import x as y` and
/// `from x import y [as z]`). An unparsable source is an error.
pub fn python_forbidden(source: &str, rules: &[String]) -> Result<Vec<Forbidden>, String> {
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
    let mut aliases: BTreeMap<String, String> = BTreeMap::new();
    let mut refs: Vec<(String, usize)> = Vec::new();
    collect(tree.root_node(), src, &mut aliases, &mut refs, 0);
    let mut out = Vec::new();
    for (name, line) in refs {
        let resolved = resolve(&name, &aliases);
        let hit = rules
            .iter()
            .find(|r| matches(r, &resolved))
            .cloned()
            .or_else(|| {
                resolved
                    .split('.')
                    .find(|seg| DUNDER_ESCAPES.contains(seg))
                    .map(|seg| seg.to_string())
            });
        if let Some(rule) = hit {
            out.push(Forbidden {
                name: resolved,
                rule,
                line,
            });
        }
    }
    out.sort_by(|a, b| (a.line, &a.name).cmp(&(b.line, &b.name)));
    out.dedup();
    Ok(out)
}

fn resolve(name: &str, aliases: &BTreeMap<String, String>) -> String {
    let (head, rest) = match name.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (name, None),
    };
    match (aliases.get(head), rest) {
        (Some(full), Some(r)) => format!("{full}.{r}"),
        (Some(full), None) => full.clone(),
        (None, _) => name.to_string(),
    }
}

fn text<'a>(node: Node<'_>, src: &'a [u8]) -> &'a str {
    node.utf8_text(src).unwrap_or_default()
}

fn collect(
    node: Node<'_>,
    src: &[u8],
    aliases: &mut BTreeMap<String, String>,
    refs: &mut Vec<(String, usize)>,
    depth: usize,
) {
    if depth > 400 {
        return;
    }
    let line = node.start_position().row + 1;
    match node.kind() {
        "import_statement" => {
            let mut c = node.walk();
            for child in node.named_children(&mut c) {
                let (module, alias) = match child.kind() {
                    "aliased_import" => (
                        child.child_by_field_name("name").map(|n| text(n, src)),
                        child.child_by_field_name("alias").map(|n| text(n, src)),
                    ),
                    "dotted_name" => (Some(text(child, src)), None),
                    _ => (None, None),
                };
                if let Some(m) = module {
                    refs.push((m.to_string(), line));
                    let bound = alias.unwrap_or_else(|| m.split('.').next().unwrap_or(m));
                    let target = if alias.is_some() {
                        m
                    } else {
                        m.split('.').next().unwrap_or(m)
                    };
                    aliases.insert(bound.to_string(), target.to_string());
                }
            }
            return;
        }
        "import_from_statement" => {
            let module = node
                .child_by_field_name("module_name")
                .map(|n| text(n, src).to_string())
                .unwrap_or_default();
            refs.push((module.clone(), line));
            let mut c = node.walk();
            for child in node.children_by_field_name("name", &mut c) {
                let (name, alias) = match child.kind() {
                    "aliased_import" => (
                        child.child_by_field_name("name").map(|n| text(n, src)),
                        child.child_by_field_name("alias").map(|n| text(n, src)),
                    ),
                    _ => (Some(text(child, src)), None),
                };
                if let Some(n) = name {
                    let full = format!("{module}.{n}");
                    refs.push((full.clone(), line));
                    aliases.insert(alias.unwrap_or(n).to_string(), full);
                }
            }
            return;
        }
        "attribute" => {
            // The whole dotted chain once (`os.path.join`), not each of its prefixes.
            refs.push((text(node, src).split_whitespace().collect(), line));
        }
        "identifier" => {
            // A reference, not a name being bound (a def, a parameter, a keyword argument).
            let binding = node.parent().is_some_and(|p| {
                matches!(
                    p.kind(),
                    "attribute"
                        | "function_definition"
                        | "class_definition"
                        | "parameters"
                        | "lambda_parameters"
                        | "default_parameter"
                        | "typed_parameter"
                        | "typed_default_parameter"
                ) || (p.kind() == "keyword_argument"
                    && p.child_by_field_name("name")
                        .is_some_and(|n| n.id() == node.id()))
            });
            if !binding {
                refs.push((text(node, src).to_string(), line));
            }
        }
        _ => {}
    }
    let mut c = node.walk();
    for child in node.children(&mut c) {
        collect(child, src, aliases, refs, depth + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Vec<String> {
        PYTHON_FORBIDDEN.iter().map(|s| s.to_string()).collect()
    }

    fn names(src: &str) -> Vec<String> {
        python_forbidden(src, &rules())
            .unwrap()
            .into_iter()
            .map(|f| f.name)
            .collect()
    }

    #[test]
    fn an_honest_stack_references_nothing_forbidden() {
        let src = "class Stack:\n    def __init__(self):\n        self._items = []\n\n    def pop(self):\n        if not self._items:\n            raise IndexError('pop from an empty stack')\n        return self._items.pop()\n";
        assert_eq!(names(src), Vec::<String>::new());
    }

    #[test]
    fn the_runners_process_is_out_of_reach_even_through_aliases() {
        assert_eq!(names("import sys\nx = sys.argv[1]\n"), vec!["sys.argv"]);
        assert_eq!(names("import sys as s\nx = s.argv\n"), vec!["sys.argv"]);
        assert_eq!(names("from sys import argv\n"), vec!["sys.argv"]);
        assert_eq!(
            names("from os import _exit as e\ne(0)\n"),
            vec!["os._exit", "os._exit"]
        );
        assert_eq!(
            names("import os\nos.execv('/bin/true', [])\n"),
            vec!["os.execv"]
        );
        assert_eq!(names("import _pytest.python\n"), vec!["_pytest.python"]);
        assert_eq!(names("import atexit\n"), vec!["atexit"]);
        assert_eq!(
            names("def f():\n    return open('/fleet/out/report.xml')\n"),
            vec!["open"]
        );
        assert_eq!(names("x = getattr(object, 'y')\n"), vec!["getattr"]);
        assert!(!names("x = ().__class__.__bases__[0].__subclasses__()\n").is_empty());
    }

    #[test]
    fn names_being_bound_are_not_references() {
        assert_eq!(
            names("def open(self, input=1):\n    return input\n"),
            vec!["input"]
        );
        assert_eq!(names("f(input=2)\n"), Vec::<String>::new());
    }

    #[test]
    fn unparsable_source_is_an_error() {
        assert!(python_forbidden("def f(:\n", &rules()).is_err());
    }
}
