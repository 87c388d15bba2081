//! Running many cases: in parallel with rayon on loopback, one after the
//! other on real NIXL (its objects cannot cross threads), with a progress bar
//! when stderr is a terminal.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;

use super::budget::MemoryBudget;
use super::plan::prefix_hits;
use crate::scenario::memory_estimate::{default_budget, estimate};
use crate::scenario::{run_case, Case, CaseReport, RunOptions, TransportKind};

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
        let report = budget.run(estimate(case).peak_bytes, || run_case(case, opts));
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

/// Shrink a failing case to the smallest prompt length, then the smallest
/// prefix hit, that still fails the same way (same outcome kind).
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
    for prompt_len in 1..case.prompt_len {
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
