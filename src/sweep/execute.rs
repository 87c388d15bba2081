//! Running many cases: in parallel with rayon on loopback, one after the
//! other on real NIXL (its objects cannot cross threads), with a progress bar
//! when stderr is a terminal.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;

use super::budget::MemoryBudget;
use super::plan::prefix_hits;
use crate::scenario::memory_estimate::{default_budget, estimate};
use crate::scenario::{Case, CaseReport, RunOptions, TransportKind};
use crate::under_test::run_case;

/// Run every case within the default memory budget (half of the memory
/// available); results keep the cases' order.
pub fn run_all(cases: &[Case], opts: &RunOptions, threads: Option<usize>) -> Vec<CaseReport> {
    run_all_within(cases, opts, threads, &MemoryBudget::new(default_budget()))
}

/// Run every case, in parallel only as far as `budget` allows (each case
/// holds its estimated peak while it runs); results keep the cases' order.
pub fn run_all_within(
    cases: &[Case],
    opts: &RunOptions,
    threads: Option<usize>,
    budget: &MemoryBudget,
) -> Vec<CaseReport> {
    run_each_within(cases, opts, threads, budget, &|case| run_case(case, opts))
}

/// [`run_all_within`] with each case run by `run_one` (kvgeom's connector
/// with its run recorded as a trace, for `--record-traces`).
pub fn run_each_within(
    cases: &[Case],
    opts: &RunOptions,
    threads: Option<usize>,
    budget: &MemoryBudget,
    run_one: &(dyn Fn(&Case) -> CaseReport + Sync),
) -> Vec<CaseReport> {
    let bar = if std::io::stderr().is_terminal() && cases.len() > 1 {
        let bar = ProgressBar::new(cases.len() as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} cases, {per_sec}, eta {eta} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let run = |case: &Case| {
        let report = budget.run(estimate(case).peak_bytes, || run_one(case));
        bar.inc(1);
        if !report.passed() {
            bar.set_message("(failures)");
        }
        report
    };
    let reports = if opts.transport == TransportKind::Nixl || threads == Some(1) {
        cases.iter().map(run).collect()
    } else {
        match rayon::ThreadPoolBuilder::new()
            .num_threads(threads.unwrap_or(0))
            .build()
        {
            Ok(pool) => pool.install(|| cases.par_iter().map(run).collect()),
            Err(_) => cases.par_iter().map(run).collect(),
        }
    };
    bar.finish_and_clear();
    reports
}

/// Prompt lengths a shrink tries at most: every length up to this many,
/// then a geometric sample, so a long prompt shrinks in bounded time.
const SHRINK_ALL_UP_TO: u32 = 256;

/// The lengths below `prompt_len` a shrink tries, smallest first.
pub(crate) fn shrink_candidates(prompt_len: u32) -> impl Iterator<Item = u32> {
    let dense = 1..prompt_len.min(SHRINK_ALL_UP_TO + 1);
    let sparse = std::iter::successors(Some(512u32), |&n| n.checked_mul(2))
        .take_while(move |&n| n < prompt_len)
        .flat_map(|n| [n - 1, n, n + 1])
        .filter(move |&n| n > SHRINK_ALL_UP_TO && n < prompt_len);
    dense.chain(sparse)
}

/// Shrink a failing case to the smallest prompt length (every length up to
/// 256, then lengths around powers of two), then the smallest prefix hit,
/// that still fails the same way (same outcome kind).
pub fn shrink(case: &Case, opts: &RunOptions) -> Case {
    let failing = run_case(case, opts);
    if failing.passed() {
        return case.clone();
    }
    let label = failing.outcome.label();
    let still_fails = |c: &Case| {
        let r = run_case(c, opts);
        !r.passed() && r.outcome.label() == label
    };
    let mut best = case.clone();
    for prompt_len in shrink_candidates(case.prompt_len) {
        let mut c = best.clone();
        c.prompt_len = prompt_len;
        if !prefix_hits(&c.geometry, prompt_len).contains(&c.prefix_hit) {
            continue;
        }
        if still_fails(&c) {
            best = c;
            break;
        }
    }
    if best.prefix_hit > 0 {
        let mut c = best.clone();
        c.prefix_hit = 0;
        if still_fails(&c) {
            best = c;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrinking_tries_a_bounded_number_of_lengths() {
        assert_eq!(shrink_candidates(5).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
        let long: Vec<u32> = shrink_candidates(u32::MAX).collect();
        assert!(long.len() < 400, "{}", long.len());
        assert!(long.windows(2).all(|w| w[0] < w[1]));
        assert!(long.contains(&513) && long.contains(&1023));
    }
}
