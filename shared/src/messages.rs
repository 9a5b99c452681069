//! Wire messages (versioned) and what they point to. A queue message is a small envelope with a
//! content-addressed reference to its payload in object storage. The results queue also carries
//! messages between runs of a tree (start, end, cancel a child), put in outboxes like jobs.

use crate::graph::{NodeKind, WorktreeMode};
use crate::ids::{Attempt, JobId, NodeId, RunId};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

pub const WIRE_VERSION: u32 = 1;

/// Payloads up to this size ride in their envelope; larger ones are stored (the claim check).
pub const INLINE_LIMIT: usize = 16 * 1024;

/// Broadcast to every worker (best effort, not persisted).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Control {
    pub v: u32,
    /// Jobs no run needs any more: stop them if running here.
    pub stop_jobs: Vec<JobId>,
    /// Messages for the sessions of running jobs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deliver: Vec<crate::session::Delivery>,
}

/// On the jobs queue.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JobEnvelope {
    pub v: u32,
    pub job_id: JobId,
    pub run_id: RunId,
    pub attempt: Attempt,
    /// Content key of the `JobSpec` (`blobs/<sha256>`); stored there unless inlined.
    pub spec_ref: String,
    /// The spec itself when it is small (at most `INLINE_LIMIT` bytes of JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Box<JobSpec>>,
    /// The team whose run the job is of (its `concurrent_jobs` limit holds the job back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The image of the job's container (`JobSpec::image`): its holders take the job first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// On the results queue: a job's start notice or its result, tagged by `kind` (`started`,
/// `finished`), each with the wire version `v`. Read with `ResultMessage::decode`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ResultMessage {
    /// A worker took the job (when its spec asks: `JobSpec::notify_start`).
    Started(StartNotice),
    Finished(ResultEnvelope),
    /// From a coordinator's outbox: create and start a child run its parent's spawn decided.
    StartRun(RunMessage),
    /// From a coordinator's outbox: a child run ended; its parent (`run_id`) hears of it.
    ChildFinished(RunMessage),
    /// From a coordinator's outbox: cancel a child run (its parent ended or stopped waiting).
    CancelRun(RunMessage),
    /// From a coordinator's outbox: a child broadcast an event; its parent relays it.
    SiblingEvent(RunMessage),
    /// From a coordinator's outbox: a sibling's event, for the run `run_id`.
    FromSibling(RunMessage),
    /// An incremental session finished an invocation (its checkpoint is kept).
    Progress(crate::session::ProgressNotice),
}

/// A message between runs (through a coordinator's outbox and the results queue): the run it
/// acts on and, for a start or a child's end, its payload (a `ChildRun` or a `ChildReport`) by
/// content key, inline when small.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunMessage {
    pub v: u32,
    pub run_id: RunId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_ref: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
}

/// Why a message on the results queue was not read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("not a result message: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("wire version {0}; this side speaks {WIRE_VERSION}")]
    Version(u32),
    #[error("unknown result message kind `{0}`")]
    UnknownKind(String),
}

impl ResultMessage {
    /// The kinds this side reads (`kind` of the variants above).
    pub const KINDS: [&'static str; 8] = [
        "started",
        "finished",
        "start_run",
        "child_finished",
        "cancel_run",
        "sibling_event",
        "from_sibling",
        "progress",
    ];

    /// Reads a message: the version first (a message of another version is not guessed at),
    /// then the kind. A message without a kind (a worker of an earlier build) is a result, or a
    /// start notice when it names the worker in `started`.
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        #[derive(Deserialize)]
        struct Head {
            v: u32,
            #[serde(default)]
            kind: Option<String>,
            #[serde(default)]
            started: Option<String>,
        }
        let head: Head = serde_json::from_slice(body)?;
        if head.v != WIRE_VERSION {
            return Err(WireError::Version(head.v));
        }
        match head.kind {
            Some(kind) if !Self::KINDS.contains(&kind.as_str()) => {
                Err(WireError::UnknownKind(kind))
            }
            Some(_) => Ok(serde_json::from_slice(body)?),
            None => {
                let env: ResultEnvelope = serde_json::from_slice(body)?;
                Ok(match head.started {
                    Some(worker) => ResultMessage::Started(StartNotice {
                        v: env.v,
                        job_id: env.job_id,
                        run_id: env.run_id,
                        attempt: env.attempt,
                        worker,
                    }),
                    None => ResultMessage::Finished(env),
                })
            }
        }
    }
}

/// A worker took a job: the watchdog's clock for it starts.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StartNotice {
    pub v: u32,
    pub job_id: JobId,
    pub run_id: RunId,
    pub attempt: Attempt,
    /// The worker that took the job.
    pub worker: String,
}

/// A job's result, on the results queue (`ResultMessage::Finished`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResultEnvelope {
    pub v: u32,
    pub job_id: JobId,
    pub run_id: RunId,
    pub attempt: Attempt,
    /// Content key of the `JobResult`; stored there unless inlined.
    pub result_ref: String,
    /// The result itself when it is small (at most `INLINE_LIMIT` bytes of JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Box<JobResult>>,
}

/// A repository as the fleet sees it: packfiles in object storage that together hold every
/// object a run needs, and where it came from.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RepoSnapshot {
    pub url: String,
    pub base_commit: String,
    pub packs: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct WorktreeSpec {
    pub commit: String,
    /// The run's baseline: claims are checked against the files changed since it.
    #[serde(default)]
    pub run_base: Option<String>,
    pub packs: Vec<String>,
    pub mode: WorktreeMode,
    pub commit_out: bool,
    /// The branches of the job's own git directory (name → commit), when its node asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<BTreeMap<String, String>>,
}

/// One step of a scripted agent: files it writes and the output it returns.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScriptStep {
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    #[serde(default)]
    pub output: Value,
    /// Shell commands run through the `run_command` tool (only where the node allows it).
    #[serde(default)]
    pub commands: Vec<String>,
    /// Other tool calls, after the commands, as `{"name", "input"}` (e.g. the `browser`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<Value>,
    /// Seconds to wait before answering (for benchmarks of parallel branches).
    #[serde(default)]
    pub delay_seconds: f64,
    /// The step answers only jobs whose parameters have these values (`{"module": "a"}`), so
    /// one script can play the same node differently in each run of a tree.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub when: BTreeMap<String, Value>,
}

/// The longest a scripted step waits before answering (its delay is for benchmarks).
pub const MAX_SCRIPT_DELAY: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl ScriptStep {
    /// Whether the step answers a job with these parameters.
    pub fn answers(&self, params: &Value) -> bool {
        self.when.iter().all(|(k, v)| params.get(k) == Some(v))
    }

    /// The wait before answering: none when `delay_seconds` is not positive, at most
    /// `MAX_SCRIPT_DELAY` (a script is the submitter's; `from_secs_f64` panics past u64::MAX s).
    pub fn delay(&self) -> std::time::Duration {
        std::time::Duration::try_from_secs_f64(self.delay_seconds)
            .unwrap_or(if self.delay_seconds > 0.0 {
                MAX_SCRIPT_DELAY
            } else {
                std::time::Duration::ZERO
            })
            .min(MAX_SCRIPT_DELAY)
    }
}

pub use crate::agent_config::{AgentConfig, CommandAgent, LlmApi, LlmBudget, LlmConfig};

/// Everything a worker needs to run one job. Stored in object storage, referenced by envelope.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JobSpec {
    pub v: u32,
    pub job_id: JobId,
    pub run_id: RunId,
    pub node: NodeId,
    pub visit: u32,
    pub attempt: Attempt,
    pub kind: NodeKind,
    /// Object key of the graph bundle.
    pub graph_ref: String,
    pub image: Option<String>,
    pub timeout_seconds: u64,
    /// The node's `with` expressions, evaluated.
    pub params: Value,
    /// Worktree files whose contents the prompt receives.
    pub context_files: Vec<String>,
    /// Command nodes: rendered command lines (split with shell rules, never run by a shell).
    pub commands: Vec<String>,
    pub worktree: Option<WorktreeSpec>,
    /// Object key prefix for this job's artifacts, ending in `/`. Each execution writes beneath
    /// it in a folder of its own, `exec-<execution>/`; the run points to the accepted one's.
    pub artifact_prefix: String,
    pub agent: AgentConfig,
    /// The run context at the time the job started (input, visits, node outcomes); agent
    /// nodes only.
    pub vars: Value,
    /// The fan-out branch of the job.
    #[serde(default)]
    pub branch: Option<u32>,
    /// Object key of the transcript whose conversation this agent continues.
    #[serde(default)]
    pub continues: Option<String>,
    #[serde(default)]
    pub nudge_after_seconds: Option<u64>,
    /// The worker announces the job's start (a `ResultMessage::Started`).
    #[serde(default)]
    pub notify_start: bool,
    /// What the job's commit may change (the node's `writes`), checked by the worker on deltas.
    #[serde(default)]
    pub write_scope: Option<crate::scope::WriteScope>,
    /// A command agent's job: what is left of the run's LLM budget (its gateway's limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm_budget: Option<LlmBudget>,
    /// An agent's: the run's budget left at publish; the loop or gateway clamps `max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm_usd_left: Option<f64>,
    /// An incremental agent's loop (seed 003): its budget, stuck rule and checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incremental: Option<crate::session::LoopSpec>,
    /// Messages the session has not received yet (later ones come on the control channel).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inbox: Vec<crate::session::SessionMessage>,
    /// The run's team: its LLM calls count against the team's fleet-wide quotas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// The step ran and its checks passed.
    Ok,
    /// The step ran and its checks failed (a verdict, not an infrastructure error).
    Failed,
    /// The agent's output broke the node's schema.
    OutputInvalid,
    TimedOut,
    /// The infrastructure failed (image missing, docker error...).
    Error,
    /// The job was dead-lettered after too many deliveries.
    Dead,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Usage {
    pub llm_calls: u32,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.llm_calls += other.llm_calls;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_usd += other.cost_usd;
    }
}

/// What a worker reports for a job. Stored in object storage, referenced by envelope.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JobResult {
    pub v: u32,
    pub job_id: JobId,
    pub run_id: RunId,
    pub attempt: Attempt,
    pub status: JobStatus,
    pub output: Value,
    pub error: Option<String>,
    /// The commit made of the worktree's changes, when the node commits.
    pub commit: Option<String>,
    /// Packfile holding the new commit's objects.
    pub pack: Option<String>,
    /// Artifact name → object key. Every key lies under the job's `artifact_prefix` and then
    /// `exec-<execution>/`: executions of one attempt never write to the same key.
    pub artifacts: BTreeMap<String, String>,
    pub usage: Usage,
    pub worker: String,
    /// The execution of the attempt that made this result (`e<N>-<nonce>`, unique per worker
    /// process); empty for results no execution made (a dead letter).
    #[serde(default)]
    pub execution: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    /// Seconds spent inside the container (create to remove).
    pub container_seconds: f64,
    /// The earlier job whose kept result this is (the step cache), when the step did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_from: Option<crate::step_cache::CachedFrom>,
    /// What the job's trusted code recorded (the tool executor, the harness ops); never an
    /// agent's answer. At most `tracking::MAX_JOB_EVENTS`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<crate::tracking::JobEvent>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::tests::{arb_json, arb_text, cases, timed, CASE_LIMIT};
    use proptest::prelude::*;
    use serde_json::json;

    /// A script step: the fields a step has, mostly of the right types, sometimes any JSON.
    fn arb_step() -> impl Strategy<Value = Value> {
        let delay = prop_oneof![
            any::<f64>().prop_filter_map("finite", |f| {
                serde_json::Number::from_f64(f).map(Value::Number)
            }),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
        ];
        let files =
            prop::collection::btree_map(arb_text(), arb_text(), 0..3).prop_map(|m| json!(m));
        let commands = prop::collection::vec(arb_text(), 0..3).prop_map(|c| json!(c));
        let or_any = |good: BoxedStrategy<Value>| {
            prop::option::weighted(0.8, prop_oneof![9 => good, 1 => arb_json()])
        };
        (
            or_any(files.boxed()),
            or_any(arb_json().boxed()),
            or_any(commands.boxed()),
            or_any(delay.boxed()),
            prop::option::weighted(0.05, arb_json()),
        )
            .prop_map(|(files, output, commands, delay, extra)| {
                let mut step = json!({});
                for (k, v) in [
                    ("files", files),
                    ("output", output),
                    ("commands", commands),
                    ("delay_seconds", delay),
                    ("unknown", extra),
                ] {
                    if let Some(v) = v {
                        step[k] = v;
                    }
                }
                step
            })
    }

    /// An agent configuration: scripted (by node, a list of steps), an LLM's, or anything.
    fn arb_agent() -> impl Strategy<Value = Value> {
        prop_oneof![
            prop::collection::btree_map(
                "[a-c]{1,2}",
                prop::collection::vec(arb_step(), 0..3),
                0..3
            )
            .prop_map(|script| json!({"backend": "scripted", "script": script})),
            (
                prop::sample::select(vec!["anthropic", "openai", "other"]),
                arb_json(),
                arb_json(),
            )
                .prop_map(|(backend, model, turns)| {
                    json!({"backend": backend, "model": model, "max_turns": turns})
                }),
            arb_json(),
        ]
    }

    fn finished() -> ResultEnvelope {
        let result: JobResult = serde_json::from_value(json!({
            "v": WIRE_VERSION, "job_id": "r1.a.1", "run_id": "r1", "attempt": 2,
            "status": "ok", "output": {"n": 1.5}, "error": null, "commit": null, "pack": null,
            "artifacts": {}, "usage": Usage::default(), "worker": "w1", "execution": "e1-aa",
            "started_at": "2026-11-22T10:00:00.123Z", "finished_at": "2026-11-22T10:00:01.500Z",
            "container_seconds": 0.25,
        }))
        .unwrap();
        ResultEnvelope {
            v: WIRE_VERSION,
            job_id: JobId::new("r1.a.1"),
            run_id: RunId::new("r1"),
            attempt: 2,
            result_ref: "blobs/abc".into(),
            result: Some(Box::new(result)),
        }
    }

    #[test]
    fn each_result_message_round_trips_under_its_kind() {
        let started = ResultMessage::Started(StartNotice {
            v: WIRE_VERSION,
            job_id: JobId::new("r1.a.1"),
            run_id: RunId::new("r1"),
            attempt: 2,
            worker: "w1".into(),
        });
        let stored = ResultEnvelope {
            result: None,
            ..finished()
        };
        for (msg, kind) in [
            (started, "started"),
            (ResultMessage::Finished(finished()), "finished"),
            (ResultMessage::Finished(stored), "finished"),
        ] {
            let body = serde_json::to_vec(&msg).unwrap();
            let raw: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(raw["kind"], kind);
            assert_eq!(raw["v"], WIRE_VERSION);
            assert!(ResultMessage::KINDS.contains(&kind));
            assert_eq!(ResultMessage::decode(&body).unwrap(), msg);
        }
    }

    #[test]
    fn a_result_of_the_previous_version_reads_and_what_is_written_reads_back() {
        let result = finished().result.expect("an inline result");
        assert_eq!(result.started_at.timestamp_millis(), 1_795_341_600_123);
        let written = serde_json::to_value(&result).unwrap();
        assert_eq!(written["started_at"], "2026-11-22T10:00:00.123Z");
        assert_eq!(written["finished_at"], "2026-11-22T10:00:01.500Z");
        assert_eq!(
            serde_json::from_value::<JobResult>(written).unwrap(),
            *result
        );
    }

    #[test]
    fn another_version_an_unknown_kind_or_junk_is_refused() {
        let mut body = serde_json::to_value(ResultMessage::Finished(finished())).unwrap();
        body["v"] = json!(WIRE_VERSION + 1);
        let err = ResultMessage::decode(body.to_string().as_bytes()).unwrap_err();
        assert!(
            matches!(err, WireError::Version(v) if v == WIRE_VERSION + 1),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "wire version {}; this side speaks {WIRE_VERSION}",
                WIRE_VERSION + 1
            )
        );
        // The version is read before the kind: a later version may have other kinds.
        body["kind"] = json!("paused");
        let err = ResultMessage::decode(body.to_string().as_bytes()).unwrap_err();
        assert!(matches!(err, WireError::Version(_)), "{err}");
        body["v"] = json!(WIRE_VERSION);
        let err = ResultMessage::decode(body.to_string().as_bytes()).unwrap_err();
        assert_eq!(err.to_string(), "unknown result message kind `paused`");
        let junk: [&[u8]; 3] = [b"not json", br#"{"kind": "started"}"#, b"[1]"];
        for junk in junk {
            let err = ResultMessage::decode(junk).unwrap_err();
            assert!(matches!(err, WireError::Malformed(_)), "{err}");
        }
        // A known kind without its fields.
        let err = ResultMessage::decode(br#"{"v": 1, "kind": "started"}"#).unwrap_err();
        assert!(
            err.to_string().starts_with("not a result message: "),
            "{err}"
        );
    }

    /// Envelopes of workers from before the kinds: a result, or a start notice that names its
    /// worker in `started`.
    #[test]
    fn envelopes_without_a_kind_are_still_read() {
        let mut old = serde_json::to_value(finished()).unwrap();
        assert!(old.get("kind").is_none());
        let read = ResultMessage::decode(old.to_string().as_bytes()).unwrap();
        assert_eq!(read, ResultMessage::Finished(finished()));
        old["result_ref"] = json!("");
        old.as_object_mut().unwrap().remove("result");
        old["started"] = json!("w1");
        match ResultMessage::decode(old.to_string().as_bytes()).unwrap() {
            ResultMessage::Started(n) => {
                assert_eq!(
                    (n.job_id.as_str(), n.attempt, n.worker.as_str()),
                    ("r1.a.1", 2, "w1")
                )
            }
            other => panic!("a start notice, not {other:?}"),
        }
    }

    #[test]
    fn a_huge_or_negative_delay_is_capped_or_none() {
        // Panicked in the scripted agent: `Duration::from_secs_f64(2.66e176)`.
        let config =
            r#"{"backend":"scripted","script":{"a":[{"delay_seconds":2.6663255344907375e+176}]}}"#;
        let AgentConfig::Scripted { script } = serde_json::from_str(config).unwrap() else {
            panic!("a script")
        };
        assert_eq!(script["a"][0].delay(), MAX_SCRIPT_DELAY);
        for (seconds, delay) in [
            (86401.0, MAX_SCRIPT_DELAY),
            (-1.0, std::time::Duration::ZERO),
            (f64::NAN, std::time::Duration::ZERO),
            (f64::INFINITY, MAX_SCRIPT_DELAY),
            (0.5, std::time::Duration::from_millis(500)),
        ] {
            let step = ScriptStep {
                delay_seconds: seconds,
                ..ScriptStep::default()
            };
            assert_eq!(step.delay(), delay, "{seconds}");
        }
    }

    proptest! {
        #![proptest_config(cases(256))]

        /// Scripts come from whoever submits a run: any of them parses or is refused, and a
        /// parsed one's delays are durations.
        #[test]
        fn any_agent_config_parses_or_is_refused(
            config in prop_oneof![
                4 => arb_agent().prop_map(|v| v.to_string()),
                1 => arb_text(),
            ],
        ) {
            let (parsed, took) = timed(|| serde_json::from_str::<AgentConfig>(&config));
            prop_assert!(took < CASE_LIMIT);
            if let Ok(agent) = parsed {
                prop_assert!(!agent.model_identity().is_empty());
                if let AgentConfig::Scripted { script } = &agent {
                    for step in script.values().flatten() {
                        prop_assert!(step.delay() <= MAX_SCRIPT_DELAY);
                    }
                }
            }
        }
    }
}
