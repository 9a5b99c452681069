//! Seed 003's skeleton generation, a harness op (`render_files`): an agent gave semantic type
//! definitions (names, signatures, docs, properties), the graph's templates turn them into the
//! skeleton module and the test skeleton. The agent writes no file: what it gave reaches the
//! worktree only through templates the graph's author wrote. Each path is checked (relative,
//! no `..`, at most `MAX_FILES`), each template must be a bundle file, and each file is written
//! beneath the worktree without following a symlink; the write scope is checked on the commit
//! as for every node.

use crate::harness::StepOutcome;
use serde_json::{json, Value};
use shared::graph::GraphBundle;
use shared::messages::JobStatus;
use shared::paths::normalize_relative;
use std::path::Path;

/// The most files one node renders.
pub const MAX_FILES: usize = 64;

/// The files `with.files` asks for, rendered over `with`: (path, contents), or why not.
pub fn render(params: &Value, bundle: &GraphBundle) -> Result<Vec<(String, String)>, String> {
    let files = params["files"]
        .as_array()
        .ok_or("`with.files` must be a list of {path, template}")?;
    if files.is_empty() || files.len() > MAX_FILES {
        return Err(format!(
            "`with.files` must name 1 to {MAX_FILES} files, not {}",
            files.len()
        ));
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for f in files {
        let (Some(path), Some(template)) = (f["path"].as_str(), f["template"].as_str()) else {
            return Err(format!("a file needs a `path` and a `template`: {f}"));
        };
        let path = normalize_relative(path)
            .map_err(|e| format!("`{path}` is not a relative path inside the worktree: {e}"))?;
        if out.iter().any(|(p, _)| *p == path) {
            return Err(format!("`{path}` is named twice"));
        }
        let text = bundle
            .file(template)
            .ok_or_else(|| format!("the template `{template}` is not in the graph's bundle"))?;
        let rendered = shared::expr::render(template, text, params)
            .map_err(|e| format!("rendering `{path}` from `{template}`: {e}"))?;
        out.push((path, rendered));
    }
    Ok(out)
}

/// Renders and writes the files beneath `root`.
pub fn render_files(params: &Value, bundle: &GraphBundle, root: &Path) -> StepOutcome {
    let files = match render(params, bundle) {
        Ok(f) => f,
        Err(e) => {
            return StepOutcome {
                status: JobStatus::Failed,
                output: json!({"rendered": []}),
                error: Some(e),
            }
        }
    };
    let mut written = Vec::new();
    for (path, text) in &files {
        if let Err(e) = crate::safe_fs::write_beneath(root, path, text.as_bytes()) {
            return StepOutcome {
                status: JobStatus::Failed,
                output: json!({"rendered": written}),
                error: Some(format!("writing `{path}`: {e}")),
            };
        }
        written.push(json!({
            "path": path,
            "bytes": text.len(),
            "sha256": shared::hashing::sha256_hex(text.as_bytes()),
        }));
    }
    StepOutcome {
        status: JobStatus::Ok,
        output: json!({"rendered": written}),
        error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::graph::load_bundle;

    const IMPL: &str = "class {{ name }}:\n{% for f in signatures %}    def {{ f.name }}(self):\n        raise NotImplementedError({{ ('TODO: implement ' ~ f.name) | tojson }})\n{% endfor %}";

    fn bundle() -> GraphBundle {
        let yaml = "name: g\nstart: r\nnodes:\n  r: {kind: harness, op: render_files, routes: [{to: done}]}\n  done: {kind: exit, status: 'true'}\n";
        let mut b = load_bundle("g.yaml", yaml, |p| Err(format!("unexpected {p}")))
            .unwrap_or_else(|e| panic!("{e:?}"));
        b.files.insert("impl.j2".into(), IMPL.into());
        b
    }

    #[test]
    fn templates_turn_semantic_types_into_files() {
        let params = json!({
            "name": "Stack",
            "signatures": [{"name": "push"}, {"name": "pop\")\nimport os #"}],
            "files": [{"path": "pkg/stack.py", "template": "impl.j2"}],
        });
        let files = render(&params, &bundle()).unwrap();
        assert_eq!(files[0].0, "pkg/stack.py");
        assert!(files[0].1.contains("def push(self):"), "{}", files[0].1);
        // Text the agent gave lands inside a string literal, escaped.
        assert!(
            files[0]
                .1
                .contains(r#"NotImplementedError("TODO: implement pop\")\nimport os #")"#),
            "{}",
            files[0].1
        );
    }

    #[test]
    fn paths_and_templates_are_checked() {
        for (files, why) in [
            (
                json!([{"path": "../x.py", "template": "impl.j2"}]),
                "not a relative path",
            ),
            (
                json!([{"path": "/etc/x", "template": "impl.j2"}]),
                "not a relative path",
            ),
            (
                json!([{"path": "x.py", "template": "nope.j2"}]),
                "not in the graph's bundle",
            ),
            (json!([{"path": "x.py"}]), "needs a `path` and a `template`"),
            (
                json!([{"path": "x.py", "template": "impl.j2"}, {"path": "./x.py", "template": "impl.j2"}]),
                "named twice",
            ),
            (json!([]), "1 to 64"),
            (json!("x.py"), "must be a list"),
        ] {
            let params = json!({"name": "S", "signatures": [], "files": files});
            let e = render(&params, &bundle()).unwrap_err();
            assert!(e.contains(why), "{files}: {e}");
        }
    }
}
