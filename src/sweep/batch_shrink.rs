//! Shrinking failures of a connector that runs cases by batch (vLLM's, one
//! driver import per batch) to minimal replays: the same search as
//! [`super::execute::shrink`] (the smallest prompt length, then no prefix
//! hit, that fails the same way), with every candidate of every failure
//! judged in one batch instead of one run per try.

use super::execute::shrink_candidates;
use super::plan::prefix_hits;
use crate::scenario::{Case, CaseReport};

/// For each failing report, the smallest case that fails the same way
/// (same outcome label) on the connector, each batch of candidates judged by
/// `run`: two batches in all.
pub fn shrink_batched<E>(
    failures: &[&CaseReport],
    mut run: impl FnMut(&[Case]) -> Result<Vec<CaseReport>, E>,
) -> Result<Vec<Case>, E> {
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
    let tried = run(&candidates)?;
    let mut minimal: Vec<Case> = failures
        .iter()
        .zip(&ranges)
        .map(|(r, range)| {
            tried[range.clone()]
                .iter()
                .find(|t| fails_like(t, r))
                .map_or_else(|| r.case.clone(), |t| t.case.clone())
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
        let tried = run(&cases)?;
        for ((i, c), t) in without_hit.into_iter().zip(&tried) {
            if fails_like(t, failures[i]) {
                minimal[i] = c;
            }
        }
    }
    Ok(minimal)
}

fn fails_like(tried: &CaseReport, failure: &CaseReport) -> bool {
    !tried.passed() && tried.outcome.label() == failure.outcome.label()
}
