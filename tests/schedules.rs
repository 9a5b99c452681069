//! Schedules on the real stack (Redis, RabbitMQ, S3, `fleet` processes):
//!
//! 1. with two coordinators driving one schedule that ticks every 2 s, each tick fires once:
//!    one batch per tick, ids and times distinct and consecutive; with every coordinator
//!    down for a while, the schedule fires once on recovery (the ticks between are counted as
//!    missed, not fired); a removed schedule fires no more;
//! 2. a webhook that answers 500 first and 200 after gets each morning report once (after one
//!    retry for the first), signed with HMAC-SHA256 (checked here with the `hmac` crate), with
//!    the report and the comparison with the previous firing, which are in object storage too;
//!    the secret never comes back in any answer or log;
//! 3. bad input (cron, name, graph, webhook, a duplicate name, unknown schedules) is refused
//!    naming what is wrong, and nothing is stored.

use fleet_tests::stack::{
    base_env, example, fleet_bin, make_calc_repo, run_cli, s3_blobs, CliOutput, Stack, StackConfig,
};
use fleet_tests::webhook::{fake_webhook, header, Received};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: &str = "s3cr3t-for-the-morning-report-0123456789";
const SECRET_ENV: &str = "FLEET_TEST_WEBHOOK_SECRET";

fn read_json(path: &str) -> anyhow::Result<Value> {
    Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
}

/// A dataset of one factory item in `dir`: the gold patch on `repo` (a missing repository
/// makes the item an infrastructure error at once, without a worker).
fn dataset(dir: &Path, repo: &str) -> anyhow::Result<PathBuf> {
    let item = json!({
        "id": "multiply",
        "repo": repo,
        "work_order": read_json(&example("factory-calc/work_order.json"))?,
        "script": read_json(&example("factory-calc/script-pass.json"))?,
    });
    let path = dir.join(format!("dataset-{}.jsonl", repo.len()));
    std::fs::write(&path, format!("{item}\n"))?;
    Ok(path)
}

/// `fleet` with the stack's environment, plus `extra`.
fn cli(stack: &Stack, args: &[&str], extra: &[(&str, &str)]) -> anyhow::Result<CliOutput> {
    let mut env = base_env(&stack.ns);
    env.push(("FLEET_SERVER".into(), stack.server.clone()));
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    run_cli(args, &env)
}

/// A coordinator of the stack's namespace started here, so the test can kill it; killed when
/// dropped.
struct Coordinator(Option<Child>);

impl Coordinator {
    fn start(stack: &Stack, log: &str) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut env = base_env(&stack.ns);
        env.extend(stack.common_env.iter().cloned());
        env.extend(stack.coordinator_env.iter().cloned());
        let file = std::fs::File::create(stack.log_dir.join(log))?;
        let child = Command::new(fleet_bin())
            .args(["coordinator", "--listen", &format!("127.0.0.1:{port}")])
            .envs(env)
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .spawn()?;
        Ok(Coordinator(Some(child)))
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn show(stack: &Stack, name: &str) -> anyhow::Result<Value> {
    stack.get(&format!("/v1/schedules/{name}")).await
}

fn firings(v: &Value) -> Vec<Value> {
    v["firings"].as_array().cloned().unwrap_or_default()
}

fn time(v: &Value) -> chrono::DateTime<chrono::Utc> {
    v.as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("not a time: {v}"))
}

/// Polls the schedule until `done` holds of it.
async fn wait_for(
    stack: &Stack,
    name: &str,
    timeout: Duration,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let v = show(stack, name).await?;
        if done(&v) {
            return Ok(v);
        }
        anyhow::ensure!(Instant::now() < deadline, "{what} after {timeout:?}: {v:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The batches the fleet holds with label `schedule=<name>`, by id: their `scheduled_for`.
async fn batches_of(stack: &Stack, name: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for b in stack
        .get("/v1/batches")
        .await?
        .as_array()
        .into_iter()
        .flatten()
    {
        let id = b["batch_id"].as_str().unwrap_or_default();
        let v = stack.get(&format!("/v1/batches/{id}")).await?;
        let labels = &v["batch"]["spec"]["labels"];
        if labels["schedule"] == name {
            let at = labels["scheduled_for"].as_str().unwrap_or_default();
            out.push((id.to_string(), at.to_string()));
        }
    }
    out.sort();
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tick_fires_once_across_coordinators_and_once_on_recovery() -> anyhow::Result<()> {
    let mut stack = Stack::start_config(StackConfig {
        tag: "sched",
        workers: 0,
        ..StackConfig::default()
    })
    .await?;
    let mut second = Coordinator::start(&stack, "coordinator-b.log")?;
    let data = dataset(stack.dir.path(), "/nonexistent/repo")?;
    let add = cli(
        &stack,
        &[
            "schedule",
            "add",
            "tick",
            "--cron",
            "*/2 * * * * *",
            "--dataset",
            &data.display().to_string(),
            "--max-infra-retries",
            "0",
        ],
        &[],
    )?;
    assert_eq!(add.code, 0, "{}", add.stderr);
    assert!(add.stdout.contains("schedule tick added"), "{}", add.stdout);

    // Two coordinators race for every tick.
    wait_for(&stack, "tick", Duration::from_secs(60), "5 firings", |v| {
        firings(v).len() >= 5
    })
    .await?;

    // Every coordinator down for 7 s, then one back: the last tick fired before is at most
    // `down_at`, the one fired on recovery at least `down_at` + 6 s, so 2 ticks or more
    // between them were missed.
    stack.kill_coordinator()?;
    second.kill();
    let down_at = chrono::Utc::now();
    tokio::time::sleep(Duration::from_secs(7)).await;
    let up_at = chrono::Utc::now();
    stack.restart_coordinator().await?;
    let after = wait_for(
        &stack,
        "tick",
        Duration::from_secs(60),
        "3 firings after recovery",
        |v| {
            firings(v)
                .iter()
                .filter(|f| time(&f["scheduled_for"]) > up_at)
                .count()
                >= 3
        },
    )
    .await?;
    let removed = cli(&stack, &["schedule", "remove", "tick"], &[])?;
    assert_eq!(removed.code, 0, "{}", removed.stderr);
    assert!(stack.get("/v1/schedules/tick").await.is_err());

    let all = firings(&after);
    let ids: BTreeSet<&str> = all.iter().filter_map(|f| f["batch_id"].as_str()).collect();
    assert_eq!(ids.len(), all.len(), "one batch id per firing: {all:#?}");
    for pair in all.windows(2) {
        let (a, b) = (
            time(&pair[0]["scheduled_for"]),
            time(&pair[1]["scheduled_for"]),
        );
        let missed = pair[1]["missed"].as_i64().unwrap_or(-1);
        // Every tick is fired once or counted as missed, never both, never twice.
        assert_eq!(
            (b - a).num_seconds(),
            2 * (1 + missed),
            "{:#?} then {:#?}",
            pair[0],
            pair[1]
        );
    }
    for f in &all {
        let at = time(&f["scheduled_for"]);
        assert_eq!(
            f["batch_id"],
            format!("tick-{}", at.format("%Y%m%dT%H%M%SZ")),
            "the id is fixed by name and tick"
        );
        assert_eq!(f["kind"], "tick");
        assert_eq!(at.timestamp() % 2, 0, "{f}");
    }
    // On recovery: one firing for the outage, the latest tick due, the rest counted.
    let back = all
        .iter()
        .position(|f| time(&f["claimed_at"]) > up_at)
        .expect("a firing after the outage");
    // While the coordinators were up, no tick was missed (one stall of the machine allowed).
    let missed_before: i64 = all[1..back]
        .iter()
        .map(|f| f["missed"].as_i64().unwrap_or(0))
        .sum();
    assert!(missed_before <= 1, "{all:#?}");
    let recovery = &all[back];
    let at = time(&recovery["scheduled_for"]);
    assert!(
        at >= down_at + chrono::TimeDelta::seconds(5),
        "{recovery:#}"
    );
    assert!(
        recovery["missed"].as_i64().unwrap_or(0) >= 2,
        "{recovery:#}"
    );
    let claimed = time(&recovery["claimed_at"]);
    assert!(
        claimed - at < chrono::TimeDelta::seconds(2),
        "the latest tick due: {recovery:#}"
    );

    // Exactly one batch per firing in the fleet, labelled with its tick (a tick between the
    // last look and the removal may have fired one more).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let batches = batches_of(&stack, "tick").await?;
    let fired: Vec<(String, String)> = {
        let mut v: Vec<(String, String)> = all
            .iter()
            .map(|f| {
                let at = time(&f["scheduled_for"]);
                (
                    f["batch_id"].as_str().unwrap_or_default().to_string(),
                    shared::time::rfc3339(&at),
                )
            })
            .collect();
        v.sort();
        v
    };
    let extra: Vec<&(String, String)> = batches.iter().filter(|b| !fired.contains(b)).collect();
    assert!(
        fired.iter().all(|f| batches.contains(f)),
        "{batches:#?}\n{fired:#?}"
    );
    let last = &fired.last().expect("firings").1;
    assert!(
        extra.len() <= 1 && extra.iter().all(|(_, at)| at > last),
        "{extra:?} beside {fired:#?}"
    );
    // Their reports were written (no webhook: nothing to deliver).
    assert!(all.iter().any(|f| f["stage"] == "reported"), "{all:#?}");
    let claimers: BTreeSet<&str> = all
        .iter()
        .filter_map(|f| f["claimed_by"].as_str())
        .collect();
    eprintln!("firings: {}, claimed by {claimers:?}", all.len());

    // Removed: nothing fires any more.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(batches_of(&stack, "tick").await?, batches);
    Ok(())
}

/// The signature header is HMAC-SHA256 of the body under the secret, computed here.
fn assert_signed(h: &axum::http::HeaderMap, body: &[u8]) {
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(body);
    let expected = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    assert_eq!(header(h, "x-fleet-signature"), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_morning_report_reaches_the_webhook_once_signed_after_a_retry() -> anyhow::Result<()> {
    let received: Received = Arc::default();
    let url = fake_webhook(received.clone(), "/hook/TOKEN").await?;
    let mut stack = Stack::start_config(StackConfig {
        tag: "schedhook",
        workers: 1,
        coordinator_env: &[("FLEET_WEBHOOK_RETRY_BASE_SECONDS", "1")],
        ..StackConfig::default()
    })
    .await?;
    stack.start_extra_coordinator()?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let data = dataset(stack.dir.path(), &repo)?;
    let add = cli(
        &stack,
        &[
            "schedule",
            "add",
            "morning",
            "--cron",
            "0 0 1 1 *",
            "--dataset",
            &data.display().to_string(),
            "--max-attempts",
            "1",
            "--webhook",
            &url,
            "--webhook-secret-env",
            SECRET_ENV,
        ],
        &[(SECRET_ENV, SECRET)],
    )?;
    assert_eq!(add.code, 0, "{}", add.stderr);

    let run = |stack: &Stack| cli(stack, &["schedule", "run-now", "morning"], &[]);
    let first = run(&stack)?;
    assert_eq!(first.code, 0, "{}", first.stderr);
    let first = first.stdout.trim().to_string();
    assert!(first.starts_with("morning-now-"), "{first}");
    let v = wait_for(
        &stack,
        "morning",
        Duration::from_secs(240),
        "delivered",
        |v| {
            firings(v)
                .first()
                .is_some_and(|f| f["delivery"]["state"] == "delivered")
        },
    )
    .await?;
    let got = received.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "one failed attempt, one delivery");
    assert_eq!((got[0].2, got[1].2), (500, 200));
    assert_eq!(got[0].1, got[1].1, "every attempt sends the same body");
    let delivery = header(&got[0].0, "x-fleet-delivery").to_string();
    assert_eq!(delivery.len(), 32);
    for (h, body, _) in &got {
        assert_signed(h, body);
        assert_eq!(header(h, "x-fleet-delivery"), delivery);
        assert_eq!(header(h, "x-fleet-event"), "schedule.report");
        assert_eq!(header(h, "content-type"), "application/json");
    }
    assert_eq!(
        (
            header(&got[0].0, "x-fleet-attempt"),
            header(&got[1].0, "x-fleet-attempt")
        ),
        ("1", "2")
    );
    let body: Value = serde_json::from_slice(&got[1].1)?;
    assert_eq!(body["delivery_id"], delivery.as_str());
    assert_eq!(
        body["timestamp"].to_string(),
        header(&got[1].0, "x-fleet-timestamp")
    );
    assert_eq!(body["schedule"], "morning");
    assert_eq!(body["batch_id"], first.as_str());
    assert_eq!(body["report"]["batch_id"], first.as_str());
    assert_eq!(body["report"]["counts"]["passed"], 1, "{body:#}");
    assert_eq!(body["report"]["items"][0]["verdict"], "PASS");
    assert!(body["comparison"].is_null() && body["previous_batch_id"].is_null());
    let attempts = &firings(&v)[0]["delivery"]["attempts"];
    assert_eq!(attempts[0]["status"], 500, "{v:#}");
    assert!(attempts[0]["error"]
        .as_str()
        .unwrap_or_default()
        .contains("500"));
    assert_eq!(attempts[1]["status"], 200);
    assert!(attempts[1]["error"].is_null());

    // The second firing is compared with the first.
    let second = run(&stack)?;
    assert_eq!(second.code, 0, "{}", second.stderr);
    let second = second.stdout.trim().to_string();
    assert_ne!(second, first);
    wait_for(
        &stack,
        "morning",
        Duration::from_secs(240),
        "delivered twice",
        |v| {
            firings(v)
                .iter()
                .filter(|f| f["delivery"]["state"] == "delivered")
                .count()
                == 2
        },
    )
    .await?;
    let got = received.lock().unwrap().clone();
    assert_eq!(got.len(), 3, "delivered at the first attempt");
    let (h, raw, _) = &got[2];
    assert_signed(h, raw);
    assert_ne!(header(h, "x-fleet-delivery"), delivery);
    let body: Value = serde_json::from_slice(raw)?;
    assert_eq!(body["batch_id"], second.as_str());
    assert_eq!(body["previous_batch_id"], first.as_str());
    assert_eq!(body["comparison"]["before"], first.as_str());
    assert_eq!(body["comparison"]["after"], second.as_str());
    assert_eq!(body["comparison"]["unchanged"], 1, "{body:#}");
    // In object storage, as the body names them, and through the API.
    let store = s3_blobs(&stack.ns);
    let folder = format!("schedules/morning/{second}/");
    let report: Value = store.get_json(&format!("{folder}report.json")).await?;
    assert_eq!(report, body["report"]);
    let comparison: Value = store.get_json(&format!("{folder}comparison.json")).await?;
    assert_eq!(comparison, body["comparison"]);
    assert_eq!(
        body["keys"]["comparison"],
        format!("{folder}comparison.json")
    );
    assert_eq!(store.get(&format!("{folder}morning.json")).await?, *raw);
    assert!(
        String::from_utf8(store.get(&format!("{folder}junit.xml")).await?)?.contains("<testcase")
    );
    let served = stack
        .get(&format!("/v1/schedules/morning/reports/{second}"))
        .await?;
    assert_eq!(served, body);

    // No more deliveries, from either coordinator.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(received.lock().unwrap().len(), 3);

    // The secret is never answered nor logged; the URL's path (a token) neither.
    let list = cli(&stack, &["schedule", "list"], &[])?;
    assert_eq!(list.code, 0, "{}", list.stderr);
    assert!(
        list.stdout.contains("morning") && list.stdout.contains("delivered"),
        "{}",
        list.stdout
    );
    let shown = cli(&stack, &["schedule", "show", "morning"], &[])?;
    let api =
        stack.get("/v1/schedules").await?.to_string() + &show(&stack, "morning").await?.to_string();
    let logs = std::fs::read_dir(&stack.log_dir)?
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect::<String>();
    for text in [&list.stdout, &shown.stdout, &api, &logs] {
        assert!(!text.contains(SECRET), "the secret leaked: {text}");
        assert!(!text.contains("TOKEN"), "the url's path leaked: {text}");
    }
    assert!(
        shown.stdout.contains("\"secret_set\": true"),
        "{}",
        shown.stdout
    );
    Ok(())
}

/// A request body the API would take, from the CLI's own reading of the files.
fn request(name: &str, cron: &str) -> anyhow::Result<Value> {
    let graph = shared::graph::load_bundle(
        "graphs/factory/graph.yaml",
        &std::fs::read_to_string(
            fleet_tests::stack::workspace_root().join("graphs/factory/graph.yaml"),
        )?,
        |p| {
            std::fs::read_to_string(
                fleet_tests::stack::workspace_root()
                    .join("graphs/factory")
                    .join(p),
            )
            .map_err(|e| e.to_string())
        },
    )
    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(json!({
        "name": name,
        "cron": cron,
        "graph": graph,
        "dataset": "{\"id\": \"a\", \"repo\": \"/r\"}\n",
        "spec": {"max_running": 1},
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_schedules_are_refused_naming_what_is_wrong() -> anyhow::Result<()> {
    let stack = Stack::start_config(StackConfig {
        tag: "schedbad",
        workers: 0,
        ..StackConfig::default()
    })
    .await?;
    let data = dataset(stack.dir.path(), "/r")?.display().to_string();
    let add = |name: &str, cron: &str, more: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["schedule", "add", name, "--cron", cron, "--dataset", &data];
        args.extend(more);
        cli(&stack, &args, env)
    };
    let ok = add("ok", "0 2 * * *", &[], &[])?;
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    // A dataset read from a mirror directory: refused without one, kept with one.
    let swe = stack.dir.path().join("swe.jsonl");
    std::fs::write(
        &swe,
        "{\"id\": \"m\", \"repo\": \"owner/name\", \"mirror\": true}\n",
    )?;
    let swe = swe.display().to_string();
    let base = [
        "schedule",
        "add",
        "swe",
        "--cron",
        "0 2 * * *",
        "--dataset",
        swe.as_str(),
    ];
    let refused = cli(&stack, &base, &[])?;
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("--mirror-dir"),
        "{}",
        refused.stderr
    );
    let mirrors = stack.dir.path().display().to_string();
    let kept = cli(
        &stack,
        &[&base[..], &["--mirror-dir", mirrors.as_str()]].concat(),
        &[],
    )?;
    assert_eq!(kept.code, 0, "{}", kept.stderr);
    let removed = cli(&stack, &["schedule", "remove", "swe"], &[])?;
    assert_eq!(removed.code, 0, "{}", removed.stderr);
    let long = "n".repeat(65);
    let bad_graph = stack.dir.path().join("missing.yaml").display().to_string();
    let cases: Vec<(CliOutput, &str)> = vec![
        (
            add("ok", "0 3 * * *", &[], &[])?,
            "schedule `ok` already exists",
        ),
        (
            add("c", "61 * * * *", &[], &[])?,
            "cron expression \"61 * * * *\"",
        ),
        (add("c", "* * *", &[], &[])?, "it has 3 fields"),
        (add("c", "0 0 30 2 *", &[], &[])?, "never fires"),
        (add("bad/name", "0 2 * * *", &[], &[])?, "[A-Za-z0-9_.-]"),
        (
            add("..", "0 2 * * *", &[], &[])?,
            "starts with a letter or a digit",
        ),
        (add(&long, "0 2 * * *", &[], &[])?, "1 to 64"),
        (
            add("g", "0 2 * * *", &["--graph", &bad_graph], &[])?,
            "cannot read graph",
        ),
        (
            add(
                "w",
                "0 2 * * *",
                &["--webhook", "http://127.0.0.1:1/x"],
                &[],
            )?,
            "--webhook-secret-env",
        ),
        (
            add(
                "w",
                "0 2 * * *",
                &[
                    "--webhook",
                    "http://127.0.0.1:1/x",
                    "--webhook-secret-env",
                    "NOPE_UNSET",
                ],
                &[],
            )?,
            "NOPE_UNSET: the variable is not set",
        ),
        (
            add(
                "w",
                "0 2 * * *",
                &[
                    "--webhook",
                    "ftp://127.0.0.1/x",
                    "--webhook-secret-env",
                    SECRET_ENV,
                ],
                &[(SECRET_ENV, SECRET)],
            )?,
            "scheme is `ftp`",
        ),
        (
            add(
                "w",
                "0 2 * * *",
                &[
                    "--webhook",
                    "http://127.0.0.1:1/x",
                    "--webhook-secret-env",
                    SECRET_ENV,
                ],
                &[(SECRET_ENV, "short")],
            )?,
            "the secret is 5 bytes",
        ),
        (
            add("l", "0 2 * * *", &["--label", "schedule=x"], &[])?,
            "label `schedule`",
        ),
        (
            cli(&stack, &["schedule", "run-now", "nope"], &[])?,
            "schedule `nope` not found",
        ),
        (
            cli(&stack, &["schedule", "remove", "nope"], &[])?,
            "schedule `nope` not found",
        ),
        (
            cli(&stack, &["schedule", "show", "nope"], &[])?,
            "schedule `nope` not found",
        ),
    ];
    for (out, why) in &cases {
        assert_ne!(out.code, 0, "{why}: {}", out.stdout);
        assert!(out.stderr.contains(why), "{why}: {}", out.stderr);
        assert!(!out.stderr.contains(SECRET), "{}", out.stderr);
    }
    // Through the API: a graph that names a start node it lacks, a duplicate, a bad body.
    let mut body = request("api", "0 2 * * *")?;
    assert_eq!(stack.post_answer("/v1/schedules", &body).await?.0, 201);
    let (status, answer) = stack.post_answer("/v1/schedules", &body).await?;
    assert_eq!(status, 409, "{answer}");
    body["name"] = json!("api2");
    body["graph"]["graph"]["start"] = json!("nowhere");
    let (status, answer) = stack.post_answer("/v1/schedules", &body).await?;
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("invalid graph")),
        "{answer}"
    );
    assert!(
        answer["details"].to_string().contains("nowhere"),
        "{answer}"
    );
    let (status, answer) = stack
        .post_answer("/v1/schedules", &json!({"name": "x"}))
        .await?;
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"]
        .as_str()
        .unwrap_or_default()
        .contains("malformed schedule"));

    // Only the good ones were stored; nothing fired.
    let names: Vec<String> = stack
        .get("/v1/schedules")
        .await?
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["name"].as_str().map(String::from))
        .collect();
    assert_eq!(names, ["api", "ok"]);
    assert_eq!(stack.get("/v1/batches").await?, json!([]));
    Ok(())
}
