//! A verifier's answer matched against the feature it verifies (seed 004): the answer's steps
//! are the feature's steps, one to one and in order (an invented, reworded or missing step is
//! refused), and a pass stands only when every step cites a screenshot the harness took in that
//! job, each step its own, in the order they were taken. The cited names are given back as the
//! artifacts they resolve to: the evidence a verdict or a quarantine item carries.

use serde_json::Value;
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum StepsError {
    #[error("the answer has no `test_passes` boolean or no `steps` list")]
    Shape,
    #[error("step {at}: numbered {number}, not {at}")]
    Number { at: usize, number: String },
    #[error("step {at}: `{given}` is not the feature's step `{expected}`")]
    Text {
        at: usize,
        given: String,
        expected: String,
    },
    #[error("step {at}: `{given}` is invented: the feature has {count} steps")]
    Invented {
        at: usize,
        given: String,
        count: usize,
    },
    #[error("a pass answers {given} of the feature's {count} steps")]
    Missing { given: usize, count: usize },
    #[error("a pass with step {at} not passed")]
    NotPassed { at: usize },
    #[error("step {at}: a pass needs a screenshot the harness took for every step")]
    NoEvidence { at: usize },
    #[error("step {at}: cites screenshot `{name}`, which this job did not take after the previous step's (it took {taken})")]
    NotTaken {
        at: usize,
        name: String,
        taken: String,
    },
    #[error("a fail with no step failed")]
    NoFailedStep,
}

/// The texts compared: whitespace collapsed, a leading `Step N:` dropped.
fn normal(text: &str) -> String {
    let t = text.trim();
    let rest = t
        .strip_prefix("Step ")
        .and_then(|r| r.split_once(':'))
        .filter(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        .map_or(t, |(_, r)| r);
    rest.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The capture number and the names a kept screenshot may be cited by
/// (`screenshots/3-home.png`, `3-home.png`, `home.png`, `home`).
fn shot(artifact: &str) -> Option<(u32, [&str; 4])> {
    let file = artifact.strip_prefix("screenshots/")?;
    let (n, plain) = file.split_once('-')?;
    let n = n.parse().ok()?;
    Some((n, [artifact, file, plain, plain.trim_end_matches(".png")]))
}

/// Checks `answer` (seed 004's verification) against the feature's `steps` and the job's kept
/// artifacts (`kept`, by name). Ok: the evidence of each answered step (the screenshot artifact
/// it resolves to, `None` where a failing answer cited none).
pub fn check_answer(
    steps: &[String],
    answer: &Value,
    kept: &[&str],
) -> Result<Vec<Option<String>>, StepsError> {
    let passes = answer["test_passes"].as_bool().ok_or(StepsError::Shape)?;
    let given = answer["steps"].as_array().ok_or(StepsError::Shape)?;
    let mut shots: Vec<(u32, [&str; 4])> = kept.iter().filter_map(|k| shot(k)).collect();
    shots.sort_by_key(|(n, _)| *n);
    let mut evidence = Vec::new();
    let mut after = 0u32;
    for (i, step) in given.iter().enumerate() {
        let at = i + 1;
        let text = step["step_text"].as_str().unwrap_or_default();
        let Some(expected) = steps.get(i) else {
            return Err(StepsError::Invented {
                at,
                given: crate::text::head(text, 200),
                count: steps.len(),
            });
        };
        if step["step_number"].as_u64() != Some(at as u64) {
            let number = step["step_number"].to_string();
            return Err(StepsError::Number { at, number });
        }
        if normal(text) != normal(expected) {
            return Err(StepsError::Text {
                at,
                given: crate::text::head(text, 200),
                expected: crate::text::head(expected, 200),
            });
        }
        let cited = step["screenshot"].as_str().filter(|s| !s.is_empty());
        let Some(name) = cited else {
            if passes {
                return Err(StepsError::NoEvidence { at });
            }
            evidence.push(None);
            continue;
        };
        let found = shots
            .iter()
            .find(|(n, names)| *n > after && names.contains(&name));
        let Some((n, names)) = found else {
            let taken: Vec<&str> = shots.iter().map(|(_, names)| names[0]).collect();
            return Err(StepsError::NotTaken {
                at,
                name: crate::text::head(name, 200),
                taken: if taken.is_empty() {
                    "none".into()
                } else {
                    taken.join(", ")
                },
            });
        };
        after = *n;
        evidence.push(Some(names[0].to_string()));
    }
    let result = |s: &Value| s["result"].as_str() == Some("pass");
    if passes {
        if given.len() != steps.len() {
            return Err(StepsError::Missing {
                given: given.len(),
                count: steps.len(),
            });
        }
        if let Some(i) = given.iter().position(|s| !result(s)) {
            return Err(StepsError::NotPassed { at: i + 1 });
        }
    } else if given.iter().all(result) {
        return Err(StepsError::NoFailedStep);
    }
    Ok(evidence)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn feature() -> Vec<String> {
        ["Step 1: Navigate to the page", "Step 2: Verify the title"]
            .map(String::from)
            .to_vec()
    }

    fn answer(passes: bool, steps: &[(&str, Option<&str>)]) -> Value {
        let steps: Vec<Value> = steps
            .iter()
            .enumerate()
            .map(|(i, (t, s))| {
                json!({"step_number": i + 1, "step_text": t, "screenshot": s,
                       "result": if passes || i + 1 < steps.len() { "pass" } else { "fail" }})
            })
            .collect();
        json!({"test_passes": passes, "steps": steps})
    }

    const KEPT: &[&str] = &[
        "screenshots/1-home.png",
        "screenshots/2-title.png",
        "transcript.json",
    ];

    #[test]
    fn a_pass_with_every_step_matched_and_shown_stands_with_its_evidence() {
        let a = answer(
            true,
            &[
                ("Navigate to the page", Some("home")),
                ("Step 2:  Verify the title", Some("2-title.png")),
            ],
        );
        assert_eq!(
            check_answer(&feature(), &a, KEPT),
            Ok(vec![
                Some("screenshots/1-home.png".into()),
                Some("screenshots/2-title.png".into())
            ])
        );
    }

    #[test]
    fn invented_reworded_missing_or_unshown_steps_are_refused() {
        let f = feature();
        let cases = [
            answer(true, &[("step 1", Some("home"))]),
            answer(true, &[("Navigate to the page", Some("home"))]),
            answer(
                true,
                &[
                    ("Navigate to the page", Some("home")),
                    ("Verify the title", Some("title")),
                    ("Verify it is fast", Some("title")),
                ],
            ),
            answer(
                true,
                &[
                    ("Navigate to the page", None),
                    ("Verify the title", Some("title")),
                ],
            ),
            // One screenshot for two steps, or taken out of order.
            answer(
                true,
                &[
                    ("Navigate to the page", Some("home")),
                    ("Verify the title", Some("home")),
                ],
            ),
            answer(
                true,
                &[
                    ("Navigate to the page", Some("title")),
                    ("Verify the title", Some("home")),
                ],
            ),
            answer(
                true,
                &[
                    ("Navigate to the page", Some("home")),
                    ("Verify the title", Some("forged.png")),
                ],
            ),
            json!({"test_passes": "yes", "steps": []}),
        ];
        for a in cases {
            assert!(check_answer(&f, &a, KEPT).is_err(), "{a}");
        }
        let e = check_answer(&f, &cases_first(), KEPT).unwrap_err();
        assert_eq!(
            e.to_string(),
            "step 1: `step 1` is not the feature's step `Step 1: Navigate to the page`"
        );
    }

    fn cases_first() -> Value {
        answer(true, &[("step 1", Some("home"))])
    }

    #[test]
    fn a_fail_names_real_steps_and_may_stop_at_the_failing_one() {
        let f = feature();
        let a = answer(false, &[("Navigate to the page", None)]);
        assert_eq!(check_answer(&f, &a, &[]), Ok(vec![None]));
        let invented = answer(false, &[("it is broken", None)]);
        assert!(check_answer(&f, &invented, &[]).is_err());
        let mut no_fail = answer(false, &[("Navigate to the page", None)]);
        no_fail["steps"][0]["result"] = json!("pass");
        assert_eq!(
            check_answer(&f, &no_fail, &[]),
            Err(StepsError::NoFailedStep)
        );
    }
}
