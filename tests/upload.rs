//! Repositories that come with their submissions, on the real stack: a coordinator serving
//! tokens with no repository roots (it opens no path on its disk at all), and
//!
//! - `fleet submit` packs the client's repository and uploads it; the run starts from the
//!   upload and its container sees the files; the same submission again uploads nothing (the
//!   coordinator's upload counters and the object store's packs unchanged) and returns the run;
//! - another team submitting the same repository uploads it for itself (its own record), and
//!   the bytes are not stored twice; it cannot start from the first team's upload by naming it;
//! - what a client may send is checked: not a pack, a pack without the commit, a pack past the
//!   size limit, an upload and a path at once, a commit id that is not one.

use fleet_tests::stack::{s3_blobs, sum_samples, Stack, StackConfig};
use fleet_tests::submit::{git, git_repo};
use serde_json::{json, Value};
use std::time::Duration;

const GRAPH: &str = r#"
name: uploaded
start: look
nodes:
  look:
    kind: command
    commands: ["grep -q 'only on the client' notes.txt"]
    image: fleet-agent-py:1
    worktree: {from: base, mode: ro}
    routes: [{to: done}]
  done: {kind: exit, status: look.ok}
"#;

async fn upload_counts(stack: &Stack) -> anyhow::Result<(f64, f64, f64)> {
    let text = stack.get_text("/metrics").await?;
    Ok((
        sum_samples(&text, "fleet_uploads_total", &[("outcome", "stored")]),
        sum_samples(&text, "fleet_uploads_total", &[("outcome", "known")]),
        sum_samples(&text, "fleet_upload_bytes_stored_total", &[]),
    ))
}

async fn wait_status(
    http: &reqwest::Client,
    stack: &Stack,
    token: &str,
    run: &str,
) -> anyhow::Result<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let v: Value = http
            .get(format!("{}/v1/runs/{run}", stack.server))
            .bearer_auth(token)
            .send()
            .await?
            .json()
            .await?;
        let status = v["status"].as_str().unwrap_or_default().to_string();
        if status != "running" {
            return Ok(v);
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "still running: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_carries_its_repository_and_the_same_one_uploads_nothing_again(
) -> anyhow::Result<()> {
    let stack = Stack::start_config(StackConfig {
        tag: "upload",
        workers: 1,
        // Tokens, no repository roots: this coordinator opens no repository path at all.
        coordinator_env: &[("FLEET_OPEN_API", "0"), ("FLEET_MAX_UPLOAD_MB", "1")],
        ..StackConfig::default()
    })
    .await?;
    let http = reqwest::Client::new();
    let admin_a =
        fleet_tests::stack::token_of(&stack.cli(&["token", "bootstrap", "--team", "team-a"])?)?;
    let admin_b =
        fleet_tests::stack::token_of(&stack.cli(&["token", "bootstrap", "--team", "team-b"])?)?;

    let client_dir = tempfile::tempdir()?;
    let repo = git_repo(
        client_dir.path(),
        "client-repo",
        &[
            ("notes.txt", "only on the client\n"),
            ("src/a.py", "x = 1\n"),
        ],
    )?;
    let commit = git(&repo, &["rev-parse", "HEAD"])?;
    let dir = stack.dir.path().join("graph");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("graph.yaml"), GRAPH)?;
    std::fs::write(dir.join("input.json"), "{}")?;
    std::fs::write(dir.join("script.json"), "{}")?;
    let path = |f: &str| dir.join(f).display().to_string();
    let repo_arg = repo.display().to_string();
    let submit = [
        "submit",
        "--graph",
        &path("graph.yaml"),
        "--repo",
        &repo_arg,
        "--input",
        &path("input.json"),
        "--script",
        &path("script.json"),
    ];
    let packs = s3_blobs(&stack.ns);

    // The path itself is refused: the coordinator cannot see the client's folder.
    let mut on_server = submit.to_vec();
    on_server.push("--repo-on-server");
    let out = stack.cli_env(&on_server, &[("FLEET_TOKEN", &admin_a)])?;
    assert_ne!(out.code, 0, "the coordinator opened a client path");
    assert!(out.stderr.contains("repository"), "{}", out.stderr);

    // Uploaded, and the run's container sees the client's files.
    let out = stack.cli_env(&submit, &[("FLEET_TOKEN", &admin_a)])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    assert!(out.stderr.contains("uploaded:"), "{}", out.stderr);
    let run_a = out.stdout.trim().to_string();
    let done = wait_status(&http, &stack, &admin_a, &run_a).await?;
    assert_eq!(done["status"], "succeeded", "{done}");
    let (stored, known, bytes) = upload_counts(&stack).await?;
    assert_eq!((stored, known), (1.0, 0.0));
    assert!(bytes > 0.0);
    let packs_before = packs.list("packs/").await?;
    assert_eq!(packs_before.len(), 1, "{packs_before:?}");

    // The same submission again: nothing sent, nothing stored, the same run.
    let out = stack.cli_env(&submit, &[("FLEET_TOKEN", &admin_a)])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    assert!(out.stderr.contains("nothing sent"), "{}", out.stderr);
    assert_eq!(out.stdout.trim(), run_a);
    assert_eq!(upload_counts(&stack).await?, (stored, known, bytes));
    assert_eq!(packs.list("packs/").await?, packs_before);

    // Team B has not uploaded this commit: it cannot name team A's upload...
    let uploaded: Value = http
        .get(format!("{}/v1/uploads/commits/{commit}", stack.server))
        .bearer_auth(&admin_a)
        .send()
        .await?
        .json()
        .await?;
    let pack = uploaded["pack"].as_str().unwrap_or_default().to_string();
    let resp = http
        .get(format!("{}/v1/uploads/commits/{commit}", stack.server))
        .bearer_auth(&admin_b)
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 404);
    let bundle = shared::graph::load_bundle("graph.yaml", GRAPH, |p| {
        std::fs::read_to_string(dir.join(p)).map_err(|e| e.to_string())
    })
    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let resp = http
        .post(format!("{}/v1/runs", stack.server))
        .bearer_auth(&admin_b)
        .json(&json!({"graph": bundle, "input": {}, "upload": {"pack": pack, "commit": commit}}))
        .send()
        .await?;
    let (status, body) = (resp.status().as_u16(), resp.text().await?);
    assert!(
        status == 400 && body.contains("was not uploaded"),
        "{status} {body}"
    );
    // ...so its own submission uploads the pack, whose bytes are not stored twice.
    let out = stack.cli_env(&submit, &[("FLEET_TOKEN", &admin_b)])?;
    anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
    assert!(out.stderr.contains("uploaded:"), "{}", out.stderr);
    let run_b = out.stdout.trim().to_string();
    assert_ne!(run_b, run_a);
    let done = wait_status(&http, &stack, &admin_b, &run_b).await?;
    assert_eq!(done["status"], "succeeded", "{done}");
    let (stored_b, known_b, bytes_b) = upload_counts(&stack).await?;
    let packs_after = packs.list("packs/").await?;
    if packs_after == packs_before {
        // The client packed the same bytes: found, not stored again.
        assert_eq!((stored_b, known_b, bytes_b), (1.0, 1.0, bytes));
    } else {
        assert_eq!(packs_after.len(), 2, "{packs_after:?}");
        assert_eq!((stored_b, known_b), (2.0, 0.0));
    }

    // What a client may send.
    let send = |body: Vec<u8>, commit: &str| {
        http.post(format!("{}/v1/uploads?commit={commit}", stack.server))
            .bearer_auth(&admin_a)
            .body(body)
            .send()
    };
    let resp = send(b"PACK\0\0\0\x02 not really".to_vec(), &commit).await?;
    let (status, body) = (resp.status().as_u16(), resp.text().await?);
    assert!(
        status == 400 && body.contains("not a valid git pack"),
        "{status} {body}"
    );
    let other = git_repo(client_dir.path(), "other", &[("b.txt", "b\n")])?;
    let other_pack = worker::git::pack_commit(&other, &git(&other, &["rev-parse", "HEAD"])?)?;
    let resp = send(other_pack.pack.clone(), &commit).await?;
    let (status, body) = (resp.status().as_u16(), resp.text().await?);
    assert!(
        status == 400 && body.contains("is not in the pack"),
        "{status} {body}"
    );
    let resp = send(other_pack.pack, "HEAD").await?;
    assert_eq!(resp.status().as_u16(), 400);
    // Past FLEET_MAX_UPLOAD_MB (1 here): refused before it is read to the end.
    // (The server may close the connection before the client has sent it all; the refusal is
    // then seen in its counter below.) The rest of the body is still on the connection, so the
    // answer closes it: a client that sent its next request on it had that request cut off.
    let big = vec![7u8; 3 << 20];
    if let Ok(resp) = send(big, &commit).await {
        let connection = resp.headers().get("connection").cloned();
        assert_eq!(resp.status().as_u16(), 413, "{}", resp.text().await?);
        assert_eq!(
            connection.as_ref().map(|v| v.as_bytes()),
            Some(&b"close"[..])
        );
    }
    let resp = http
        .post(format!("{}/v1/runs", stack.server))
        .bearer_auth(&admin_a)
        .json(&json!({"graph": bundle, "input": {}, "repo": "/etc",
            "upload": {"pack": pack, "commit": commit}}))
        .send()
        .await?;
    let (status, body) = (resp.status().as_u16(), resp.text().await?);
    assert!(
        status == 400 && body.contains("not both"),
        "{status} {body}"
    );
    let text = stack.get_text("/metrics").await?;
    assert_eq!(
        sum_samples(&text, "fleet_uploads_total", &[("outcome", "refused")]),
        4.0
    );
    Ok(())
}

/// A coordinator remembers the upload records it read or wrote (a submission's check costs no
/// request to the object store), yet a commit uploaded again in another pack through another
/// coordinator is taken by the first: the remembered record names another pack, so the store's
/// is read. (Refusing on the remembered record would refuse a pack the team did upload.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_uploaded_again_through_another_coordinator_is_taken_by_the_first(
) -> anyhow::Result<()> {
    let mut stack = Stack::start_config(StackConfig {
        tag: "upload-again",
        workers: 1,
        ..StackConfig::default()
    })
    .await?;
    let other = stack.start_serving_coordinator().await?;
    let http = reqwest::Client::new();
    let client_dir = tempfile::tempdir()?;
    let repo = git_repo(
        client_dir.path(),
        "client-repo",
        &[("notes.txt", "only on the client\n")],
    )?;
    let commit = git(&repo, &["rev-parse", "HEAD"])?;
    let upload = |server: String, pack: Vec<u8>| {
        let (http, commit) = (http.clone(), commit.clone());
        async move {
            let resp = http
                .post(format!("{server}/v1/uploads?commit={commit}"))
                .header("content-type", "application/octet-stream")
                .body(pack)
                .send()
                .await?;
            anyhow::ensure!(resp.status().is_success(), "{}", resp.text().await?);
            let answer: Value = resp.json().await?;
            Ok::<String, anyhow::Error>(answer["pack"].as_str().unwrap_or_default().into())
        }
    };
    // The commit alone, through the first coordinator, which then answers for it.
    let first = upload(
        stack.server.clone(),
        worker::git::pack_commit(&repo, &commit)?.pack,
    )
    .await?;
    let known: Value = http
        .get(format!("{}/v1/uploads/commits/{commit}", stack.server))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(known["pack"], first.as_str(), "{known}");
    // The same commit in a larger pack (a later commit's history holds it), through the other.
    git(&repo, &["checkout", "-q", "-b", "later"])?;
    std::fs::write(repo.join("later.txt"), "later\n")?;
    git(&repo, &["add", "."])?;
    git(&repo, &["commit", "-q", "-m", "later"])?;
    let later = git(&repo, &["rev-parse", "HEAD"])?;
    let second = upload(other, worker::git::pack_commit(&repo, &later)?.pack).await?;
    assert_ne!(second, first, "the second pack must differ from the first");

    // The first coordinator takes a run from the second pack.
    let bundle = shared::graph::load_bundle("graph.yaml", GRAPH, |p| Err(format!("no file {p}")))
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let resp = http
        .post(format!("{}/v1/runs", stack.server))
        .json(&json!({"graph": bundle, "input": {},
            "upload": {"pack": second, "commit": commit}}))
        .send()
        .await?;
    let (status, body) = (resp.status().as_u16(), resp.text().await?);
    assert_eq!(status, 201, "{body}");
    let run: Value = serde_json::from_str(&body)?;
    let run = run["run_id"].as_str().unwrap_or_default().to_string();
    let done = stack.wait_run(&run, Duration::from_secs(120)).await?;
    assert_eq!(done["status"], "succeeded", "{done}");

    // Each answer was timed under its route's template, method and status class.
    let text = stack.get_text("/metrics").await?;
    let answered = |route: &str, method: &str| {
        sum_samples(
            &text,
            "fleet_api_request_seconds_count",
            &[("route", route), ("method", method), ("status", "2xx")],
        )
    };
    assert_eq!(answered("/v1/runs", "post"), 1.0, "{text}");
    assert_eq!(answered("/v1/uploads", "post"), 1.0, "{text}");
    assert_eq!(answered("/v1/uploads/commits/:commit", "get"), 1.0);
    Ok(())
}

/// The server's check of a pack, on packs made the way `fleet submit` makes them.
#[test]
fn a_pack_is_taken_only_with_its_commit_its_history_and_files_within_bounds() -> anyhow::Result<()>
{
    use worker::git::{inspect_pack, pack_commit};
    let dir = tempfile::tempdir()?;
    let repo = git_repo(
        dir.path(),
        "r",
        &[("a.txt", "alpha\n"), ("src/b.py", &"x".repeat(4096))],
    )?;
    std::fs::write(repo.join("a.txt"), "alpha two\n")?;
    git(
        &repo,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@localhost",
            "commit",
            "-qam",
            "two",
        ],
    )?;
    let commit = git(&repo, &["rev-parse", "HEAD"])?;
    let packed = pack_commit(&repo, &commit)?;
    let seen = inspect_pack(&packed.pack, &commit, 1 << 20)?;
    assert_eq!(seen.commit, commit);
    let expected =
        shared::factory::tree_hash(packed.files.iter().map(|(p, b)| (p.as_str(), b.as_slice())));
    assert_eq!(seen.tree_hash, expected);
    assert_eq!(seen.files, packed.files.len());

    let refused = |pack: &[u8], commit: &str, max: u64| {
        inspect_pack(pack, commit, max)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| "taken".into())
    };
    assert!(refused(b"PACK not really", &commit, 1 << 20).contains("not a valid git pack"));
    assert!(refused(&packed.pack, &"0".repeat(40), 1 << 20).contains("is not in the pack"));
    assert!(refused(&packed.pack, "HEAD", 1 << 20).contains("not a full commit id"));
    assert!(refused(&packed.pack, &commit, 1024).contains("expand past"));
    // The tip alone: its tree and its parent left out.
    let r = git2::Repository::open(&repo)?;
    let mut pb = r.packbuilder()?;
    pb.insert_object(git2::Oid::from_str(&commit)?, None)?;
    let mut buf = git2::Buf::new();
    pb.write_buf(&mut buf)?;
    let why = refused(&buf, &commit, 1 << 20);
    assert!(why.contains("not in the pack"), "{why}");
    Ok(())
}
