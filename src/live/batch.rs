//! The entry point of the live mode: a batch of cases in a fresh scratch
//! folder, run by the driver processes ([`super::chunks`]).

use std::time::Duration;

use crate::scenario::{Case, Placed};

use super::blocks::BlockCheck;
use super::chunks::{run_chunks, BatchContext};
use super::error::BatchError;
use super::python::Interpreter;
use super::run::{remove_unless_kept, Hooks, JudgeDriverCase};

/// How the driver processes of a batch run.
#[derive(Clone, Copy)]
pub struct DriverSettings<'a> {
    /// The interpreter with vLLM (and what moves the bytes).
    pub python: &'a Interpreter,
    /// Deployments whose blocks the driver derives with vLLM's own
    /// functions (each case of a checked geometry gets its comparison).
    pub checks: &'a [BlockCheck],
    /// Time-out of one case inside the driver.
    pub case_limit: Duration,
    /// Test hooks, and where traces are saved.
    pub hooks: &'a Hooks,
    /// Driver processes run at once.
    pub drivers: usize,
}

/// Run every case, prepared for its placement (`placed`, in case order;
/// a case whose request vLLM's scheduler makes, `settings.hooks.requests`,
/// for the placement the driver's place phase gives it first),
/// through vLLM's connector in a fresh scratch folder, in driver batches of
/// at most [`CHUNK_MEMORY_BYTES`](super::chunks::CHUNK_MEMORY_BYTES) of
/// initial memory, up to `settings.drivers` driver processes at once, each
/// case handed to `judge` while its driver output is on disk; the judged
/// cases in order. `Err` when the driver cannot run at all (the caller
/// exits 2).
pub fn run_in_scratch<T: Send>(
    cases: &[Case],
    placed: Vec<Placed>,
    settings: DriverSettings<'_>,
    judge: &JudgeDriverCase<'_, T>,
) -> Result<Vec<T>, BatchError> {
    let dir = crate::driver::fresh_scratch("live");
    // The place phase first: the requests vLLM's scheduler makes replace
    // the given placement of their cases.
    let placed_by_scheduler = match super::place::place_batch(
        &dir.join("place"),
        cases,
        settings.hooks.requests,
        settings.python,
    ) {
        Ok(p) => p,
        Err(e) => {
            remove_unless_kept(&dir);
            return Err(e);
        }
    };
    let mut placed = placed;
    if placed_by_scheduler.iter().any(Option::is_some) {
        for case in &cases[placed.len().min(cases.len())..] {
            placed.push(crate::scenario::shape_and_place(case));
        }
    }
    let mut scheduler = Vec::with_capacity(cases.len());
    for (i, s) in placed_by_scheduler.into_iter().enumerate() {
        scheduler.push(s.map(|s| {
            let mut info = s.info;
            info.placement = s.placed.as_ref().ok().cloned();
            placed[i] = s.placed;
            info
        }));
    }
    let batch = BatchContext {
        dir: &dir,
        cases,
        checks: settings.checks,
        python: settings.python,
        case_limit: settings.case_limit,
        hooks: settings.hooks,
        scheduler: &scheduler,
        judge,
    };
    let result = run_chunks(&batch, placed, settings.drivers);
    remove_unless_kept(&dir);
    result
}
