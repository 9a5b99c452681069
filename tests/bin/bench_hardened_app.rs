//! The product of `fleet-bench hardened` (`bench_hardened.rs`): a to-do page of ten features,
//! served by Python's standard library, and the agents' conversations with the fake LLM server.
//!
//! - the initializer writes feature_list.json (ten features, all `passes: false`), init.sh,
//!   the server and a skeleton page, then submits;
//! - coding session `s` reads the list, writes the page with every feature up to its share,
//!   flips `passes` of its share in feature_list.json on disk and submits;
//! - the verifier of feature `n` starts the app from its own checkout (`sh init.sh`), fetches
//!   the page and exits non-zero unless the markup of feature `n` is in it, then submits a
//!   pass. The verdict is scripted; the bench checks afterwards that every verifier's command
//!   really exited 0 in its container.
//!
//! Conversations are keyed by text of the first user message: "INITIALIZER AGENT", "CODING
//! AGENT (session s)", and for each verifier the description of its feature (the verifier's
//! prompt holds the feature as JSON; the ten descriptions are distinct and none is in another
//! prompt).

use fleet_tests::fake_llm::{Conversation, ScriptedReply};
use serde_json::{json, Value};

pub const URL: &str = "http://127.0.0.1:8765/";

/// One feature: category, description, steps, and the
/// page's parts for it (body, style, script).
pub struct Feature {
    pub category: &'static str,
    pub description: &'static str,
    pub steps: [&'static str; 3],
    html: &'static str,
    css: &'static str,
    js: &'static str,
}

pub const FEATURES: [Feature; 10] = [
    Feature {
        category: "functional",
        description: "The page shows the heading To-do",
        steps: ["Verify the page title is To-do", "Verify an h1 element reads exactly To-do",
                "Verify no other h1 element is on the page"],
        html: "<h1>To-do</h1>",
        css: "",
        js: "",
    },
    Feature {
        category: "functional",
        description: "Adding an item shows it in the list",
        steps: ["Type milk into the field with id item", "Click the button Add",
                "Verify the list with id items has one entry milk and the field is empty"],
        html: "<input id=\"item\" value=\"\"><button id=\"add\">Add</button>\n<ul id=\"items\"></ul>",
        css: "",
        js: "function render() {
  var ul = document.getElementById(\"items\");
  ul.innerHTML = \"\";
  todos.forEach(function (t, i) {
    var li = document.createElement(\"li\");
    li.textContent = t.text;
    hooks.forEach(function (h) { h(li, t, i); });
    ul.appendChild(li);
  });
  after.forEach(function (f) { f(); });
}
document.getElementById(\"add\").onclick = function () {
  var field = document.getElementById(\"item\");
  if (!check(field.value)) { return; }
  todos.push({text: field.value, done: false});
  field.value = \"\";
  render();
};",
    },
    Feature {
        category: "edge-case",
        description: "An empty item is refused with an error message",
        steps: ["Leave the field with id item empty", "Click the button Add",
                "Verify the element with id error reads Item is empty and the list is empty"],
        html: "<p id=\"error\"></p>",
        css: "#error { color: #b00; }",
        js: "check = function (v) {
  document.getElementById(\"error\").textContent = v ? \"\" : \"Item is empty\";
  return !!v;
};",
    },
    Feature {
        category: "functional",
        description: "The footer counts the items",
        steps: ["Add the items a and b", "Verify the element with id count reads 2 items",
                "Add the item c and verify it reads 3 items"],
        html: "<p id=\"count\">0 items</p>",
        css: "",
        js: "after.push(function () {
  document.getElementById(\"count\").textContent = todos.length + \" items\";
});",
    },
    Feature {
        category: "functional",
        description: "Each entry has a Delete button that removes it",
        steps: ["Add the items a and b", "Click the Delete button of the entry a",
                "Verify the list has one entry b"],
        html: "",
        css: ".delete { margin-left: 1em; }",
        js: "hooks.push(function (li, t, i) {
  var b = document.createElement(\"button\");
  b.className = \"delete\";
  b.textContent = \"Delete\";
  b.onclick = function () { todos.splice(i, 1); render(); };
  li.appendChild(b);
});",
    },
    Feature {
        category: "functional",
        description: "A checkbox marks an entry done",
        steps: ["Add the item milk", "Click the checkbox of the entry milk",
                "Verify the checkbox is checked"],
        html: "",
        css: "",
        js: "hooks.push(function (li, t) {
  var c = document.createElement(\"input\");
  c.type = \"checkbox\";
  c.checked = t.done;
  c.onchange = function () { t.done = c.checked; render(); };
  li.prepend(c);
});",
    },
    Feature {
        category: "functional",
        description: "Clear completed removes the done entries",
        steps: ["Add the items a and b and check a",
                "Click the button with id clear-completed", "Verify the list has one entry b"],
        html: "<button id=\"clear-completed\">Clear completed</button>",
        css: "",
        js: "document.getElementById(\"clear-completed\").onclick = function () {
  todos = todos.filter(function (t) { return !t.done; });
  render();
};",
    },
    Feature {
        category: "functional",
        description: "Filters show all, active or done entries",
        steps: ["Add the items a and b and check a", "Click the button with id filter-active",
                "Verify only b is visible"],
        html: "<nav><button id=\"filter-all\">All</button><button id=\"filter-active\">Active</button><button id=\"filter-done\">Done</button></nav>",
        css: "",
        js: "var filter = \"all\";
[\"all\", \"active\", \"done\"].forEach(function (f) {
  document.getElementById(\"filter-\" + f).onclick = function () { filter = f; render(); };
});
hooks.push(function (li, t) {
  li.hidden = filter === \"active\" ? t.done : filter === \"done\" ? !t.done : false;
});",
    },
    Feature {
        category: "functional",
        description: "Entries survive a reload of the page",
        steps: ["Add the item milk", "Reload the page",
                "Verify the list with id items still has the entry milk"],
        html: "",
        css: "",
        js: "after.push(function () { localStorage.setItem(\"todos\", JSON.stringify(todos)); });
todos = JSON.parse(localStorage.getItem(\"todos\") || \"[]\");
render();",
    },
    Feature {
        category: "style",
        description: "Done entries are struck through",
        steps: ["Add the item milk", "Check the entry milk",
                "Verify the entry milk is shown with a line through it"],
        html: "",
        css: "li.done { text-decoration: line-through; }",
        js: "hooks.push(function (li, t) { li.classList.toggle(\"done\", t.done); });",
    },
];

pub const SPEC: &str = "A to-do page for one person, served by Python's standard library on \
127.0.0.1:8765: a heading, a field and an Add button for new entries, an error for an empty \
entry, a count of entries, deleting and checking off entries, clearing the checked ones, three \
filters, entries kept in the browser's local storage across reloads, and checked entries drawn \
struck through.";

const SERVER: &str = r#""""Serves the to-do page on 127.0.0.1:8765 (python3 app/server.py)."""
import functools
import http.server
import pathlib

ROOT = str(pathlib.Path(__file__).parent)
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=ROOT)
http.server.ThreadingHTTPServer(("127.0.0.1", 8765), handler).serve_forever()
"#;

const INIT: &str = r#"#!/bin/sh
# Starts the to-do page in the background and prints its URL.
python3 app/server.py >/tmp/todo.log 2>&1 &
for _ in $(seq 50); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/')" 2>/dev/null && break
  sleep 0.1
done
echo http://127.0.0.1:8765/
"#;

/// The page with the features of `ids` (1-based).
pub fn page(ids: &[usize]) -> String {
    let on = |i: &usize| ids.contains(&(i + 1));
    let pick = |part: fn(&Feature) -> &'static str| -> Vec<&'static str> {
        FEATURES
            .iter()
            .enumerate()
            .filter(|(i, _)| on(i))
            .map(|(_, f)| part(f))
            .filter(|s| !s.is_empty())
            .collect()
    };
    let body = if ids.is_empty() {
        vec!["<p>Work in progress.</p>"]
    } else {
        pick(|f| f.html)
    };
    format!(
        "<!doctype html>\n<html>\n<head><meta charset=\"utf-8\"><title>To-do</title>\n<style>\n{}\n</style></head>\n<body>\n{}\n<script>\nvar todos = [], hooks = [], after = [];\nvar check = function () {{ return true; }};\n{}\n</script>\n</body>\n</html>\n",
        pick(|f| f.css).join("\n"),
        body.join("\n"),
        pick(|f| f.js).join("\n")
    )
}

/// feature_list.json with the features of `passing` marked passing.
pub fn feature_list(passing: &[usize]) -> String {
    let list: Vec<Value> = FEATURES
        .iter()
        .enumerate()
        .map(|(i, f)| {
            json!({"id": i + 1, "category": f.category, "description": f.description,
                   "steps": steps_of(f), "passes": passing.contains(&(i + 1))})
        })
        .collect();
    serde_json::to_string_pretty(&list).expect("a list of features") + "\n"
}

/// A feature's steps as the list on disk has them.
fn steps_of(f: &Feature) -> Vec<String> {
    let mut steps = vec![format!("Step 1: Navigate to {URL}")];
    steps.extend(
        f.steps
            .iter()
            .enumerate()
            .map(|(k, s)| format!("Step {}: {s}", k + 2)),
    );
    steps
}

/// The features each of `sessions` coding sessions claims: consecutive shares of the ten.
pub fn shares(sessions: usize) -> Vec<Vec<usize>> {
    let n = FEATURES.len();
    let per = n.div_ceil(sessions.clamp(1, n));
    (1..=n)
        .collect::<Vec<_>>()
        .chunks(per)
        .map(<[usize]>::to_vec)
        .collect()
}

/// The run's input: the spec, where the app answers, the quality gates, the verifier's image.
pub fn input(verifier_image: &str) -> Value {
    json!({
        "spec": SPEC,
        "app_url": URL,
        "gates": [
            {"name": "syntax", "blocking": true,
             "command": "python3 -B -c \"import ast; ast.parse(open('app/server.py').read(), 'app/server.py')\""},
            {"name": "list", "blocking": true,
             "command": "python3 -c \"import json; assert len(json.load(open('feature_list.json'))) == 10\""}
        ],
        "verifier_image": verifier_image,
    })
}

fn write(path: &str, content: String) -> ScriptedReply {
    ScriptedReply::tool_use("write_file", json!({"path": path, "content": content}))
}

fn command(command: String) -> ScriptedReply {
    ScriptedReply::tool_use("run_command", json!({"command": command}))
}

/// Every agent's conversation, for `sessions` coding sessions.
pub fn conversations(sessions: usize) -> Vec<Conversation> {
    for (i, f) in FEATURES.iter().enumerate() {
        assert!(!SPEC.contains(f.description), "the spec names no feature");
        for (k, g) in FEATURES.iter().enumerate() {
            assert!(
                i == k || !g.description.contains(f.description),
                "distinct keys"
            );
        }
    }
    let mut convs = vec![Conversation::new(
        "INITIALIZER AGENT",
        vec![
            write("feature_list.json", feature_list(&[])),
            write("init.sh", INIT.to_string()),
            write("app/server.py", SERVER.to_string()),
            write("app/index.html", page(&[])),
            ScriptedReply::tool_use(
                "submit",
                json!({"summary": "ten features, init.sh, the server and a skeleton page"}),
            ),
        ],
    )];
    let mut done: Vec<usize> = Vec::new();
    for (s, share) in shares(sessions).into_iter().enumerate() {
        done.extend(&share);
        convs.push(Conversation::new(
            format!("CODING AGENT (session {})", s + 1),
            vec![
                command("cat feature_list.json".into()),
                write("app/index.html", page(&done)),
                write("feature_list.json", feature_list(&done)),
                ScriptedReply::tool_use(
                    "submit",
                    json!({"summary": format!("features {share:?} built"), "claimed": share}),
                ),
            ],
        ));
    }
    for f in FEATURES.iter() {
        // The seed's verifier: the page the harness started, in the browser, a screenshot
        // after each of the feature's steps, each step answered as written.
        let steps = steps_of(f);
        let observation = "the page the app serves shows the feature".to_string();
        let mut actions = vec![json!({"text": "body"})];
        actions.extend((1..=steps.len()).map(|k| json!({"screenshot": format!("step_{k}")})));
        let answered: Vec<Value> = steps
            .iter()
            .enumerate()
            .map(|(k, text)| {
                json!({"step_number": k + 1, "step_text": text, "result": "pass",
                       "screenshot": format!("step_{}", k + 1), "observation": observation,
                       "reasoning": "the step as written, seen in the browser"})
            })
            .collect();
        convs.push(Conversation::new(
            f.description,
            vec![
                ScriptedReply::tool_use("browser", json!({"url": URL, "actions": actions})),
                ScriptedReply::tool_use(
                    "submit",
                    json!({"test_passes": true, "steps": answered,
                           "overall_reasoning": observation, "failure_reason": null}),
                ),
            ],
        ));
    }
    convs
}
