//! The warm pool on the real stack (`FLEET_WARM_CONTAINERS`): jobs after the first of their
//! kind run in containers started before they were submitted, each container serves one job
//! only (nothing a job leaves in its container reaches the next), a read-only worktree stays
//! read-only, and the pool's containers do not outlive their worker: drained when it stops,
//! reaped when it was killed. A worker whose disks are low removes the images no container uses
//! and no tag names, and no other. With image affinity, jobs of an image go to the worker that
//! holds it, and to another once it is gone. (The step cache is off: every probe must run.)

use fleet_tests::stack::{containers, Stack};
use fleet_tests::submit::git_repo;
use std::path::Path;
use std::time::{Duration, Instant};

const GRAPH: &str = r#"
name: warm-probe
start: probe
defaults:
  image: fleet-agent-py:1
  timeout_seconds: 60
nodes:
  probe:
    kind: command
    commands:
      - "sh -c 'echo host=$(hostname); echo tmp=$(ls -A /tmp | tr \"\\n\" ,); echo file=$(cat probe.txt); touch /tmp/left-behind; (sleep 600 >/dev/null 2>&1 &); if echo x > written.txt 2>/dev/null; then echo wrote; else echo read-only; fi'"
    worktree: { from: base, mode: ro }
    routes:
      - to: done
  done:
    kind: exit
    status: probe.ok
"#;

fn repo(dir: &Path, content: &str) -> anyhow::Result<String> {
    Ok(git_repo(dir, "repo", &[("probe.txt", content)])?
        .display()
        .to_string())
}

/// What the probe printed, as `key=value` pairs.
struct Probe {
    host: String,
    tmp: String,
    file: String,
    wrote: bool,
    /// The worker that ran it.
    worker: String,
}

async fn probe(stack: &Stack, graph: &str, repo: &str) -> anyhow::Result<Probe> {
    let input = stack.dir.path().join("in.json");
    // A new input each time: the same submission twice is one run.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::fs::write(&input, format!("{{\"probe\": {n}}}"))?;
    let input = input.display().to_string();
    let script = stack.dir.path().join("script.json");
    std::fs::write(&script, "{}")?;
    let script = script.display().to_string();
    let out = stack.cli(&[
        "submit", "--graph", graph, "--repo", repo, "--input", &input, "--script", &script,
    ])?;
    anyhow::ensure!(out.code == 0, "{}", out.stderr);
    let run = out.stdout.trim().to_string();
    let status = stack.wait_run(&run, Duration::from_secs(120)).await?;
    anyhow::ensure!(status["status"] == "succeeded", "{status}");
    let stdout = stack
        .node_artifact_text(&run, "probe", 1, "logs/command_0.stdout")
        .await?;
    let field = |k: &str| -> String {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_default()
            .to_string()
    };
    Ok(Probe {
        host: field("host"),
        tmp: field("tmp"),
        file: field("file"),
        wrote: stdout.lines().any(|l| l == "wrote"),
        worker: (status["jobs"].as_array().into_iter().flatten())
            .find(|j| j["node"] == "probe")
            .and_then(|j| j["worker"].as_str())
            .unwrap_or_default()
            .to_string(),
    })
}

fn warm_of(worker: &str) -> Vec<String> {
    let mut found = containers("fleet.warm=1");
    let mine = containers(&format!("fleet.worker={worker}"));
    found.retain(|c| mine.contains(c));
    found
}

/// Waits until the worker's pool holds a ready container (its gauge), and checks that Docker
/// shows exactly one warm container of the worker.
async fn ready(stack: &Stack, worker: &str) -> anyhow::Result<()> {
    let gauge = "fleet_worker_warm_containers";
    stack
        .wait_for_metric(worker, gauge, &[], 1.0, Duration::from_secs(30))
        .await?;
    anyhow::ensure!(warm_of(worker).len() == 1, "{:?}", warm_of(worker));
    Ok(())
}

async fn wait_until(what: &str, mut ok: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok() {
        anyhow::ensure!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_containers_serve_one_job_each_and_go_with_their_worker() -> anyhow::Result<()> {
    let mut stack = Stack::start_with(
        "warm",
        1,
        1,
        &[("FLEET_WARM_CONTAINERS", "1"), ("FLEET_STEP_CACHE", "off")],
    )
    .await?;
    let worker = stack.worker_ids()[0].clone();
    let dir = stack.dir.path().join("g");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("graph.yaml"), GRAPH)?;
    let graph = dir.join("graph.yaml").display().to_string();
    let secret = format!("content-{}", std::process::id());
    let repo = repo(stack.dir.path(), &secret)?;

    // The first job of its kind starts cold; the pool is filled for the next one.
    let first = probe(&stack, &graph, &repo).await?;
    assert_eq!(first.file, secret, "the job's worktree is mounted");
    let mut hosts = vec![first.host.clone()];
    for _ in 0..3 {
        ready(&stack, &worker).await?;
        let ready = warm_of(&worker);
        let p = probe(&stack, &graph, &repo).await?;
        let total = "fleet_worker_containers_total";
        let warm = stack
            .worker_metric(&worker, total, &[("start", "warm")])
            .await?;
        let cold = stack
            .worker_metric(&worker, total, &[("start", "cold")])
            .await?;
        assert_eq!(
            cold, 1.0,
            "only the first job started a container of its own"
        );
        assert!(
            ready.iter().any(|id| id.starts_with(&p.host)),
            "the job ran in the container started before it ({}), not in {ready:?}",
            p.host
        );
        assert_eq!(p.file, secret, "the job's worktree was handed in");
        assert_eq!(warm, hosts.len() as f64, "every later job was handed one");
        assert_eq!(p.tmp, "", "nothing of another job's is in the container");
        assert!(!p.wrote, "a read-only worktree stays read-only when warm");
        assert!(!hosts.contains(&p.host), "a container served two jobs");
        hosts.push(p.host);
    }
    // Every job's container is gone with its job (removed in the background once killed),
    // its leftover process too.
    wait_until("every job's container is removed", || {
        let all = containers("fleet.worker");
        !hosts
            .iter()
            .any(|h| all.iter().any(|c| c.starts_with(h.as_str())))
    })
    .await?;

    // A worker that stops drains its pool.
    ready(&stack, &worker).await?;
    stack.stop_worker(&worker)?;
    wait_until("the stopped worker's pool is drained", || {
        warm_of(&worker).is_empty()
    })
    .await?;

    // A worker killed with its pool full: its restart reaps the pool it left.
    stack.start_worker(&worker)?;
    probe(&stack, &graph, &repo).await?;
    ready(&stack, &worker).await?;
    let left = warm_of(&worker);
    stack.kill_worker(&worker)?;
    assert_eq!(warm_of(&worker), left, "a killed worker drains nothing");
    stack.start_worker(&worker)?;
    wait_until("the killed worker's pool is reaped on restart", || {
        !warm_of(&worker).iter().any(|c| left.contains(c))
    })
    .await?;
    let again = probe(&stack, &graph, &repo).await?;
    assert_eq!(again.file, secret);
    Ok(())
}

/// `docker` with `args`; its standard output, trimmed.
fn docker(args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("docker").args(args).output()?;
    anyhow::ensure!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// Imports an image of one file holding `content` under `tag`; returns its id.
fn import(dir: &Path, tag: &str, content: &str) -> anyhow::Result<String> {
    let root = dir.join(format!("rootfs-{content}"));
    std::fs::create_dir_all(&root)?;
    std::fs::write(root.join("content.txt"), content)?;
    let tar = dir.join(format!("{content}.tar"));
    let made = std::process::Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()?;
    anyhow::ensure!(made.success(), "tar failed");
    docker(&["import", &tar.display().to_string(), tag])
}

fn image_exists(id: &str) -> bool {
    docker(&["image", "inspect", "--format", "{{.Id}}", id]).is_ok()
}

/// A worker whose disks are low removes the images no container uses and no tag names (what a
/// rebuilt tag leaves behind), at most once a minute, and never an image a tag names or a
/// container uses: no registry would bring it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_disk_is_low_removes_unused_untagged_images_only() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let name = format!("fleet-prune-probe-{}", std::process::id());
    let (kept, used) = (format!("{name}:kept"), format!("{name}:used"));
    // A tag rebuilt: its first image is untagged and unused.
    let replaced = import(dir.path(), &kept, "replaced")?;
    let current = import(dir.path(), &kept, "current")?;
    // Another rebuilt while a container (created, never started) uses its first image.
    let in_use = import(dir.path(), &used, "in-use")?;
    let holder = docker(&[
        "create",
        "--label",
        "fleet.test=prune",
        &used,
        "/content.txt",
    ])?;
    import(dir.path(), &used, "used-current")?;
    assert!(image_exists(&replaced) && image_exists(&in_use));

    let low = [
        ("FLEET_STEP_CACHE", "off"),
        ("FLEET_DISK_LOW_WATER_MB", "1000000000"),
    ];
    let stack = Stack::start_with("imgprune", 1, 1, &low).await?;
    let worker = stack.worker_ids()[0].clone();
    let g = stack.dir.path().join("g");
    std::fs::create_dir_all(&g)?;
    std::fs::write(g.join("graph.yaml"), GRAPH)?;
    let graph = g.join("graph.yaml").display().to_string();
    let repo = repo(stack.dir.path(), "pruned")?;
    let pruned = || {
        stack.worker_metric(
            &worker,
            "fleet_worker_disk_pressure_evictions_total",
            &[("what", "image")],
        )
    };

    let first = probe(&stack, &graph, &repo).await?;
    assert_eq!(first.file, "pruned", "the job ran on the low disk");
    assert!(
        !image_exists(&replaced),
        "the rebuilt tag's old image is gone"
    );
    assert!(image_exists(&current), "a tagged image stays");
    assert!(image_exists(&in_use), "an image a container uses stays");
    assert!(image_exists("fleet-agent-py:1"), "the job's image stays");
    let after_first = pruned().await?;
    assert!(after_first >= 1.0, "counted: {after_first}");

    // Within the minute, the next job leaves a newly untagged image for the next prune.
    import(dir.path(), &kept, "newer")?;
    let tags = docker(&[
        "image",
        "inspect",
        "--format",
        "{{len .RepoTags}}",
        &current,
    ])?;
    assert_eq!(tags, "0", "the image it replaced is untagged now");
    let second = probe(&stack, &graph, &repo).await?;
    assert_eq!(second.file, "pruned");
    assert!(image_exists(&current), "no second prune within a minute");
    assert_eq!(pruned().await?, after_first);

    docker(&["rm", &holder])?;
    for image in [kept.as_str(), used.as_str(), &current, &in_use] {
        let _ = docker(&["rmi", image]);
    }
    Ok(())
}

/// Image affinity (`FLEET_IMAGE_AFFINITY_WAIT_MS`): once a worker has run a container of an
/// image, that image's jobs go to it while another worker is idle beside it; when it has gone,
/// a job of the image waits out the affinity wait and then runs on the other one, which holds
/// the image from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_an_image_go_to_the_worker_that_holds_it_and_to_another_when_it_is_gone(
) -> anyhow::Result<()> {
    let mut stack = Stack::start_with(
        "affinity",
        2,
        1,
        &[
            ("FLEET_STEP_CACHE", "off"),
            ("FLEET_IMAGE_AFFINITY_WAIT_MS", "3000"),
        ],
    )
    .await?;
    let workers = stack.worker_ids();
    let g = stack.dir.path().join("g");
    std::fs::create_dir_all(&g)?;
    std::fs::write(g.join("graph.yaml"), GRAPH)?;
    let graph = g.join("graph.yaml").display().to_string();
    let repo = repo(stack.dir.path(), "affine")?;

    // The first job goes to either worker (neither holds the image yet).
    let holder = probe(&stack, &graph, &repo).await?.worker;
    anyhow::ensure!(workers.contains(&holder), "ran on {holder:?}");
    let other = workers
        .iter()
        .find(|w| **w != holder)
        .cloned()
        .unwrap_or_default();
    // Without affinity two idle consumers of one queue share its jobs; with it, the holder
    // takes every one.
    let mut ran = Vec::new();
    for _ in 0..6 {
        ran.push(probe(&stack, &graph, &repo).await?.worker);
    }
    assert_eq!(
        ran,
        vec![holder.clone(); 6],
        "every job of the image on its holder"
    );

    // The holder stops: its image's queue has no consumer, and a job of the image goes on to
    // the other worker once the wait is over.
    stack.stop_worker(&holder)?;
    let p = probe(&stack, &graph, &repo).await?;
    assert_eq!(p.file, "affine");
    assert_eq!(p.worker, other, "the job its holder left");
    // It holds the image now: the next ones are its own.
    assert_eq!(probe(&stack, &graph, &repo).await?.worker, other);
    Ok(())
}
