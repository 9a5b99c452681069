//! Mutation testing's verdicts (seed 000), derived from mutants the harness executed: counts of
//! killed, survived, timed out and unviable mutants, and `TestSuiteRobust` / `HasGaps` / `Weak`
//! from them. An agent's own counts never enter here. Pure.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MutantStatus {
    /// The frozen tests failed on the mutant.
    Killed,
    /// The frozen tests passed on the mutant: a gap in the tests.
    Survived,
    /// The tests ran past the mutant's time limit (counted as detected).
    TimedOut,
    /// The mutant could not be made or does not parse (not counted).
    Unviable,
}

/// One executed mutant.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MutantResult {
    pub id: String,
    /// Seed 000's `MutationType` name (`RemovedCheck`, `ConditionFlip`, ...).
    pub mutation_type: String,
    #[serde(default)]
    pub function: Option<String>,
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub line: usize,
    #[serde(default)]
    pub description: String,
    pub status: MutantStatus,
    #[serde(default)]
    pub seconds: f64,
}

/// Mutation types whose survival blocks even in advisory mode (seed 000's `hasCriticalSeverity`).
pub const CRITICAL_TYPES: &[&str] = &["RemovedCheck", "ConditionFlip"];

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Tally {
    /// Viable mutants the tests ran against: killed + survived + timed out.
    pub tried: usize,
    pub killed: usize,
    pub survived: usize,
    pub timed_out: usize,
    pub unviable: usize,
    pub survivors: Vec<MutantResult>,
    /// Survivors of a critical type.
    pub critical: Vec<MutantResult>,
    /// `TestSuiteRobust` (none survived), `TestSuiteWeak` (more than half survived),
    /// `TestSuiteHasGaps` (some survived), `TestSuiteUntested` (no viable mutant was tried).
    pub verdict: String,
    /// Detected / tried, 0 when nothing was tried.
    pub score: f64,
}

pub fn tally(results: &[MutantResult]) -> Tally {
    let count = |s: MutantStatus| results.iter().filter(|r| r.status == s).count();
    let (killed, survived, timed_out, unviable) = (
        count(MutantStatus::Killed),
        count(MutantStatus::Survived),
        count(MutantStatus::TimedOut),
        count(MutantStatus::Unviable),
    );
    let tried = killed + survived + timed_out;
    let survivors: Vec<MutantResult> = results
        .iter()
        .filter(|r| r.status == MutantStatus::Survived)
        .cloned()
        .collect();
    let critical = survivors
        .iter()
        .filter(|r| CRITICAL_TYPES.contains(&r.mutation_type.as_str()))
        .cloned()
        .collect();
    let verdict = if tried == 0 {
        "TestSuiteUntested"
    } else if survived == 0 {
        "TestSuiteRobust"
    } else if survived * 2 > tried {
        "TestSuiteWeak"
    } else {
        "TestSuiteHasGaps"
    };
    Tally {
        tried,
        killed,
        survived,
        timed_out,
        unviable,
        survivors,
        critical,
        verdict: verdict.into(),
        score: if tried == 0 {
            0.0
        } else {
            (killed + timed_out) as f64 / tried as f64
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(t: &str, s: MutantStatus) -> MutantResult {
        MutantResult {
            id: format!("{t}-{s:?}"),
            mutation_type: t.into(),
            function: None,
            path: "x.py".into(),
            line: 1,
            description: String::new(),
            status: s,
            seconds: 0.0,
        }
    }

    #[test]
    fn verdicts_come_from_executed_counts() {
        use MutantStatus::*;
        assert_eq!(tally(&[]).verdict, "TestSuiteUntested");
        assert_eq!(
            tally(&[r("OffByOne", Unviable)]).verdict,
            "TestSuiteUntested"
        );
        let t = tally(&[r("OffByOne", Killed), r("RemovedCheck", TimedOut)]);
        assert_eq!(
            (t.verdict.as_str(), t.tried, t.score),
            ("TestSuiteRobust", 2, 1.0)
        );
        let t = tally(&[
            r("OffByOne", Killed),
            r("BoundaryMutation", Survived),
            r("ChangedOperator", Killed),
        ]);
        assert_eq!(t.verdict, "TestSuiteHasGaps");
        assert!(t.critical.is_empty());
        let t = tally(&[
            r("RemovedCheck", Survived),
            r("ConditionFlip", Survived),
            r("OffByOne", Killed),
        ]);
        assert_eq!(t.verdict, "TestSuiteWeak");
        assert_eq!(t.critical.len(), 2);
    }

    #[test]
    fn exactly_half_surviving_is_gaps_not_weak() {
        use MutantStatus::*;
        let t = tally(&[r("OffByOne", Survived), r("OffByOne", Killed)]);
        assert_eq!(t.verdict, "TestSuiteHasGaps");
    }
}
