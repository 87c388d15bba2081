//! The one judge of a connector under test: a [`RunRecord`] becomes the
//! case's report (the oracles over the observed pairs and memory, the
//! geometry's expectations about refusals), a sweep's reports are held to
//! an expectations file ([`judge_sweep`]), and two records compare as plans
//! (every posted pair, the post-process calls, or how each ended).

use serde::Serialize;

use super::code::{CodeUnderTest, ConnectorKind};
use super::connector_log::ConnectorLog;
use super::expectations::Expectations;
use super::post_process_calls::{first_call_difference, logged_calls, CallKey};
use super::record::RunRecord;
use crate::geometry::{Geometry, Mode};
use crate::layout::{CaseLayout, Side};
use crate::nixl::DescRow;
use crate::oracle::{self, OracleInput, Violation};
use crate::scenario::{CaseReport, Outcome, Stats};

/// The verdict on one record: its outcome, counts and violations.
pub struct Verdict {
    /// The outcome after the oracles and the geometry's expectations.
    pub outcome: Outcome,
    /// What moved.
    pub stats: Stats,
    /// Every oracle violation.
    pub violations: Vec<Violation>,
}

/// Judge one run: every oracle over what the run observed (when it
/// completed), then the geometry's expectations.
pub fn verdict(record: &RunRecord) -> Verdict {
    let violations = match &record.observed {
        Some(input) if record.bytes_observed => oracle::run_all(input),
        Some(input) => oracle::run_descriptor_level(input),
        None => Vec::new(),
    };
    let (pairs, transferred_bytes) = record.observed.as_ref().map_or((0, 0), |input| {
        input.posted_pairs().fold((0, 0), |(n, bytes), p| {
            (n + 1, bytes + p.destination.row.len)
        })
    });
    let redundant_writes = record
        .observed
        .as_ref()
        .map(oracle::no_double_write::redundant_writes)
        .unwrap_or_default();
    let stats = Stats {
        pairs,
        transferred_bytes,
        zeroed_bytes: record.zeroed_bytes,
        memory_bytes: record.memory_bytes,
        redundant_writes,
    };
    let outcome = expected_outcome(
        &record.case.geometry,
        record.case.mode,
        record.outcome.to_outcome(),
        &violations,
    );
    Verdict {
        outcome,
        stats,
        violations,
    }
}

/// [`verdict`] as the case's report.
pub fn judge(record: &RunRecord) -> CaseReport {
    let Verdict {
        outcome,
        stats,
        violations,
    } = verdict(record);
    CaseReport {
        case: record.case.clone(),
        outcome,
        stats,
        violations,
    }
}

/// A sweep judged against an expectations file (`expected/*.toml`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepVerdict {
    /// One line per case that did not end as the file says (an unlisted
    /// failure, a listed case that passed or failed otherwise).
    pub disagreements: Vec<String>,
    /// The file's entries that cover no case of the sweep (not run here).
    pub unused: Vec<String>,
    /// Cases that did not pass.
    pub failed: usize,
    /// Cases judged.
    pub cases: usize,
    /// Entries in the file.
    pub expected_failures: usize,
}

impl SweepVerdict {
    /// Exactly the listed cases failed, each the listed way.
    pub fn as_expected(&self) -> bool {
        self.disagreements.is_empty()
    }
}

/// Every judged case of a sweep of `code` against the expectations: the
/// sweep is as expected when exactly the listed cases fail, each the listed
/// way. An entry's `message` is kvgeom's wording of a crash or refusal, so
/// it is held only against kvgeom's own connector; another connector raises
/// its own (vLLM often a bare `AssertionError`), and its outcome kinds and
/// oracle sets are still compared.
pub fn judge_sweep(
    expectations: &Expectations,
    reports: &[CaseReport],
    code: &CodeUnderTest,
) -> SweepVerdict {
    let without_messages;
    let expectations = if code.connector == ConnectorKind::Kvgeom {
        expectations
    } else {
        without_messages = expectations.without_messages();
        &without_messages
    };
    SweepVerdict {
        disagreements: expectations.compare(reports),
        unused: expectations.unused(reports),
        failed: reports.iter().filter(|r| r.failed()).count(),
        cases: reports.len(),
        expected_failures: expectations.failures.len(),
    }
}

/// Apply the geometry's expectation about rejections in `mode`.
pub fn expected_outcome(
    geometry: &Geometry,
    mode: Mode,
    outcome: Outcome,
    violations: &[Violation],
) -> Outcome {
    match (outcome, geometry.expected_rejection(mode)) {
        (Outcome::UnexpectedRejection { side, message }, Some(expected))
            if message.contains(expected) =>
        {
            Outcome::ExpectedRejection { side, message }
        }
        (Outcome::Passed, Some(expected)) | (Outcome::Violations, Some(expected)) => {
            Outcome::MissingRejection {
                expected: expected.to_string(),
            }
        }
        (Outcome::Passed, None) if !violations.is_empty() => Outcome::Violations,
        (other, _) => other,
    }
}

/// A run's plan: its posted pairs ([`plan_keys`]), or, when it made none,
/// how it ended.
pub type Plan = Result<Vec<String>, Outcome>;

/// A run under test compared with a reference run's plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlanComparison {
    /// The run posted exactly the pairs the reference plans.
    pub equal: bool,
    /// The first pair (or list) that differs, when not equal.
    pub first_difference: Option<String>,
    /// When not equal: the finding (`docs/findings/NAME.md`) of the
    /// release's allowed plan difference that covers the case
    /// (`under_test::plan_differences`); absent in JSON otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed: Option<String>,
}

/// The plan of a judged run: its posted pairs when it observed any, else
/// its judged outcome.
pub fn plan_of(observed: Option<&OracleInput>, judged: &Outcome) -> Plan {
    match observed {
        Some(input) => Ok(plan_keys(input)),
        None => Err(judged.clone()),
    }
}

/// Where a row lies, independent of addresses: `agent rREGION+OFFSET/LEN`.
pub(crate) fn place_of(layout: &CaseLayout, row: DescRow) -> String {
    for side in [Side::Prefill, Side::Decode] {
        for engine in layout.engines(side) {
            if let Some((region, offset)) = engine.locate(row.addr, row.len) {
                return format!("{} r{region}+{offset}/{}", engine.agent_name(), row.len);
            }
        }
    }
    format!("unregistered {:#x}/{}", row.addr, row.len)
}

/// Every posted pair as `op source -> destination` (agent, region, offset
/// and length of each end), sorted.
pub fn plan_keys(input: &OracleInput) -> Vec<String> {
    let mut keys: Vec<String> = input
        .posted_pairs()
        .map(|p| {
            format!(
                "{:?} {} -> {}",
                p.op,
                place_of(&input.case, p.source.row),
                place_of(&input.case, p.destination.row)
            )
        })
        .collect();
    keys.sort();
    keys
}

/// No comparison: the connector did not run the case (a driver or
/// harness error), which never counts as agreeing.
pub(crate) fn not_run(why: &str) -> PlanComparison {
    PlanComparison {
        equal: false,
        first_difference: Some(format!("vLLM's connector did not run the case: {why}")),
        allowed: None,
    }
}

/// How a run that made no transfers ended, for comparing two of them: a
/// refusal (expected or not: the geometry judges that), a crash, a hang, or
/// another ending by its label.
fn stop_kind(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::UnexpectedRejection { .. } | Outcome::ExpectedRejection { .. } => "rejected",
        other => other.label(),
    }
}

/// `plan`, unequal from the first difference of the post-process calls
/// when the pairs were equal (both runs moved bytes): the driver's in its
/// `log`, the reference's `calls`.
pub(crate) fn with_post_process(
    plan: PlanComparison,
    log: &ConnectorLog,
    calls: &[CallKey],
) -> PlanComparison {
    if !plan.equal {
        return plan;
    }
    match first_call_difference(log, calls, &logged_calls(log)) {
        Some(d) => PlanComparison {
            equal: false,
            first_difference: Some(d),
            allowed: None,
        },
        None => plan,
    }
}

/// kvgeom's plan (the reference) against the run under test's.
pub fn compare_plans(kvgeom: &Plan, vllm: &Plan) -> PlanComparison {
    let first_difference = match (kvgeom, vllm) {
        (Err(k), Err(v)) if stop_kind(k) != stop_kind(v) => Some(format!(
            "kvgeom's connector stops ({}); vLLM stops otherwise ({})",
            k.describe(),
            v.describe()
        )),
        (Err(_), Err(_)) => None,
        (Ok(k), Err(v)) => Some(format!(
            "kvgeom's plan moves {} pairs; vLLM made no transfers ({})",
            k.len(),
            v.describe()
        )),
        (Err(k), Ok(v)) => Some(format!(
            "kvgeom's connector stops ({}); vLLM moved {} pairs",
            k.describe(),
            v.len()
        )),
        (Ok(k), Ok(v)) => {
            let at = k.iter().zip(v).position(|(a, b)| a != b);
            match at {
                Some(i) => Some(format!("pair {i}: kvgeom {} ; vLLM {}", k[i], v[i])),
                None if k.len() != v.len() => Some(format!(
                    "kvgeom's plan has {} pairs, vLLM's {}",
                    k.len(),
                    v.len()
                )),
                None => None,
            }
        }
    };
    PlanComparison {
        equal: first_difference.is_none(),
        first_difference,
        allowed: None,
    }
}

#[cfg(test)]
mod tests {
    use super::compare_plans;
    use crate::layout::Side;
    use crate::scenario::Outcome;

    fn crashed() -> Outcome {
        Outcome::Crashed {
            side: Side::Decode,
            message: "IndexError".into(),
        }
    }

    #[test]
    fn two_runs_without_transfers_are_equal_only_when_they_end_alike() {
        let refused = |expected: bool| {
            let (side, message) = (Side::Decode, "refused".to_string());
            if expected {
                Outcome::ExpectedRejection { side, message }
            } else {
                Outcome::UnexpectedRejection { side, message }
            }
        };
        assert!(compare_plans(&Err(crashed()), &Err(crashed())).equal);
        assert!(compare_plans(&Err(refused(true)), &Err(refused(false))).equal);
        let differ = compare_plans(&Err(crashed()), &Err(refused(false)));
        assert!(!differ.equal);
        assert!(differ
            .first_difference
            .unwrap()
            .contains("vLLM stops otherwise"));
        let hung = Outcome::Hung {
            message: "waits".into(),
        };
        assert!(!compare_plans(&Err(hung), &Err(crashed())).equal);
    }

    #[test]
    fn plans_differ_at_their_first_unequal_pair() {
        let k = Ok(vec!["a".to_string(), "b".to_string()]);
        let v = Ok(vec!["a".to_string(), "c".to_string()]);
        let d = compare_plans(&k, &v);
        assert_eq!(
            d.first_difference.as_deref(),
            Some("pair 1: kvgeom b ; vLLM c")
        );
        assert!(!compare_plans(&k, &Err(crashed())).equal);
    }
}
