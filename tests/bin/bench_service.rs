//! The team service under load, on the real stack with tokens (every request passes the guard:
//! the token looked up by its hash in Redis, the run's team checked):
//!
//! 1. status reads with `--runs` runs stored (each waits at an approval, so all stay in the
//!    run store): `GET /v1/runs/:id` and `GET /v1/runs/:id/graph` one client at a time (p50,
//!    p99), `GET /v1/runs` (the whole list), and `--clients` clients at once (reads per second);
//! 2. the dashboard's live updates for a `--fan`-branch fan-out: the run waits at a gate while a
//!    stream reader and headless Chromium on the dashboard open it, then is approved; events
//!    delivered per second and the longest gap between two, and in the browser the events drawn
//!    and the longest main-thread stall.
//!
//! Usage: fleet-bench service [--runs N] [--reads N] [--clients C] [--fan N]

use fleet_tests::stack::{make_calc_repo, Stack, StackConfig};
use futures::StreamExt;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

pub struct Options {
    pub runs: usize,
    pub reads: usize,
    pub clients: usize,
    pub fan: usize,
}

const GATED: &str = r#"
name: stored
start: gate
nodes:
  gate: {kind: approval, routes: [{to: done}]}
  done: {kind: exit, status: gate.ok}
"#;

const FAN: &str = r#"
name: live-fanout
start: gate
nodes:
  gate: {kind: approval, routes: [{to: spread}]}
  spread: {kind: fanout, over: input.items, body: noop, join: gather}
  noop: {kind: harness, op: noop, timeout_seconds: 60, routes: [{to: gather}]}
  gather: {kind: join, routes: [{to: done}]}
  done: {kind: exit, status: "gather.output.count == (input.items | length)"}
"#;

fn bundle(yaml: &str) -> anyhow::Result<shared::graph::GraphBundle> {
    shared::graph::load_bundle("graph.yaml", yaml, |p| Err(format!("no file {p}")))
        .map_err(|e| anyhow::anyhow!("{e:?}"))
}

/// p50, p99 and max of `xs` (seconds) in milliseconds.
fn percentiles(xs: &mut [f64]) -> Value {
    xs.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let at = |q: f64| xs[((xs.len() as f64 - 1.0) * q).round() as usize] * 1e3;
    json!({"n": xs.len(), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0)})
}

struct Api {
    http: reqwest::Client,
    server: String,
    token: String,
}

impl Api {
    async fn get(&self, path: &str) -> anyhow::Result<(f64, Value)> {
        let t = Instant::now();
        let resp = self
            .http
            .get(format!("{}{path}", self.server))
            .bearer_auth(&self.token)
            .send()
            .await?;
        anyhow::ensure!(resp.status().is_success(), "{path}: {}", resp.status());
        let body: Value = resp.json().await?;
        Ok((t.elapsed().as_secs_f64(), body))
    }

    async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let resp = self
            .http
            .post(format!("{}{path}", self.server))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await?;
        let status = resp.status();
        let body: Value = resp.json().await?;
        anyhow::ensure!(status.is_success(), "{path}: {status} {body}");
        Ok(body)
    }
}

pub async fn run(o: Options) -> anyhow::Result<()> {
    let stack = Stack::start_config(StackConfig {
        tag: "svc",
        workers: 2,
        concurrency: 16,
        coordinator_env: &[("FLEET_OPEN_API", "0")],
        ..StackConfig::default()
    })
    .await?;
    let out = stack.cli(&["token", "bootstrap", "--team", "bench"])?;
    anyhow::ensure!(out.code == 0, "{}", out.stderr);
    let api = std::sync::Arc::new(Api {
        http: reqwest::Client::new(),
        server: stack.server.clone(),
        token: out.stdout.trim().to_string(),
    });
    // The repository, uploaded once.
    let repo = make_calc_repo(stack.dir.path())?;
    let commit = fleet_tests::submit::git(&repo, &["rev-parse", "HEAD"])?;
    let pack = worker::git::pack_commit(&repo, &commit)?.pack;
    let up: Value = api
        .http
        .post(format!("{}/v1/uploads?commit={commit}", api.server))
        .bearer_auth(&api.token)
        .body(pack)
        .send()
        .await?
        .json()
        .await?;
    let upload = json!({"pack": up["pack"], "commit": commit});

    // 1. Runs stored, then reads.
    let gated = bundle(GATED)?;
    let t = Instant::now();
    let ids: Vec<String> = futures::stream::iter(0..o.runs)
        .map(|i| {
            let (api, gated, upload) = (api.clone(), gated.clone(), upload.clone());
            async move {
                let body = json!({"graph": gated, "input": {"n": i}, "upload": upload});
                let made = api.post("/v1/runs", &body).await?;
                Ok::<_, anyhow::Error>(made["run_id"].as_str().unwrap_or_default().to_string())
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let submit_secs = t.elapsed().as_secs_f64();
    eprintln!("{} runs stored in {submit_secs:.1} s", ids.len());
    for id in ids.iter().take(100) {
        api.get(&format!("/v1/runs/{id}")).await?;
    }
    let mut status = Vec::new();
    let mut graph = Vec::new();
    for k in 0..o.reads {
        let id = &ids[(k * 7919) % ids.len()];
        status.push(api.get(&format!("/v1/runs/{id}")).await?.0);
        graph.push(api.get(&format!("/v1/runs/{id}/graph")).await?.0);
    }
    let mut list = Vec::new();
    for _ in 0..50 {
        let (secs, body) = api.get("/v1/runs").await?;
        anyhow::ensure!(
            body.as_array().map_or(0, Vec::len) >= o.runs,
            "the list holds every run"
        );
        list.push(secs);
    }
    let t = Instant::now();
    let per_client = o.reads / o.clients.max(1);
    let concurrent: Vec<anyhow::Result<usize>> =
        futures::future::join_all((0..o.clients).map(|c| {
            let (api, ids) = (api.clone(), ids.clone());
            async move {
                for k in 0..per_client {
                    let id = &ids[(c * 104729 + k * 7919) % ids.len()];
                    api.get(&format!("/v1/runs/{id}")).await?;
                }
                Ok(per_client)
            }
        }))
        .await;
    let done: usize = concurrent
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .iter()
        .sum();
    let concurrent_secs = t.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({"bench": "service-reads", "runs_stored": ids.len(), "submit_seconds": submit_secs,
            "status": percentiles(&mut status), "graph": percentiles(&mut graph),
            "list": percentiles(&mut list),
            "concurrent": {"clients": o.clients, "reads": done,
                "reads_per_second": done as f64 / concurrent_secs}})
    );

    // 2. Live updates of a fan-out, to a stream reader and to the dashboard in Chromium.
    let items: Vec<usize> = (0..o.fan).collect();
    let made = api
        .post(
            "/v1/runs",
            &json!({"graph": bundle(FAN)?, "input": {"items": items}, "upload": upload}),
        )
        .await?;
    let run = made["run_id"].as_str().unwrap_or_default().to_string();
    let reader = {
        let api = api.clone();
        let run = run.clone();
        tokio::spawn(async move { read_stream(&api, &run).await })
    };
    let browser = {
        let (server, token, run) = (api.server.clone(), api.token.clone(), run.clone());
        tokio::task::spawn_blocking(move || watch_in_browser(&server, &token, &run))
    };
    // The browser starts and opens the run (about a second), then the gate opens.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let approved_at = Instant::now();
    api.post(
        &format!("/v1/runs/{run}/approvals/gate"),
        &json!({"approved": true, "by": "bench"}),
    )
    .await?;
    let stream = reader.await??;
    let run_secs = stream
        .last_at
        .map_or(0.0, |l| l.duration_since(approved_at).as_secs_f64());
    let (events_drawn, stall_ms) = browser.await??;
    println!(
        "{}",
        json!({"bench": "dashboard-live", "branches": o.fan,
            "events_after_approval": stream.after(approved_at),
            "seconds_from_approval_to_last_event": run_secs,
            "events_per_second": stream.after(approved_at) as f64 / run_secs.max(1e-9),
            "longest_gap_ms": stream.longest_gap(approved_at) * 1e3,
            "mean_event_bytes": stream.bytes as f64 / stream.at.len().max(1) as f64,
            "last_view_ok_branches": stream.last_ok,
            "browser_events_drawn": events_drawn, "browser_longest_stall_ms": stall_ms})
    );
    anyhow::ensure!(stream.last_ok == o.fan as u64, "every branch seen done");
    Ok(())
}

/// What the stream reader saw.
struct Seen {
    at: Vec<Instant>,
    last_at: Option<Instant>,
    bytes: usize,
    last_ok: u64,
}

impl Seen {
    fn after(&self, t: Instant) -> usize {
        self.at.iter().filter(|a| **a >= t).count()
    }

    fn longest_gap(&self, t: Instant) -> f64 {
        let after: Vec<&Instant> = self.at.iter().filter(|a| **a >= t).collect();
        after
            .windows(2)
            .map(|w| w[1].duration_since(*w[0]).as_secs_f64())
            .fold(0.0, f64::max)
    }
}

async fn read_stream(api: &Api, run: &str) -> anyhow::Result<Seen> {
    let resp = api
        .http
        .get(format!("{}/v1/runs/{run}/watch", api.server))
        .bearer_auth(&api.token)
        .send()
        .await?;
    anyhow::ensure!(resp.status().is_success(), "watch: {}", resp.status());
    let mut seen = Seen {
        at: Vec::new(),
        last_at: None,
        bytes: 0,
        last_ok: 0,
    };
    let mut buf = String::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let data: String = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            if data.is_empty() {
                continue;
            }
            let now = Instant::now();
            seen.at.push(now);
            seen.last_at = Some(now);
            seen.bytes += data.len();
            let view: Value = serde_json::from_str(&data)?;
            seen.last_ok = view["nodes"]
                .as_array()
                .and_then(|ns| ns.iter().find(|n| n["id"] == "noop"))
                .and_then(|n| n["ok"].as_u64())
                .unwrap_or(0);
        }
    }
    Ok(seen)
}

/// The dashboard in headless Chromium on the run until it succeeded: the events it drew and its
/// longest main-thread stall in ms.
fn watch_in_browser(server: &str, token: &str, run: &str) -> anyhow::Result<(u64, u64)> {
    let request = json!({
        "url": format!("{server}/ui#run={run}"),
        "timeout_seconds": 120,
        "screenshot_dir": std::env::temp_dir().join("fleet-bench-dashboard"),
        "actions": [
            {"type": {"selector": "#token", "text": token}},
            {"click": "#login"},
            {"wait_for": "[data-run-status=\"succeeded\"]"},
            {"screenshot": "bench-fanout-done"},
            {"text": "#events"},
            {"text": "#stall"}
        ]
    });
    let answer = fleet_tests::browser::fleet_browser(&request)?;
    anyhow::ensure!(answer["ok"] == true, "the browser: {answer}");
    let texts: Vec<u64> = answer["actions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["action"] == "text")
        .filter_map(|a| a["text"].as_str()?.trim().parse().ok())
        .collect();
    Ok((
        texts.first().copied().unwrap_or(0),
        texts.get(1).copied().unwrap_or(0),
    ))
}
