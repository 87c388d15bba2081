//! A recorded v2 trace (`kvgeom-vllm-trace/2`, docs/trace-format.md)
//! replayed as a connector under test: the trace is a serialised run
//! record (the case, the driver's report of what vLLM's connector
//! registered, listed, posted and post-processed, how it ended, and each
//! region's memory before and after), so placing a case returns the traced
//! blocks and running it returns the recorded run, read again from its file
//! and moved into the record. `check-trace` and `diff-trace` judge the same
//! traces ([`check_recorded`], [`diff_recorded`]).

mod recorded;
mod recorded_judge;
mod recorded_lists;

pub use recorded::{
    ImageProblem, RecordedCase, RecordedError, RecordedErrorKind, RegionImages, MAX_REBUILD_BYTES,
    TRACE_FORMAT_V2,
};
pub use recorded_judge::{
    check_recorded, diff_recorded, explain_recorded, RecordedCheck, RecordedDiff,
};

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::layout::Side;
use crate::live::pairs::resolve_pairs;
use crate::live::{connector_log, run_outcome};
use crate::oracle::{MemoryImages, OracleInput};
use crate::scenario::{Case, Placement};
use crate::scheduler::request_shape;
use crate::under_test::{ConnectorUnderTest, Placed, RunLog, RunOutcome, RunRecord};
use recorded_judge::id_findings;

/// Recorded v2 traces, each one case, replayed as a connector.
pub struct ReplayConnector {
    /// Each trace's file and the case it names, in the order given.
    traces: Vec<(PathBuf, Case, Placement)>,
    /// What ran in each trace, without repeats.
    codes: Vec<crate::under_test::CodeUnderTest>,
}

impl ReplayConnector {
    /// Read every trace (checked against kvgeom's preparation of its case,
    /// as `check-trace` does); its memory is read again when it runs.
    pub fn open(paths: &[PathBuf]) -> Result<Self, RecordedError> {
        let mut traces = Vec::with_capacity(paths.len());
        let mut codes = Vec::new();
        for path in paths {
            let rc = RecordedCase::read(path)?;
            let placement = traced_placement(&rc);
            if !codes.contains(&rc.code_under_test) {
                codes.push(rc.code_under_test.clone());
            }
            traces.push((path.clone(), rc.case, placement));
        }
        Ok(ReplayConnector { traces, codes })
    }

    /// The traced cases, in the order of their files.
    pub fn cases(&self) -> Vec<Case> {
        self.traces
            .iter()
            .map(|(_, case, _)| case.clone())
            .collect()
    }

    /// What ran: the code the traces record, when they all record one
    /// (replaying traces of several at once names none of them: `version`
    /// lists every version, sorted).
    pub fn code_under_test(&self) -> crate::under_test::CodeUnderTest {
        if let [one] = self.codes.as_slice() {
            return one.clone();
        }
        let versions: std::collections::BTreeSet<&str> =
            self.codes.iter().map(|c| c.version.as_str()).collect();
        let version = versions.into_iter().collect::<Vec<_>>().join(", ");
        crate::under_test::CodeUnderTest::vllm(&version)
    }

    /// The file of each case, in order.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.traces.iter().map(|(path, _, _)| path.as_path())
    }
}

/// Whether `a` and `b` are the same case (the connector's variant aside).
fn same_case(a: &Case, b: &Case) -> bool {
    a.geometry == b.geometry
        && (a.prompt_len, a.prefix_hit, a.mode, a.allocation, a.seed)
            == (b.prompt_len, b.prefix_hit, b.mode, b.allocation, b.seed)
}

/// The blocks the trace's request holds on each engine.
fn traced_placement(rc: &RecordedCase) -> Placement {
    Placement {
        decode: rc.spec.decode.request_blocks.clone(),
        prefill: rc.spec.prefill.request_blocks.clone(),
        decode_pool: rc.spec.decode.num_logical_blocks,
        prefill_pool: rc.spec.prefill.num_logical_blocks,
    }
}

impl ConnectorUnderTest for ReplayConnector {
    type Error = RecordedError;
    type Placement = Placed;
    type Record = RunRecord;

    /// The traced blocks (a case not among the traces: the harness's error).
    fn place(&self, cases: &[Case]) -> Vec<Placed> {
        cases
            .iter()
            .enumerate()
            .map(|(i, case)| match self.traces.get(i) {
                Some((_, traced, placement)) if same_case(traced, case) => {
                    let shape = request_shape(
                        &case.geometry,
                        case.prompt_len,
                        case.prefix_hit,
                        case.allocation,
                    );
                    Ok((shape, placement.clone()))
                }
                _ => Err(crate::scenario::Outcome::Error {
                    message: format!("case {i} is not the case of recorded trace {i}"),
                }),
            })
            .collect()
    }

    /// Each trace read again, its run record moved out of it and judged,
    /// traces in parallel on the caller's thread pool.
    fn run<T: Send>(
        &self,
        cases: &[Case],
        placed: Vec<Placed>,
        judge: &(dyn Fn(RunRecord) -> T + Sync),
    ) -> Result<Vec<T>, RecordedError> {
        // In parallel, on the caller's thread pool: each trace holds its
        // memory only while it is judged.
        let runs: Vec<(&Case, Placed, &Path)> = cases
            .iter()
            .zip(placed)
            .zip(&self.traces)
            .map(|((case, placed), (path, _, _))| (case, placed, path.as_path()))
            .collect();
        runs.into_par_iter()
            .map(|(case, placed, path)| {
                let record = match placed {
                    Ok(_) => run_record(RecordedCase::read(path)?),
                    Err(outcome) => RunRecord::not_run(case, RunOutcome::from_outcome(outcome)),
                };
                Ok(judge(record))
            })
            .collect()
    }
}

/// The run record a v2 trace holds: vLLM's ending, its transfers resolved
/// onto kvgeom's layout model of the case, and the traced memory images
/// (moved, not copied). A transfer whose ids fall outside its lists (real
/// NIXL refuses it) makes no record: the harness cannot resolve it.
pub fn run_record(rc: RecordedCase) -> RunRecord {
    let case = rc.case.clone();
    if let Some(first) = id_findings(&rc).into_iter().next() {
        let message = format!("{}: vLLM's {first}", rc.path.display());
        return RunRecord::not_run(&case, RunOutcome::NotRun { message });
    }
    let outcome = run_outcome(&rc.result);
    if outcome != RunOutcome::Completed {
        return RunRecord {
            log: RunLog::Driver(Box::new(connector_log(&rc.result))),
            uncompared: None,
            ..RunRecord::not_run(&case, outcome)
        };
    }
    let pairs = match resolve_pairs(&rc.result, &rc.prepared) {
        Ok(pairs) => pairs,
        Err(e) => {
            let message = format!("{}: {e}", rc.path.display());
            return RunRecord::not_run(&case, RunOutcome::NotRun { message });
        }
    };
    let bytes_observed = rc.memory.is_some();
    let RecordedCase {
        spec,
        result,
        memory,
        prepared,
        ..
    } = rc;
    let mut input = OracleInput::new(prepared.layout, case.prompt_len, case.prefix_hit, pairs)
        .with_transferred_tokens(prepared.transferred_tokens);
    if let Some(mut memory) = memory {
        for (side, engine) in [(Side::Prefill, &spec.prefill), (Side::Decode, &spec.decode)] {
            for rank in 0..engine.tp_size {
                let agent = side.agent_name(rank);
                let (mut before, mut after) = (Vec::new(), Vec::new());
                for region in 0..engine.regions {
                    // `RecordedCase::read` checked that every region has its images.
                    if let Some(images) = memory.remove(&(agent.clone(), region)) {
                        before.push(images.before);
                        after.push(images.after.into());
                    }
                }
                let before = before.into();
                input.set_memory(side, rank, MemoryImages { before, after });
            }
        }
    }
    RunRecord {
        case,
        outcome,
        observed: Some(input),
        bytes_observed,
        zeroed_bytes: 0,
        memory_bytes: 0,
        log: RunLog::Driver(Box::new(connector_log(&result))),
        uncompared: None,
    }
}
