//! The runner's pure parts: results it makes itself, execution names and folders, error
//! classes, resources from the environment, folder sweeps, the quota outcome.

use super::cleanup::{folder_tag, left_by_another_process, stale};
use super::execute::quota_exceeded;
use super::execution::{container_name, process_nonce, JobFolder};
use super::results::without_host_paths;
use super::*;
use crate::blobs::BlobError;
use crate::git::GitError;
use crate::sandbox::{disk, SandboxError};
use serde_json::{json, Value};
use shared::messages::JobStatus;
use std::time::Duration;

#[test]
fn no_host_path_of_the_worker_survives_in_a_reported_output() {
    let out = json!({
        "failures": [{"message": "/srv/fleet/w1/jobs/r1.fix.1-a1-e1-ab12/wt/src/x.py:3: boom"}],
        "n": 3,
    });
    let clean = without_host_paths(out);
    let text = clean.to_string();
    assert!(!text.contains("/srv/fleet"), "{text}");
    assert!(text.contains("src/x.py:3: boom"), "{text}");
    assert_eq!(clean["n"], 3);
}

fn spec() -> JobSpec {
    serde_json::from_value(json!({
        "v": WIRE_VERSION, "job_id": "r1.po.1", "run_id": "r1", "node": "po", "visit": 1,
        "attempt": 2, "kind": "harness", "graph_ref": "g", "image": null,
        "timeout_seconds": 60, "params": {}, "context_files": [], "commands": [],
        "worktree": null, "artifact_prefix": "runs/r1/po_1/",
        "agent": shared::messages::AgentConfig::default(), "vars": null,
    }))
    .expect("a job spec")
}

/// A start and an end a second apart.
fn ran() -> Ran {
    let started_at = "2024-01-01T00:00:00.000Z".parse().unwrap();
    Ran {
        started_at,
        finished_at: started_at + chrono::TimeDelta::seconds(1),
    }
}

#[test]
fn the_panic_message_comes_from_str_and_string_payloads() {
    let caught = |f: fn()| std::panic::catch_unwind(f).expect_err("it panics");
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let literal = caught(|| panic!("a literal"));
    let formatted = caught(|| panic!("formatted {}", 42));
    let other = caught(|| std::panic::panic_any(7_u8));
    std::panic::set_hook(prev);
    assert_eq!(panic_message(literal.as_ref()), "a literal");
    assert_eq!(panic_message(formatted.as_ref()), "formatted 42");
    assert_eq!(panic_message(other.as_ref()), "a panic without a message");
}

#[test]
fn a_panic_becomes_an_error_result_of_the_same_attempt() {
    let r = panicked_result(&spec(), "w1", "e1-x", ran(), "boom");
    assert_eq!(r.status, JobStatus::Error);
    assert_eq!(
        r.error.as_deref(),
        Some("the worker panicked running this job: boom")
    );
    assert_eq!(r.attempt, 2);
    assert_eq!(r.job_id.as_str(), "r1.po.1");
    assert_eq!(r.run_id.as_str(), "r1");
    assert_eq!(r.worker, "w1");
    assert_eq!(r.execution, "e1-x");
    assert_eq!(
        (r.started_at, r.finished_at),
        (ran().started_at, ran().finished_at)
    );
    assert_eq!(r.output, Value::Null);
    assert!(r.commit.is_none() && r.pack.is_none() && r.artifacts.is_empty());
    // A huge message is cut, so the result stays small.
    let long = panicked_result(&spec(), "w1", "e2-x", ran(), &"x".repeat(10_000));
    assert!(long.error.unwrap().len() < 2_200);
}

#[test]
fn container_names_carry_the_execution_and_stay_docker_safe() {
    let name = container_name("w/1", &spec(), "e3-0abc12");
    assert_eq!(name, "fleet-w_1-r1.po.1-a2-e3-0abc12");
    assert_ne!(
        container_name("w1", &spec(), "e1-0abc12"),
        container_name("w1", &spec(), "e2-0abc12")
    );
}

#[test]
fn each_execution_writes_its_artifacts_beneath_a_folder_of_its_own() {
    let at = |tag: &str| Execution {
        tag: tag.to_string(),
        dir: std::path::PathBuf::from("/unused"),
        container: String::new(),
    };
    assert_eq!(
        at("e1-0abc12").artifact_prefix(&spec()),
        "runs/r1/po_1/exec-e1-0abc12/"
    );
    assert_ne!(
        at("e1-0abc12").artifact_prefix(&spec()),
        at("e1-9fff00").artifact_prefix(&spec()),
        "two workers' first executions of the same attempt"
    );
}

#[test]
fn job_folders_refuse_a_taken_path_and_go_when_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("jobs").join("r1.po.1-a2-e1-x");
    let folder = JobFolder::create(&dir, "r1.po.1").unwrap();
    std::fs::write(dir.join("file"), b"x").unwrap();
    assert!(
        JobFolder::create(&dir, "r1.po.1").is_err(),
        "two executions never share a folder"
    );
    assert!(dir.exists(), "the refused second one did not remove it");
    drop(folder);
    assert!(!dir.exists());
}

#[test]
fn a_permanent_failure_becomes_an_error_result_of_the_same_attempt() {
    let r = permanent_result(
        &spec(),
        "w1",
        "e1-x",
        ran(),
        "node `ghost` is not in the job's graph `g`",
    );
    assert_eq!(r.status, JobStatus::Error);
    assert_eq!(r.attempt, 2);
    assert_eq!(r.worker, "w1");
    let error = r.error.unwrap();
    assert!(error.contains("permanent"), "{error}");
    assert!(error.contains("node `ghost` is not in"), "{error}");
}

#[test]
fn errors_are_classed_once_where_they_are_made() {
    let git = |code, class| GitError::Git(git2::Error::new(code, class, "x"));
    use git2::{ErrorClass, ErrorCode};
    // A commit that is not in the packs, an id that is not one: never on another try.
    let missing: RunError = git(ErrorCode::NotFound, ErrorClass::Odb).into();
    assert!(!missing.is_transient(), "{missing}");
    let bad_id: RunError = git(ErrorCode::GenericError, ErrorClass::Invalid).into();
    assert!(!bad_id.is_transient());
    // The disk, a lock, the store: maybe next time.
    let os: RunError = git(ErrorCode::GenericError, ErrorClass::Os).into();
    assert!(os.is_transient());
    let locked: RunError = git(ErrorCode::Locked, ErrorClass::Index).into();
    assert!(locked.is_transient());
    let io: RunError = GitError::Io(std::io::Error::other("disk full")).into();
    assert!(io.is_transient());
    let apply: RunError = GitError::Apply("hunk 1 failed".into()).into();
    assert!(!apply.is_transient());
    let store = |e| -> RunError { BlobError::Store(e).into() };
    assert!(!store(object_store::Error::NotFound {
        path: "graphs/g.json".into(),
        source: "gone".into()
    })
    .is_transient());
    assert!(store(object_store::Error::Generic {
        store: "S3",
        source: "connection reset".into()
    })
    .is_transient());
    let sandbox: RunError = SandboxError::Refused("root".into()).into();
    assert!(!sandbox.is_transient());
    assert_eq!(sandbox.reason(), "refused: root");
    let docker: RunError = SandboxError::Io(std::io::Error::other("socket")).into();
    assert!(docker.is_transient());
}

#[test]
fn job_resources_come_from_the_environment_with_defaults() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let d = JobResources::from_lookup(env(&[])).unwrap();
    assert_eq!(d, JobResources::default());
    assert_eq!(d.disk_quota.unwrap().limit_bytes, DEFAULT_JOB_DISK_MB << 20);
    assert_eq!(d.dir_max_age, Duration::from_secs(86_400));
    assert_eq!(d.sweep_every(), Duration::from_secs(3600));
    let r = JobResources::from_lookup(env(&[
        ("FLEET_JOB_DISK_MB", "50"),
        ("FLEET_JOB_DIR_MAX_AGE_SECONDS", "2"),
    ]))
    .unwrap();
    assert_eq!(r.disk_quota.unwrap().limit_bytes, 50 << 20);
    assert_eq!(r.dir_max_age, Duration::from_secs(2));
    assert_eq!(r.sweep_every(), Duration::from_secs(1));
    assert_eq!(d.disk_low_water, Some(1024 << 20));
    let low = JobResources::from_lookup(env(&[("FLEET_DISK_LOW_WATER_MB", "300")])).unwrap();
    assert_eq!(low.disk_low_water, Some(300 << 20));
    let off = JobResources::from_lookup(env(&[
        ("FLEET_JOB_DISK_MB", "0"),
        ("FLEET_DISK_LOW_WATER_MB", "0"),
    ]))
    .unwrap();
    assert_eq!(off.disk_quota, None);
    assert_eq!(off.disk_low_water, None);
    for bad in [
        &[("FLEET_JOB_DISK_MB", "2G")][..],
        &[("FLEET_JOB_DISK_MB", "-1")],
        &[("FLEET_JOB_DISK_MB", "99999999999999999")],
        &[("FLEET_JOB_DIR_MAX_AGE_SECONDS", "0")],
        &[("FLEET_JOB_DIR_MAX_AGE_SECONDS", "1d")],
        &[("FLEET_DISK_LOW_WATER_MB", "1G")],
        &[("FLEET_DISK_LOW_WATER_MB", "99999999999999999")],
    ] {
        let bad: &'static [(&'static str, &'static str)] = bad;
        let e = JobResources::from_lookup(env(bad)).unwrap_err();
        assert!(e.contains(bad[0].0), "{e}");
    }
}

#[test]
fn job_folder_names_end_with_their_execution_tag() {
    assert_eq!(folder_tag("r1.po.1-a2-e3-0abc12"), Some("e3-0abc12"));
    assert_eq!(folder_tag("r1.my-node.1-a1-e10-ff00aa"), Some("e10-ff00aa"));
    for odd in [
        "",
        "x",
        "r1.po.1",
        "r1-a1-ex-0abc12",
        "r1-a1-e1-",
        "r1-a1-e-0abc",
        "e1-0a",
    ] {
        assert_eq!(folder_tag(odd), None, "{odd}");
    }
    // Nonces are made so.
    let n = process_nonce();
    assert_eq!(
        folder_tag(&format!("j-a1-e1-{n}")),
        Some(&*format!("e1-{n}"))
    );
}

#[test]
fn at_start_every_folder_but_this_processes_goes() {
    assert!(left_by_another_process("r1.po.1-a1-e4-aaaaaa", "bbbbbb"));
    assert!(!left_by_another_process("r1.po.1-a1-e4-bbbbbb", "bbbbbb"));
    assert!(left_by_another_process("stray-file", "bbbbbb"));
    assert!(left_by_another_process("x-a1-e1-abbbbbb", "bbbbbb"));
}

#[test]
fn only_old_folders_of_executions_not_running_are_stale() {
    let day = Duration::from_secs(86_400);
    let running: std::collections::HashSet<String> = ["e1-aaaaaa".to_string()].into();
    let old = day + Duration::from_secs(1);
    assert!(!stale("r1.a.1-a1-e1-aaaaaa", old, &running, day), "running");
    assert!(stale("r1.a.1-a1-e2-aaaaaa", old, &running, day));
    assert!(
        !stale("r1.a.1-a1-e2-aaaaaa", day, &running, day),
        "not older"
    );
    assert!(stale("leftover", old, &running, day));
    assert!(!stale("leftover", Duration::ZERO, &running, day));
}

#[test]
fn a_folder_over_its_quota_fails_the_job_with_both_sizes() {
    let step = quota_exceeded(
        disk::Exceeded {
            used_bytes: 60 << 20,
            limit_bytes: 50 << 20,
        },
        disk::DiskUsage {
            bytes: 70 << 20,
            entries: 3,
        },
    );
    assert_eq!(step.status, JobStatus::Failed);
    assert!(step
        .error
        .as_deref()
        .unwrap()
        .starts_with("disk_quota_exceeded: "));
    assert_eq!(
        step.output,
        json!({"disk_quota_exceeded": {
            "used_bytes": 60 << 20, "limit_bytes": 50 << 20, "after_kill_bytes": 70 << 20
        }})
    );
}

/// A read-only worktree of a commit, with nothing else asked of it.
fn read_only_worktree() -> shared::messages::WorktreeSpec {
    shared::messages::WorktreeSpec {
        commit: "0".repeat(40),
        run_base: None,
        packs: vec![],
        mode: shared::graph::WorktreeMode::Ro,
        commit_out: false,
        git: None,
    }
}

#[test]
fn only_read_only_steps_the_worker_never_writes_share_a_checkout() {
    use super::execute::may_share_checkout;
    use shared::graph::{HarnessOp, NodeBody, WorktreeMode};
    use shared::messages::WorktreeSpec;
    let ro = read_only_worktree();
    let command = NodeBody::Command {
        commands: vec!["true".into()],
    };
    assert!(may_share_checkout(&ro, &command));
    let rw = WorktreeSpec {
        mode: WorktreeMode::Rw,
        ..ro.clone()
    };
    assert!(!may_share_checkout(&rw, &command), "a writer");
    let own_git = WorktreeSpec {
        git: Some([("base".to_string(), "0".repeat(40))].into()),
        ..ro.clone()
    };
    assert!(
        !may_share_checkout(&own_git, &command),
        "a .git laid inside"
    );
    let committing = WorktreeSpec {
        commit_out: true,
        ..ro.clone()
    };
    assert!(!may_share_checkout(&committing, &command));
    // Harness steps that write a read-only worktree from the worker's side (tests restored,
    // mutants applied, files rendered), and every other harness step: never shared.
    for op in [
        HarnessOp::RunTests,
        HarnessOp::RunMutants,
        HarnessOp::RenderFiles,
        HarnessOp::CheckBuild,
        HarnessOp::Noop,
    ] {
        assert!(
            !may_share_checkout(&ro, &NodeBody::Harness { op }),
            "{op:?}"
        );
    }
}

#[test]
fn only_steps_in_the_workers_process_without_a_worktree_go_without_a_job_folder() {
    use super::needs_job_folder;
    use shared::graph::{HarnessOp, NodeBody};
    let bare = spec();
    assert!(bare.worktree.is_none());
    let with_worktree = JobSpec {
        worktree: Some(read_only_worktree()),
        ..spec()
    };
    let noop = NodeBody::Harness {
        op: HarnessOp::Noop,
    };
    assert!(!needs_job_folder(&bare, Some(&noop)));
    assert!(
        needs_job_folder(&with_worktree, Some(&noop)),
        "a worktree lives in it"
    );
    let tests = NodeBody::Harness {
        op: HarnessOp::RunTests,
    };
    assert!(needs_job_folder(&bare, Some(&tests)), "container mounts");
    let command = NodeBody::Command {
        commands: vec!["true".into()],
    };
    assert!(needs_job_folder(&bare, Some(&command)));
    assert!(needs_job_folder(&bare, None), "a node the graph lacks");
}
