//! Named fault points, for the fault tests: a process started with `FLEET_FAULT_PAUSE=<name>`
//! and `FLEET_FAULT_DIR=<dir>` stops at the first pass through the point `<name>`, writes
//! `<dir>/<name>.reached` and waits until `<dir>/<name>.resume` exists (or until the test kills
//! it, which is the point). Without the variables a point costs one environment lookup, done
//! once per process.
//!
//! Points (each named where it is passed): `worker.before_container`, `worker.mid_run`,
//! `worker.after_store`, `worker.after_ack`, `coordinator.after_commit`,
//! `coordinator.after_claim`, `coordinator.after_publish`, `coordinator.before_first_mirror`,
//! and in the Docker adapter `docker.after_create` (before the start), `docker.before_exec`,
//! `docker.in_exec` (the command running).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use tracing::warn;

struct Armed {
    name: String,
    dir: PathBuf,
    fired: AtomicBool,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let name = std::env::var("FLEET_FAULT_PAUSE").ok()?;
            let dir = std::env::var("FLEET_FAULT_DIR").ok()?;
            Some(Armed {
                name,
                dir: PathBuf::from(dir),
                fired: AtomicBool::new(false),
            })
        })
        .as_ref()
}

/// Passes the fault point `name`: a no-op unless this process was armed for it.
pub async fn point(name: &str) {
    let Some(armed) = armed() else { return };
    if armed.name != name || armed.fired.swap(true, Ordering::SeqCst) {
        return;
    }
    warn!(
        point = name,
        "fault point reached; pausing until told to resume"
    );
    let reached = armed.dir.join(format!("{name}.reached"));
    if let Err(e) = std::fs::write(&reached, b"") {
        warn!(point = name, error = %e, "could not mark the fault point");
    }
    let resume = armed.dir.join(format!("{name}.resume"));
    while !resume.exists() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    warn!(point = name, "fault point resumed");
}
