//! fleet-bench worktree: a job's worktree materialised by the worker against `git clone
//! --local` of the same repository, side by side in one run (issue 13, item 5).
//!
//! A repository of `--files` files (100 per folder, ~200 bytes each) is committed with the git
//! CLI and packed as a submission is; the pack goes to S3. The worker's git cache then takes
//! it once (download, index into its mirror, check out: a job's first worktree of this repo on
//! a worker), and after that every round times, interleaved one for one, a checkout from the
//! mirror into a fresh job folder (`GitCache::materialize`: what every later writing job of the
//! repo costs), a later read-only job's worktree on the commit's shared checkout
//! (`GitCache::materialize_shared`: its own git directory and index copy, the files shared), a
//! writing job's worktree layered over that checkout where this machine can mount overlays
//! (`GitCache::materialize_layered`: the same git directory and an overlay mount) and `git clone
//! --local -q` (hard links to the objects, then git's own checkout). After each, one file is
//! changed and the job's commit of its worktree (`commit_all`, what a committing job ends with)
//! is timed too, for the checkout and the overlay.

use super::stats;
use fleet_tests::stack::{s3_blobs, unique_namespace};
use std::path::Path;
use std::process::Command;
use std::time::Instant;
use worker::git::{pack_commit, GitCache};

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("git")
        .args(["-c", "user.name=bench", "-c", "user.email=bench@localhost"])
        .args(args)
        .current_dir(dir)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn make_repo(dir: &Path, files: usize) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    git(dir, &["init", "-q"])?;
    for i in 0..files {
        let folder = dir.join(format!("pkg{:03}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&folder)?;
        }
        let body = format!("def f{i}(x):\n    return x + {i}\n").repeat(6);
        std::fs::write(folder.join(format!("m{i:05}.py")), body)?;
    }
    git(dir, &["add", "-A"])?;
    git(dir, &["commit", "-qm", "bench"])?;
    Ok(())
}

pub async fn run(files: usize, rounds: usize) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let repo = tmp.path().join("repo");
    make_repo(&repo, files)?;
    let out = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(&repo)
        .output()?;
    let commit = String::from_utf8(out.stdout)?.trim().to_string();
    let packed = pack_commit(&repo, &commit)?;
    let ns = unique_namespace("wt");
    let blobs = s3_blobs(&ns);
    let key = format!("packs/{commit}.pack");
    blobs.put(&key, packed.pack).await?;

    // Files owned by a sandbox user, as a worker's are; layered where the machine allows.
    let layered =
        worker::git::layered::decide(worker::git::layered::Mode::Auto, &tmp.path().join("probe"))
            .map_err(anyhow::Error::msg)?;
    let cache = GitCache::open(&tmp.path().join("cache"), Some((10001, 10001)), layered)?;
    let t = Instant::now();
    cache
        .ensure_packs(&blobs, std::slice::from_ref(&key))
        .await?;
    let first = cache
        .materialize(&commit, &tmp.path().join("job-first"))
        .await?;
    let first_secs = t.elapsed().as_secs_f64();
    let checked = worker::git::paths_on_disk(&first.dir)?;
    anyhow::ensure!(
        checked.len() == files,
        "{} files checked out",
        checked.len()
    );

    // The commit's shared checkout, made once (a read-only job's first on the worker).
    let t = Instant::now();
    let (made, _lease) = cache
        .materialize_shared(&commit, &tmp.path().join("job-shared-first"))
        .await?;
    let shared_first_secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(made.is_shared(), "the checkout is not shared");

    let (mut fleet, mut clone, mut shared) = (Vec::new(), Vec::new(), Vec::new());
    let (mut layers, mut diff_private, mut diff_layered) = (Vec::new(), Vec::new(), Vec::new());
    let mut mounted = Vec::new();
    // A writing job's commit after it changed one file (`commit_all`: the index's stat data
    // spares hashing the others): the same commit from either worktree.
    let mut commits = std::collections::BTreeSet::new();
    let mut diff_once = |wt: &worker::git::Worktree, out: &mut Vec<f64>| -> anyhow::Result<()> {
        std::fs::write(wt.dir.join("pkg000/m00000.py"), "changed\n")?;
        let t = Instant::now();
        let made = wt.commit_all("one change")?;
        out.push(t.elapsed().as_secs_f64());
        let made = made.ok_or_else(|| anyhow::anyhow!("the change was not committed"))?;
        let changes = wt.changes(&wt.base(), &made)?;
        anyhow::ensure!(changes.len() == 1, "the commit holds {changes:?}");
        commits.insert(made);
        Ok(())
    };
    for i in 0..rounds {
        // Alternating which goes first; nothing deleted until the end (ext4 looks long for a
        // free inode among many recently deleted ones, which would charge whichever ran after
        // a deletion).
        let dest = tmp.path().join(format!("clone-{i}"));
        let clone_once = || -> anyhow::Result<f64> {
            let t = Instant::now();
            let st = Command::new("git")
                .args(["clone", "--local", "-q"])
                .arg(&repo)
                .arg(&dest)
                .status()?;
            anyhow::ensure!(st.success(), "git clone --local failed");
            Ok(t.elapsed().as_secs_f64())
        };
        if i % 2 == 1 {
            clone.push(clone_once()?);
        }
        let t = Instant::now();
        let private = cache
            .materialize(&commit, &tmp.path().join(format!("job-{i}")))
            .await?;
        fleet.push(t.elapsed().as_secs_f64());
        diff_once(&private, &mut diff_private)?;
        if layered {
            let dest = tmp.path().join(format!("job-rw-{i}"));
            let t = Instant::now();
            let (wt, lease) = cache.materialize_layered(&commit, &dest).await?;
            layers.push(t.elapsed().as_secs_f64());
            anyhow::ensure!(
                wt.is_layered() && !lease.created(),
                "a writer was not layered"
            );
            diff_once(&wt, &mut diff_layered)?;
            mounted.push((dest, lease));
        }
        let t = Instant::now();
        let (wt, lease) = cache
            .materialize_shared(&commit, &tmp.path().join(format!("job-ro-{i}")))
            .await?;
        shared.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(
            wt.dir == made.dir && !lease.created(),
            "a read-only job did not share"
        );
        drop(lease);
        if i % 2 == 0 {
            clone.push(clone_once()?);
        }
    }
    anyhow::ensure!(
        commits.len() == 1,
        "the worktrees committed different trees: {commits:?}"
    );
    for (dest, lease) in mounted {
        worker::git::layered::unmount_job(&dest);
        drop(lease);
    }
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let ratio = mean(&fleet) / mean(&clone);
    let layered_ratio = layered.then(|| mean(&layers) / mean(&clone));
    let shared_ratio = mean(&shared) / mean(&clone);
    println!("## Worktree of a {files}-file repository (ms)\n");
    println!("| path | n | mean | p50 | p95 | min |\n|---|---|---|---|---|---|");
    println!(
        "{}",
        stats("worker: checkout from its mirror (a later job)", &mut fleet)
    );
    println!(
        "{}",
        stats(
            "worker: a read-only job on the commit's shared checkout",
            &mut shared
        )
    );
    if layered {
        println!(
            "{}",
            stats(
                "worker: a writing job's overlay on the commit's shared checkout",
                &mut layers
            )
        );
    }
    println!("{}", stats("git clone --local", &mut clone));
    println!(
        "{}",
        stats(
            "worker: commit after one change, checked-out worktree",
            &mut diff_private
        )
    );
    if layered {
        println!(
            "{}",
            stats(
                "worker: commit after one change, overlay worktree",
                &mut diff_layered
            )
        );
    } else {
        println!(
            "\n(no overlay: this process cannot mount one, or no docker engine shares its mounts)"
        );
    }
    println!(
        "\nratio worker / clone (mean): {ratio:.2}, read-only on the shared checkout \
         {shared_ratio:.3}; the repository's first job on a worker (download, index, checkout): \
         {:.0} ms; the shared checkout's making (a commit's first read-only job): {:.0} ms\n",
        first_secs * 1e3,
        shared_first_secs * 1e3
    );
    println!(
        "{}",
        serde_json::json!({"bench": "worktree", "files": files, "rounds": rounds,
            "worker_ms": mean(&fleet) * 1e3, "clone_ms": mean(&clone) * 1e3,
            "ratio": ratio, "first_ms": first_secs * 1e3,
            "shared_ms": mean(&shared) * 1e3, "shared_ratio": shared_ratio,
            "shared_first_ms": shared_first_secs * 1e3,
            "layered": layered,
            "layered_ms": layered.then(|| mean(&layers) * 1e3),
            "layered_ratio": layered_ratio,
            "commit_private_ms": mean(&diff_private) * 1e3,
            "commit_layered_ms": layered.then(|| mean(&diff_layered) * 1e3)})
    );
    Ok(())
}
