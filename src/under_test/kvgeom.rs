//! kvgeom's own connector as a connector under test: placed by the
//! scenario's seeded placement (`scenario::run::shape_and_place`), run by
//! `scenario::run` over the recording transport, cases in parallel (rayon).

use rayon::prelude::*;

use super::judge::{verdict, Verdict};
use super::record::{RunLog, RunOutcome, RunRecord};
use super::{ConnectorUnderTest, Placed};
use crate::scenario::memory_estimate::estimate;
use crate::scenario::run::{run_placed, shape_and_place};
use crate::scenario::{Case, CaseReport, CaseRun, RunOptions};

/// kvgeom's connector, run with `opts` (transport, memory, policy).
#[derive(Clone, Copy, Debug, Default)]
pub struct KvgeomConnector {
    /// How its cases run.
    pub opts: RunOptions,
}

impl KvgeomConnector {
    /// The connector run with `opts`.
    pub fn new(opts: &RunOptions) -> Self {
        KvgeomConnector { opts: *opts }
    }

    /// Run one placed case.
    pub fn run_one(&self, case: &Case, placed: Placed) -> RunRecord {
        let (record, run) = self.run_unlogged(case, placed);
        RunRecord {
            log: RunLog::Kvgeom(Box::new(run)),
            ..record
        }
    }

    /// Run one placed case: its record, without the log, and the run.
    fn run_unlogged(&self, case: &Case, placed: Placed) -> (RunRecord, CaseRun) {
        let (mut run, outcome) = match placed {
            Ok((shape, placement)) => run_placed(case, &self.opts, &shape, &placement),
            Err(outcome) => (CaseRun::new(case), outcome),
        };
        let record = RunRecord {
            case: case.clone(),
            outcome: RunOutcome::from_outcome(outcome),
            observed: run.oracle_input.take(),
            bytes_observed: true,
            zeroed_bytes: run.zeroed_bytes,
            memory_bytes: estimate(case).peak_bytes,
            log: RunLog::Nothing,
            uncompared: None,
        };
        (record, run)
    }
}

impl ConnectorUnderTest for KvgeomConnector {
    type Error = std::convert::Infallible;
    type Placement = Placed;
    type Record = RunRecord;

    fn place(&self, cases: &[Case]) -> Vec<Placed> {
        cases.par_iter().map(shape_and_place).collect()
    }

    fn run<T: Send>(
        &self,
        cases: &[Case],
        placed: Vec<Placed>,
        judge: &(dyn Fn(RunRecord) -> T + Sync),
    ) -> Result<Vec<T>, Self::Error> {
        Ok(cases
            .par_iter()
            .zip(placed)
            .map(|(case, placed)| judge(self.run_one(case, placed)))
            .collect())
    }
}

/// One case through kvgeom's connector, judged, with everything its run
/// produced (for `explain` and the tests).
pub fn run_case_detailed(case: &Case, opts: &RunOptions) -> CaseRun {
    run_placed_detailed(case, opts, shape_and_place(case))
}

/// [`run_case_detailed`] for a request already placed (the blocks another
/// connector's placement, e.g. vLLM's scheduler, gave it).
pub fn run_placed_detailed(case: &Case, opts: &RunOptions, placed: Placed) -> CaseRun {
    let (record, mut run) = KvgeomConnector::new(opts).run_unlogged(case, placed);
    let Verdict {
        outcome,
        stats,
        violations,
    } = verdict(&record);
    run.oracle_input = record.observed;
    run.report.outcome = outcome;
    run.report.stats = stats;
    run.report.violations = violations;
    run
}

/// One case through kvgeom's connector, judged.
pub fn run_case(case: &Case, opts: &RunOptions) -> CaseReport {
    run_case_detailed(case, opts).report
}
