//! kvgeom's own connector in the one sweep and explain
//! ([`super::pipeline`]): cases on the recording transport, in parallel
//! within the memory budget; one case's descriptor tables and byte
//! verdicts (`--svg`, `--record-trace`).

use super::pipeline::{
    expected_or_passed, refused_plan_options, Explained, Judged, OneCase, PipelineConnector, Swept,
};
use super::sweep::{threads_within_limit, SweepArgs};
use super::{ExplainArgs, EXIT_BAD_INPUT, EXIT_FAILED};
use crate::lifecycle::{KvgeomScenarios, LifecycleDefect, LifecycleError, ScenarioConnector};
use crate::report::explain::{explain_text, svg};
use crate::scenario::memory_estimate::{default_budget, Budget};
use crate::scenario::{Case, CaseReport, Outcome};
use crate::scenario::{MemoryKind, RunOptions, TransportKind};
use crate::sweep::budget::MemoryBudget;
use crate::sweep::plan::SourcedGeometry;
use crate::sweep::{compare, execute};
use crate::under_test::{run_case, run_case_detailed, CodeUnderTest};
use crate::variant::Variant;

/// kvgeom's own connector in the one sweep ([`super::pipeline`]): cases on
/// the recording transport, in parallel within the memory budget.
pub(crate) struct KvgeomPipeline {
    /// The variant every case runs (`--policy`, `--defect`).
    variant: Variant,
    /// How the cases run.
    run_opts: RunOptions,
    /// `--max-memory`, as the cases are checked against it.
    budget: Option<Budget>,
    /// `--threads`, checked.
    threads: Option<usize>,
}

impl KvgeomPipeline {
    /// The connector before its options are read.
    pub(crate) fn new() -> Self {
        KvgeomPipeline {
            variant: Variant::KVGEOM,
            run_opts: RunOptions::default(),
            budget: None,
            threads: None,
        }
    }
}

impl PipelineConnector for KvgeomPipeline {
    fn refused(&self, args: &SweepArgs) -> Option<String> {
        refused_plan_options(args)
    }

    fn options(&mut self, args: &SweepArgs) -> Result<(), u8> {
        self.threads = threads_within_limit(args.threads)?;
        Ok(())
    }

    fn lifecycle(
        &self,
        variant: Option<LifecycleDefect>,
    ) -> Result<Box<dyn ScenarioConnector>, LifecycleError> {
        Ok(Box::new(KvgeomScenarios::new(variant)))
    }

    fn start(
        &mut self,
        args: &SweepArgs,
        _sources: &[SourcedGeometry],
        cases: Vec<Case>,
    ) -> Result<Vec<Case>, u8> {
        self.variant = args.run.variant.variant()?;
        let budget = super::max_memory_option(args.run.max_memory.as_deref())?;
        self.run_opts = RunOptions {
            transport: args.run.transport,
            memory: args.memory,
            policy: None,
            device_platform: false,
        };
        // A case whose request cannot be placed, or that cannot fit alone
        // in the budget, is refused before anything is allocated.
        for case in &cases {
            super::pools_hold(case)?;
        }
        // Real NIXL and device memory need every rank's memory, touched or not.
        let every_rank =
            args.run.transport == TransportKind::Nixl || args.memory == MemoryKind::Vram;
        super::cases_fit(&cases, &budget, every_rank)?;
        // A missing runtime or device is bad input, not a failed invariant.
        if let Some(first) = cases.first() {
            let probe = crate::under_test::run_case(first, &self.run_opts);
            if let crate::scenario::Outcome::Error { message } = &probe.outcome {
                eprintln!("error: {message}");
                return Err(EXIT_BAD_INPUT);
            }
        }
        self.budget = Some(budget);
        Ok(cases)
    }

    fn shard_key(&self, args: &SweepArgs) -> String {
        format!(
            "{:?} {:?} {:?}",
            args.random, args.run.transport, args.memory
        )
    }

    fn run(&mut self, args: &SweepArgs, cases: &[Case]) -> Result<Vec<Judged>, u8> {
        let threads = self.threads;
        let bytes = self.budget.map_or_else(default_budget, |b| b.bytes);
        let budget = MemoryBudget::new(bytes);
        let reports = match &args.record_traces {
            None => execute::run_all_within(cases, &self.run_opts, threads, &budget),
            Some(dir) => run_recorded(cases, &self.run_opts, threads, &budget, dir)?,
        };
        Ok(reports.into_iter().map(Judged::plain).collect())
    }

    fn code_under_test(&self, _judged: &[Judged]) -> CodeUnderTest {
        CodeUnderTest::kvgeom(self.variant)
    }

    fn refused_explain(&self, _args: &ExplainArgs) -> Option<String> {
        None
    }

    fn explain(&mut self, args: &ExplainArgs, one: OneCase) -> Result<Explained, u8> {
        kvgeom_explain(args, &one.case)
    }

    fn verdict(&mut self, sweep: &Swept<'_>) -> u8 {
        let Swept {
            args,
            expectations,
            code,
            ..
        } = *sweep;
        let differs = args.compare_host && !same_as_host(sweep.reports, self.threads);
        let exit = expected_or_passed(sweep.reports, expectations, code, "cases");
        if differs {
            EXIT_FAILED
        } else {
            exit
        }
    }

    fn run_candidates(&mut self, cases: &[Case]) -> Option<Vec<CaseReport>> {
        Some(cases.iter().map(|c| run_case(c, &self.run_opts)).collect())
    }

    /// One case at a time, stopping at the first candidate that fails the
    /// same way (a real-scale case costs seconds).
    fn shrink(&mut self, failures: &[&CaseReport]) -> Vec<Case> {
        failures
            .iter()
            .map(|r| execute::shrink(&r.case, &self.run_opts))
            .collect()
    }
}

/// Every case run through kvgeom's connector as [`execute::run_all_within`]
/// runs it, each run written into `dir` as a trace (named as a live sweep
/// names them, gzipped); a trace that cannot be written fails the sweep
/// with exit 2, naming the first.
fn run_recorded(
    cases: &[crate::scenario::Case],
    opts: &RunOptions,
    threads: Option<usize>,
    budget: &MemoryBudget,
    dir: &std::path::Path,
) -> Result<Vec<CaseReport>, u8> {
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("error: --record-traces {}: {e}", dir.display());
        return Err(EXIT_BAD_INPUT);
    }
    let failed = std::sync::Mutex::new(None);
    let reports = execute::run_each_within(cases, opts, threads, budget, &|case| {
        let run = crate::under_test::run_case_detailed(case, opts);
        let path = dir.join(format!("{}.gz", crate::driver::trace_file_name(case)));
        let code = CodeUnderTest::kvgeom(case.variant);
        if let Err(e) = crate::trace::write_trace(&run, &code, &path) {
            let mut first = failed.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert(e);
        }
        run.report
    });
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => {
            eprintln!("error: --record-traces: {e}");
            Err(EXIT_BAD_INPUT)
        }
        None => Ok(reports),
    }
}

/// Run the cases of `reports` again on host memory over the loopback
/// transport and report every case whose results differ; true when none does.
fn same_as_host(reports: &[CaseReport], threads: Option<usize>) -> bool {
    let cases: Vec<Case> = reports.iter().map(|r| r.case.clone()).collect();
    let reference = execute::run_all(&cases, &RunOptions::default(), threads);
    let mismatches = compare::compare(reports, &reference);
    if mismatches.is_empty() {
        eprintln!(
            "compared with host memory over loopback: all {} cases give the same results",
            reports.len()
        );
        return true;
    }
    eprintln!(
        "compared with host memory over loopback: {} differences",
        mismatches.len()
    );
    for m in mismatches.iter().take(10) {
        eprintln!("- {m}");
    }
    false
}

/// `kvgeom explain --connector kvgeom`: the case run on kvgeom's connector,
/// its descriptor tables and byte verdicts (and `--svg`, `--record-trace`).
fn kvgeom_explain(args: &ExplainArgs, case: &Case) -> Result<Explained, u8> {
    // An unwritable --svg is refused before the case runs.
    if let Some(path) = &args.svg {
        super::write_output("--svg", path, "")?;
    }
    if let Some(path) = &args.record_trace {
        super::write_output("--record-trace", path, "")?;
    }
    super::pools_hold(case)?;
    let budget = super::max_memory_option(args.run.max_memory.as_deref())?;
    // With --svg, the byte map keeps one class byte per byte of decode's
    // request blocks: at most every decode rank's arenas again.
    let need = crate::scenario::estimate_memory(case);
    let every_rank = args.run.transport == TransportKind::Nixl;
    let mapped = need.mapped_bytes(every_rank);
    let svg_bytes = if args.svg.is_some() {
        need.decode_rank_bytes
            .saturating_mul(u64::from(need.decode_ranks))
    } else {
        0
    };
    let bytes = mapped.saturating_add(svg_bytes);
    if bytes > budget.bytes {
        let extra = (svg_bytes > 0).then_some((svg_bytes, "for the --svg byte map"));
        eprintln!(
            "error: {}",
            need.refusal_of(case, every_rank, extra, &budget)
        );
        return Err(EXIT_BAD_INPUT);
    }
    let run = run_case_detailed(
        case,
        &RunOptions {
            transport: args.run.transport,
            ..RunOptions::default()
        },
    );
    if let Outcome::Error { message } = &run.report.outcome {
        eprintln!("error: {message}");
        return Err(EXIT_BAD_INPUT);
    }
    if let Some(path) = &args.record_trace {
        let code = crate::under_test::CodeUnderTest::kvgeom(case.variant);
        if let Err(e) = crate::trace::write_trace(&run, &code, path) {
            eprintln!("error: --record-trace: {e}");
            return Err(EXIT_BAD_INPUT);
        }
    }
    if let Some(path) = &args.svg {
        super::write_output("--svg", path, &svg(&run))?;
    }
    Ok(Explained {
        text: explain_text(&run),
        passed: run.report.passed(),
    })
}
