//! Tokens and teams on the real stack, every route checked, the checks generated from the
//! API's own route table (`coordinator::api::routes()`): a coordinator with the API closed (the
//! default), the first admin tokens of two teams made with `fleet token bootstrap`, then
//!
//! - every route but the public ones refuses a missing, malformed, unknown or revoked token
//!   (401), and a viewer's token on every route that changes something (403);
//! - every route that names team A's run, batch, schedule or artifact answers team B's admin
//!   404, as for something that does not exist; B's lists hold nothing of A's;
//! - the same submission by both teams makes two runs; A's member submits, approves and
//!   reads its own run;
//! - the coordinator opens a repository path only beneath the roots its admin allows
//!   (`FLEET_REPO_ROOTS`), symlinks resolved.

use coordinator::api::{routes, Verb};
use fleet_tests::stack::{example, make_calc_repo, Stack, StackConfig};
use serde_json::{json, Value};
use shared::auth::Access;
use std::time::Duration;

const GRAPH: &str = r#"
name: gated
start: work
nodes:
  work:
    kind: agent
    template: prompt.md
    output_schema: schema.json
    image: fleet-agent-py:1
    routes: [{to: gate}]
  gate:
    kind: approval
    routes: [{to: done}]
  done: {kind: exit, status: gate.ok}
"#;

struct Api<'a> {
    stack: &'a Stack,
    http: reqwest::Client,
}

impl Api<'_> {
    async fn call(
        &self,
        verb: Verb,
        path: &str,
        token: Option<&str>,
    ) -> anyhow::Result<(u16, Value)> {
        let url = format!("{}{path}", self.stack.server);
        let mut req = match verb {
            Verb::Get => self.http.get(url),
            Verb::Post => self.http.post(url).json(&json!({})),
        };
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_checks_the_token_and_the_team_of_what_it_names() -> anyhow::Result<()> {
    // The stack's repositories are made beneath the temporary folder: the one root allowed.
    let root = std::env::temp_dir().canonicalize()?.display().to_string();
    let stack = Stack::start_config(StackConfig {
        tag: "auth",
        workers: 1,
        coordinator_env: &[("FLEET_OPEN_API", "0"), ("FLEET_REPO_ROOTS", &root)],
        ..StackConfig::default()
    })
    .await?;
    let api = Api {
        stack: &stack,
        http: reqwest::Client::new(),
    };
    // A fresh install: nothing but the public routes answers without a token.
    let (status, _) = api.call(Verb::Get, "/v1/runs", None).await?;
    assert_eq!(status, 401);
    let admin_a =
        fleet_tests::stack::token_of(&stack.cli(&["token", "bootstrap", "--team", "team-a"])?)?;
    let admin_b =
        fleet_tests::stack::token_of(&stack.cli(&["token", "bootstrap", "--team", "team-b"])?)?;
    let as_a = [("FLEET_TOKEN", admin_a.as_str())];
    let member_a = fleet_tests::stack::token_of(&stack.cli_env(
        &["token", "create", "--role", "member", "--name", "ci"],
        &as_a,
    )?)?;
    let viewer_a = fleet_tests::stack::token_of(
        &stack.cli_env(&["token", "create", "--role", "viewer"], &as_a)?,
    )?;
    let out = stack.cli_env(
        &["token", "create", "--role", "member", "--team", "team-b"],
        &as_a,
    )?;
    assert_ne!(out.code, 0, "an admin makes tokens of its own team only");
    let listed = stack.cli_env(&["token", "list"], &as_a)?;
    assert_eq!(listed.stdout.lines().count(), 3, "{}", listed.stdout);
    assert!(
        !listed.stdout.contains(&member_a),
        "a token is never listed"
    );

    // Team A's things: a run waiting at its approval, a batch, a schedule.
    let dir = stack.dir.path().join("gated");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("graph.yaml"), GRAPH)?;
    std::fs::write(dir.join("prompt.md"), "work\n")?;
    std::fs::write(dir.join("schema.json"), r#"{"type": "object"}"#)?;
    std::fs::write(dir.join("input.json"), "{}")?;
    std::fs::write(
        dir.join("script.json"),
        json!({"work": [{"output": {"done": true}}]}).to_string(),
    )?;
    let repo = make_calc_repo(stack.dir.path())?.display().to_string();
    let path = |f: &str| dir.join(f).display().to_string();
    let submit_args = [
        "submit",
        "--graph",
        &path("graph.yaml"),
        "--repo",
        &repo,
        "--input",
        &path("input.json"),
        "--script",
        &path("script.json"),
    ];
    let as_member = [("FLEET_TOKEN", member_a.as_str())];
    let out = stack.cli_env(&submit_args, &as_member)?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    let run_a = out.stdout.trim().to_string();
    // A repository only team A uploads.
    let only_a = fleet_tests::submit::git_repo(stack.dir.path(), "only-a", &[("a.txt", "a\n")])?;
    let commit_a = fleet_tests::submit::git(&only_a, &["rev-parse", "HEAD"])?;
    let resp = api
        .http
        .post(format!("{}/v1/uploads?commit={commit_a}", stack.server))
        .bearer_auth(&member_a)
        .body(worker::git::pack_commit(&only_a, &commit_a)?.pack)
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 201, "{}", resp.text().await?);
    let out = stack.cli_env(&submit_args, &[("FLEET_TOKEN", viewer_a.as_str())])?;
    assert_ne!(out.code, 0, "a viewer cannot submit");
    // A repository outside the allowed root, directly or through a symlink beneath it.
    let bundle = shared::graph::load_bundle("graph.yaml", GRAPH, |p| {
        std::fs::read_to_string(dir.join(p)).map_err(|e| e.to_string())
    })
    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let link = stack.dir.path().join("escape");
    std::os::unix::fs::symlink("/etc", &link)?;
    // Beneath the root, but git would read elsewhere: borrowed objects, a `.git` file.
    let borrowing = make_calc_repo(&stack.dir.path().join("borrowing"))?;
    std::fs::write(borrowing.join(".git/objects/info/alternates"), "/etc\n")?;
    let pointing = stack.dir.path().join("pointing");
    std::fs::create_dir_all(&pointing)?;
    std::fs::write(pointing.join(".git"), "gitdir: /etc\n")?;
    let cases = [
        ("/etc".to_string(), "not beneath a root"),
        (link.display().to_string(), "not beneath a root"),
        (
            borrowing.display().to_string(),
            "its borrowed object store `/etc`",
        ),
        (pointing.display().to_string(), "its git directory `/etc`"),
    ];
    for (outside, why) in &cases {
        let resp = api
            .http
            .post(format!("{}/v1/runs", stack.server))
            .header("Authorization", format!("Bearer {member_a}"))
            .json(&json!({"graph": bundle, "input": {}, "repo": outside}))
            .send()
            .await?;
        let status = resp.status().as_u16();
        let body = resp.text().await?;
        assert!(
            status == 400 && body.contains(why),
            "{outside}: {status} {body}"
        );
    }
    // The same submission by team B is another run.
    let out = stack.cli_env(&submit_args, &[("FLEET_TOKEN", admin_b.as_str())])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    assert_ne!(out.stdout.trim(), run_a);
    let item = json!({"id": "gold", "repo": repo,
        "work_order": serde_json::from_str::<Value>(&std::fs::read_to_string(example("factory-calc/work_order.json"))?)?,
        "script": serde_json::from_str::<Value>(&std::fs::read_to_string(example("factory-calc/script-pass.json"))?)?});
    std::fs::write(dir.join("data.jsonl"), format!("{item}\n"))?;
    let out = stack.cli_env(&["batch", "submit", &path("data.jsonl")], &as_member)?;
    anyhow::ensure!(out.code == 0, "batch failed: {}", out.stderr);
    let batch_a = out.stdout.trim().to_string();
    let out = stack.cli_env(
        &[
            "schedule",
            "add",
            "nightly-a",
            "--cron",
            "0 2 * * *",
            "--dataset",
            &path("data.jsonl"),
        ],
        &as_member,
    )?;
    anyhow::ensure!(out.code == 0, "schedule failed: {}", out.stderr);
    // A's run waits at its gate, with artifacts.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let artifact = loop {
        let (_, s) = api
            .call(Verb::Get, &format!("/v1/runs/{run_a}"), Some(&viewer_a))
            .await?;
        if s["awaiting_approval"] == json!(["gate"]) {
            let (_, listing) = api
                .call(
                    Verb::Get,
                    &format!("/v1/runs/{run_a}/artifacts"),
                    Some(&viewer_a),
                )
                .await?;
            let key = listing["keys"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .find(|k| k.ends_with("/output.json"))
                .unwrap_or_default()
                .to_string();
            anyhow::ensure!(key.starts_with("runs/"), "no artifact: {listing}");
            break key;
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "never waited: {s}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (_, tokens) = api.call(Verb::Get, "/v1/tokens", Some(&admin_a)).await?;
    let token_a = tokens[0]["id"].as_str().unwrap_or_default().to_string();

    // Every route of the table, with A's things in its path.
    let fill = |path: &str| -> String {
        let mut out = Vec::new();
        let section = path.split('/').nth(2).unwrap_or_default();
        for seg in path.split('/') {
            out.push(match (section, seg) {
                ("runs", ":id") => run_a.clone(),
                ("batches", ":id" | ":other") | ("schedules", ":batch") => batch_a.clone(),
                ("schedules", ":name") => "nightly-a".to_string(),
                ("tokens", ":id") => token_a.clone(),
                ("uploads", ":commit") => commit_a.clone(),
                (_, ":node") => "gate".to_string(),
                (_, ":item") => "1".to_string(),
                (_, "*key") => artifact.clone(),
                (_, other) => other.to_string(),
            });
        }
        out.join("/")
    };
    let malformed = "fleet_not-a-token";
    let unknown = format!("fleet_{}", "0".repeat(64));
    let mut failures = Vec::new();
    let all = routes();
    assert!(all.len() > 30, "the whole table");
    for route in &all {
        let path = fill(route.path);
        let what = format!("{} {}", route.verb.as_str(), route.path);
        if route.access == Access::Public {
            let (status, _) = api.call(route.verb, &path, None).await?;
            if status == 401 {
                failures.push(format!("{what}: public, yet 401"));
            }
            continue;
        }
        for token in [None, Some(malformed), Some(unknown.as_str())] {
            let (status, body) = api.call(route.verb, &path, token).await?;
            if status != 401 {
                failures.push(format!("{what} with {token:?}: {status} {body}"));
            }
        }
        if route.access != Access::Read {
            let (status, body) = api.call(route.verb, &path, Some(&viewer_a)).await?;
            if status != 403 {
                failures.push(format!("{what} as a viewer: {status} {body}"));
            }
        }
        let names_a_thing = route.path.contains(':') || route.path.contains('*');
        let (status, body) = api.call(route.verb, &path, Some(&admin_b)).await?;
        if names_a_thing && status != 404 {
            failures.push(format!("{what} as team b: {status}, not 404: {body}"));
        }
        if !names_a_thing && route.verb == Verb::Get {
            let text = body.to_string();
            if [&run_a, &batch_a, &token_a]
                .iter()
                .any(|id| text.contains(id.as_str()))
                || text.contains("nightly-a")
            {
                failures.push(format!("{what} as team b lists team a's: {text}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // Schedule names are each team's own: B may use A's name, and neither sees the other's.
    let as_b = [("FLEET_TOKEN", admin_b.as_str())];
    let add = |who: &[(&str, &str)]| {
        stack.cli_env(
            &[
                "schedule",
                "add",
                "nightly-a",
                "--cron",
                "0 3 * * *",
                "--dataset",
                &path("data.jsonl"),
            ],
            who,
        )
    };
    let out = add(&as_b)?;
    assert_eq!(out.code, 0, "b uses the same name: {}", out.stderr);
    let out = add(&as_member)?;
    assert!(
        out.code != 0 && out.stderr.contains("409"),
        "a's own name is taken: {}",
        out.stderr
    );
    let (_, mine) = api
        .call(Verb::Get, "/v1/schedules/nightly-a", Some(&admin_b))
        .await?;
    assert_eq!(mine["cron"], "0 3 * * *", "b sees its own: {mine}");
    assert_eq!(mine["name"], "nightly-a");
    let (_, theirs) = api
        .call(Verb::Get, "/v1/schedules/nightly-a", Some(&admin_a))
        .await?;
    assert_eq!(theirs["cron"], "0 2 * * *", "a sees its own: {theirs}");

    // A's member approves its own run; it finishes; A's viewer reads the result.
    let out = stack.cli_env(&["approve", &run_a, "gate"], &as_member)?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = stack.cli_env(
        &["wait", &run_a, "--timeout", "60"],
        &[("FLEET_TOKEN", viewer_a.as_str())],
    )?;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    // A revoked token stops working at once.
    let out = stack.cli_env(&["token", "revoke", &token_a], &as_a)?;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let (status, _) = api.call(Verb::Get, "/v1/runs", Some(&admin_a)).await?;
    assert_eq!(status, 401, "the bootstrap token was revoked");
    let (status, _) = api.call(Verb::Get, "/v1/runs", Some(&viewer_a)).await?;
    assert_eq!(status, 200);
    Ok(())
}
