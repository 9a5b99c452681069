//! Command agents: a program installed in the node's image, run in the job's container with
//! the job on stdin, its answer the last line of its stdout. It reaches the model only through
//! the job's [`Gateway`] (`FLEET_LLM_SOCKET`), which holds the key and the budget and counts
//! what was spent; the program's own account of its usage is never read.

use super::gateway::Gateway;
use super::{validate, AgentJob, AgentOutcome};
use serde_json::{json, Value};
use shared::messages::{CommandAgent, JobStatus, LlmApi};
use std::time::Duration;

/// What of the program's output the transcript keeps (the tail).
const STDOUT_KEPT: usize = 64 << 10;
const STDERR_KEPT: usize = 16 << 10;

/// One command agent job.
pub struct CommandJob<'a> {
    pub job: AgentJob<'a>,
    pub agent: &'a CommandAgent,
    /// The gateway's socket as the container sees it.
    pub socket: String,
    /// The session the program continues from visit to visit of its node.
    pub session_id: String,
    pub timeout: Duration,
}

fn tail(bytes: &[u8], keep: usize) -> String {
    let from = bytes.len().saturating_sub(keep);
    String::from_utf8_lossy(&bytes[from..]).into_owned()
}

/// The program's answer: the last non-empty line of its stdout, a JSON object with `output`.
pub fn answer_of(stdout: &[u8]) -> Result<Value, String> {
    let text = String::from_utf8_lossy(stdout);
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or("the agent program printed nothing; its last line must be {\"output\": ...}")?;
    let v: Value = serde_json::from_str(last.trim()).map_err(|e| {
        format!("the agent program's last line is not json ({e}); it must be {{\"output\": ...}}")
    })?;
    match v.get("output") {
        Some(_) if v.is_object() => Ok(v),
        _ => Err("the agent program's last line has no `output`".into()),
    }
}

/// Runs the program; its usage is the gateway's books (closed here).
pub async fn run(c: CommandJob<'_>, gateway: Gateway) -> AgentOutcome {
    let api = match c.agent.api {
        LlmApi::Anthropic => "anthropic",
        LlmApi::Openai => "openai",
    };
    let mut argv = vec![
        "env".to_string(),
        format!("FLEET_LLM_SOCKET={}", c.socket),
        format!("FLEET_LLM_API={api}"),
        format!("FLEET_LLM_MODEL={}", c.agent.model),
        format!("FLEET_SESSION_ID={}", c.session_id),
    ];
    argv.extend(c.agent.argv.iter().cloned());
    let stdin = json!({
        "node": c.job.node,
        "visit": c.job.visit,
        "session_id": c.session_id,
        "prompt": c.job.prompt,
        "output_schema": c.job.schema,
    });
    let ran = c
        .job
        .tools
        .session
        .exec(&argv, Some(stdin.to_string().into_bytes()), c.timeout)
        .await;
    let closed = gateway.close().await;
    let usage = closed.usage;
    let mut transcript = json!({
        "backend": "command",
        "argv": c.agent.argv,
        "session_id": c.session_id,
        "prompt": c.job.prompt,
        "calls": closed.calls,
        "peak_connections": closed.peak_connections,
        "peak_body_bytes": closed.peak_body_bytes,
    });
    let outcome = |status, output, error: Option<String>, transcript| AgentOutcome {
        status,
        output,
        error,
        usage,
        transcript,
    };
    let out = match ran {
        Ok(out) => out,
        Err(e) => {
            let error = format!("the agent program could not run: {e}");
            return outcome(JobStatus::Error, Value::Null, Some(error), transcript);
        }
    };
    transcript["exit_code"] = json!(out.exit_code);
    transcript["stdout"] = json!(tail(&out.stdout, STDOUT_KEPT));
    transcript["stderr"] = json!(tail(&out.stderr, STDERR_KEPT));
    if out.timed_out {
        let error = format!("the agent program ran past {:?}", c.timeout);
        return outcome(JobStatus::TimedOut, Value::Null, Some(error), transcript);
    }
    if out.exit_code != 0 {
        let error = format!(
            "the agent program exited with {}: {}",
            out.exit_code,
            tail(&out.stderr, 2000).trim()
        );
        return outcome(JobStatus::Failed, Value::Null, Some(error), transcript);
    }
    let answer = match answer_of(&out.stdout) {
        Ok(a) => a,
        Err(e) => return outcome(JobStatus::OutputInvalid, Value::Null, Some(e), transcript),
    };
    if let Some(t) = answer.get("transcript") {
        transcript["agent_transcript"] = t.clone();
    }
    let output = answer["output"].clone();
    match validate(c.job.schema, &output) {
        Ok(()) => outcome(JobStatus::Ok, output, None, transcript),
        Err(e) => outcome(JobStatus::OutputInvalid, output, Some(e), transcript),
    }
}

#[cfg(test)]
mod tests {
    use super::answer_of;
    use serde_json::json;

    #[test]
    fn the_answer_is_the_last_non_empty_line_with_an_output() {
        let out = b"progress 1\n{\"output\": 1}\nnot json\n{\"output\": {\"a\": 2}}\n\n  \n";
        assert_eq!(answer_of(out).unwrap(), json!({"output": {"a": 2}}));
        for bad in [
            &b""[..],
            b"\n \n",
            b"{\"output\": 1}\nlast words",
            b"{\"result\": 1}",
            b"[1]",
        ] {
            assert!(
                answer_of(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
