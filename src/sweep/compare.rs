//! Comparing two runs of the same cases case by case: `kvgeom sweep
//! --compare-host` runs every case again on host memory over the loopback
//! transport and requires the same outcome, the same counts and the same
//! violations. Messages of outcomes a transport words itself (crashes,
//! hangs, harness errors) are compared by kind only; everything else must
//! be equal, since the layout model reports bytes relative to each region
//! and never raw addresses.

use crate::scenario::{CaseReport, Outcome};

/// One case whose two runs differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Position of the case in the sweep.
    pub index: usize,
    /// The command that replays the case.
    pub replay: String,
    /// What differs, in words.
    pub what: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "case {}: {} (replay: {})",
            self.index, self.what, self.replay
        )
    }
}

/// The part of an outcome both runs must agree on.
fn outcome_key(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Crashed { side, .. } => format!("crashed on {side}"),
        Outcome::Hung { .. } | Outcome::Error { .. } => outcome.label().to_string(),
        other => other.describe(),
    }
}

/// Where `run` differs from `reference` (the same cases in the same order).
pub fn compare(run: &[CaseReport], reference: &[CaseReport]) -> Vec<Mismatch> {
    let mut out = Vec::new();
    if run.len() != reference.len() {
        out.push(Mismatch {
            index: run.len().min(reference.len()),
            replay: String::new(),
            what: format!(
                "{} cases against {} in the reference run",
                run.len(),
                reference.len()
            ),
        });
    }
    for (index, (a, b)) in run.iter().zip(reference).enumerate() {
        let mismatch = |what: String| Mismatch {
            index,
            replay: a.case.replay_command(),
            what,
        };
        if a.case.replay_command() != b.case.replay_command() {
            out.push(mismatch(format!(
                "different cases: reference is {}",
                b.case.replay_command()
            )));
            continue;
        }
        let (ka, kb) = (outcome_key(&a.outcome), outcome_key(&b.outcome));
        if ka != kb {
            out.push(mismatch(format!("outcome {ka:?}, on host {kb:?}")));
        }
        if a.stats != b.stats {
            out.push(mismatch(format!(
                "counts {:?}, on host {:?}",
                a.stats, b.stats
            )));
        }
        if a.violations != b.violations {
            let first = a
                .violations
                .iter()
                .zip(&b.violations)
                .find(|(x, y)| x != y)
                .map(|(x, y)| format!("; first difference: {x} / on host: {y}"))
                .unwrap_or_default();
            out.push(mismatch(format!(
                "{} violations, on host {}{first}",
                a.violations.len(),
                b.violations.len()
            )));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::load_geometry;
    use crate::layout::Side;
    use crate::oracle::Violation;
    use crate::scenario::{Case, RunOptions};
    use crate::scheduler::DecodeAllocation;
    use crate::under_test::run_case;
    use std::path::Path;
    use std::sync::Arc;

    fn report(prompt_len: u32) -> CaseReport {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("geometries/g1-mla-kda-ppl3-vs-2.toml");
        let case = Case {
            geometry: Arc::new(load_geometry(&path).unwrap()),
            file: None,
            prompt_len,
            prefix_hit: 0,
            mode: crate::geometry::Mode::Pull,
            allocation: DecodeAllocation::Mainline,
            seed: 0,
            variant: crate::variant::Variant::KVGEOM,
        };
        run_case(&case, &RunOptions::default())
    }

    #[test]
    fn equal_runs_have_no_mismatch_and_each_difference_is_named() {
        let reference = vec![report(5), report(9)];
        assert_eq!(compare(&reference, &reference), vec![]);

        let mut run = reference.clone();
        run[1].stats.zeroed_bytes += 1;
        run[0]
            .violations
            .push(Violation::new("coverage", "missing"));
        run[0].outcome = Outcome::Crashed {
            side: Side::Decode,
            message: "device gone".into(),
        };
        let found = compare(&run, &reference);
        let whats: Vec<(usize, &str)> = found.iter().map(|m| (m.index, m.what.as_str())).collect();
        assert_eq!(
            whats,
            [
                (0, "outcome \"crashed on decode\", on host \"passed\""),
                (0, "1 violations, on host 0"),
                (
                    1,
                    &*format!(
                        "counts {:?}, on host {:?}",
                        run[1].stats, reference[1].stats
                    )
                ),
            ]
        );
        assert!(found[0].replay.contains("--prompt 5"), "{}", found[0]);
    }

    #[test]
    fn crash_messages_may_differ_but_not_their_side() {
        let mut a = report(5);
        let mut b = a.clone();
        a.outcome = Outcome::Crashed {
            side: Side::Decode,
            message: "NIXL backend error: x".into(),
        };
        b.outcome = Outcome::Crashed {
            side: Side::Decode,
            message: "other words".into(),
        };
        assert_eq!(compare(&[a.clone()], &[b.clone()]), vec![]);
        b.outcome = Outcome::Crashed {
            side: Side::Prefill,
            message: "other words".into(),
        };
        assert_eq!(compare(&[a], &[b]).len(), 1);
    }
}
