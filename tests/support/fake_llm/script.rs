//! A graph's scripted-agent script played by the fake LLM in the providers' wire formats: each
//! request is matched to its agent node by the node's prompt (the first line of its template,
//! up to the first Jinja tag), then to one of the node's script steps (the next one not yet
//! played whose `when` parameters its prompt names), and answered with one turn of parallel
//! tool calls: the step's files (`write_file`), commands (`run_command`), other tool calls, then
//! `submit` with the step's output. The agent loop runs each call in the container as it would
//! a model's, so the run sees exactly what the scripted agent would have done, but every agent
//! node is answered by the built-in loop over the real API shapes.

use super::{Call, Responder, ScriptedReply};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// What the responder played: `(node, step index)` in order, for the test's assertions.
pub type Played = Arc<Mutex<Vec<(String, usize)>>>;

struct Node {
    name: String,
    marker: String,
    steps: Vec<Value>,
    played: Vec<bool>,
}

/// Builds a responder for the graph in `graph_dir` (its `graph.yaml`) playing `script`; also
/// returns the log of what it played.
pub fn script_responder(
    graph_dir: &Path,
    script: &Value,
    pick: Option<Picker>,
) -> anyhow::Result<(Responder, Played)> {
    let graph: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(graph_dir.join("graph.yaml"))?)?;
    let mut nodes = Vec::new();
    for (name, node) in graph["nodes"].as_mapping().into_iter().flatten() {
        if node["kind"].as_str() != Some("agent") {
            continue;
        }
        let name = name.as_str().unwrap_or_default().to_string();
        let template = node["template"].as_str().unwrap_or_default();
        let text = std::fs::read_to_string(graph_dir.join(template))?;
        let first = text.lines().next().unwrap_or_default();
        let marker = first
            .split("{{")
            .next()
            .and_then(|s| s.split("{%").next())
            .unwrap_or_default()
            .trim()
            .to_string();
        anyhow::ensure!(marker.len() >= 6, "node `{name}`: no plain first line");
        let steps = script[&name].as_array().cloned().unwrap_or_default();
        let played = vec![false; steps.len()];
        nodes.push(Node {
            name,
            marker,
            steps,
            played,
        });
    }
    let state = Arc::new(Mutex::new(nodes));
    let played: Played = Arc::default();
    let log = played.clone();
    let responder: Responder = Box::new(move |body| {
        let texts = user_texts(body);
        let mut nodes = state.lock().unwrap_or_else(|p| p.into_inner());
        // The newest prompt: a continued session carries its earlier prompts too.
        let prompt = texts
            .iter()
            .rev()
            .find(|t| nodes.iter().any(|n| t.contains(&n.marker)))?;
        let (node, step) = choose(&mut nodes, prompt, pick.as_ref())?;
        let name = node.name.clone();
        let reply = reply_of(&node.steps[step]);
        log.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name, step));
        Some(reply)
    });
    Ok((responder, played))
}

/// Picks `(node, step)` for a prompt among the nodes whose template it carries, where the
/// default rule cannot (e.g. two nodes of one template, parameters the prompt does not name).
pub type Picker = Box<dyn Fn(&str, &[&str]) -> Option<(String, usize)> + Send + Sync>;

/// The node whose marker the newest prompt carries (the longest, when several do) and the step to
/// play: `pick`'s choice if it makes one, else the node's steps not yet played whose `when` values
/// the prompt names, the one named earliest first, else the one named earliest of all.
fn choose<'a>(
    nodes: &'a mut [Node],
    prompt: &str,
    pick: Option<&Picker>,
) -> Option<(&'a Node, usize)> {
    let mut found: Vec<usize> = (0..nodes.len())
        .filter(|&i| prompt.contains(&nodes[i].marker))
        .collect();
    let longest = found.iter().map(|&i| nodes[i].marker.len()).max()?;
    found.retain(|&i| nodes[i].marker.len() == longest);
    let names: Vec<&str> = found.iter().map(|&i| nodes[i].name.as_str()).collect();
    let picked = pick
        .and_then(|pick| pick(prompt, &names))
        .and_then(|(name, j)| Some((found.iter().copied().find(|&i| nodes[i].name == name)?, j)));
    let (i, j) = match picked {
        Some(picked) => picked,
        None => {
            let i = *found.first()?;
            let node = &nodes[i];
            let from = prompt.find(&node.marker).unwrap_or(0);
            let score = |j: usize| when_position(&node.steps[j], &prompt[from..]);
            let best = |fresh: bool| {
                (0..node.steps.len())
                    .filter(|&j| !fresh || !node.played[j])
                    .filter_map(|j| score(j).map(|s| (s, j)))
                    .min()
                    .map(|(_, j)| j)
            };
            (i, best(true).or_else(|| best(false))?)
        }
    };
    *nodes[i].played.get_mut(j)? = true;
    Some((&nodes[i], j))
}

/// Where the prompt names the last of the step's `when` values (each as a whole word, its
/// first occurrence); `None` when it does not name them all, 0 for a step without `when`.
fn when_position(step: &Value, prompt: &str) -> Option<usize> {
    let mut last = 0;
    for v in step["when"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
    {
        let want = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let at = prompt.match_indices(&want).map(|(at, _)| at).find(|&at| {
            let before = prompt[..at].chars().next_back();
            let after = prompt[at + want.len()..].chars().next();
            !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
        })?;
        last = last.max(at);
    }
    Some(last)
}

/// The step as one turn of parallel tool calls, `submit` last.
fn reply_of(step: &Value) -> ScriptedReply {
    let mut calls = Vec::new();
    for (path, content) in step["files"].as_object().into_iter().flatten() {
        calls.push(Call {
            name: "write_file".into(),
            input: json!({"path": path, "content": content}),
        });
    }
    for command in step["commands"].as_array().into_iter().flatten() {
        calls.push(Call {
            name: "run_command".into(),
            input: json!({"command": command}),
        });
    }
    for call in step["tool_calls"].as_array().into_iter().flatten() {
        calls.push(Call {
            name: call["name"].as_str().unwrap_or_default().into(),
            input: call["input"].clone(),
        });
    }
    calls.push(Call {
        name: "submit".into(),
        input: step["output"].clone(),
    });
    ScriptedReply::calls(calls).with_usage(400, 120)
}

/// The text of each user turn of a request (Anthropic strings and text blocks; OpenAI user
/// messages), in order.
fn user_texts(body: &Value) -> Vec<String> {
    let mut texts = Vec::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        if m["role"] != "user" {
            continue;
        }
        let mut text = String::new();
        match &m["content"] {
            Value::String(s) => text.push_str(s),
            Value::Array(blocks) => {
                for b in blocks.iter().filter(|b| b["type"] == "text") {
                    text.push_str(b["text"].as_str().unwrap_or_default());
                }
            }
            _ => {}
        }
        texts.push(text);
    }
    texts
}

/// The names of a script's nodes, for checking that each was played.
pub fn script_nodes(script: &Value) -> BTreeMap<String, usize> {
    script
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_array().map_or(0, Vec::len)))
        .collect()
}
