//! `kvgeom explain`'s command line (the one explain is
//! `super::pipeline::explain`).

use std::path::PathBuf;

use super::{OneAllocArg, OneModeArg, RunArgs};

/// The command line of `kvgeom explain`. Four of the shared options are
/// described here for one case (the sweep's wording is the full one).
#[derive(Clone, Debug, clap::Args)]
#[command(
    mut_arg("max_memory", |a| a.help(
        "Memory the case may use (e.g. 1.5G; default: half of the memory available); \
         a larger case is refused before it allocates"
    )),
    mut_arg("connector", |a| a.help("Which connector runs: kvgeom's, or vLLM's own from the venv")),
    mut_arg("vllm_python", |a| a.help("The Python interpreter with vLLM (see `sweep --vllm-python`)")),
    mut_arg("nixl", |a| a.help("With --connector vllm or sglang: what moves the bytes (see `sweep --nixl`)")),
)]
pub struct ExplainArgs {
    pub geometry: PathBuf,
    #[arg(long)]
    pub prompt: u32,
    #[arg(long, default_value_t = 0)]
    pub prefix_hit: u32,
    /// One case: pull or push (a sweep runs both).
    #[arg(long, value_enum, default_value = "pull")]
    pub mode: OneModeArg,
    /// One case: mainline or with-last-token (a sweep runs both).
    #[arg(long, value_enum, default_value = "mainline")]
    pub alloc: OneAllocArg,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub run: RunArgs,
    /// Also write an SVG byte map of decode's request blocks.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Save the case's trace (v2 with --connector vllm, v3 with kvgeom's
    /// connector; memory images for a case of at most 1 MiB) as FILE
    /// (gzipped when FILE ends in .gz).
    #[arg(long, value_name = "FILE")]
    pub record_trace: Option<PathBuf>,
}
