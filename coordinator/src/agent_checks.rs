//! A submission's agent checked against its graph before anything is stored: a command agent
//! names a program and stays within `shared::limits`, the built-in loop's turns and tokens do
//! too, and a scripted agent has steps for the agent nodes its graph starts with.

use shared::graph::{Graph, GraphBundle, NodeKind};
use shared::messages::{AgentConfig, ScriptStep};
use shared::providers::Provider;
use std::collections::BTreeMap;

/// What is wrong with a command agent: no program, or budgets past `shared::limits`.
fn command_exceeds(c: &shared::messages::CommandAgent) -> Option<String> {
    use shared::limits::{MAX_COMMAND_CALLS, MAX_COMMAND_TOKENS};
    if c.argv.first().is_none_or(|p| p.trim().is_empty()) {
        return Some("the command agent has no program (`argv` is empty)".into());
    }
    if c.model.trim().is_empty() {
        return Some("the command agent has no model".into());
    }
    if c.max_calls == 0 || c.max_calls > MAX_COMMAND_CALLS {
        return Some(format!(
            "max_calls is {}; it must be between 1 and {MAX_COMMAND_CALLS}",
            c.max_calls
        ));
    }
    if c.max_tokens == 0 || c.max_tokens > MAX_COMMAND_TOKENS {
        return Some(format!(
            "max_tokens is {}; it must be between 1 and {MAX_COMMAND_TOKENS}",
            c.max_tokens
        ));
    }
    None
}

/// What is wrong with the submission's agent for this graph, as a message: budgets past
/// `shared::limits`, or a script that cannot drive the graph's agent nodes (empty, an empty
/// entry for an agent node, none for the start node, or steps only for nodes that are not
/// the graph's agents).
pub(crate) fn agent_exceeds(agent: &AgentConfig, graph: &Graph) -> Option<String> {
    use shared::limits::{MAX_TOKENS, MAX_TURNS};
    let agents: Vec<&str> = graph
        .nodes
        .iter()
        .filter(|(_, n)| n.kind() == NodeKind::Agent)
        .map(|(id, _)| id.as_str())
        .collect();
    let llm = match agent {
        AgentConfig::Anthropic(c) | AgentConfig::Openai(c) => c,
        AgentConfig::Scripted { script } => return script_misses(script, graph, &agents),
        AgentConfig::Command(c) => return command_exceeds(c),
    };
    if llm.max_turns == 0 || llm.max_turns > MAX_TURNS {
        return Some(format!(
            "max_turns is {}; it must be between 1 and {MAX_TURNS}",
            llm.max_turns
        ));
    }
    if llm.max_tokens == 0 || llm.max_tokens > MAX_TOKENS {
        return Some(format!(
            "max_tokens is {}; it must be between 1 and {MAX_TOKENS}",
            llm.max_tokens
        ));
    }
    // Anthropic's Messages API takes 0.0 to 1.0, OpenAI's chat completions 0 to 2 (their
    // API references).
    let top = if matches!(agent, AgentConfig::Anthropic(_)) {
        1.0
    } else {
        2.0
    };
    if !llm.temperature.is_finite() || !(0.0..=top).contains(&llm.temperature) {
        return Some(format!(
            "temperature is {}; it must be between 0 and {top}",
            llm.temperature
        ));
    }
    None
}

/// A run's model without a price: refused (closed by default), never counted at $0.
pub(crate) fn unpriced(agent: &AgentConfig, prices: &worker::agent::PriceTable) -> Option<String> {
    let model = model_of(agent)?;
    prices.price(model).is_none().then(|| {
        format!(
            "no price for model `{model}`: a run's spend is never counted at $0; name its price \
             in FLEET_PRICES (`{{\"{model}\": [usd_per_mtok_in, usd_per_mtok_out]}}`) on the \
             coordinators and workers"
        )
    })
}

/// The model a run's agents call (none for a script).
pub(crate) fn model_of(agent: &AgentConfig) -> Option<&str> {
    match agent {
        AgentConfig::Anthropic(c) | AgentConfig::Openai(c) => Some(&c.model),
        AgentConfig::Command(c) => Some(&c.model),
        AgentConfig::Scripted { .. } => None,
    }
}

/// The provider a run's agents call: the built-in loop's API, or a command agent's.
pub(crate) fn provider_of(agent: &AgentConfig) -> Option<Provider> {
    match agent {
        AgentConfig::Anthropic(_) => Some(Provider::Anthropic),
        AgentConfig::Openai(_) => Some(Provider::Openai),
        AgentConfig::Command(c) => Some(match c.api {
            shared::agent_config::LlmApi::Anthropic => Provider::Anthropic,
            shared::agent_config::LlmApi::Openai => Provider::Openai,
        }),
        AgentConfig::Scripted { .. } => None,
    }
}

/// The providers' rules on the graph's agent schemas for this submission: what the run's
/// provider would refuse, as messages (the submission is refused); what the other provider
/// would refuse is logged as a warning.
pub(crate) fn provider_refusals(agent: &AgentConfig, bundle: &GraphBundle) -> Vec<String> {
    let provider = provider_of(agent);
    let found = shared::graph::check_providers(bundle, provider.as_slice());
    for w in &found.warnings {
        tracing::warn!(graph = %bundle.source, warning = %w, "another provider would refuse this graph's schema");
    }
    found.errors.iter().map(|e| e.to_string()).collect()
}

/// A scripted agent for a graph with agent nodes: every entry it has for an agent node has
/// steps, the start node (when it is an agent) has an entry, and at least one agent node has
/// one. Nodes that may never run (a path the script does not take) need none.
fn script_misses(
    script: &BTreeMap<String, Vec<ScriptStep>>,
    graph: &Graph,
    agents: &[&str],
) -> Option<String> {
    if agents.is_empty() {
        return None;
    }
    let steps: usize = script.values().map(Vec::len).sum();
    if steps == 0 {
        return Some(format!(
            "the graph has agent nodes ({}) and the agent script has no steps",
            agents.join(", ")
        ));
    }
    if let Some(empty) = agents
        .iter()
        .find(|a| script.get(**a).is_some_and(Vec::is_empty))
    {
        return Some(format!(
            "the agent script's entry for node `{empty}` has no steps"
        ));
    }
    let start = graph.start.as_str();
    if agents.contains(&start) && !script.contains_key(start) {
        return Some(format!(
            "the graph starts with agent node `{start}` and the agent script has no steps for it"
        ));
    }
    if !agents.iter().any(|a| script.contains_key(*a)) {
        return Some(format!(
            "the agent script has steps for {} but none for the graph's agent nodes ({})",
            script
                .keys()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", "),
            agents.join(", ")
        ));
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use shared::messages::LlmConfig;

    fn llm(turns: u32, tokens: u32) -> AgentConfig {
        AgentConfig::Anthropic(LlmConfig {
            model: "m".into(),
            temperature: 0.0,
            max_tokens: tokens,
            max_turns: turns,
        })
    }

    fn graph(start: &str) -> Graph {
        serde_yaml::from_str(&format!(
            "name: g\nstart: {start}\nnodes:\n  \
             a: {{kind: agent, template: t.j2, output_schema: s.json}}\n  \
             b: {{kind: agent, template: t.j2, output_schema: s.json}}\n  \
             c: {{kind: command, commands: [x]}}\n"
        ))
        .expect("a graph")
    }

    pub(crate) fn no_agents() -> Graph {
        serde_yaml::from_str("name: g\nstart: c\nnodes:\n  c: {kind: command, commands: [x]}\n")
            .expect("a graph")
    }

    pub(crate) fn script(entries: &[(&str, usize)]) -> AgentConfig {
        AgentConfig::Scripted {
            script: entries
                .iter()
                .map(|(node, n)| (node.to_string(), vec![ScriptStep::default(); *n]))
                .collect(),
        }
    }

    #[test]
    fn agent_budgets_past_the_limits_are_refused() {
        let g = graph("a");
        assert_eq!(agent_exceeds(&llm(20, 4096), &g), None);
        assert!(agent_exceeds(&llm(4_000_000_000, 4096), &g)
            .unwrap()
            .contains("max_turns is 4000000000"));
        assert!(agent_exceeds(&llm(20, 0), &g)
            .unwrap()
            .contains("max_tokens"));
    }

    #[test]
    fn command_agents_without_a_program_or_past_their_limits_are_refused() {
        let g = graph("a");
        let command = |argv: &[&str], model: &str, calls: u32, tokens: u64| {
            AgentConfig::Command(shared::messages::CommandAgent {
                argv: argv.iter().map(|a| a.to_string()).collect(),
                api: shared::messages::LlmApi::Anthropic,
                model: model.into(),
                max_calls: calls,
                max_tokens: tokens,
            })
        };
        assert_eq!(agent_exceeds(&command(&["agent"], "m", 5, 100), &g), None);
        let why = |a| agent_exceeds(&a, &g).unwrap_or_default();
        assert!(why(command(&[], "m", 5, 100)).contains("no program"));
        assert!(why(command(&["  "], "m", 5, 100)).contains("no program"));
        assert!(why(command(&["agent"], " ", 5, 100)).contains("no model"));
        assert!(why(command(&["agent"], "m", 0, 100)).contains("max_calls is 0"));
        assert!(why(command(&["agent"], "m", 5, u64::MAX)).contains("max_tokens"));
    }

    #[test]
    fn scripts_that_cannot_drive_the_graph_are_refused() {
        let g = graph("a");
        let empty = script(&[]);
        assert!(agent_exceeds(&empty, &g).unwrap().contains("no steps"));
        assert_eq!(
            agent_exceeds(&empty, &no_agents()),
            None,
            "graphs without agents need none"
        );
        assert!(agent_exceeds(&script(&[("a", 0)]), &g)
            .unwrap()
            .contains("no steps"));
        let only_b_empty = agent_exceeds(&script(&[("a", 1), ("b", 0)]), &g).unwrap();
        assert!(
            only_b_empty.contains("node `b` has no steps"),
            "{only_b_empty}"
        );
        let no_start = agent_exceeds(&script(&[("b", 1)]), &g).unwrap();
        assert!(
            no_start.contains("starts with agent node `a`"),
            "{no_start}"
        );
        let elsewhere = agent_exceeds(&script(&[("se", 2)]), &graph("c")).unwrap();
        assert!(
            elsewhere.contains("steps for `se` but none for the graph's agent nodes (a, b)"),
            "{elsewhere}"
        );
        // A node the script's path never reaches may go without steps.
        assert_eq!(agent_exceeds(&script(&[("a", 1)]), &g), None);
        assert_eq!(agent_exceeds(&script(&[("b", 1)]), &graph("c")), None);
    }
}
