//! The `browser` tool on the real stack: an agent node in `fleet-agent-web:1` (headless
//! Chromium and `fleet-browser`), driven by the fake LLM server over the Anthropic wire format,
//! starts the repository's to-do page with `run_command` (Python's `http.server` in the
//! background, inside the job's container, which has no network but its loopback), then checks
//! it in the browser: types an item, clicks Add, reads the list the page's script built and
//! takes a screenshot. Pages off the loopback are refused before anything runs; a wait that
//! never ends ends at its timeout. The screenshot is an artifact of the job (a PNG, fetched
//! through the API), named in the transcript and the verification log.

use fleet_tests::fake_llm::{FakeLlm, ScriptedReply};
use fleet_tests::stack::Stack;
use fleet_tests::submit::git_repo;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const PORT: u16 = 8321;

const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>To-do</title></head>
<body>
<h1>To-do</h1>
<input id="new" placeholder="what needs doing"> <button id="add">Add</button>
<ul id="items"></ul>
<p id="count">0 items</p>
<script>
document.getElementById('add').addEventListener('click', function () {
  var input = document.getElementById('new');
  if (!input.value) return;
  var li = document.createElement('li');
  li.textContent = input.value;
  document.getElementById('items').appendChild(li);
  input.value = '';
  var n = document.querySelectorAll('#items li').length;
  document.getElementById('count').textContent = n + (n === 1 ? ' item' : ' items');
  console.log('added ' + li.textContent);
});
</script>
</body></html>
"#;

const GRAPH: &str = r#"
name: web-verify
start: verify
nodes:
  verify:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    tools: [run_command, browser]
    image: fleet-agent-web:1
    worktree: {from: base, mode: ro}
    timeout_seconds: 300
    routes: [{to: done}]
  done: {kind: exit, status: verify.ok}
"#;

const SCHEMA: &str = r#"{"type": "object", "required": ["verdict"],
  "properties": {"verdict": {"enum": ["confirmed", "failed"]}}}"#;

/// The tool results of the last user turn of an Anthropic request body.
fn tool_results(body: &Value) -> Vec<Value> {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_array())
        .map(|c| {
            c.iter()
                .filter(|b| b["type"] == "tool_result")
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

fn content(result: &Value) -> String {
    match &result["content"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_checks_a_page_in_the_browser_and_keeps_a_screenshot() -> anyhow::Result<()> {
    let url = format!("http://127.0.0.1:{PORT}/site/index.html");
    let serve = format!(
        "nohup python3 -m http.server {PORT} --bind 127.0.0.1 >/tmp/http.log 2>&1 &\n\
         for i in $(seq 100); do python3 -c 'import urllib.request,sys; \
         urllib.request.urlopen(sys.argv[1])' {url} 2>/dev/null && echo up && exit 0; \
         sleep 0.1; done; cat /tmp/http.log; exit 1"
    );
    let llm = FakeLlm::start(vec![
        ScriptedReply::tool_use("run_command", json!({"command": serve})),
        ScriptedReply::tool_use("browser", json!({"url": "file:///etc/passwd"})),
        ScriptedReply::tool_use("browser", json!({"url": "http://10.0.0.1/", "actions": []})),
        ScriptedReply::tool_use(
            "browser",
            json!({"url": url, "actions": [{"screenshot": "../../escape"}]}),
        ),
        ScriptedReply::tool_use(
            "browser",
            json!({"url": url, "timeout_seconds": 30, "actions": [
                {"text": "#count"},
                {"type": {"selector": "#new", "text": "buy milk"}},
                {"click": "#add"},
                {"wait_for": "#items li"},
                {"text": "#items"},
                {"text": "#count"},
                {"screenshot": "after-add"}
            ]}),
        ),
        ScriptedReply::tool_use(
            "browser",
            json!({"url": url, "timeout_seconds": 3, "actions": [
                {"wait_for": "#never-there"}, {"screenshot": "never"}
            ]}),
        ),
        ScriptedReply::tool_use("submit", json!({"verdict": "confirmed"})),
    ])
    .await?;
    let stack = Stack::start(
        "browser",
        1,
        &[
            ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
            ("ANTHROPIC_API_KEY", "k"),
        ],
    )
    .await?;
    let repo = git_repo(
        stack.dir.path(),
        "todo",
        &[("site/index.html", PAGE), ("README.md", "a to-do page\n")],
    )?;
    let dir = stack.dir.path().join("web-verify");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("graph.yaml"), GRAPH)?;
    std::fs::write(dir.join("prompt.md"), "Check that adding an item works.\n")?;
    std::fs::write(dir.join("schema.json"), SCHEMA)?;
    std::fs::write(dir.join("input.json"), "{}")?;
    let path = |name: &str| dir.join(name).display().to_string();
    let out = stack.cli(&[
        "submit",
        "--graph",
        &path("graph.yaml"),
        "--repo",
        &repo.display().to_string(),
        "--input",
        &path("input.json"),
        "--llm-api",
        "anthropic",
        "--llm-model",
        "fake",
    ])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let run = out.stdout.trim().to_string();
    let status = stack.wait_run(&run, Duration::from_secs(240)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 7, "six tool calls, then the submit");
    let answer = |turn: usize| {
        let results = tool_results(&reqs[turn].body);
        assert_eq!(results.len(), 1, "{}", reqs[turn].body);
        results[0].clone()
    };
    let served = answer(1);
    assert!(content(&served).contains("up"), "{served}");

    // Pages off the loopback and bad names are refused with the reason, before anything runs
    // (the verification log counts only the calls that ran).
    let file = answer(2);
    assert_eq!(file["is_error"], true, "{file}");
    assert!(
        content(&file).contains("url `file:///etc/passwd` refused: only http and https"),
        "{file}"
    );
    let far = answer(3);
    assert_eq!(far["is_error"], true, "{far}");
    assert!(
        content(&far).contains("only 127.0.0.1 and localhost"),
        "{far}"
    );
    let escape = answer(4);
    assert_eq!(escape["is_error"], true, "{escape}");
    assert!(content(&escape).contains("letters, digits"), "{escape}");

    // The page's script ran on the click: the list and the count changed.
    let checked = answer(5);
    assert_ne!(checked["is_error"], true, "{checked}");
    let result: Value = serde_json::from_str(&content(&checked))?;
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["title"], "To-do");
    assert_eq!(result["url"], url);
    let actions = result["actions"].as_array().expect("actions");
    assert_eq!(actions.len(), 7, "{result}");
    assert!(actions.iter().all(|a| a["ok"] == true), "{result}");
    assert_eq!(actions[0]["text"], "0 items");
    assert_eq!(actions[4]["text"], "buy milk");
    assert_eq!(actions[5]["text"], "1 item");
    assert_eq!(result["console"], json!(["log: added buy milk"]));
    let shot = &actions[6];
    assert_eq!(shot["artifact"], "screenshots/1-after-add.png", "{shot}");
    assert!(
        shot.get("path").is_none(),
        "no container path for the agent: {shot}"
    );

    // A wait that never ends ends at the call's timeout, with the reason; the rest is skipped.
    let waited = answer(6);
    let result: Value = serde_json::from_str(&content(&waited))?;
    assert_eq!(result["ok"], false, "{result}");
    assert!(
        result["error"]
            .as_str()
            .is_some_and(|e| e.contains("wait_for") && e.contains("before the timeout")),
        "{result}"
    );
    assert_eq!(result["actions"][1]["error"], "skipped");
    assert!(
        result["seconds"].as_f64().is_some_and(|s| s < 10.0),
        "{result}"
    );

    // The screenshot is the job's artifact: a PNG of the 1280 × 800 viewport.
    let key = stack
        .artifact_key(&run, "verify", 1, "screenshots/1-after-add.png")
        .await?;
    let started = Instant::now();
    let png = stack.get_bytes(&format!("/v1/artifacts/{key}")).await?;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a png");
    assert_eq!(&png[12..16], b"IHDR");
    let width = u32::from_be_bytes(png[16..20].try_into()?);
    let height = u32::from_be_bytes(png[20..24].try_into()?);
    assert_eq!((width, height), (1280, 800));
    assert!(png.len() > 2_000, "a page with text, not an empty frame");
    let keep = fleet_tests::browser::output_dir().join("screenshots");
    std::fs::create_dir_all(&keep)?;
    std::fs::write(keep.join("browser-tool-after-add.png"), &png)?;

    // The transcript and the verification log name it; the log holds the two calls that ran.
    let transcript = stack
        .node_artifact_text(&run, "verify", 1, "transcript.json")
        .await?;
    assert!(transcript.contains("screenshots/1-after-add.png"));
    let log = stack
        .node_artifact_json(&run, "verify", 1, "verification_log.json")
        .await?;
    assert_eq!(log["calls"], 2, "{log}");
    assert_eq!(log["screenshots"], 1, "{log}");
    assert_eq!(
        log["log"][0]["result"]["actions"][6]["artifact"],
        "screenshots/1-after-add.png"
    );
    assert_eq!(log["log"][0]["input"]["url"], url);
    Ok(())
}
