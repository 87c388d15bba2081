//! Shrinking a live failure to a minimal replay: the same search as the
//! sweep's (`sweep::execute::shrink`: the smallest prompt length, then no
//! prefix hit, that fails the same way), with every candidate of every
//! failure run in one driver batch instead of one process per try.

use std::time::Duration;

use super::batch::run_sweep;
use super::error::BatchError;
use super::python::Interpreter;
use crate::scenario::{Case, CaseReport};
use crate::sweep::execute::shrink_candidates;
use crate::sweep::plan::prefix_hits;
use crate::variant::Variant;

/// For each failing report, the smallest case that fails the same way
/// (same outcome label) on vLLM's connector: two driver batches in all.
pub fn shrink_live(
    failures: &[&CaseReport],
    python: &Interpreter,
    case_limit: Duration,
    drivers: usize,
) -> Result<Vec<Case>, BatchError> {
    // Shorter prompts with the same prefix hit, smallest first.
    let mut candidates: Vec<Case> = Vec::new();
    let mut ranges = Vec::new();
    for r in failures {
        let start = candidates.len();
        for prompt_len in shrink_candidates(r.case.prompt_len) {
            if prefix_hits(&r.case.geometry, prompt_len).contains(&r.case.prefix_hit) {
                let mut c = r.case.clone();
                c.prompt_len = prompt_len;
                candidates.push(c);
            }
        }
        ranges.push(start..candidates.len());
    }
    let tried = run_sweep(&candidates, &[], python, case_limit, drivers)?;
    let mut minimal: Vec<Case> = failures
        .iter()
        .zip(&ranges)
        .map(|(r, range)| {
            tried[range.clone()]
                .iter()
                .find(|t| fails_like(&t.report, r))
                .map_or_else(|| r.case.clone(), |t| t.report.case.clone())
        })
        .collect();
    // Then without the prefix hit.
    let without_hit: Vec<(usize, Case)> = minimal
        .iter()
        .enumerate()
        .filter(|(_, c)| c.prefix_hit > 0)
        .map(|(i, c)| {
            let mut c = c.clone();
            c.prefix_hit = 0;
            (i, c)
        })
        .collect();
    if !without_hit.is_empty() {
        let cases: Vec<Case> = without_hit.iter().map(|(_, c)| c.clone()).collect();
        let tried = run_sweep(&cases, &[], python, case_limit, drivers)?;
        for ((i, c), t) in without_hit.into_iter().zip(&tried) {
            if fails_like(&t.report, failures[i]) {
                minimal[i] = c;
            }
        }
    }
    Ok(minimal)
}

fn fails_like(tried: &CaseReport, failure: &CaseReport) -> bool {
    !tried.passed() && tried.outcome.label() == failure.outcome.label()
}

/// The command that replays `case` on vLLM's connector.
pub fn live_replay_command(case: &Case) -> String {
    let mut plain = case.clone();
    plain.variant = Variant::default();
    format!("{} --connector vllm", plain.replay_command())
}
