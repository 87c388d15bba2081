//! The commands behind the `kvgeom` binary. Each returns the process exit
//! status: 0 when everything passed, 1 when an invariant is violated (or a
//! defect is missed, or a trace differs), 2 on bad input.

/// `print!` to standard output through [`output::write_stdout`]: a closed
/// pipe ends the command quietly instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::output::write_stdout(format_args!($($arg)*))
    };
}

/// `println!` through [`output::write_stdout`].
macro_rules! outln {
    () => {
        $crate::cli::output::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::output::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod bench;
mod bench_scale;
mod canary;
mod checkout;
mod choices;
mod connectors;
mod derive;
mod explain;
mod kvgeom;
mod layout;
mod lifecycle;
mod live;
mod matrix;
mod mutants;
mod output;
mod pipeline;
mod replay;
mod report_merge;
mod run_args;
mod run_lines;
mod sglang;
mod sglang_state_explain;
mod sweep;
mod traces;

pub use bench::{
    bench, bench_peer, bench_vram, BenchArgs, BenchKind, BenchPeerArgs, OpArg, VramArgs,
};
pub use bench_scale::{bench_scale, ScaleFormat};
pub use choices::{AllocArg, ConnectorArg, ModeArg, NixlArg, OneAllocArg, OneModeArg};
pub use connectors::{explain, lifecycle, sweep};
pub use derive::{derive, DeriveArgs, DeriveFormat};
pub use explain::ExplainArgs;
pub use layout::{layout, LayoutArgs};
pub use lifecycle::{bench_lifecycle, LifecycleArgs, LifecycleFormat, LIFECYCLE_SCHEMA};
pub use matrix::{matrix, MatrixArgs, MatrixFormat, MATRIX_SCHEMA};
pub use mutants::{defects, mutants, MutantsArgs, MutantsFormat, MUTANTS_SCHEMA};
pub use report_merge::{merge as merge_reports, report_merge, MergeError, ReportMergeArgs};
pub use run_args::RunArgs;
pub(crate) use sweep::threads_within_limit;
pub use sweep::SweepArgs;
pub use traces::{
    check_trace, diff_trace, CheckTraceArgs, DiffTraceArgs, TraceFormat, TRACE_VERDICTS_SCHEMA,
};

use std::path::Path;

use crate::connector::NamedPolicy;
use crate::defects::Defect;
use crate::limits::{MAX_PROMPT_LEN, MAX_RANDOM_CASES};
use crate::variant::Variant;

/// Everything passed.
pub const EXIT_OK: u8 = 0;
/// An invariant is violated (or a defect missed, or a trace differs).
pub const EXIT_FAILED: u8 = 1;
/// Bad input: unreadable or malformed files, unknown names, missing runtime.
pub const EXIT_BAD_INPUT: u8 = 2;

/// Parse `--defect NAME`, naming the known defects when it is unknown.
pub(crate) fn parse_defect(name: Option<&str>) -> Result<Option<Defect>, u8> {
    match name {
        None => Ok(None),
        Some(n) => Defect::from_name(n).map(Some).ok_or_else(|| {
            let known: Vec<&str> = Defect::ALL.iter().map(|d| d.name()).collect();
            eprintln!(
                "error: --defect {n}: unknown defect; known: {} (`kvgeom defects` describes them)",
                known.join(", ")
            );
            EXIT_BAD_INPUT
        }),
    }
}

/// `--policy NAME` and `--defect NAME`: which connector variant runs.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct VariantArgs {
    /// The connector's policy: `kvgeom` (the correct connector) or
    /// `vllm-0.33.0` (vLLM 0.33.0 as released, its known bugs included).
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    /// Run kvgeom's policy with one known defect (see `kvgeom defects`).
    #[arg(long, value_name = "NAME", conflicts_with = "policy")]
    pub defect: Option<String>,
}

impl VariantArgs {
    /// The variant, or exit 2 after naming what is known.
    pub(crate) fn variant(&self) -> Result<Variant, u8> {
        if let Some(d) = parse_defect(self.defect.as_deref())? {
            return Ok(Variant::Defect(d));
        }
        match self.policy.as_deref() {
            None => Ok(Variant::KVGEOM),
            Some(name) => NamedPolicy::from_name(name)
                .map(Variant::Policy)
                .ok_or_else(|| {
                    let known: Vec<&str> = NamedPolicy::ALL.iter().map(|p| p.name()).collect();
                    eprintln!(
                        "error: --policy {name}: unknown policy; known: {}",
                        known.join(", ")
                    );
                    EXIT_BAD_INPUT
                }),
        }
    }
}

/// `--prompts LIST`, parsed, or exit 2 naming the option.
pub(crate) fn prompts_option(text: Option<&str>) -> Result<Option<Vec<u32>>, u8> {
    text.map(crate::sweep::prompts::parse_prompt_list)
        .transpose()
        .map_err(|e| {
            eprintln!("error: --prompts {e}");
            EXIT_BAD_INPUT
        })
}

/// `--prompt N` of one case: 1 to [`MAX_PROMPT_LEN`] tokens.
pub(crate) fn prompt_option(n: u32) -> Result<(), u8> {
    if n == 0 || n > MAX_PROMPT_LEN {
        eprintln!("error: --prompt {n}: a prompt length must be 1 to {MAX_PROMPT_LEN} tokens");
        return Err(EXIT_BAD_INPUT);
    }
    Ok(())
}

/// `--max-memory SIZE` (half of the memory available when it is not given),
/// within what an address-space limit leaves: the budget, which also
/// becomes the default of this process's later runs.
pub(crate) fn max_memory_option(
    text: Option<&str>,
) -> Result<crate::scenario::memory_estimate::Budget, u8> {
    use crate::scenario::memory_estimate::{parse_size, set_process_budget, Budget};
    match text.map(parse_size).transpose() {
        Ok(b) => {
            let budget = Budget::new(b);
            set_process_budget(budget);
            Ok(budget)
        }
        Err(e) => {
            eprintln!("error: --max-memory {e}");
            Err(EXIT_BAD_INPUT)
        }
    }
}

/// `--threads` and `--max-memory` of a command that runs cases, each
/// checked (exit 2 naming the option).
pub(crate) fn threads_and_budget(
    threads: Option<usize>,
    max_memory: Option<&str>,
) -> Result<(Option<usize>, crate::scenario::memory_estimate::Budget), u8> {
    Ok((
        threads_within_limit(threads)?,
        max_memory_option(max_memory)?,
    ))
}

/// `--max-memory` of a command that reads its cases from files (check-trace,
/// diff-trace): checked, and made this process's budget, which rebuilding a
/// case is held to.
pub fn memory_option(max_memory: Option<&str>) -> Result<(), u8> {
    max_memory_option(max_memory).map(|_| ())
}

/// Every case fits `budget` (its mapped bytes; with `every_rank`, every
/// rank's arenas), or the first that does not is refused with exit 2.
pub(crate) fn cases_fit(
    cases: &[crate::scenario::Case],
    budget: &crate::scenario::memory_estimate::Budget,
    every_rank: bool,
) -> Result<(), u8> {
    use crate::scenario::estimate_memory;
    for case in cases {
        let need = estimate_memory(case);
        let bytes = need.mapped_bytes(every_rank);
        if bytes > budget.bytes {
            eprintln!("error: {}", need.refusal_of(case, every_rank, None, budget));
            return Err(EXIT_BAD_INPUT);
        }
    }
    Ok(())
}

/// Every case fits `budget` as kvgeom prepares it for vLLM's connector (the
/// live mode: [`MemoryEstimate::prepared_bytes`](crate::scenario::MemoryEstimate::prepared_bytes)),
/// or the first that does not is refused with exit 2.
pub(crate) fn prepared_cases_fit(
    cases: &[crate::scenario::Case],
    budget: &crate::scenario::memory_estimate::Budget,
) -> Result<(), u8> {
    use crate::scenario::estimate_memory;
    for case in cases {
        let need = estimate_memory(case);
        if need.prepared_bytes() > budget.bytes {
            let extra = need.prepared_bytes() - need.every_rank_bytes;
            let purpose = "for the copies of their initial images and kvgeom's own run";
            eprintln!(
                "error: {}",
                need.refusal_of(case, true, Some((extra, purpose)), budget)
            );
            return Err(EXIT_BAD_INPUT);
        }
    }
    Ok(())
}

/// `--random N`: 1 to [`MAX_RANDOM_CASES`] cases.
pub(crate) fn random_option(n: Option<usize>) -> Result<(), u8> {
    match n {
        Some(n) if n == 0 || n as u64 > MAX_RANDOM_CASES => {
            eprintln!(
                "error: --random {n}: the number of cases to draw must be 1 to {MAX_RANDOM_CASES}"
            );
            Err(EXIT_BAD_INPUT)
        }
        _ => Ok(()),
    }
}

/// The case's request fits its engines' pools, or exit 2 naming the file
/// and the pool field.
pub(crate) fn pools_hold(case: &crate::scenario::Case) -> Result<(), u8> {
    let shape = crate::scheduler::request_shape(
        &case.geometry,
        case.prompt_len,
        case.prefix_hit,
        case.allocation,
    );
    crate::scenario::placement::check_pools(&case.geometry, &shape).map_err(|e| {
        let file = case.file.as_ref().map_or_else(
            || case.geometry_name().to_string(),
            |f| f.display().to_string(),
        );
        eprintln!("error: {file}: {e}");
        EXIT_BAD_INPUT
    })
}

/// Write `text` to the file an option (`--out`, `--svg`) names, or exit 2
/// naming the option, the file and why.
pub(crate) fn write_output(option: &str, path: &Path, text: &str) -> Result<(), u8> {
    std::fs::write(path, text).map_err(|e| {
        eprintln!("error: {option} {}: cannot write: {e}", path.display());
        EXIT_BAD_INPUT
    })
}

/// The default geometry folder when no path is given (`geometries/` here,
/// else the checkout's); `Err` is exit 2 after saying where to run.
pub(crate) fn default_paths(paths: Vec<std::path::PathBuf>) -> Result<Vec<std::path::PathBuf>, u8> {
    if !paths.is_empty() {
        return Ok(paths);
    }
    checkout::checkout_path("geometries")
        .map(|found| vec![found])
        .map_err(|e| {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        })
}

/// The cases of shard `of` (all of them without `--shard`), its record and
/// positions, saying on stderr how many of the sweep's cases it holds.
#[allow(clippy::type_complexity)]
fn shard_cases(
    all_cases: Vec<crate::scenario::Case>,
    of: Option<(u32, u32)>,
    sources: &[crate::sweep::plan::SourcedGeometry],
    opts: &crate::sweep::plan::PlanOptions,
    options: &str,
) -> (
    Vec<crate::scenario::Case>,
    Option<(crate::sweep::shard::Shard, Vec<usize>)>,
) {
    let Some(of) = of else {
        return (all_cases, None);
    };
    let (mine, info, positions) =
        crate::sweep::shard::select(&all_cases, of, sources, opts, options);
    eprintln!(
        "shard {}/{}: {} of {} cases",
        info.index,
        info.count,
        positions.len(),
        all_cases.len()
    );
    (mine, Some((info, positions)))
}

/// Print a sweep's verdict against its expectations file (stderr); true
/// when the sweep is as expected.
fn print_sweep_verdict(v: &crate::under_test::SweepVerdict) -> bool {
    if !v.unused.is_empty() {
        eprintln!(
            "note: {} of {} expected failures cover no case of this sweep (not run here)",
            v.unused.len(),
            v.expected_failures
        );
    }
    if v.as_expected() {
        eprintln!(
            "\n{} of {} cases failed, each as expected ({} expected failures)",
            v.failed, v.cases, v.expected_failures
        );
        return true;
    }
    eprintln!(
        "\n{} disagreements with the expectations ({} of {} cases failed):",
        v.disagreements.len(),
        v.failed,
        v.cases
    );
    for d in v.disagreements.iter().take(20) {
        eprintln!("- {d}");
    }
    if v.disagreements.len() > 20 {
        eprintln!("  ... and {} more", v.disagreements.len() - 20);
    }
    false
}

/// Exit 2 naming why one geometry of another stack cannot run on kvgeom's
/// or vLLM's connector (`explain`, `layout`).
fn refuse_other_stack(
    geometry: &crate::geometry::Geometry,
    path: &std::path::Path,
) -> Result<(), u8> {
    if geometry.stack == crate::geometry::Stack::Vllm {
        return Ok(());
    }
    eprintln!(
        "error: {}: stack = \"{}\": kvgeom's and vLLM's connectors run vLLM's KV cache, not SGLang's pools",
        path.display(),
        geometry.stack.as_str()
    );
    Err(EXIT_BAD_INPUT)
}
