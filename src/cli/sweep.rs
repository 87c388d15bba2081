//! `kvgeom sweep`'s command line (the one sweep is `super::pipeline::sweep`).

use std::path::PathBuf;

use super::EXIT_BAD_INPUT;
use super::{AllocArg, ModeArg, RunArgs};
use crate::limits::{available_cores, THREADS_PER_CORE};
use crate::report::sweep_report::Format;
use crate::scenario::MemoryKind;

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
    /// vLLM driver processes run at once (default: one per core, at most 4,
    /// and at most one per 32 cases).
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
pub(crate) fn overwritten_input(
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
