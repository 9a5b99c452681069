//! The graph against the LLM providers' rules (`crate::providers`): an agent node's output
//! schema is sent as the `submit` tool's schema (Anthropic's `input_schema`, OpenAI's
//! `function.parameters`), so a schema a provider refuses fails every request of that node.

use super::CheckError;
use crate::graph::GraphBundle;
use crate::providers::{tool_breaches, Provider};

/// What the providers would refuse of a graph: errors for the providers the run is meant
/// for, warnings for the others.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProviderFindings {
    pub errors: Vec<CheckError>,
    pub warnings: Vec<CheckError>,
}

/// Checks every agent node's output schema as the `submit` tool's schema for each provider;
/// a breach is an error for a provider in `errors_for` and a warning for any other. A schema
/// that is not in the bundle or not JSON is left to [`super::check`].
pub fn check_providers(bundle: &GraphBundle, errors_for: &[Provider]) -> ProviderFindings {
    let mut found = ProviderFindings::default();
    for (id, node) in &bundle.graph.nodes {
        let Some(agent) = node.agent() else { continue };
        let path = agent.output_schema.as_str();
        let Some(schema) = bundle
            .file(path)
            .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
        else {
            continue;
        };
        for provider in Provider::ALL {
            for breach in tool_breaches(provider, crate::providers::SUBMIT_TOOL, &schema) {
                let e = CheckError::new(
                    &bundle.source,
                    Some(id.as_str()),
                    "output_schema",
                    format!(
                        "`{path}`, sent as the `submit` tool's {}: {breach}",
                        provider.schema_field()
                    ),
                );
                if errors_for.contains(&provider) {
                    found.errors.push(e);
                } else {
                    found.warnings.push(e);
                }
            }
        }
    }
    found
}
