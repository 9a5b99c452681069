//! Checkouts shared by a commit's read-only jobs (issue 13, item 5), on the real stack: later
//! read-only jobs of a commit read the files the first one checked out (the same inodes), none
//! of them can change those files in any way, a read-write job of the same commit gets a
//! worktree of its own whose changes never reach the shared one (an overlay on it: what it
//! changes, adds and removes is its commit's, and its worker leaves nothing mounted, even when
//! killed), a restarted worker trusts no
//! checkout it left, with a warm pool only a large commit is shared, and a worker whose disk is
//! low removes the idle ones, and empties its git mirror when no job holds it. (The step cache
//! is off: every probe must run.)

use fleet_tests::stack::Stack;
use fleet_tests::submit::{git_repo, submit_yaml};
use std::path::Path;
use std::time::Duration;

/// A graph of one command node on the worktree `worktree` (a YAML flow mapping); `command` is
/// the inside of a YAML double-quoted string.
fn one_command(name: &str, node: &str, command: &str, worktree: &str) -> String {
    format!(
        r#"
name: {name}
start: {node}
defaults:
  image: fleet-agent-py:1
  timeout_seconds: 120
nodes:
  {node}:
    kind: command
    commands:
      - "{command}"
    worktree: {worktree}
    routes:
      - to: done
  done:
    kind: exit
    status: {node}.ok
"#
    )
}

/// A read-only probe that reports what it sees and tries every way of changing the worktree;
/// then a read-write job of the same commit that changes it.
fn graph() -> String {
    one_command(
        "shared-probe",
        "probe",
        r#"sh -c 'echo ino=$(stat -c %i probe.txt); echo file=$(cat probe.txt); for how in \"echo x > probe.txt\" \"echo x >> probe.txt\" \"touch new.txt\" \"rm -f probe.txt\" \"chmod 777 probe.txt\" \"mv probe.txt moved.txt\" \"mkdir d\" \"ln -s /etc/passwd link\"; do if sh -c \"$how\" 2>/dev/null; then echo changed=$how; fi; done; echo after=$(cat probe.txt)'"#,
        "{ from: base, mode: ro }",
    )
}

fn writer() -> String {
    one_command(
        "shared-writer",
        "write",
        r#"sh -c 'echo changed-by-a-writer > probe.txt; echo ino=$(stat -c %i probe.txt)'"#,
        "{ from: base, mode: rw }",
    )
}

/// A repository with `probe.txt` holding `content`, and `extra` more files.
fn repo(dir: &Path, name: &str, content: &str, extra: usize) -> anyhow::Result<String> {
    let names: Vec<String> = (0..extra).map(|i| format!("many/f{i}.txt")).collect();
    let bodies: Vec<String> = (0..extra).map(|i| i.to_string()).collect();
    let mut files = vec![("probe.txt", content)];
    files.extend(
        names
            .iter()
            .map(String::as_str)
            .zip(bodies.iter().map(String::as_str)),
    );
    Ok(git_repo(dir, name, &files)?.display().to_string())
}

/// Runs the graph `yaml` on `repo` (a new input each time: the same submission twice is one
/// run) and returns the `key=value` lines its one command printed.
async fn run(stack: &Stack, yaml: &str, node: &str, repo: &str) -> anyhow::Result<Vec<String>> {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let input = serde_json::json!({ "probe": n });
    let run = submit_yaml(stack, &format!("p{n}"), yaml, Path::new(repo), &input)?;
    let status = stack.wait_run(&run, Duration::from_secs(120)).await?;
    anyhow::ensure!(status["status"] == "succeeded", "{status}");
    let stdout = stack
        .node_artifact_text(&run, node, 1, "logs/command_0.stdout")
        .await?;
    Ok(stdout.lines().map(str::to_string).collect())
}

fn field(lines: &[String], key: &str) -> String {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_default()
        .to_string()
}

fn changed(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("changed="))
        .map(str::to_string)
        .collect()
}

async fn worktrees(stack: &Stack, worker: &str, how: &str) -> anyhow::Result<f64> {
    stack
        .worker_metric(worker, "fleet_worker_worktrees_total", &[("how", how)])
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_jobs_of_a_commit_share_one_checkout_that_none_can_change() -> anyhow::Result<()>
{
    let mut stack = Stack::start_with("shared", 1, 2, &[("FLEET_STEP_CACHE", "off")]).await?;
    let worker = stack.worker_ids()[0].clone();
    let secret = format!("content-{}", std::process::id());
    let repo = repo(stack.dir.path(), "repo", &secret, 10)?;

    let first = run(&stack, &graph(), "probe", &repo).await?;
    assert_eq!(field(&first, "file"), secret, "the checkout is mounted");
    assert_eq!(changed(&first), Vec::<String>::new(), "{first:?}");
    assert_eq!(field(&first, "after"), secret);
    assert_eq!(worktrees(&stack, &worker, "shared_new").await?, 1.0);
    let inode = field(&first, "ino");

    // Later read-only jobs, one after another and two at once, read the same files.
    let mut later = vec![run(&stack, &graph(), "probe", &repo).await?];
    let probe = graph();
    let (a, b) = tokio::join!(
        run(&stack, &probe, "probe", &repo),
        run(&stack, &probe, "probe", &repo)
    );
    later.push(a?);
    later.push(b?);
    for p in &later {
        assert_eq!(field(p, "ino"), inode, "the commit's checkout is shared");
        assert_eq!(field(p, "file"), secret);
        assert_eq!(
            changed(p),
            Vec::<String>::new(),
            "no way of changing it works"
        );
        assert_eq!(field(p, "after"), secret);
    }
    assert_eq!(worktrees(&stack, &worker, "shared_new").await?, 1.0);
    assert_eq!(worktrees(&stack, &worker, "shared").await?, 3.0);

    // A read-write job of the same commit writes a worktree of its own (an overlay on the
    // checkout: the stack's worker runs as root)...
    let w = run(&stack, &writer(), "write", &repo).await?;
    assert!(!field(&w, "ino").is_empty(), "{w:?}");
    assert_eq!(worktrees(&stack, &worker, "layered").await?, 1.0);
    assert_eq!(worktrees(&stack, &worker, "private").await?, 0.0);
    // ...and what it wrote never reaches the commit's read-only jobs.
    let after = run(&stack, &graph(), "probe", &repo).await?;
    assert_eq!(field(&after, "file"), secret, "{after:?}");
    assert_eq!(field(&after, "ino"), inode);

    // A restarted worker trusts no checkout it left: the folder is emptied, the next read-only
    // job checks the commit out again.
    let checkouts = stack
        .dir
        .path()
        .join(format!("work-{worker}"))
        .join("git/checkouts");
    assert!(
        checkouts.join(field_commit(&checkouts)?).exists(),
        "the shared checkout is under {}",
        checkouts.display()
    );
    stack.kill_worker(&worker)?;
    stack.start_worker(&worker)?;
    let again = run(&stack, &graph(), "probe", &repo).await?;
    assert_eq!(field(&again, "file"), secret);
    assert_ne!(
        field(&again, "ino"),
        inode,
        "checked out again after the restart"
    );
    assert_eq!(worktrees(&stack, &worker, "shared_new").await?, 1.0);
    Ok(())
}

/// The one commit checked out under `checkouts` (a folder named after its 40-hex id).
fn field_commit(checkouts: &Path) -> anyhow::Result<String> {
    let names: Vec<String> = std::fs::read_dir(checkouts)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.len() == 40 && n.chars().all(|c| c.is_ascii_hexdigit()))
        .collect();
    anyhow::ensure!(names.len() == 1, "checkouts: {names:?}");
    Ok(names[0].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_warm_pool_only_a_large_commit_is_shared() -> anyhow::Result<()> {
    let stack = Stack::start_with(
        "sharedwarm",
        1,
        1,
        &[("FLEET_WARM_CONTAINERS", "1"), ("FLEET_STEP_CACHE", "off")],
    )
    .await?;
    let worker = stack.worker_ids()[0].clone();
    let small = repo(stack.dir.path(), "small", "small", 10)?;
    let large = repo(stack.dir.path(), "large", "large", 2_000)?;

    // A small commit: a worktree of its own each time (the warm container is worth more).
    for _ in 0..2 {
        let p = run(&stack, &graph(), "probe", &small).await?;
        assert_eq!(field(&p, "file"), "small");
        assert_eq!(changed(&p), Vec::<String>::new(), "{p:?}");
    }
    assert_eq!(worktrees(&stack, &worker, "private").await?, 2.0);
    // A large one: shared, its container started cold.
    let (a, b) = (
        run(&stack, &graph(), "probe", &large).await?,
        run(&stack, &graph(), "probe", &large).await?,
    );
    assert_eq!(
        field(&a, "ino"),
        field(&b, "ino"),
        "the large commit is shared"
    );
    assert_eq!(changed(&b), Vec::<String>::new(), "{b:?}");
    assert_eq!(field(&b, "file"), "large");
    assert_eq!(worktrees(&stack, &worker, "private").await?, 2.0);
    assert_eq!(worktrees(&stack, &worker, "shared_new").await?, 1.0);
    assert_eq!(worktrees(&stack, &worker, "shared").await?, 1.0);
    Ok(())
}

/// The commits checked out under `checkouts`, and whether anything else is left there.
fn checked_out(checkouts: &Path) -> anyhow::Result<(usize, Vec<String>)> {
    let mut commits = 0;
    let mut other = Vec::new();
    for e in std::fs::read_dir(checkouts)?.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.len() == 40 && n.chars().all(|c| c.is_ascii_hexdigit()) {
            commits += 1;
        } else {
            other.push(n);
        }
    }
    Ok((commits, other))
}

/// One worker running `concurrency` jobs at once whose disk is always low: its low-water
/// mark is above any disk's free space.
async fn low_disk_stack(tag: &str, concurrency: usize) -> anyhow::Result<Stack> {
    let low = [
        ("FLEET_STEP_CACHE", "off"),
        ("FLEET_DISK_LOW_WATER_MB", "1000000000"),
    ];
    Stack::start_with(tag, 1, concurrency, &low).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_disk_is_low_removes_idle_shared_checkouts() -> anyhow::Result<()> {
    let stack = low_disk_stack("sharedlow", 1).await?;
    let worker = stack.worker_ids()[0].clone();
    let one = repo(stack.dir.path(), "one", "one", 3)?;
    let two = repo(stack.dir.path(), "two", "two", 3)?;
    let checkouts = stack
        .dir
        .path()
        .join(format!("work-{worker}"))
        .join("git/checkouts");

    let a = run(&stack, &graph(), "probe", &one).await?;
    assert_eq!(field(&a, "file"), "one");
    assert_eq!(checked_out(&checkouts)?, (1, vec![]));
    // The next job finds the disk low: the idle checkout goes before its own is made.
    let b = run(&stack, &graph(), "probe", &two).await?;
    assert_eq!(field(&b, "file"), "two");
    assert_eq!(
        checked_out(&checkouts)?,
        (1, vec![]),
        "the idle one is gone"
    );
    let again = run(&stack, &graph(), "probe", &one).await?;
    assert_eq!(field(&again, "file"), "one", "made again when needed");
    assert_eq!(changed(&again), Vec::<String>::new());
    assert_eq!(worktrees(&stack, &worker, "shared_new").await?, 3.0);
    assert_eq!(worktrees(&stack, &worker, "shared").await?, 0.0);
    let evicted = stack
        .worker_metric(
            &worker,
            "fleet_worker_disk_pressure_evictions_total",
            &[("what", "checkout")],
        )
        .await?;
    assert_eq!(evicted, 2.0);
    // The git mirror too, when no job held it: the second and third jobs each emptied it, and
    // fetched their pack again.
    let emptied = stack
        .worker_metric(
            &worker,
            "fleet_worker_disk_pressure_evictions_total",
            &[("what", "mirror")],
        )
        .await?;
    assert_eq!(emptied, 2.0);
    let packs = checkouts.with_file_name("packs-indexed");
    assert_eq!(
        std::fs::read_dir(&packs)?.count(),
        1,
        "only the last run's pack is in the mirror"
    );
    Ok(())
}

/// A writer that waits for the test's word (a file `go` in its worktree) before it writes
/// and commits; its commit is read by the next node.
const HELD_WRITER: &str = r#"
name: held-writer
start: write
defaults:
  image: fleet-agent-py:1
  timeout_seconds: 120
nodes:
  write:
    kind: command
    commands:
      - "sh -c 'while [ ! -e go ]; do sleep 0.1; done; echo by-the-writer > probe.txt; echo wrote=yes'"
    worktree: { from: base, mode: rw, commit: true }
    writes: ["'**'"]
    routes:
      - to: read
  read:
    kind: command
    commands:
      - "sh -c 'echo probe=$(cat probe.txt)'"
    worktree: { from: write, mode: ro }
    routes:
      - to: done
  done:
    kind: exit
    status: read.ok
"#;

/// The mirror's objects are read by every job's git directory, so a job holds the mirror
/// until it ends: another job that finds the disk low meanwhile leaves it be, and the holder
/// commits on it. Once nobody holds it, the next low disk empties it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_holding_the_mirror_keeps_it_when_the_disk_is_low() -> anyhow::Result<()> {
    let stack = low_disk_stack("sharedheld", 2).await?;
    let worker = stack.worker_ids()[0].clone();
    let emptied = || {
        stack.worker_metric(
            &worker,
            "fleet_worker_disk_pressure_evictions_total",
            &[("what", "mirror")],
        )
    };
    let one = repo(stack.dir.path(), "one", "one", 3)?;
    let two = repo(stack.dir.path(), "two", "two", 3)?;
    let held = submit_yaml(
        &stack,
        "held",
        HELD_WRITER,
        Path::new(&one),
        &serde_json::json!({}),
    )?;
    // The writer's worktree, once its job is waiting in it.
    let jobs = stack.dir.path().join(format!("work-{worker}/jobs"));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let wt = loop {
        let found = std::fs::read_dir(&jobs).into_iter().flatten().flatten();
        let waiting = found
            .map(|e| e.path().join("wt"))
            .find(|wt| wt.join("probe.txt").exists());
        if let Some(wt) = waiting {
            break wt;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the writer never started"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Another job finds the disk low while the writer holds the mirror.
    let other = run(&stack, &graph(), "probe", &two).await?;
    assert_eq!(field(&other, "file"), "two");
    assert_eq!(emptied().await?, 0.0, "the held mirror was emptied");
    std::fs::write(wt.join("go"), "")?;
    let status = stack.wait_run(&held, Duration::from_secs(120)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    let read = stack
        .node_artifact_text(&held, "read", 1, "logs/command_0.stdout")
        .await?;
    assert!(read.contains("probe=by-the-writer"), "{read}");
    // Nobody holds it now: the next low disk empties it.
    let again = run(&stack, &graph(), "probe", &two).await?;
    assert_eq!(field(&again, "file"), "two");
    assert!(emptied().await? >= 1.0, "an idle mirror is emptied");
    Ok(())
}

/// A writer that changes its worktree every way it can (an overlay on the commit's shared
/// checkout); its commit is handed to a reader that reports what it got.
const LAYERED: &str = r#"
name: layered-writer
start: write
defaults:
  image: fleet-agent-py:1
  timeout_seconds: 60
nodes:
  write:
    kind: command
    commands:
      - "sh -c 'echo by-the-writer > probe.txt && echo more >> many/f1.txt && rm many/f2.txt && mv many/f3.txt moved.txt && mkdir -p new/deep && echo added > new/deep/added.txt && ln probe.txt hard.txt && echo wrote=yes'"
    worktree: { from: base, mode: rw, commit: true }
    writes: ["'**'"]
    routes:
      - to: read
  read:
    kind: command
    commands:
      - "sh -c 'echo probe=$(cat probe.txt); echo f1=$(cat many/f1.txt | tr \"\\n\" +); echo f2=$(test -e many/f2.txt && echo there || echo gone); echo f3=$(test -e many/f3.txt && echo there || echo gone); echo moved=$(cat moved.txt); echo added=$(cat new/deep/added.txt); echo hard=$(cat hard.txt); echo files=$(find many -type f | wc -l)'"
    worktree: { from: write, mode: ro }
    routes:
      - to: done
  done:
    kind: exit
    status: read.ok
"#;

/// What `LAYERED`'s reader must find: every change its writer made, committed.
fn assert_every_change_committed(got: &[String]) {
    assert_eq!(field(got, "probe"), "by-the-writer", "{got:?}");
    assert_eq!(field(got, "f1"), "1more+");
    assert_eq!(field(got, "f2"), "gone", "a removal is committed");
    assert_eq!(field(got, "f3"), "gone", "a rename is committed");
    assert_eq!(field(got, "moved"), "3");
    assert_eq!(field(got, "added"), "added");
    assert_eq!(field(got, "hard"), "by-the-writer");
    assert_eq!(field(got, "files"), "8");
}

fn trasher() -> String {
    one_command(
        "trasher",
        "trash",
        r#"sh -c 'chmod 700 many/f4.txt; echo more >> many/f1.txt; ln -s /etc/passwd link; ln -s /etc/passwd many/f5.txt 2>/dev/null; rm -rf ./* ./.[!.]*; echo left=$(ls -A | wc -l)'"#,
        "{ from: base, mode: rw }",
    )
}

/// What reads the base commit: `probe.txt`, and how many files `many/` holds.
fn base_reader() -> String {
    one_command(
        "base-reader",
        "read",
        r#"sh -c 'echo probe=$(cat probe.txt); echo f1=$(cat many/f1.txt); echo f4=$(stat -c %a many/f4.txt); echo files=$(find many -type f | wc -l); echo extra=$(ls moved.txt new link hard.txt 2>/dev/null | wc -l)'"#,
        "{ from: base, mode: ro }",
    )
}

/// Mount points under `dir` in this machine's mount table (the tests run in the workers' mount
/// namespace).
fn mounts_under(dir: &Path) -> anyhow::Result<Vec<String>> {
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    let dir = dir.canonicalize()?;
    Ok(table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(&dir))
        .map(str::to_string)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_layered_worktree_commits_every_change_and_leaves_the_shared_checkout_as_it_was(
) -> anyhow::Result<()> {
    let stack = Stack::start_with("layered", 1, 2, &[("FLEET_STEP_CACHE", "off")]).await?;
    let worker = stack.worker_ids()[0].clone();
    let repo = repo(stack.dir.path(), "repo", "original", 10)?;
    let work = stack.dir.path().join(format!("work-{worker}"));

    // The commit's read-only jobs make and read its checkout.
    let before = run(&stack, &base_reader(), "read", &repo).await?;
    assert_eq!(field(&before, "probe"), "original");
    assert_eq!(field(&before, "files"), "10");

    // The writer's every change is in its commit, as the next node reads it...
    let got = run(&stack, LAYERED, "read", &repo).await?;
    assert_eq!(worktrees(&stack, &worker, "layered").await?, 1.0, "{got:?}");
    assert_every_change_committed(&got);

    // A writer that changes modes, links out and removes every file (no commit: its write
    // scope would refuse links and mode changes).
    let trashed = run(&stack, &trasher(), "trash", &repo).await?;
    assert_eq!(field(&trashed, "left"), "0", "{trashed:?}");
    assert_eq!(worktrees(&stack, &worker, "layered").await?, 2.0);

    // ...and none of it reached the checkout the commit's read-only jobs share.
    let after = run(&stack, &base_reader(), "read", &repo).await?;
    assert_eq!(
        (
            field(&after, "probe"),
            field(&after, "f1"),
            field(&after, "f4"),
            field(&after, "files"),
            field(&after, "extra"),
        ),
        (
            "original".into(),
            "1".into(),
            "644".into(),
            "10".into(),
            "0".into()
        ),
        "{after:?}"
    );
    assert_eq!(worktrees(&stack, &worker, "shared").await?, 1.0);
    // Every job folder is gone, and nothing is left mounted.
    assert_eq!(mounts_under(&work)?, Vec::<String>::new());
    Ok(())
}

fn slow_writer() -> String {
    one_command(
        "slow-writer",
        "write",
        r#"sh -c 'echo x > probe.txt; sleep 20'"#,
        "{ from: base, mode: rw }",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_overlays_are_unmounted_when_it_starts_again() -> anyhow::Result<()> {
    let mut stack = Stack::start_with("layeredkill", 1, 1, &[("FLEET_STEP_CACHE", "off")]).await?;
    let worker = stack.worker_ids()[0].clone();
    let repo = repo(stack.dir.path(), "repo", "original", 3)?;
    let jobs = stack.dir.path().join(format!("work-{worker}/jobs"));
    let run = submit_yaml(
        &stack,
        "slow",
        &slow_writer(),
        Path::new(&repo),
        &serde_json::json!({}),
    )?;
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while mounts_under(&jobs)?.is_empty() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the writer's overlay was never mounted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stack.kill_worker(&worker)?;
    assert_eq!(mounts_under(&jobs)?.len(), 1, "a killed worker leaves it");
    stack.start_worker(&worker)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !mounts_under(&jobs)?.is_empty() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the restarted worker left the overlay mounted: {:?}",
            mounts_under(&jobs)?
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The run goes on: the job runs again on the restarted worker.
    let status = stack.wait_run(&run, Duration::from_secs(150)).await?;
    assert_eq!(status["status"], "succeeded", "{status}");
    assert_eq!(mounts_under(&jobs)?, Vec::<String>::new());
    Ok(())
}

/// A writer allowed `probe.txt` only, that also rewrites `many/f1.txt` to the same size and
/// puts its modification time back: what an agent would do to slip a change past a check
/// that trusted the files' stat data.
fn sly_writer() -> String {
    one_command(
        "sly-writer",
        "write",
        r#"sh -c 'echo by-the-writer > probe.txt; t=$(stat -c %Y many/f1.txt); printf 9 > many/f1.txt; touch -d @$t many/f1.txt; echo sly=$(cat many/f1.txt)'"#,
        "{ from: base, mode: rw, commit: true }\n    writes: [\"probe.txt\"]",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_warm_pool_a_small_commits_writer_commits_every_change_from_a_worktree_of_its_own(
) -> anyhow::Result<()> {
    // A small commit's jobs check out worktrees of their own (for the warm container), whose git
    // directories are made only when the harness first reads git, after the container ran.
    let stack = Stack::start_with(
        "ownwriter",
        1,
        1,
        &[("FLEET_WARM_CONTAINERS", "1"), ("FLEET_STEP_CACHE", "off")],
    )
    .await?;
    let worker = stack.worker_ids()[0].clone();
    let repo = repo(stack.dir.path(), "repo", "original", 10)?;

    let got = run(&stack, LAYERED, "read", &repo).await?;
    assert_eq!(worktrees(&stack, &worker, "private").await?, 2.0, "{got:?}");
    assert_every_change_committed(&got);

    // The change outside its scope is seen, however well its stat data were put back.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let input = serde_json::json!({ "sly": N.fetch_add(1, std::sync::atomic::Ordering::Relaxed) });
    let run = submit_yaml(&stack, "sly", &sly_writer(), Path::new(&repo), &input)?;
    let status = stack.wait_run(&run, Duration::from_secs(120)).await?;
    assert_ne!(status["status"], "succeeded", "{status}");
    let stdout = stack
        .node_artifact_text(&run, "write", 1, "logs/command_0.stdout")
        .await?;
    assert!(
        stdout.contains("sly=9"),
        "the writer did rewrite it: {stdout}"
    );
    assert!(
        status.to_string().contains("many/f1.txt"),
        "the refusal names the file: {status}"
    );
    assert_eq!(worktrees(&stack, &worker, "private").await?, 3.0);
    Ok(())
}
