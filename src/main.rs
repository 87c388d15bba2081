//! The `kvgeom` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use kvgeom::cli;
use kvgeom::geometry::Mode;
use kvgeom::report::sweep_report::Format;
use kvgeom::scenario::{MemoryKind, TransportKind};
use kvgeom::scheduler::DecodeAllocation;

#[derive(Parser)]
#[command(
    name = "kvgeom",
    version,
    about = "Verify KV-cache transfers over NIXL across P/D block geometries"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// `pull`, `push` or `both`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum ModeArg {
    Pull,
    Push,
    Both,
}

impl ModeArg {
    fn modes(self) -> Vec<Mode> {
        match self {
            ModeArg::Pull => vec![Mode::Pull],
            ModeArg::Push => vec![Mode::Push],
            ModeArg::Both => vec![Mode::Pull, Mode::Push],
        }
    }
}

/// Decode allocation model: `mainline`, `with-last-token` or `both`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum AllocArg {
    Mainline,
    WithLastToken,
    Both,
}

impl AllocArg {
    fn allocations(self) -> Option<Vec<DecodeAllocation>> {
        match self {
            AllocArg::Mainline => Some(vec![DecodeAllocation::Mainline]),
            AllocArg::WithLastToken => Some(vec![DecodeAllocation::WithLastToken]),
            AllocArg::Both => None,
        }
    }

    fn single(self) -> DecodeAllocation {
        match self {
            AllocArg::WithLastToken => DecodeAllocation::WithLastToken,
            _ => DecodeAllocation::Mainline,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run every case of geometry files (or folders) through the connector and the oracles.
    Sweep {
        /// Geometry files or folders (default: geometries/).
        paths: Vec<PathBuf>,
        /// Prompt lengths, e.g. `2..=39,41` (default: each file's own list or the residue sweep).
        #[arg(long)]
        prompts: Option<String>,
        #[arg(long, value_enum, default_value = "both")]
        mode: ModeArg,
        /// Decode allocation model (both: every hybrid case runs with each).
        #[arg(long, value_enum, default_value = "both")]
        alloc: AllocArg,
        #[arg(long, value_enum, default_value = "loopback")]
        transport: TransportKind,
        #[arg(long, value_enum, default_value = "host")]
        memory: MemoryKind,
        #[command(flatten)]
        variant: cli::VariantArgs,
        /// Draw this many random cases instead of the grid.
        #[arg(long)]
        random: Option<usize>,
        /// Seed of the random draw and of block placement.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Worker threads (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
        /// Write the report here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Do not shrink failing cases to a minimal replay.
        #[arg(long)]
        no_shrink: bool,
        /// Run every case again on host memory over the loopback transport
        /// and fail unless each gives the same results.
        #[arg(long)]
        compare_host: bool,
        /// Pass when exactly the failures listed in this file occur (e.g.
        /// `--policy vllm-0.33.0 --expect expected/vllm-0.33.0.toml`).
        #[arg(long, value_name = "FILE")]
        expect: Option<PathBuf>,
        /// Which connector runs: kvgeom's, or vLLM's own from the venv
        /// (scripts/install-vllm.sh), judged by the same oracles.
        #[arg(long, value_enum, default_value = "kvgeom")]
        connector: cli::ConnectorArg,
        /// The Python interpreter with vLLM (default: KVGEOM_VLLM_PYTHON,
        /// else .vllm-venv/bin/python).
        #[arg(long, value_name = "PATH")]
        vllm_python: Option<PathBuf>,
    },
    /// Run one case and show the plan, every pair and, per local block, what was
    /// transferred, zeroed and left stale.
    Explain {
        geometry: PathBuf,
        #[arg(long)]
        prompt: u32,
        #[arg(long, default_value_t = 0)]
        prefix_hit: u32,
        #[arg(long, value_enum, default_value = "pull")]
        mode: ModeArg,
        #[arg(long, value_enum, default_value = "mainline")]
        alloc: AllocArg,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[command(flatten)]
        variant: cli::VariantArgs,
        #[arg(long, value_enum, default_value = "loopback")]
        transport: TransportKind,
        /// Also write an SVG byte map of decode's request blocks.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Which connector runs: kvgeom's, or vLLM's own from the venv.
        #[arg(long, value_enum, default_value = "kvgeom")]
        connector: cli::ConnectorArg,
        /// The Python interpreter with vLLM (see `sweep --vllm-python`).
        #[arg(long, value_name = "PATH")]
        vllm_python: Option<PathBuf>,
    },
    /// Print a geometry's descriptor lists as tables (what the snapshots hold).
    Layout {
        geometry: PathBuf,
        #[arg(long, value_enum, default_value = "pull")]
        mode: ModeArg,
        #[command(flatten)]
        variant: cli::VariantArgs,
    },
    /// Run the descriptor-level oracles on traces recorded from vLLM.
    CheckTrace { files: Vec<PathBuf> },
    /// Rebuild traced vLLM cases with kvgeom's connector and compare lists and transfers.
    DiffTrace {
        files: Vec<PathBuf>,
        #[command(flatten)]
        variant: cli::VariantArgs,
    },
    /// List the known connector defects.
    Defects,
    /// Run the sweep once per defect and report whether the oracles catch each.
    Mutants {
        paths: Vec<PathBuf>,
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Benchmarks: the byte-level sweep, the transports, one request on GPU memory.
    Bench {
        #[arg(value_enum, default_value = "sweep")]
        what: cli::BenchKind,
        #[arg(long)]
        threads: Option<usize>,
        #[command(flatten)]
        vram: cli::VramArgs,
    },
    /// The prefill side of `bench vram --peer-process` (started by it).
    #[command(hide = true)]
    BenchPeer {
        #[arg(long)]
        geometry: PathBuf,
        #[arg(long)]
        prompt: u32,
        #[arg(long, value_enum)]
        memory: MemoryKind,
    },
}

fn main() -> ExitCode {
    let args = Cli::parse();
    let code = match args.command {
        Command::Sweep {
            paths,
            prompts,
            mode,
            alloc,
            transport,
            memory,
            variant,
            random,
            seed,
            threads: _,
            format,
            out,
            no_shrink: _,
            compare_host,
            expect,
            connector: cli::ConnectorArg::Vllm,
            vllm_python,
        } => cli::live_sweep(cli::LiveSweepArgs {
            paths,
            prompts,
            modes: mode.modes(),
            allocations: alloc.allocations(),
            random,
            seed,
            format,
            out,
            expect,
            vllm_python,
            transport,
            memory,
            defect: variant.defect,
            policy: variant.policy,
            compare_host,
        }),
        Command::Sweep {
            paths,
            prompts,
            mode,
            alloc,
            transport,
            memory,
            variant,
            random,
            seed,
            threads,
            format,
            out,
            no_shrink,
            compare_host,
            expect,
            ..
        } => cli::sweep(cli::SweepArgs {
            paths,
            prompts,
            modes: mode.modes(),
            allocations: alloc.allocations(),
            transport,
            memory,
            variant,
            random,
            seed,
            threads,
            format,
            out,
            shrink: !no_shrink,
            compare_host,
            expect,
        }),
        Command::Explain {
            geometry,
            prompt,
            prefix_hit,
            mode,
            alloc,
            seed,
            variant,
            transport,
            svg,
            connector: cli::ConnectorArg::Vllm,
            vllm_python,
        } => cli::live_explain(cli::LiveExplainArgs {
            geometry,
            prompt,
            prefix_hit,
            mode: mode.modes()[0],
            allocation: alloc.single(),
            seed,
            vllm_python,
            transport,
            defect: variant.defect,
            policy: variant.policy,
            svg: svg.is_some(),
        }),
        Command::Explain {
            geometry,
            prompt,
            prefix_hit,
            mode,
            alloc,
            seed,
            variant,
            transport,
            svg,
            ..
        } => cli::explain(cli::ExplainArgs {
            geometry,
            prompt,
            prefix_hit,
            mode: mode.modes()[0],
            allocation: alloc.single(),
            seed,
            variant,
            transport,
            svg,
        }),
        Command::Layout {
            geometry,
            mode,
            variant,
        } => cli::layout(&geometry, mode.modes()[0], &variant),
        Command::CheckTrace { files } => cli::check_trace(&files),
        Command::DiffTrace { files, variant } => cli::diff_trace(&files, &variant),
        Command::Defects => cli::defects(),
        Command::Mutants { paths, threads } => cli::mutants(paths, threads),
        Command::Bench {
            what: cli::BenchKind::Vram,
            vram,
            ..
        } => cli::bench_vram(&vram),
        Command::Bench { what, threads, .. } => cli::bench(what, threads),
        Command::BenchPeer {
            geometry,
            prompt,
            memory,
        } => cli::bench_peer(geometry, prompt, memory),
    };
    ExitCode::from(code)
}
