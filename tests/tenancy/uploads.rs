//! Item 5: one upload crashes a coordinator. A pack of a few hundred KiB whose one file is
//! 300 MiB of zeros (a zlib bomb) is uploaded to a coordinator that takes files up to 32 MiB:
//! it is refused from the object's header, without being inflated; the coordinator's peak
//! memory (`VmHWM`) barely moves.

use fleet_tests::stack::{Stack, StackConfig};
use fleet_tests::submit::{git, git_repo};

/// The coordinator's peak resident memory so far, in KiB.
fn peak_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmHWM for {pid}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zlib_bomb_pack_is_refused_without_being_inflated() -> anyhow::Result<()> {
    let stack = Stack::start_config(StackConfig {
        tag: "tenbomb",
        workers: 0,
        coordinator_env: &[("FLEET_MAX_UPLOAD_MB", "8")],
        ..StackConfig::default()
    })
    .await?;
    let repo = git_repo(stack.dir.path(), "bomb", &[("a.txt", "a\n")])?;
    let big = std::fs::File::create(repo.join("zeros.bin"))?;
    big.set_len(300 << 20)?;
    drop(big);
    git(&repo, &["add", "zeros.bin"])?;
    git(
        &repo,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@localhost",
            "commit",
            "-qm",
            "bomb",
        ],
    )?;
    let commit = git(&repo, &["rev-parse", "HEAD"])?;
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("git rev-list --objects HEAD | git pack-objects -q --stdout")
        .current_dir(&repo)
        .output()?;
    anyhow::ensure!(out.status.success(), "pack-objects failed");
    let pack = out.stdout;
    assert!(pack.len() < 8 << 20, "the bomb is {} bytes", pack.len());

    let pid = stack.coordinator_pid().expect("a coordinator");
    let before = peak_kib(pid)?;
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/uploads?commit={commit}", stack.server))
        .header("Content-Type", "application/octet-stream")
        .body(pack)
        .send()
        .await?;
    let status = resp.status().as_u16();
    let said = resp.text().await?;
    let grew_mib = peak_kib(pid)?.saturating_sub(before) >> 10;
    eprintln!("coordinator peak memory grew by {grew_mib} MiB");
    assert_eq!(status, 400, "{said}");
    assert!(said.contains("expand past"), "{said}");
    assert!(
        grew_mib < 64,
        "the coordinator's peak memory grew by {grew_mib} MiB checking a {} MiB file",
        300
    );
    Ok(())
}
