//! `kvgeom sweep`.

use std::path::PathBuf;

use super::{default_paths, AllocArg, ModeArg, RunArgs};
use super::{EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::limits::{available_cores, THREADS_PER_CORE};
use crate::report::sweep_report::{self, Format};
use crate::scenario::CaseReport;
use crate::scenario::{MemoryKind, RunOptions, TransportKind};
use crate::sweep::budget::MemoryBudget;
use crate::sweep::shard::parse_shard;
use crate::sweep::{compare, execute, plan, prompts};
use crate::under_test::expectations::Expectations;
use crate::under_test::{judge_sweep, CodeUnderTest};

/// The command line of `kvgeom sweep`.
#[derive(Clone, Debug, clap::Args)]
pub struct SweepArgs {
    /// Geometry files or folders, searched recursively (default: geometries/).
    pub paths: Vec<PathBuf>,
    /// Prompt lengths, e.g. `2..=39,41` (default: each file's own list or the residue sweep).
    #[arg(long)]
    pub prompts: Option<String>,
    #[arg(long, value_enum, default_value = "both")]
    pub mode: ModeArg,
    /// Decode allocation model (both: every hybrid case runs with each).
    #[arg(long, value_enum, default_value = "both")]
    pub alloc: AllocArg,
    #[command(flatten)]
    pub run: RunArgs,
    #[arg(long, value_enum, default_value = "host")]
    pub memory: MemoryKind,
    /// Draw this many random cases instead of the grid.
    #[arg(long)]
    pub random: Option<usize>,
    /// Seed of the random draw and of block placement.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Worker threads (default: all cores); with `--connector vllm`, the
    /// vLLM driver processes run at once (default: one per core, at most 4).
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Write the report here instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Do not shrink failing cases to a minimal replay.
    #[arg(long)]
    pub no_shrink: bool,
    /// Run every case again on host memory over the loopback transport
    /// and fail unless each gives the same results.
    #[arg(long)]
    pub compare_host: bool,
    /// Pass when exactly the failures listed in this file occur (e.g.
    /// `--policy vllm-0.33.0 --expect expected/vllm-0.33.0.toml`).
    #[arg(long, value_name = "FILE")]
    pub expect: Option<PathBuf>,
    /// With --connector vllm: the plan differences allowed, instead of the
    /// release's committed file (expected/plan-differences/vllm-X.toml):
    /// a listed case whose plan differs is printed as allowed, with its
    /// finding, and does not fail the sweep.
    #[arg(long, value_name = "FILE")]
    pub plan_differences: Option<PathBuf>,
    /// With --connector vllm: compare vLLM's plans with this kvgeom policy
    /// (e.g. `vllm-0.33.0`) instead of its release's; for a release kvgeom
    /// models, a difference still fails the sweep unless it is an allowed
    /// plan difference (--plan-differences). The expectations stay the
    /// release's.
    #[arg(long, value_name = "NAME")]
    pub compare_policy: Option<String>,
    /// Run shard K of N (1-based) of the cases, e.g. `--shard 2/4` on the
    /// second of four CI runners; `kvgeom report merge` joins the JSON or
    /// JUnit reports.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<String>,
    /// Save every case's trace into this folder, for check-trace,
    /// diff-trace and --connector replay: with --connector vllm its v2
    /// trace (vLLM's lists, transfers and outcome; memory images for a case
    /// of at most 1 MiB) and, for a pull case, one v1 trace per decode rank
    /// (`<case>-d<rank>.jsonl.gz`); with kvgeom's connector its v3 trace
    /// (the same record, naming the code that ran).
    #[arg(long, value_name = "DIR")]
    pub record_traces: Option<PathBuf>,
}

/// `--threads`: at least 1, and at most a few threads per core (more only
/// thrash); a larger value is capped with a note.
pub(crate) fn threads_within_limit(threads: Option<usize>) -> Result<Option<usize>, u8> {
    let Some(n) = threads else {
        return Ok(None);
    };
    if n == 0 {
        eprintln!("error: --threads 0: give at least 1 (or leave it out to use every core)");
        return Err(EXIT_BAD_INPUT);
    }
    let cap = available_cores() * THREADS_PER_CORE;
    if n > cap {
        eprintln!(
            "note: --threads {n} capped at {cap} ({THREADS_PER_CORE} per core on {} cores)",
            available_cores()
        );
        return Ok(Some(cap));
    }
    Ok(Some(n))
}

/// The input `out` would overwrite: a geometry file or folder entry, or the
/// expectations file.
fn overwritten_input(
    out: &std::path::Path,
    paths: &[PathBuf],
    expect: Option<&std::path::Path>,
) -> Option<PathBuf> {
    let out = std::fs::canonicalize(out).ok()?;
    let mut inputs: Vec<PathBuf> = expect.map(|e| e.to_path_buf()).into_iter().collect();
    for p in paths {
        if p.is_dir() {
            inputs.extend(crate::geometry::toml_files_in(p).unwrap_or_default());
        } else {
            inputs.push(p.clone());
        }
    }
    inputs
        .into_iter()
        .find(|i| std::fs::canonicalize(i).is_ok_and(|c| c == out))
}

/// `kvgeom sweep --connector kvgeom`.
pub(crate) fn kvgeom_sweep(args: SweepArgs) -> u8 {
    let variant = match args.run.variant.variant() {
        Ok(v) => v,
        Err(code) => return code,
    };
    let prompt_list = match super::prompts_option(args.prompts.as_deref()) {
        Ok(p) => p,
        Err(code) => return code,
    };
    if let Err(code) = super::random_option(args.random) {
        return code;
    }
    let budget = match super::max_memory_option(args.run.max_memory.as_deref()) {
        Ok(b) => b,
        Err(code) => return code,
    };
    let threads = match threads_within_limit(args.threads) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let paths = match default_paths(args.paths) {
        Ok(p) => p,
        Err(code) => return code,
    };
    if let Some(out) = &args.out {
        if let Some(input) = overwritten_input(out, &paths, args.expect.as_deref()) {
            // The input is named when --out names it another way.
            let which = if input == *out {
                String::new()
            } else {
                format!(" ({})", input.display())
            };
            eprintln!(
                "error: --out {}: that is an input of this sweep{which}; write the report elsewhere",
                out.display()
            );
            return EXIT_BAD_INPUT;
        }
    }
    let expectations = match args.expect.as_deref().map(Expectations::load).transpose() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let sources = match plan::load_sources(&paths).map(super::vllm_stack_only) {
        Ok(Ok(s)) => s,
        Ok(Err(code)) => return code,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    for s in &sources {
        let file = s
            .file
            .as_ref()
            .map_or_else(|| s.geometry.name.clone(), |f| f.display().to_string());
        if let Err(e) = prompts::check_default_sweep(&file, &s.geometry, prompt_list.is_some()) {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    }
    let opts = plan::PlanOptions {
        prompts: prompt_list,
        modes: args.mode.modes(),
        allocations: args.alloc.allocations(),
        variant,
        seed: args.seed,
    };
    let shard_of = match args.shard.as_deref().map(parse_shard).transpose() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: --shard {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let all_cases = match args.random {
        Some(n) => plan::random(&sources, n, args.seed, &opts),
        None => plan::grid(&sources, &opts),
    };
    let options = format!(
        "{:?} {:?} {:?}",
        args.random, args.run.transport, args.memory
    );
    let (cases, shard) = super::shard_cases(all_cases, shard_of, &sources, &opts, &options);
    let run_opts = RunOptions {
        transport: args.run.transport,
        memory: args.memory,
        policy: None,
        device_platform: false,
    };
    // A case whose request cannot be placed, or that cannot fit alone in the
    // budget, is refused before anything is allocated.
    for case in &cases {
        if let Err(code) = super::pools_hold(case) {
            return code;
        }
    }
    // Real NIXL and device memory need every rank's memory, touched or not.
    let every_rank = args.run.transport == TransportKind::Nixl || args.memory == MemoryKind::Vram;
    if let Err(code) = super::cases_fit(&cases, &budget, every_rank) {
        return code;
    }
    // A missing runtime or device is bad input, not a failed invariant.
    if let Some(first) = cases.first() {
        let probe = crate::under_test::run_case(first, &run_opts);
        if let crate::scenario::Outcome::Error { message } = &probe.outcome {
            eprintln!("error: {message}");
            return EXIT_BAD_INPUT;
        }
    }
    let budget = MemoryBudget::new(budget.bytes);
    let reports = match &args.record_traces {
        None => execute::run_all_within(&cases, &run_opts, threads, &budget),
        Some(dir) => match run_recorded(&cases, &run_opts, threads, &budget, dir) {
            Ok(reports) => reports,
            Err(code) => return code,
        },
    };
    let shard = shard.as_ref().map(|(s, p)| (s, p.as_slice()));
    let text = match args.format {
        Format::Table => sweep_report::table(&reports),
        Format::Json => sweep_report::json(&reports, shard, &CodeUnderTest::kvgeom(variant)),
        Format::Junit => sweep_report::junit(&reports, shard, &CodeUnderTest::kvgeom(variant)),
    };
    match &args.out {
        Some(path) => {
            if let Err(code) = super::write_output("--out", path, &text) {
                return code;
            }
        }
        None => out!("{text}"),
    }
    let differs = args.compare_host && !same_as_host(&cases, &reports, threads);
    if let Some(expectations) = &expectations {
        return judge_against(
            expectations,
            &reports,
            &CodeUnderTest::kvgeom(variant),
            differs,
        );
    }
    let failures: Vec<_> = reports.iter().filter(|r| !r.passed()).collect();
    if failures.is_empty() {
        return if differs { EXIT_FAILED } else { EXIT_OK };
    }
    // A short summary with a minimal replay for the first failures.
    eprintln!("\n{} of {} cases failed", failures.len(), reports.len());
    let mut shown = Vec::new();
    for r in failures {
        let key = (
            r.case.geometry_name().to_string(),
            r.case.mode,
            r.outcome.label(),
        );
        if shown.contains(&key) || shown.len() >= 5 {
            continue;
        }
        shown.push(key);
        let minimal = if !args.no_shrink {
            execute::shrink(&r.case, &run_opts)
        } else {
            r.case.clone()
        };
        eprintln!("- {}: {}", r.case.label(), r.outcome.describe());
        for v in r.violations.iter().take(3) {
            eprintln!("    {v}");
        }
        eprintln!("  replay: {}", minimal.replay_command());
    }
    EXIT_FAILED
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

/// Exit status of a sweep judged against expected failures: 0 when exactly
/// the expected cases failed the expected way.
fn judge_against(
    expectations: &Expectations,
    reports: &[CaseReport],
    code: &CodeUnderTest,
    differs: bool,
) -> u8 {
    if super::print_sweep_verdict(&judge_sweep(expectations, reports, code)) && !differs {
        EXIT_OK
    } else {
        EXIT_FAILED
    }
}

/// Run `cases` on host memory over the loopback transport and report every
/// case whose results differ from `reports`; true when none does.
fn same_as_host(
    cases: &[crate::scenario::Case],
    reports: &[crate::scenario::CaseReport],
    threads: Option<usize>,
) -> bool {
    let reference = execute::run_all(cases, &RunOptions::default(), threads);
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
