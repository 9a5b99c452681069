//! The built-in agent loop, written once over `ChatApi`: turns up to `max_turns`, the nudge,
//! tool calls run in the container, the `submit` tool and text answers checked against the
//! schema, token counts and cost, and the transcript.

use super::llm::{
    count_tokens, json_from_text, post_with_retry, Billed, LlmError, LlmSettings, Price, SUBMIT,
    SUBMIT_DESCRIPTION,
};
use super::provider::{ChatApi, Endpoint, Reply, ToolCall, ToolOutput, ToolResult};
use super::{validate, AgentJob, AgentOutcome, NUDGE};
use crate::tools::ToolDef;
use async_trait::async_trait;
use serde_json::Value;
use shared::messages::{JobStatus, LlmConfig, Usage};
use std::time::Instant;
use tracing::debug;

/// How a conversation ends short of an API error: a valid answer, or why none came.
pub type Ended = Result<Value, String>;

/// Sends a request body and returns the response body (counting the call into `usage`).
#[async_trait]
pub trait Transport: Sync {
    async fn post(
        &self,
        endpoint: &Endpoint,
        body: &Value,
        usage: &mut Usage,
    ) -> Result<Value, LlmError>;

    /// What the job's team has left to spend today, if it has a dollar limit.
    async fn team_usd_left(&self) -> Result<Option<f64>, LlmError> {
        Ok(None)
    }
}

/// The real transport: HTTP with retries.
struct Http<'a> {
    client: &'a reqwest::Client,
    settings: &'a LlmSettings,
}

#[async_trait]
impl Transport for Http<'_> {
    async fn post(
        &self,
        endpoint: &Endpoint,
        body: &Value,
        usage: &mut Usage,
    ) -> Result<Value, LlmError> {
        let Endpoint { url, headers } = endpoint;
        post_with_retry(self.client, url, headers, body, self.settings, usage).await
    }

    async fn team_usd_left(&self) -> Result<Option<f64>, LlmError> {
        match (&self.settings.gate, &self.settings.scope) {
            (Some(gate), Some(scope)) => gate
                .usd_left(scope)
                .await
                .map_err(|e| LlmError::Quota(e.into())),
            _ => Ok(None),
        }
    }
}

/// Runs the agent over `api`; `prior` is the transcript of the session it continues, if any.
pub async fn run<A: ChatApi>(
    api: &A,
    job: AgentJob<'_>,
    cfg: &LlmConfig,
    settings: &LlmSettings,
    http: &reqwest::Client,
    prior: Option<Value>,
) -> AgentOutcome {
    let transport = Http {
        client: http,
        settings,
    };
    let mut messages = api.start(prior.as_ref(), &job.prompt);
    let mut usage = Usage::default();
    // Closed by default: no call of a model without a price.
    let price = settings
        .prices
        .price(&cfg.model)
        .ok_or_else(|| LlmError::NoPrice(cfg.model.clone()));
    let ended = match (api.endpoint(settings), price) {
        (Ok(endpoint), Ok(price)) => {
            let chat = Chat {
                api,
                job: &job,
                cfg,
                endpoint,
                transport: &transport,
                money: Money {
                    price,
                    usd_left: job.usd_left,
                },
            };
            chat.converse(&mut messages, &mut usage).await
        }
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    conclude(ended, usage, api.transcript(&cfg.model, messages))
}

/// How a conversation ended: a valid answer, no valid answer (the schema was never met), or an
/// error of the API.
pub fn conclude(ended: Result<Ended, LlmError>, usage: Usage, transcript: Value) -> AgentOutcome {
    let (status, output, error) = match ended {
        Ok(Ok(output)) => (JobStatus::Ok, output, None),
        Ok(Err(invalid)) => (JobStatus::OutputInvalid, Value::Null, Some(invalid)),
        Err(e) => (JobStatus::Error, Value::Null, Some(e.to_string())),
    };
    AgentOutcome {
        status,
        output,
        error,
        usage,
        transcript,
    }
}

/// Reads a response body: counts its tokens into `usage` (also when the rest is malformed),
/// then parses it.
pub fn read_reply<A: ChatApi>(api: &A, body: &Value, usage: &mut Usage) -> Result<Reply, LlmError> {
    let tokens = api.usage(body);
    count_tokens(usage, tokens.input, tokens.output);
    api.parse(body)
}

/// One conversation: the API, the job, where its requests go, and what it may spend.
pub struct Chat<'a, A, T> {
    pub api: &'a A,
    pub job: &'a AgentJob<'a>,
    pub cfg: &'a LlmConfig,
    pub endpoint: Endpoint,
    pub transport: &'a T,
    pub money: Money,
}

/// The model's price and what the run's budget had left when the job was published.
#[derive(Clone, Copy, Debug)]
pub struct Money {
    pub price: Price,
    pub usd_left: Option<f64>,
}

impl Money {
    /// The `max_tokens` of the next call: the configured one, clamped to the output tokens
    /// the budget still pays for once the call's input is paid: the run's budget (less what
    /// this job spent) or the team's (`team_left`, read from the fleet's ledger before the
    /// call, this job's spend included), whichever has less. The input is estimated from
    /// below by the previous call's (a conversation only grows) and from the body's size
    /// (4 bytes a token). `Budget` when not one output token is left.
    pub fn max_tokens(
        &self,
        configured: u32,
        spent_usd: f64,
        input_estimate: u64,
        team_left: Option<f64>,
    ) -> Result<u32, LlmError> {
        let run_left = self.usd_left.map(|left| left - spent_usd);
        let left = match (run_left, team_left) {
            (None, None) => return Ok(configured),
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
        };
        let input = Billed {
            input: input_estimate,
            ..Billed::default()
        };
        let mut affordable = self.price.output_tokens_for(left - self.price.cost(&input));
        let team_binds = team_left.is_some_and(|t| run_left.is_none_or(|r| t < r));
        if affordable == 0 && team_binds {
            // The team's ledger stops the next call at 100% (`budget_exhausted`); until then
            // a call whose input may pass what is left goes with the least output.
            affordable = 1;
        }
        if affordable == 0 {
            return Err(LlmError::Budget {
                left: left.max(0.0),
            });
        }
        Ok(u32::try_from(affordable)
            .unwrap_or(u32::MAX)
            .min(configured))
    }
}

/// What answering one tool call came to.
enum Answered {
    /// A `submit` that meets the schema: the conversation's answer.
    Submitted(Value),
    Result(ToolResult),
}

impl<A: ChatApi, T: Transport> Chat<'_, A, T> {
    /// `Ok(Ok(output))` on a valid answer, `Ok(Err(reason))` when none came in `max_turns`.
    pub async fn converse(
        &self,
        messages: &mut Vec<Value>,
        usage: &mut Usage,
    ) -> Result<Ended, LlmError> {
        let tools = self.tools();
        let mut last_problem = String::from("the agent never submitted");
        let started = Instant::now();
        let mut nudged = false;
        // The tokens the last call read and wrote: the next call reads at least as many.
        let mut last_input = 0u64;
        for turn in 0..self.cfg.max_turns {
            if !nudged && self.job.nudge_after.is_some_and(|n| started.elapsed() >= n) {
                nudged = true;
                debug!(
                    api = A::NAME,
                    node = self.job.node,
                    turn,
                    "nudging the agent"
                );
                self.api.nudge(messages, NUDGE);
            }
            // A turn boundary: messages from other sessions join the last user turn.
            if let Some(inbox) = self.job.inbox {
                let arrived = inbox.take();
                if !arrived.is_empty() {
                    debug!(
                        api = A::NAME,
                        node = self.job.node,
                        turn,
                        count = arrived.len(),
                        "messages delivered into the session"
                    );
                    self.api.nudge(messages, &super::inbox::as_text(&arrived));
                }
            }
            let mut cfg = self.cfg.clone();
            let sized = self.api.request(&cfg, &tools, messages).to_string().len() as u64 / 4;
            let team_left = self.transport.team_usd_left().await?;
            cfg.max_tokens = self.money.max_tokens(
                cfg.max_tokens,
                usage.cost_usd,
                sized.max(last_input),
                team_left,
            )?;
            if cfg.max_tokens < self.cfg.max_tokens {
                debug!(
                    api = A::NAME,
                    node = self.job.node,
                    turn,
                    max_tokens = cfg.max_tokens,
                    team_usd_left = team_left,
                    "max_tokens clamped to the run's or the team's budget"
                );
            }
            let body = self.api.request(&cfg, &tools, messages);
            let resp = self.transport.post(&self.endpoint, &body, usage).await?;
            let billed = Billed::of_reply(&resp);
            usage.cost_usd += self.money.price.cost(&billed);
            usage.input_tokens = usage
                .input_tokens
                .saturating_add(billed.cache_write.saturating_add(billed.cache_read));
            last_input = [billed.output, billed.cache_write, billed.cache_read]
                .into_iter()
                .fold(billed.input, u64::saturating_add);
            let reply = read_reply(self.api, &resp, usage)?;
            debug!(
                api = A::NAME,
                node = self.job.node,
                turn,
                calls = reply.calls.len(),
                stop_reason = reply.stop_reason.as_deref().unwrap_or(""),
                "llm replied"
            );
            messages.push(reply.turn);
            if reply.calls.is_empty() {
                if let Some(v) = json_from_text(&reply.text) {
                    match validate(self.job.schema, &v) {
                        Ok(()) => return Ok(Ok(v)),
                        Err(e) => last_problem = e,
                    }
                }
                messages.push(self.api.user_text(format!(
                    "Call the `submit` {} with your final answer. ({last_problem})",
                    A::TOOL_NOUN
                )));
                continue;
            }
            let mut results = Vec::with_capacity(reply.calls.len());
            for call in reply.calls {
                match self.answer(call, &mut last_problem).await {
                    Answered::Submitted(output) => return Ok(Ok(output)),
                    Answered::Result(result) => results.push(result),
                }
            }
            messages.extend(self.api.tool_results(results));
        }
        Ok(Err(format!(
            "no valid answer within {} turns: {last_problem}",
            self.cfg.max_turns
        )))
    }

    /// The node's tools, then `submit` with the output schema as its input schema.
    fn tools(&self) -> Vec<ToolDef> {
        let mut tools = self.job.tools.definitions();
        tools.push(ToolDef {
            name: SUBMIT,
            description: SUBMIT_DESCRIPTION,
            schema: self.job.schema.clone(),
        });
        tools
    }

    /// Answers one call: a `submit` is checked against the schema (a failing one becomes
    /// `last_problem`), any other call runs in the container.
    async fn answer(&self, call: ToolCall, last_problem: &mut String) -> Answered {
        let output = match call.input {
            Err(e) => ToolOutput::Refused(e),
            Ok(input) if call.name == SUBMIT => match validate(self.job.schema, &input) {
                Ok(()) => return Answered::Submitted(input),
                Err(e) => {
                    last_problem.clone_from(&e);
                    ToolOutput::Refused(e)
                }
            },
            Ok(input) => match self.job.tools.call(&call.name, &input).await {
                Ok(text) => ToolOutput::Done(text),
                Err(e) => ToolOutput::Failed(e),
            },
        };
        Answered::Result(ToolResult {
            id: call.id,
            output,
        })
    }
}
