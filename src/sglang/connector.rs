//! SGLang's own P/D transfer as a connector under test
//! ([`ConnectorUnderTest`]). *Place*: each case's pools and the request's
//! pages and state slots on each engine ([`batch::prepare`]; a case kvgeom
//! cannot model is placed as that error). *Run*: every placed case's memory
//! written into one batch folder, one driver process for the whole batch
//! (SGLang's import takes ~10 s; a case well under 0.1 s), then each case's
//! record (its `result.json` with its folder of final memory, or how it
//! ended without one) handed to the judge in turn while the folder exists;
//! `--record-traces` writes each case's trace just before. The judge is
//! [`judge_record`] (`run::judge_result` on the driver's result). SGLang's
//! pools are not kvgeom's block layout, so the placement is a
//! [`Prepared`] and the record a [`SglangRecord`], not `Placed` and
//! `RunRecord`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::batch::{self, Prepared};
use super::error::ModelError;
use super::final_memory::CaseFolder;
use super::python::SglangPython;
use super::result::{DriverResult, RESULT_FORMAT};
use super::run::{judge_result, not_judged, BatchError, SglangCase, TraceTarget, CASE_TIMEOUT_S};
use crate::driver::{fresh_scratch, remove_unless_kept, run_driver};
use crate::scenario::Case;
use crate::under_test::{ConnectorUnderTest, RunOutcome};

/// SGLang's transfer run by the driver under `python`, each case's trace
/// written to `traces` when given.
#[derive(Clone, Copy, Debug)]
pub struct SglangConnector<'a> {
    /// The interpreter with SGLang, the driver and the NIXL it runs over.
    pub python: &'a SglangPython,
    /// Where the cases are recorded as traces, if anywhere.
    pub traces: Option<&'a TraceTarget>,
}

/// What one case's run left for the judge.
#[derive(Debug)]
pub struct SglangRecord {
    /// The case.
    pub case: Case,
    /// The driver's run of it, or how it ended without a result to judge.
    pub run: Result<DriverRun, RunOutcome>,
}

/// A case the driver ran and wrote a result for.
#[derive(Debug)]
pub struct DriverRun {
    /// How the case was placed and prepared.
    pub prepared: Prepared,
    /// The driver's `result.json`.
    pub result: DriverResult,
    /// The case's folder in the batch (its final memory).
    pub folder: PathBuf,
}

/// The judge of an SGLang record: the layout checks, the driver's status
/// and the oracles over its final memory.
pub fn judge_record(record: SglangRecord) -> SglangCase {
    match record.run {
        Ok(run) => judge_result(
            &record.case,
            &run.prepared,
            &run.result,
            &CaseFolder(&run.folder),
        ),
        Err(outcome) => not_judged(&record.case, outcome),
    }
}

/// Each case's pools and pages (`batch::prepare`), numbered in order: the
/// connector's placement, which `explain` checks before looking for SGLang.
pub fn place(cases: &[Case]) -> Vec<Result<Prepared, ModelError>> {
    cases
        .iter()
        .enumerate()
        .map(|(i, case)| batch::prepare(case, i))
        .collect()
}

/// Run and judge `cases` with `python`; the judged cases in order.
pub fn run_sweep(cases: &[Case], python: &SglangPython) -> Result<Vec<SglangCase>, BatchError> {
    run_sweep_recording(cases, python, None)
}

/// [`run_sweep`], writing each case the driver ran as a trace to `traces`:
/// place, run, judge through [`SglangConnector`].
pub fn run_sweep_recording(
    cases: &[Case],
    python: &SglangPython,
    traces: Option<&TraceTarget>,
) -> Result<Vec<SglangCase>, BatchError> {
    let connector = SglangConnector { python, traces };
    let placed = connector.place(cases);
    connector.run(cases, placed, &judge_record)
}

impl ConnectorUnderTest for SglangConnector<'_> {
    type Error = BatchError;
    type Placement = Result<Prepared, ModelError>;
    type Record = SglangRecord;

    /// [`place`]: the placement needs no interpreter.
    fn place(&self, cases: &[Case]) -> Vec<Self::Placement> {
        place(cases)
    }

    /// One driver batch in a scratch folder (kept when
    /// `KVGEOM_KEEP_SGLANG_BATCH` is set), each case's record judged after
    /// the driver ended.
    fn run<T: Send>(
        &self,
        cases: &[Case],
        placed: Vec<Self::Placement>,
        judge: &(dyn Fn(SglangRecord) -> T + Sync),
    ) -> Result<Vec<T>, BatchError> {
        if let Some(TraceTarget::Folder(to)) = self.traces {
            std::fs::create_dir_all(to).map_err(|source| BatchError::Write {
                dir: to.clone(),
                source,
            })?;
        }
        let dir = fresh_scratch("sglang-batch");
        let result = self.run_in(&dir, cases, placed, judge);
        if remove_unless_kept(&dir, "KVGEOM_KEEP_SGLANG_BATCH") {
            eprintln!("note: the SGLang batch is kept in {}", dir.display());
        }
        result
    }
}

impl SglangConnector<'_> {
    fn run_in<T>(
        &self,
        dir: &Path,
        cases: &[Case],
        placed: Vec<Result<Prepared, ModelError>>,
        judge: &(dyn Fn(SglangRecord) -> T + Sync),
    ) -> Result<Vec<T>, BatchError> {
        let python = self.python;
        let write = |source| BatchError::Write {
            dir: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(write)?;
        let mut prepared: Vec<Result<Prepared, ModelError>> = Vec::with_capacity(cases.len());
        let mut specs = Vec::new();
        for p in placed {
            match p.and_then(|p| batch::case_spec(&p).map(|s| (p, s))) {
                Ok((p, spec)) => {
                    batch::write_case(dir, &p).map_err(write)?;
                    specs.push(spec);
                    prepared.push(Ok(p));
                }
                Err(e) => prepared.push(Err(e)),
            }
        }
        let mut killed = false;
        if !specs.is_empty() {
            let n = specs.len() as u64;
            batch::write_batch(dir, specs, CASE_TIMEOUT_S, &python.nixl).map_err(write)?;
            let limit = Duration::from_secs(180 + n * (CASE_TIMEOUT_S + 5));
            let run = python.driver_run();
            let scratch = dir.join("driver-output");
            match run_driver(&run, &python.driver, &[dir.as_os_str()], &scratch, limit) {
                Ok(f) => killed = f.timed_out(),
                // A driver that failed after some cases wrote their results:
                // those are judged, the others have none.
                Err(e)
                    if e.ended_with_a_status()
                        && prepared
                            .iter()
                            .flatten()
                            .any(|p| dir.join(&p.id).join("result.json").is_file()) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut judged = Vec::with_capacity(cases.len());
        for (case, p) in cases.iter().zip(prepared) {
            let run = match p {
                Ok(p) => {
                    let folder = dir.join(&p.id);
                    if let Some(target) = self.traces {
                        record_trace(case, &p, &folder, target)?;
                    }
                    read_result(p, folder, killed)
                }
                Err(e) => Err(RunOutcome::NotRun {
                    message: format!("kvgeom cannot model this SGLang case: {e}"),
                }),
            };
            judged.push(judge(SglangRecord {
                case: case.clone(),
                run,
            }));
        }
        Ok(judged)
    }
}

/// The driver's result of a prepared case, or how the case ended without
/// one (stopped at the batch's time limit, or no readable result).
fn read_result(prepared: Prepared, folder: PathBuf, killed: bool) -> Result<DriverRun, RunOutcome> {
    let path = folder.join("result.json");
    let not_run = |message| RunOutcome::NotRun { message };
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(_) if killed => {
            return Err(RunOutcome::Hung {
                message: "the SGLang driver was stopped at its time limit before this case ended"
                    .into(),
            })
        }
        Err(e) => {
            return Err(not_run(format!(
                "the SGLang driver wrote no {}: {e}",
                path.display()
            )))
        }
    };
    let result: DriverResult = match serde_json::from_slice(&text) {
        Ok(r) => r,
        Err(e) => return Err(not_run(format!("{}: {e}", path.display()))),
    };
    if result.format != RESULT_FORMAT {
        return Err(not_run(format!(
            "{}: format {:?}, expected {RESULT_FORMAT}",
            path.display(),
            result.format
        )));
    }
    Ok(DriverRun {
        prepared,
        result,
        folder,
    })
}

/// Write the trace of a case the driver ran (one that left no
/// `result.json` has none).
fn record_trace(
    case: &Case,
    p: &Prepared,
    case_dir: &Path,
    target: &TraceTarget,
) -> Result<(), BatchError> {
    use super::trace_file::{trace_of, write, SglangTraceError};
    if !case_dir.join("result.json").is_file() {
        return Ok(());
    }
    let path = target.path_of(case);
    let trace = trace_of(case, p, case_dir).map_err(|kind| SglangTraceError {
        path: path.clone(),
        kind,
    })?;
    Ok(write(&trace, &path)?)
}

#[cfg(test)]
#[path = "connector_tests.rs"]
mod tests;
