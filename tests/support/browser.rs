//! Headless Chromium (Debian's `chromium` package) for pages the fleet serves or writes: the
//! DOM after the page's scripts ran, and a screenshot kept as test output under
//! `target/test-output/screenshots/`.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The browser binary: `FLEET_CHROMIUM`, else `chromium` on the PATH.
fn binary() -> String {
    std::env::var("FLEET_CHROMIUM").unwrap_or_else(|_| "chromium".into())
}

/// Runs headless Chromium on `url` with `extra` flags and a throwaway profile; its stdout.
fn headless(url: &str, extra: &[String]) -> anyhow::Result<String> {
    let profile = tempfile::tempdir()?;
    let out = Command::new(binary())
        .args([
            "--headless",
            // The tests run as root in CI: Chromium's own sandbox refuses root.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .output()
        .with_context(|| format!("cannot start `{}` (is Chromium installed?)", binary()))?;
    if !out.status.success() {
        bail!(
            "chromium failed on {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The page's DOM, serialised after its scripts ran.
pub fn dom(url: &str) -> anyhow::Result<String> {
    headless(url, &["--dump-dom".into()])
}

/// Where tests keep what they show: `FLEET_TEST_OUTPUT`, else the workspace's
/// `target/test-output`.
pub fn output_dir() -> PathBuf {
    match std::env::var_os("FLEET_TEST_OUTPUT") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-output"),
    }
}

/// A screenshot of the page (1280 × `height`) as `screenshots/<name>.png` in [`output_dir`];
/// its path.
/// Checked to be a PNG of some substance, not an empty frame.
pub fn screenshot(url: &str, name: &str, height: u32) -> anyhow::Result<PathBuf> {
    let dir = output_dir().join("screenshots");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{name}.png"));
    let _ = std::fs::remove_file(&path);
    headless(
        url,
        &[
            format!("--window-size=1280,{height}"),
            format!("--screenshot={}", path.display()),
        ],
    )?;
    let png =
        std::fs::read(&path).with_context(|| format!("no screenshot at {}", path.display()))?;
    if !png.starts_with(b"\x89PNG\r\n\x1a\n") || png.len() < 10_000 {
        bail!(
            "the screenshot {} is not a page ({} bytes)",
            path.display(),
            png.len()
        );
    }
    eprintln!("screenshot: {}", path.display());
    Ok(path)
}

/// A file's `file://` URL, with `fragment` (`#...`) when not empty.
pub fn file_url(path: &Path, fragment: &str) -> anyhow::Result<String> {
    let path = path.canonicalize()?;
    Ok(format!("file://{}{fragment}", path.display()))
}

/// Runs `images/agents/fleet-browser` (headless Chromium over the DevTools pipe) on the host with
/// `request` on stdin; its JSON answer.
pub fn fleet_browser(request: &serde_json::Value) -> anyhow::Result<serde_json::Value> {
    use std::io::Write;
    let mut child = Command::new("python3")
        .arg(crate::stack::workspace_root().join("images/agents/fleet-browser"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(request.to_string().as_bytes())?;
    let done = child.wait_with_output()?;
    serde_json::from_slice(&done.stdout).map_err(|e| {
        anyhow::anyhow!(
            "fleet-browser said no json ({e}): {} {}",
            String::from_utf8_lossy(&done.stdout),
            String::from_utf8_lossy(&done.stderr)
        )
    })
}
