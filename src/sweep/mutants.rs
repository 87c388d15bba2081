//! Running the sweep once per known defect: a defect that corrupts is
//! caught when at least one case fails; a defect that only costs (identical
//! bytes written again) is shown when no case fails and some carry its
//! redundant writes. An oracle that no defect can fail is not trusted.

use std::collections::BTreeSet;

use rayon::prelude::*;

use super::execute;
use super::plan::{sampled_grid, PlanOptions, SourcedGeometry};
use crate::defects::{Defect, Effect};
use crate::scenario::{Case, RunOptions};
use crate::under_test::run_case;
use crate::variant::Variant;

/// One defect's result over a sweep.
#[derive(Clone, Debug)]
pub struct MutantResult {
    /// The defect the sweep ran.
    pub defect: Defect,
    /// Cases run (all of them, or up to the first failing chunk).
    pub cases: usize,
    /// Cases that failed: the defect is caught when any did.
    pub failed: usize,
    /// The first failing case, shrunk, and why it failed.
    pub first: Option<(Case, String)>,
    /// The oracles whose violations failed the cases that failed.
    pub oracles: BTreeSet<&'static str>,
    /// Passing cases with redundant writes (identical bytes written again).
    pub redundant: usize,
    /// The most writers of one destination byte among them (`k`x).
    pub multiplicity: u32,
}

impl MutantResult {
    /// Whether any case failed.
    pub fn caught(&self) -> bool {
        self.failed > 0
    }

    /// Whether the sweep showed the defect as its table row says: a
    /// corrupting defect caught, a costly one judged right with redundant
    /// writes.
    pub fn as_described(&self) -> bool {
        match self.defect.info().effect {
            Effect::Corrupts => self.caught(),
            Effect::Costs => !self.caught() && self.redundant > 0,
        }
    }
}

/// Cases per parallel chunk when stopping at the first failure.
const CHUNK: usize = 64;

/// Run the grid of `sources` with `defect`. With `stop_early` the sweep stops
/// after the first chunk that has a failure (enough to know it is caught)
/// or, for a costly defect, redundant writes.
pub fn run_mutant(
    sources: &[SourcedGeometry],
    defect: Defect,
    opts: &RunOptions,
    threads: Option<usize>,
    stop_early: bool,
) -> MutantResult {
    run_mutant_sampled(sources, |_| false, defect, opts, threads, stop_early)
}

/// `run_mutant` with each source for which `sampled` holds reduced to its
/// sample (`plan::sample_options`: one prompt, the mainline allocation).
pub fn run_mutant_sampled(
    sources: &[SourcedGeometry],
    sampled: impl Fn(&SourcedGeometry) -> bool,
    defect: Defect,
    opts: &RunOptions,
    threads: Option<usize>,
    stop_early: bool,
) -> MutantResult {
    let cases = sampled_grid(
        sources,
        &PlanOptions {
            variant: Variant::Defect(defect),
            ..PlanOptions::default()
        },
        sampled,
    );
    let mut ran = 0;
    let mut failures = Vec::new();
    let (mut redundant, mut multiplicity) = (0, 0);
    let mut tally = |reports: Vec<crate::scenario::CaseReport>| {
        ran += reports.len();
        for r in reports {
            if !r.passed() {
                failures.push(r);
            } else if !r.stats.redundant_writes.is_none() {
                redundant += 1;
                multiplicity = multiplicity.max(r.stats.redundant_writes.multiplicity);
            }
        }
        // Enough to know: a failure, or a costly defect's cost shown (a
        // stopped run vouches only for the cases it ran; the command runs
        // every case).
        !failures.is_empty() || (defect.info().effect == Effect::Costs && redundant > 0)
    };
    if stop_early {
        for chunk in cases.chunks(CHUNK) {
            if tally(chunk.par_iter().map(|c| run_case(c, opts)).collect()) {
                break;
            }
        }
    } else {
        tally(execute::run_all(&cases, opts, threads));
    }
    let oracles = failures
        .iter()
        .flat_map(|r| r.violations.iter().map(|v| v.oracle))
        .collect();
    let first = failures
        .first()
        .map(|r| (execute::shrink(&r.case, opts), r.outcome.describe()));
    MutantResult {
        defect,
        cases: ran,
        failed: failures.len(),
        first,
        oracles,
        redundant,
        multiplicity,
    }
}
