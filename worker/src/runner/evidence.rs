//! An agent's cited evidence checked against what its job kept: every screenshot the answer
//! names (the node's `evidence:` expression over `output`) must be one this job's browser calls
//! took (`screenshots/<n>-<name>.png`, named in full, as `<n>-<name>.png`, or by `<name>`). A
//! verifier that invents a screenshot to back a pass gets `output_invalid`, so its pass never
//! counts.

use crate::agent::AgentOutcome;
use serde_json::{json, Value};
use shared::graph::AgentBody;
use shared::messages::JobStatus;
use std::collections::BTreeMap;

/// Marks `out` invalid when it cites a screenshot the job did not keep (`kept`: the job's
/// artifacts by name).
pub(super) fn check(node: &AgentBody, out: &mut AgentOutcome, kept: &BTreeMap<String, String>) {
    let Some(expr) = &node.evidence else {
        return;
    };
    if out.status != JobStatus::Ok {
        return;
    }
    let cited = match shared::expr::eval(expr, &json!({"output": out.output})) {
        Ok(Value::Array(items)) => items,
        Ok(Value::Null) => Vec::new(),
        Ok(other) => return invalid(out, format!("evidence: `{expr}` gave {other}, not a list")),
        Err(e) => return invalid(out, format!("evidence: `{expr}` cannot be read: {e}")),
    };
    if let Err(why) = missing(&cited, kept) {
        invalid(out, why);
    }
}

fn invalid(out: &mut AgentOutcome, why: String) {
    tracing::info!(reason = %why, "answer cites evidence it does not have");
    out.status = JobStatus::OutputInvalid;
    out.error = Some(why);
}

/// The first cited screenshot that is not among `kept`.
fn missing(cited: &[Value], kept: &BTreeMap<String, String>) -> Result<(), String> {
    let shots: Vec<&str> = kept
        .keys()
        .map(String::as_str)
        .filter(|k| k.starts_with("screenshots/"))
        .collect();
    for c in cited {
        let Some(name) = c.as_str() else {
            return Err(format!("evidence: {c} is not a screenshot's name"));
        };
        if !shots.iter().any(|s| names(s).contains(&name)) {
            return Err(format!(
                "evidence: the answer cites screenshot `{}` that this job did not take (it took {})",
                shared::text::head(name, 200),
                if shots.is_empty() {
                    "none".to_string()
                } else {
                    shots.join(", ")
                }
            ));
        }
    }
    Ok(())
}

/// The names a kept screenshot may be cited by: `screenshots/3-home.png`, `3-home.png`,
/// `home.png`, `home`.
fn names(artifact: &str) -> [&str; 4] {
    let file = artifact.trim_start_matches("screenshots/");
    let plain = file.split_once('-').map_or(file, |(_, rest)| rest);
    [artifact, file, plain, plain.trim_end_matches(".png")]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(names: &[&str]) -> BTreeMap<String, String> {
        names
            .iter()
            .map(|n| (n.to_string(), format!("runs/r/verify/{n}")))
            .collect()
    }

    #[test]
    fn a_screenshot_the_job_took_may_be_cited_by_any_of_its_names() {
        let k = kept(&[
            "screenshots/1-home.png",
            "screenshots/2-after-add.png",
            "transcript.json",
        ]);
        for cited in [
            "screenshots/1-home.png",
            "1-home.png",
            "home.png",
            "home",
            "after-add",
        ] {
            assert_eq!(missing(&[json!(cited)], &k), Ok(()), "{cited}");
        }
    }

    #[test]
    fn an_invented_screenshot_or_another_artifact_is_not_evidence() {
        let k = kept(&["screenshots/1-home.png", "transcript.json"]);
        for cited in [
            json!("forged.png"),
            json!("transcript.json"),
            json!("screenshots/2-home.png"),
            json!(7),
        ] {
            assert!(
                missing(std::slice::from_ref(&cited), &k).is_err(),
                "{cited}"
            );
        }
        let none = missing(&[json!("home")], &kept(&[])).unwrap_err();
        assert!(none.contains("it took none"), "{none}");
    }
}
