//! How a run's agent nodes are served ([`AgentConfig`]): a script, the built-in loop over
//! one of two LLM APIs ([`LlmConfig`]), or a program in the image that reaches the model only
//! through the worker's gateway ([`CommandAgent`]). Belongs to the run, not the graph.

use crate::messages::ScriptStep;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How agent nodes of a run are served. Belongs to the run, not the graph.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(tag = "backend", rename_all = "snake_case", deny_unknown_fields)]
pub enum AgentConfig {
    /// Per node, the steps for visits 1, 2, ... (the last repeats).
    Scripted {
        script: BTreeMap<String, Vec<ScriptStep>>,
    },
    /// The built-in agent loop over the Anthropic Messages API.
    Anthropic(LlmConfig),
    /// The built-in agent loop over OpenAI-compatible chat completions.
    Openai(LlmConfig),
    /// An agent program installed in the node's image, reaching the model only through the
    /// worker's LLM gateway (which holds the key and the budget).
    Command(CommandAgent),
}

/// The API a command agent speaks through the gateway.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LlmApi {
    /// `POST /v1/messages`.
    Anthropic,
    /// `POST /v1/chat/completions`.
    Openai,
}

/// An agent program run in the node's container: it reads the job (prompt, output schema,
/// session id) as JSON on stdin and prints `{"output": ...}` as the last line of its stdout.
/// Its only way to the model is the worker's gateway, a unix socket whose path is in
/// `FLEET_LLM_SOCKET`; the container's network stays closed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandAgent {
    /// The program and its arguments (looked up on the image's `PATH`).
    pub argv: Vec<String>,
    pub api: LlmApi,
    /// Every call is made with this model, whatever the program asks for.
    pub model: String,
    /// Calls the run's command agents may make through their gateways, over every job (then
    /// a gateway answers 429 `budget_exhausted`).
    #[serde(default = "default_max_calls")]
    pub max_calls: u32,
    /// Input plus output tokens the run's command agents may spend, over every job (checked
    /// before each call).
    #[serde(default = "default_max_job_tokens")]
    pub max_tokens: u64,
}

/// What is left of a run's command-agent budget when a job is published: its gateway allows
/// no more. The run's usage counts finished jobs only, so agents running at once in one run
/// may together spend up to one budget each beyond it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LlmBudget {
    pub calls: u32,
    pub tokens: u64,
}

impl LlmBudget {
    /// The budget left of `agent`'s after the run spent `used`.
    pub fn left(agent: &CommandAgent, used: &crate::messages::Usage) -> LlmBudget {
        LlmBudget {
            calls: agent.max_calls.saturating_sub(used.llm_calls),
            tokens: agent
                .max_tokens
                .saturating_sub(used.input_tokens.saturating_add(used.output_tokens)),
        }
    }
}

fn default_max_calls() -> u32 {
    50
}
fn default_max_job_tokens() -> u64 {
    1_000_000
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig::Scripted {
            script: BTreeMap::new(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    pub model: String,
    #[serde(default)]
    pub temperature: f64,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    #[serde(default = "default_max_turns")]
    pub max_turns: u32,
}

fn default_max_tokens() -> u32 {
    4096
}
fn default_max_turns() -> u32 {
    20
}

impl AgentConfig {
    /// The "model" that enters the run id: a scripted agent's model is its script.
    pub fn model_identity(&self) -> String {
        match self {
            AgentConfig::Scripted { script } => {
                format!("scripted:{}", &crate::hashing::canonical_hash(script)[..12])
            }
            AgentConfig::Anthropic(c) => format!("anthropic:{}", c.model),
            AgentConfig::Openai(c) => format!("openai:{}", c.model),
            AgentConfig::Command(c) => format!(
                "command:{}:{}",
                c.model,
                &crate::hashing::canonical_hash(&c.argv)[..12]
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::Usage;

    #[test]
    fn the_budget_left_is_the_runs_less_what_it_spent_never_below_zero() {
        let agent = CommandAgent {
            argv: vec!["a".into()],
            api: LlmApi::Openai,
            model: "m".into(),
            max_calls: 5,
            max_tokens: 1000,
        };
        let used = |calls, input, output| Usage {
            llm_calls: calls,
            input_tokens: input,
            output_tokens: output,
            cost_usd: 0.0,
        };
        let left = |u: Usage| LlmBudget::left(&agent, &u);
        assert_eq!(
            left(used(0, 0, 0)),
            LlmBudget {
                calls: 5,
                tokens: 1000
            }
        );
        assert_eq!(
            left(used(2, 300, 100)),
            LlmBudget {
                calls: 3,
                tokens: 600
            }
        );
        assert_eq!(
            left(used(9, u64::MAX, 7)),
            LlmBudget {
                calls: 0,
                tokens: 0
            }
        );
    }
}
