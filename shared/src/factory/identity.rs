//! Run identity: a run is named by a hash over everything in its submission that changes what
//! runs, so a changed graph, agent or repository is a new run, and an unchanged submission the
//! same run.

use crate::hashing::{canonical_hash, sha256_hex};
use crate::messages::AgentConfig;
use serde_json::{json, Value};

/// What a submission runs, besides its input: the graph bundle, the agent and the repository.
#[derive(Clone, Copy, Debug)]
pub struct RunIdentity<'a> {
    /// The graph bundle's content hash (graph, templates and schemas).
    pub graph_hash: &'a str,
    /// The agent: the script, or the API, the model and every parameter of the loop.
    pub agent: &'a AgentConfig,
    /// The commit the run starts from.
    pub base_commit: &'a str,
    /// The seed's hash of that commit's files.
    pub repo_tree_hash: &'a str,
}

/// Keys of a run's input that only say where something was read from (the factory's
/// `work_order_path`): they travel with the run but do not change what runs.
const NOT_IDENTITY: &[&str] = &["work_order_path"];

impl RunIdentity<'_> {
    /// The submission's content hash: sha256 of the canonical JSON of the graph hash, the input
    /// (as the run sees it, without `NOT_IDENTITY` keys), the agent, the base commit and the
    /// tree hash. Stored with the run as `meta.submission_hash`.
    pub fn submission_hash(&self, input: &Value) -> String {
        let mut input = input.clone();
        if let Some(obj) = input.as_object_mut() {
            for key in NOT_IDENTITY {
                obj.remove(*key);
            }
        }
        canonical_hash(&json!({
            "v": 1,
            "graph": self.graph_hash,
            "input": input,
            "agent": self.agent,
            "base_commit": self.base_commit,
            "repo_tree_hash": self.repo_tree_hash,
        }))
    }

    /// The run id of a submission to any graph but the factory: the submission hash's first
    /// 12 hex digits; with the hash itself.
    pub fn run_id(&self, input: &Value) -> (String, String) {
        let hash = self.submission_hash(input);
        (hash[..12].to_string(), hash)
    }
}

/// The factory's run id: the seed's `sha256(work_order_hash + repo_tree_hash_before +
/// config_hash)`, extended by the submission hash (the seed's parts leave out the graph, the
/// agent's script or parameters and the commit), first 12 hex digits.
pub fn factory_run_id(
    work_order_hash: &str,
    repo_tree_hash_before: &str,
    config_hash: &str,
    submission_hash: &str,
) -> String {
    sha256_hex(
        format!("{work_order_hash}{repo_tree_hash_before}{config_hash}{submission_hash}")
            .as_bytes(),
    )[..12]
        .to_string()
}

/// Whether `id` may name a run given by the submitter: 1 to 64 ASCII letters, digits, `-` or
/// `_` (a run id is part of object keys and of job ids, `<run>.<node>.<visit>`).
pub fn valid_run_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{LlmConfig, ScriptStep};

    fn scripted(summary: &str) -> AgentConfig {
        let step: ScriptStep =
            serde_json::from_value(json!({"output": {"summary": summary}})).expect("a script step");
        AgentConfig::Scripted {
            script: [("se".to_string(), vec![step])].into_iter().collect(),
        }
    }

    fn llm(model: &str, max_turns: u32) -> AgentConfig {
        AgentConfig::Anthropic(LlmConfig {
            model: model.into(),
            temperature: 0.0,
            max_tokens: 4096,
            max_turns,
        })
    }

    #[test]
    fn every_part_of_a_submission_changes_its_hash() {
        let agent = scripted("a");
        let base = RunIdentity {
            graph_hash: "g",
            agent: &agent,
            base_commit: "c",
            repo_tree_hash: "t",
        };
        let input = json!({"x": 1});
        let h = base.submission_hash(&input);
        assert_eq!(h, base.submission_hash(&input), "deterministic");
        let other_agent = scripted("b");
        let llm_a = llm("m", 20);
        let llm_b = llm("m", 21);
        let variants = [
            RunIdentity {
                graph_hash: "g2",
                ..base
            },
            RunIdentity {
                agent: &other_agent,
                ..base
            },
            RunIdentity {
                base_commit: "c2",
                ..base
            },
            RunIdentity {
                repo_tree_hash: "t2",
                ..base
            },
        ];
        for v in variants {
            assert_ne!(v.submission_hash(&input), h, "{v:?}");
        }
        assert_ne!(base.submission_hash(&json!({"x": 2})), h);
        // Every parameter of a model agent counts, not only the model's name.
        let a = RunIdentity {
            agent: &llm_a,
            ..base
        };
        let b = RunIdentity {
            agent: &llm_b,
            ..base
        };
        assert_ne!(a.submission_hash(&input), b.submission_hash(&input));
    }

    #[test]
    fn where_the_work_order_was_read_from_is_not_identity() {
        let agent = scripted("a");
        let id = RunIdentity {
            graph_hash: "g",
            agent: &agent,
            base_commit: "c",
            repo_tree_hash: "t",
        };
        assert_eq!(
            id.submission_hash(&json!({"work_order": {"a": 1}, "work_order_path": "/x/wo.json"})),
            id.submission_hash(&json!({"work_order": {"a": 1}, "work_order_path": "wo.json"}))
        );
        let (run, hash) = id.run_id(&json!({}));
        assert_eq!(run, hash[..12]);
    }

    #[test]
    fn factory_ids_extend_the_seeds_formula() {
        let a = factory_run_id("w", "t", "c", "s1");
        assert_eq!(a.len(), 12);
        assert_eq!(a, factory_run_id("w", "t", "c", "s1"));
        assert_ne!(a, factory_run_id("w", "t", "c", "s2"));
        assert_eq!(a, sha256_hex(b"wtcs1")[..12]);
    }

    #[test]
    fn run_ids_given_by_a_submitter_are_plain() {
        assert!(valid_run_id("my-run_1"));
        for bad in ["", "a.b", "../x", "a/b", "a b", &"x".repeat(65), "é"] {
            assert!(!valid_run_id(bad), "{bad:?}");
        }
    }
}
