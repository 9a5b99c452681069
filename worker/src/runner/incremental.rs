//! Seed 003's incremental sessions, in one job: the node's session invoked again and again
//! (one conversation), each invocation's changes committed, the checkpoint commands run in the
//! container and their failures put into the next invocation's prompt, messages from other
//! sessions taken at each turn boundary, until the agent is done with every checkpoint green,
//! the budget is spent or the session is stuck (`shared::session`). After each invocation the
//! loop keeps a checkpoint in object storage (its book, the transcript, the pack of its
//! commits) *before* it announces the progress: a worker that takes the job over after a crash
//! resumes from there instead of from scratch.

use super::{RunError, Runner};
use crate::agent::inbox::Inbox;
use crate::agent::{self, AgentJob, AgentOutcome};
use crate::browser::Evidence;
use crate::git::Worktree;
use crate::harness::{excerpt, run_logged, Artifacts};
use crate::queue::{Broker, QueueName};
use crate::sandbox::Session;
use crate::tools::ToolBox;
use serde_json::Value;
use shared::graph::Tool;
use shared::ids::JobId;
use shared::messages::{JobSpec, JobStatus, ResultMessage, WIRE_VERSION};
use shared::session::{
    continuation_prompt, Checkpoint, CheckpointRun, IncrementalProgress, LoopBook, LoopEnd,
    LoopSpec, ProgressNotice, SessionMessage,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// One incremental session: the job, its loop, and where it runs.
pub(super) struct Sessions<'a> {
    pub spec: &'a JobSpec,
    pub plan: &'a LoopSpec,
    pub tools: &'a [Tool],
    /// Where the tool calls' events go, and the node's retry strategy.
    pub journal: &'a crate::tools::Journal,
    pub retry: Option<&'a shared::resilience::RetryConfig>,
    /// The first invocation's prompt (the node's template, rendered).
    pub prompt: String,
    pub schema: &'a Value,
    pub session: &'a dyn Session,
    pub wt: &'a Worktree,
    pub timeout: Duration,
}

/// Where a job's checkpoint is kept: one per job (run, node, visit), whatever the attempt.
fn checkpoint_key(spec: &JobSpec) -> String {
    format!(
        "runs/{}/checkpoints/{}.json",
        spec.run_id,
        shared::hashing::sha256_hex(spec.job_id.as_str().as_bytes())
    )
}

/// The most jobs whose messages came before their session started that a worker holds on to.
const EARLY_JOBS: usize = 256;
/// How long such messages are held.
const EARLY_FOR: Duration = Duration::from_secs(600);

/// The inboxes of the sessions running here, and messages for sessions that have not started
/// here yet (the control channel reaches every worker; the one that starts the session, maybe
/// only a moment later, takes them).
#[derive(Default)]
pub(crate) struct Mailroom {
    inboxes: std::collections::HashMap<JobId, Inbox>,
    early: std::collections::HashMap<JobId, (Instant, Vec<SessionMessage>)>,
}

impl Mailroom {
    fn deliver(&mut self, job: &JobId, messages: Vec<SessionMessage>) -> bool {
        if let Some(inbox) = self.inboxes.get(job) {
            inbox.offer(messages);
            return true;
        }
        let now = Instant::now();
        self.early
            .retain(|_, (at, _)| now.duration_since(*at) < EARLY_FOR);
        if self.early.len() >= EARLY_JOBS && !self.early.contains_key(job) {
            if let Some(oldest) = self
                .early
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(j, _)| j.clone())
            {
                self.early.remove(&oldest);
            }
        }
        let held = self.early.entry(job.clone()).or_insert((now, Vec::new()));
        held.0 = now;
        held.1.extend(messages);
        false
    }

    fn open(&mut self, job: &JobId, inbox: Inbox) {
        if let Some((_, early)) = self.early.remove(job) {
            inbox.offer(early);
        }
        self.inboxes.insert(job.clone(), inbox);
    }
}

/// Removes the job's inbox from the runner when the session ends, however it ends.
struct Registered<'a> {
    runner: &'a Runner,
    job: JobId,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.runner
            .mailroom
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .inboxes
            .remove(&self.job);
    }
}

/// Where the loop stands: from a checkpoint, or from the start.
struct Resumed {
    book: LoopBook,
    transcript: Option<Value>,
    last: Value,
    end: Option<LoopEnd>,
    after: Option<u32>,
    /// Whether the checkpoint's invocation committed something.
    committed: bool,
}

/// What a checkpoint keeps of the loop.
struct Kept<'a> {
    book: &'a LoopBook,
    transcript: &'a Option<Value>,
    last: &'a Value,
    end: Option<LoopEnd>,
    committed: bool,
}

impl Runner {
    /// Progress notices go to `broker` (the consumer that serves this runner sets it).
    pub(crate) fn send_notices_to(&self, broker: Arc<dyn Broker>) {
        let _ = self.notices.set(broker);
    }

    /// Messages for a session running here; false when the job does not run here.
    pub fn deliver(&self, job: &JobId, messages: Vec<SessionMessage>) -> bool {
        let count = messages.len();
        let here = self
            .mailroom
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .deliver(job, messages);
        if here {
            info!(job = %job, count, "messages for a running session");
        }
        here
    }

    pub(super) async fn incremental(
        &self,
        s: Sessions<'_>,
        prior: Option<Value>,
        art: &mut Artifacts<'_>,
    ) -> Result<AgentOutcome, RunError> {
        let key = checkpoint_key(s.spec);
        let Resumed {
            mut book,
            mut transcript,
            mut last,
            mut end,
            after,
            committed,
        } = self.resume(&s, &key, prior).await?;
        if let Some(n) = after {
            // The execution that kept the checkpoint may have died before announcing it: the
            // engine takes an invocation's progress once, so it is announced again.
            self.announce(s.spec, n, &last, committed, s.wt.head(), book.delivered)
                .await;
        }
        let inbox = Inbox::after(book.delivered);
        inbox.offer(s.spec.inbox.clone());
        self.mailroom
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .open(&s.spec.job_id, inbox.clone());
        let _registered = Registered {
            runner: self,
            job: s.spec.job_id.clone(),
        };
        // One for the session: screenshots are numbered on across invocations.
        let evidence = Evidence::new(art);
        while end.is_none() {
            let n = book.invocations + 1;
            let mut prompt = if n == 1 {
                s.prompt.clone()
            } else {
                continuation_prompt(n, &book)
            };
            let arrived = inbox.take();
            if !arrived.is_empty() {
                prompt = format!("{}\n\n{prompt}", agent::inbox::as_text(&arrived));
            }
            art.put(&format!("prompts/{n}.md"), prompt.clone().into_bytes())
                .await?;
            let job = AgentJob {
                node: s.spec.node.as_str(),
                visit: s.spec.visit,
                params: &s.spec.params,
                nudge_after: None,
                prompt,
                schema: s.schema,
                tools: ToolBox {
                    session: s.session,
                    allowed: s.tools,
                    command_timeout: Duration::from_secs(120).min(s.timeout),
                    evidence: Some(&evidence),
                    journal: s.journal,
                    retry: s.retry,
                },
                inbox: Some(&inbox),
                invocation: Some(n),
                usd_left: s.spec.llm_usd_left,
            };
            let out = agent::run(
                job,
                &s.spec.agent,
                &self
                    .config
                    .llm
                    .for_job(s.spec.run_id.as_str(), s.spec.team.as_deref()),
                &self.http,
                transcript.take(),
            )
            .await;
            evidence.flush(art).await?;
            book.usage.add(&out.usage);
            if out.status != JobStatus::Ok {
                return Ok(AgentOutcome {
                    usage: book.usage,
                    ..out
                });
            }
            let progress = match IncrementalProgress::read(&out.output) {
                Ok(p) => p,
                Err(e) => {
                    return Ok(AgentOutcome {
                        status: JobStatus::OutputInvalid,
                        error: Some(e),
                        usage: book.usage,
                        ..out
                    })
                }
            };
            let message = format!(
                "{}: invocation {n}\n\nSession: {}.{}\nNode: {}",
                s.spec.node, s.spec.run_id, s.spec.node, s.spec.node
            );
            let committed =
                s.wt.blocking(move |wt| wt.commit_all(&message))
                    .await?
                    .is_some();
            let checkpoints = self.checkpoints(&s, n, art).await?;
            // What a checkpoint left in the worktree (build outputs) is nobody's change.
            s.wt.blocking(|wt| wt.advance_to(&wt.head())).await?;
            book.delivered = inbox.taken();
            end = book.record(s.plan, &progress, committed, checkpoints);
            transcript = Some(out.transcript);
            last = out.output;
            let kept = Kept {
                book: &book,
                transcript: &transcript,
                last: &last,
                end,
                committed,
            };
            let head = self.keep_checkpoint(&s, &key, kept).await?;
            crate::faults::point("worker.after_checkpoint").await;
            info!(job = %s.spec.job_id, invocation = n, committed, end = ?end, "invocation checkpointed");
            self.announce(s.spec, n, &last, committed, head, book.delivered)
                .await;
        }
        let end = end.expect("the loop ran until it ended");
        let message = format!(
            "{}: {} invocations ({end:?})\n\nSession: {}.{}\nNode: {}",
            s.spec.node, book.invocations, s.spec.run_id, s.spec.node, s.spec.node
        );
        s.wt.blocking(move |wt| wt.squash_since_base(&message))
            .await?;
        Ok(AgentOutcome {
            status: JobStatus::Ok,
            output: book.output(end, after, &last),
            error: None,
            usage: book.usage,
            transcript: transcript.unwrap_or(Value::Null),
        })
    }

    /// The job's checkpoint, if an earlier execution kept one: the worktree moved to its
    /// commit, the loop's book and transcript taken over.
    async fn resume(
        &self,
        s: &Sessions<'_>,
        key: &str,
        prior: Option<Value>,
    ) -> Result<Resumed, RunError> {
        let fresh = Resumed {
            book: LoopBook::default(),
            transcript: prior,
            last: Value::Null,
            end: None,
            after: None,
            committed: false,
        };
        let kept: Checkpoint = match self.blobs.get_json(key).await {
            Ok(c) => c,
            Err(e) if e.is_not_found() => return Ok(fresh),
            Err(e) => return Err(e.into()),
        };
        if kept.job_id != s.spec.job_id {
            warn!(job = %s.spec.job_id, other = %kept.job_id, "a checkpoint of another job under this job's key; starting afresh");
            return Ok(fresh);
        }
        if let Some(pack) = &kept.pack {
            self.git
                .ensure_packs(&self.blobs, std::slice::from_ref(pack))
                .await?;
        }
        let commit = kept.commit.clone();
        s.wt.blocking(move |wt| wt.advance_to(&commit)).await?;
        info!(job = %s.spec.job_id, attempt = s.spec.attempt, invocations = kept.book.invocations, "resuming an incremental session from its checkpoint");
        Ok(Resumed {
            after: Some(kept.book.invocations),
            book: kept.book,
            transcript: Some(kept.transcript),
            last: kept.last,
            end: kept.end,
            committed: kept.committed,
        })
    }

    /// Runs the checkpoint commands of invocation `n` in the container.
    async fn checkpoints(
        &self,
        s: &Sessions<'_>,
        n: u32,
        art: &mut Artifacts<'_>,
    ) -> Result<Vec<CheckpointRun>, RunError> {
        let mut runs = Vec::new();
        for (name, line) in &s.plan.checkpoints {
            let run = match shared::factory::split_command(line) {
                Ok(argv) => {
                    let label = format!("checkpoint_{n}_{name}");
                    let r = run_logged(s.session, &argv, s.timeout, &label, art).await?;
                    CheckpointRun {
                        name: name.clone(),
                        exit_code: r.exit_code,
                        excerpt: excerpt(&r),
                    }
                }
                Err(e) => CheckpointRun {
                    name: name.clone(),
                    exit_code: 127,
                    excerpt: e,
                },
            };
            runs.push(run);
        }
        Ok(runs)
    }

    /// Keeps the checkpoint of the invocation just finished; returns the worktree's head.
    async fn keep_checkpoint(
        &self,
        s: &Sessions<'_>,
        key: &str,
        kept: Kept<'_>,
    ) -> Result<String, RunError> {
        let Kept {
            book,
            transcript,
            last,
            end,
            committed,
        } = kept;
        let head = s.wt.head();
        let mut pack = None;
        if head != s.wt.base() {
            let commit = head.clone();
            let bytes = s.wt.blocking(move |wt| wt.pack_since_base(&commit)).await?;
            let pack_key = format!("packs/{}.pack", shared::hashing::sha256_hex(&bytes));
            self.blobs.put(&pack_key, bytes).await?;
            pack = Some(pack_key);
        }
        let checkpoint = Checkpoint {
            job_id: s.spec.job_id.clone(),
            book: book.clone(),
            transcript: transcript.clone().unwrap_or(Value::Null),
            commit: head.clone(),
            pack,
            last: last.clone(),
            end,
            committed,
        };
        self.blobs.put_json(key, &checkpoint).await?;
        Ok(head)
    }

    /// Announces an invocation's progress (best effort: the checkpoint is kept, and a lost
    /// notice only delays crosstalk to the next one).
    async fn announce(
        &self,
        spec: &JobSpec,
        invocation: u32,
        output: &Value,
        committed: bool,
        commit: String,
        delivered: u64,
    ) {
        let Some(broker) = self.notices.get() else {
            return;
        };
        let notice = ResultMessage::Progress(ProgressNotice {
            v: WIRE_VERSION,
            job_id: spec.job_id.clone(),
            run_id: spec.run_id.clone(),
            attempt: spec.attempt,
            invocation,
            output: output.clone(),
            committed,
            commit,
            delivered,
        });
        let body = serde_json::to_vec(&notice).expect("a progress notice serializes");
        let id = format!("{}.a{}.i{invocation}", spec.job_id, spec.attempt);
        if let Err(e) = broker.publish(QueueName::Results, &body, &id).await {
            warn!(job = %spec.job_id, invocation, error = %e, "could not announce an invocation's progress");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::ids::NodeId;

    fn msg(seq: u64) -> SessionMessage {
        SessionMessage {
            seq,
            from: NodeId::new("tests_loop"),
            invocation: 1,
            text: format!("m{seq}"),
        }
    }

    #[test]
    fn messages_that_come_before_their_session_wait_for_it() {
        let mut room = Mailroom::default();
        let job = JobId::new("r.impl.1");
        assert!(!room.deliver(&job, vec![msg(1)]), "no session yet");
        let inbox = Inbox::default();
        room.open(&job, inbox.clone());
        assert!(room.deliver(&job, vec![msg(2)]));
        assert_eq!(inbox.take(), vec![msg(1), msg(2)]);
        // Held messages are bounded by job count.
        for i in 0..(EARLY_JOBS + 10) {
            room.deliver(&JobId::new(format!("r.other.{i}")), vec![msg(1)]);
        }
        assert!(room.early.len() <= EARLY_JOBS);
    }
}
