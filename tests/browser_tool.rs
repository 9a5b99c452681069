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
    tools: [read_file, run_command, browser]
    image: fleet-agent-web:1
    worktree: {from: base, mode: ro}
    timeout_seconds: 300
    # The seed's strategy for timing failures, shortened: two attempts, one second apart.
    tool_policy: {profile: python_app, retry: {max_attempts: 2, backoff_seconds: [1]}}
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
        "claude-haiku-4-5",
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
    // It is a timing failure (the seed's class for an element that did not appear), nothing was
    // typed or clicked, so the call ran again under the node's strategy: two attempts.
    let waited = answer(6);
    assert_eq!(waited["is_error"], true, "{waited}");
    let text = content(&waited);
    assert!(
        text.contains("did not appear") && text.contains("[timing error, failed after 2 attempts]"),
        "{text}"
    );
    let json_at = text
        .find("\n{")
        .expect("the browser's answer follows the error");
    let result: Value = serde_json::from_str(&text[json_at + 1..])?;
    assert_eq!(result["ok"], false, "{result}");
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

    // The transcript and the verification log name it; the log holds the three calls that ran
    // (the last one twice).
    let transcript = stack
        .node_artifact_text(&run, "verify", 1, "transcript.json")
        .await?;
    assert!(transcript.contains("screenshots/1-after-add.png"));
    let log = stack
        .node_artifact_json(&run, "verify", 1, "verification_log.json")
        .await?;
    assert_eq!(log["calls"], 3, "{log}");
    assert_eq!(log["screenshots"], 1, "{log}");
    assert_eq!(
        log["log"][0]["result"]["actions"][6]["artifact"],
        "screenshots/1-after-add.png"
    );
    assert_eq!(log["log"][0]["input"]["url"], url);
    Ok(())
}

/// A page server that is not ready at first: it accepts and resets (RST) every connection of
/// its first `N` bursts (a burst: connections less than half a second apart, as the browser
/// may open or retry more than one for one page load), logging each, then serves the
/// directory over HTTP on the same socket.
const LATE_SERVER: &str = r#"import functools, http.server, socket, struct, sys, time
port, resets = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(16)
print("listening", flush=True)
bursts, last = 0, 0.0
while True:
    c, addr = s.accept()
    now = time.monotonic()
    if now - last > 0.5:
        bursts += 1
    if bursts > resets:
        break
    last = now
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    print("reset burst", bursts, flush=True)
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="site")
server = http.server.HTTPServer(("127.0.0.1", port), handler, bind_and_activate=False)
server.socket = s
server.process_request(c, addr)
server.serve_forever()
"#;

const LATE_PORT: u16 = 8323;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_not_up_yet_is_retried_per_its_class_and_a_bad_selector_is_not() -> anyhow::Result<()>
{
    let url = format!("http://127.0.0.1:{LATE_PORT}/index.html");
    let serve = format!(
        "nohup python3 late.py {LATE_PORT} 2 >/tmp/late.log 2>&1 &\n\
         for i in $(seq 100); do grep -q listening /tmp/late.log && echo up && exit 0; \
         sleep 0.1; done; cat /tmp/late.log; exit 1"
    );
    let llm = FakeLlm::start(vec![
        ScriptedReply::tool_use("run_command", json!({"command": serve})),
        // Reset twice (transient): run again after 1 s, then 3 s; the third load succeeds.
        ScriptedReply::tool_use(
            "browser",
            json!({"url": url, "actions": [{"text": "h1"}, {"screenshot": "up"}]}),
        ),
        // A selector the page cannot parse: the seed's selector class, a hint, never run again.
        ScriptedReply::tool_use("browser", json!({"url": url, "actions": [{"click": "#"}]})),
        // A path out of the worktree: a permission error, fatal, nothing runs.
        ScriptedReply::tool_use("read_file", json!({"path": "../../etc/shadow"})),
        ScriptedReply::tool_use("run_command", json!({"command": "cat /tmp/late.log"})),
        ScriptedReply::tool_use("submit", json!({"verdict": "confirmed"})),
    ])
    .await?;
    let stack = Stack::start(
        "browser-retry",
        1,
        &[
            ("FLEET_ANTHROPIC_BASE_URL", llm.base_url.as_str()),
            ("ANTHROPIC_API_KEY", "k"),
        ],
    )
    .await?;
    let repo = git_repo(
        stack.dir.path(),
        "late",
        &[("site/index.html", PAGE), ("late.py", LATE_SERVER)],
    )?;
    let dir = stack.dir.path().join("web-retry");
    std::fs::create_dir_all(&dir)?;
    // The seed's own strategies (no override): transient 1 s, 3 s.
    let graph = GRAPH.replace(
        "{profile: python_app, retry: {max_attempts: 2, backoff_seconds: [1]}}",
        "{profile: python_app}",
    );
    std::fs::write(dir.join("graph.yaml"), &graph)?;
    std::fs::write(dir.join("prompt.md"), "Check the page.\n")?;
    std::fs::write(dir.join("schema.json"), SCHEMA)?;
    std::fs::write(dir.join("input.json"), "{}")?;
    let path = |name: &str| dir.join(name).display().to_string();
    let submit = |graph: &str| {
        stack.cli(&[
            "submit",
            "--graph",
            graph,
            "--repo",
            &repo.display().to_string(),
            "--input",
            &path("input.json"),
            "--llm-api",
            "anthropic",
            "--llm-model",
            "claude-haiku-4-5",
        ])
    };
    let out = submit(&path("graph.yaml"))?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let run = out.stdout.trim().to_string();
    let status = stack.wait_run(&run, Duration::from_secs(240)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 6, "five tool calls, then the submit");
    let answer = |turn: usize| tool_results(&reqs[turn].body)[0].clone();

    let loaded = answer(2);
    assert_ne!(loaded["is_error"], true, "{loaded}");
    let result: Value = serde_json::from_str(&content(&loaded))?;
    assert_eq!(result["actions"][0]["text"], "To-do", "{result}");
    let selector = content(&answer(3));
    assert!(
        selector.contains("[selector error, needs a change]") && selector.contains("#new-todo"),
        "the seed's selector hint: {selector}"
    );
    assert!(content(&answer(4)).contains("[permission error, fatal]"));
    // The server's own log: the first two page loads were reset, the third served.
    let log = content(&answer(5));
    assert!(
        log.contains("reset burst 2") && !log.contains("reset burst 3"),
        "{log}"
    );
    assert!(log.contains("GET /index.html"), "{log}");

    // The run's event log tells the same story, from the worker's executor.
    let retries = stack.events(&run, "tool_retry")?;
    let waits: Vec<&Value> = retries.iter().map(|e| &e["data"]["wait_seconds"]).collect();
    assert_eq!(waits, [&json!(1), &json!(3)], "{retries:?}");
    assert!(retries.iter().all(|e| e["data"]["tool"] == "browser"));
    let errors = stack.events(&run, "tool_error")?;
    let classes: Vec<(String, String)> = errors
        .iter()
        .filter(|e| e["data"]["preflight"] != true)
        .map(|e| {
            (
                e["data"]["tool"].as_str().unwrap_or_default().to_string(),
                e["data"]["error_type"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    let pairs: Vec<(&str, &str)> = classes
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("browser", "transient"),
            ("browser", "transient"),
            ("browser", "selector"),
            ("read_file", "permission"),
        ],
        "{errors:?}"
    );
    // The profile's pre-flight: pytest (optional for python_app) is not in the web image.
    assert!(
        errors.iter().any(|e| e["data"]["preflight"] == true
            && e["data"]["tool"] == "pytest"
            && e["data"]["required"] == false),
        "{errors:?}"
    );
    let uses = stack.events(&run, "tool_use")?;
    let outcomes: Vec<(Value, Value)> = uses
        .iter()
        .filter(|e| e["data"]["tool"] == "browser")
        .map(|e| (e["data"]["attempts"].clone(), e["data"]["outcome"].clone()))
        .collect();
    assert_eq!(
        outcomes,
        [
            (json!(3), json!("success")),
            (json!(1), json!("needs_hint"))
        ],
        "{uses:?}"
    );

    // A profile whose required tools the image lacks stops the step before the agent starts.
    let node_graph = graph.replace("{profile: python_app}", "{profile: cli_tool}");
    std::fs::write(
        dir.join("graph-node.yaml"),
        node_graph.replace("run_command, browser", "run_command"),
    )?;
    let out = submit(&path("graph-node.yaml"))?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let failed = out.stdout.trim().to_string();
    let status = stack.wait_run(&failed, Duration::from_secs(120)).await?;
    assert_eq!(status["status"], "failed", "{status}");
    let errors = stack.events(&failed, "tool_error")?;
    let missing: Vec<&Value> = errors
        .iter()
        .filter(|e| e["data"]["required"] == true)
        .map(|e| &e["data"]["tool"])
        .collect();
    assert_eq!(missing, [&json!("node"), &json!("npm")], "{errors:?}");
    assert_eq!(
        llm.requests().len(),
        6,
        "no LLM call for a step that could not start"
    );
    Ok(())
}
