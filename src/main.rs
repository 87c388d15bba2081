//! The `kvgeom` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use kvgeom::geometry::Mode;
use kvgeom::internals::cli;
use kvgeom::internals::Format;
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

/// One mode, for commands that show a single case.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum OneModeArg {
    Pull,
    Push,
}

impl OneModeArg {
    fn mode(self) -> Mode {
        match self {
            OneModeArg::Pull => Mode::Pull,
            OneModeArg::Push => Mode::Push,
        }
    }
}

/// One decode allocation model, for commands that show a single case.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum OneAllocArg {
    Mainline,
    WithLastToken,
}

impl OneAllocArg {
    fn allocation(self) -> DecodeAllocation {
        match self {
            OneAllocArg::Mainline => DecodeAllocation::Mainline,
            OneAllocArg::WithLastToken => DecodeAllocation::WithLastToken,
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
}

#[derive(Subcommand)]
enum ReportCommand {
    /// Join the JSON or JUnit reports of every shard of one sweep (`sweep
    /// --shard K/N --format json|junit`) into the report, and exit status,
    /// of a single run.
    Merge {
        /// The report of every shard, all JSON or all JUnit.
        #[arg(required = true, value_name = "REPORT")]
        files: Vec<PathBuf>,
        /// Write the merged report here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Run every case of geometry files (or folders) through the connector and the oracles.
    Sweep {
        /// Geometry files or folders, searched recursively (default: geometries/).
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
        /// Worker threads (default: all cores); with `--connector vllm`, the
        /// vLLM driver processes run at once (default: one per core, at most 4).
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
        /// Memory the sweep may use (e.g. 1.5G; default: half of the memory
        /// available). Cases run in parallel only as far as it allows.
        #[arg(long, value_name = "SIZE")]
        max_memory: Option<String>,
        /// Run shard K of N (1-based) of the cases, e.g. `--shard 2/4` on the
        /// second of four CI runners; `kvgeom report merge` joins the JSON or
        /// JUnit reports.
        #[arg(long, value_name = "K/N")]
        shard: Option<String>,
        /// Which connector runs: kvgeom's, or vLLM's own from the venv
        /// (scripts/install-vllm.sh), judged by the same oracles.
        #[arg(long, value_enum, default_value = "kvgeom")]
        connector: cli::ConnectorArg,
        /// The Python interpreter with vLLM (default: KVGEOM_VLLM_PYTHON,
        /// else .vllm-venv/bin/python).
        #[arg(long, value_name = "PATH")]
        vllm_python: Option<PathBuf>,
        /// With --connector vllm: what moves the bytes, the driver's NIXL
        /// stand-in (default), real NIXL agents over host memory (needs the
        /// nixl package: scripts/install-vllm.sh --nixl), or auto.
        #[arg(long, value_enum, value_name = "KIND")]
        nixl: Option<cli::NixlArg>,
        /// With --connector vllm: save every case's v2 trace (vLLM's lists,
        /// transfers and outcome; memory images for a case of at most 1 MiB)
        /// and, for a pull case, one v1 trace per decode rank
        /// (`<case>-d<rank>.jsonl.gz`) into this folder, for check-trace and
        /// diff-trace.
        #[arg(long, value_name = "DIR")]
        record_traces: Option<PathBuf>,
    },
    /// Run one case and show the plan, every pair and, per local block, what was
    /// transferred, zeroed and left stale.
    Explain {
        geometry: PathBuf,
        #[arg(long)]
        prompt: u32,
        #[arg(long, default_value_t = 0)]
        prefix_hit: u32,
        /// One case: pull or push (a sweep runs both).
        #[arg(long, value_enum, default_value = "pull")]
        mode: OneModeArg,
        /// One case: mainline or with-last-token (a sweep runs both).
        #[arg(long, value_enum, default_value = "mainline")]
        alloc: OneAllocArg,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[command(flatten)]
        variant: cli::VariantArgs,
        #[arg(long, value_enum, default_value = "loopback")]
        transport: TransportKind,
        /// Also write an SVG byte map of decode's request blocks.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Memory the case may use (e.g. 1.5G; default: half of the memory
        /// available); a larger case is refused before it allocates.
        #[arg(long, value_name = "SIZE")]
        max_memory: Option<String>,
        /// Which connector runs: kvgeom's, or vLLM's own from the venv.
        #[arg(long, value_enum, default_value = "kvgeom")]
        connector: cli::ConnectorArg,
        /// The Python interpreter with vLLM (see `sweep --vllm-python`).
        #[arg(long, value_name = "PATH")]
        vllm_python: Option<PathBuf>,
        /// With --connector vllm: what moves the bytes (see `sweep --nixl`).
        #[arg(long, value_enum, value_name = "KIND")]
        nixl: Option<cli::NixlArg>,
        /// With --connector vllm: save the case's v2 trace (with memory
        /// images for a case of at most 1 MiB) as FILE (gzipped when FILE
        /// ends in .gz).
        #[arg(long, value_name = "FILE")]
        record_trace: Option<PathBuf>,
    },
    /// Print a geometry's descriptor lists as tables (what the snapshots hold).
    Layout {
        geometry: PathBuf,
        #[arg(long, value_enum, default_value = "pull")]
        mode: ModeArg,
        #[command(flatten)]
        variant: cli::VariantArgs,
    },
    /// Derive one engine's geometry (or a P/D pair's geometry file) from a
    /// model's HF config, TP and attention backend, as vLLM 0.33.0 runs it.
    Derive(Box<cli::DeriveArgs>),
    /// Run the descriptor-level oracles on traces recorded from vLLM.
    CheckTrace {
        /// Trace files (`.jsonl`, `.jsonl.gz`) or folders, searched recursively.
        files: Vec<PathBuf>,
        /// `text` (one line per file) or `json` (schema `kvgeom-trace-verdicts/1`).
        #[arg(long, value_enum, default_value = "text")]
        format: cli::TraceFormat,
        /// Memory rebuilding one traced case may take (e.g. 1.5G; default:
        /// half of the memory available, within an address-space limit, and
        /// at most 4 GiB).
        #[arg(long, value_name = "SIZE")]
        max_memory: Option<String>,
    },
    /// Rebuild traced vLLM cases with kvgeom's connector and compare lists and transfers.
    DiffTrace {
        /// Trace files (`.jsonl`, `.jsonl.gz`) or folders, searched recursively.
        files: Vec<PathBuf>,
        #[command(flatten)]
        variant: cli::VariantArgs,
        /// `text` (one line per file) or `json` (schema `kvgeom-trace-verdicts/1`).
        #[arg(long, value_enum, default_value = "text")]
        format: cli::TraceFormat,
        /// Memory rebuilding one traced case may take (e.g. 1.5G; default:
        /// half of the memory available, within an address-space limit, and
        /// at most 4 GiB).
        #[arg(long, value_name = "SIZE")]
        max_memory: Option<String>,
    },
    /// Work with sweep reports.
    Report {
        #[command(subcommand)]
        what: ReportCommand,
    },
    /// List the known connector defects.
    Defects,
    /// Run the sweep once per defect and report whether the oracles catch each.
    Mutants {
        paths: Vec<PathBuf>,
        #[arg(long)]
        threads: Option<usize>,
        /// Every case of the real-scale pairs in subfolders too (by default
        /// each runs the middle prompt of its list, both modes, mainline).
        #[arg(long)]
        full: bool,
        /// Output: text or json (schema `kvgeom-mutants/1`).
        #[arg(long, value_enum, default_value_t)]
        format: cli::MutantsFormat,
        /// Memory the sweeps may use (e.g. 1.5G; default: half of the memory
        /// available, within an address-space limit); a larger case is
        /// refused before anything runs.
        #[arg(long, value_name = "SIZE")]
        max_memory: Option<String>,
    },
    /// Benchmarks: the byte-level sweep, the transports, one request on GPU memory.
    Bench {
        #[arg(value_enum, default_value = "sweep")]
        what: cli::BenchKind,
        /// Geometry files to measure (scale only; default: bench/scale/).
        files: Vec<PathBuf>,
        /// Output of `bench scale`: table or json (scale only).
        #[arg(long, value_enum)]
        format: Option<cli::ScaleFormat>,
        #[arg(long)]
        threads: Option<usize>,
        #[command(flatten)]
        vram: cli::VramArgs,
        /// Memory the benchmark may allocate (e.g. 1.5G; default: half of
        /// the memory available, within an address-space limit); it says
        /// what it will allocate first, and refuses more.
        #[arg(long, value_name = "SIZE")]
        max_memory: Option<String>,
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
    // The docs test checks that every documented command line parses.
    if std::env::var_os("KVGEOM_PARSE_ONLY").is_some_and(|v| v == "1") {
        return ExitCode::SUCCESS;
    }
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
            threads,
            format,
            out,
            no_shrink,
            compare_host,
            expect,
            max_memory,
            shard,
            connector: cli::ConnectorArg::Vllm,
            vllm_python,
            nixl,
            record_traces,
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
            nixl,
            shard,
            shrink: !no_shrink,
            transport,
            memory,
            defect: variant.defect,
            policy: variant.policy,
            compare_host,
            threads,
            max_memory,
            record_traces,
        }),
        Command::Sweep {
            nixl: Some(_),
            connector: cli::ConnectorArg::Kvgeom,
            ..
        }
        | Command::Explain {
            nixl: Some(_),
            connector: cli::ConnectorArg::Kvgeom,
            ..
        } => {
            eprintln!(
                "error: --nixl selects what moves the bytes of vLLM's connector (--connector vllm); \
                 kvgeom's own connector takes --transport loopback|nixl"
            );
            2
        }
        Command::Sweep {
            record_traces: Some(dir),
            ..
        } => {
            eprintln!(
                "error: --record-traces {}: traces record vLLM's own connector; add --connector vllm",
                dir.display()
            );
            cli::EXIT_BAD_INPUT
        }
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
            max_memory,
            shard,
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
            max_memory,
            shard,
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
            max_memory,
            connector: cli::ConnectorArg::Vllm,
            vllm_python,
            nixl,
            record_trace,
        } => cli::live_explain(cli::LiveExplainArgs {
            geometry,
            prompt,
            prefix_hit,
            mode: mode.mode(),
            allocation: alloc.allocation(),
            seed,
            vllm_python,
            nixl,
            transport,
            defect: variant.defect,
            policy: variant.policy,
            svg: svg.is_some(),
            record_trace,
            max_memory,
        }),
        Command::Explain {
            record_trace: Some(file),
            ..
        } => {
            eprintln!(
                "error: --record-trace {}: traces record vLLM's own connector; add --connector vllm",
                file.display()
            );
            cli::EXIT_BAD_INPUT
        }
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
            max_memory,
            ..
        } => cli::explain(cli::ExplainArgs {
            geometry,
            prompt,
            prefix_hit,
            mode: mode.mode(),
            allocation: alloc.allocation(),
            seed,
            variant,
            transport,
            svg,
            max_memory,
        }),
        Command::Layout {
            geometry,
            mode,
            variant,
        } => cli::layout(&geometry, &mode.modes(), &variant),
        Command::Derive(args) => cli::derive(&args),
        Command::CheckTrace {
            files,
            format,
            max_memory,
        } => match cli::memory_option(max_memory.as_deref()) {
            Ok(()) => cli::check_trace(&files, format),
            Err(code) => code,
        },
        Command::DiffTrace {
            files,
            variant,
            format,
            max_memory,
        } => match cli::memory_option(max_memory.as_deref()) {
            Ok(()) => cli::diff_trace(&files, &variant, format),
            Err(code) => code,
        },
        Command::Report {
            what: ReportCommand::Merge { files, out },
        } => cli::report_merge(&files, out.as_deref()),
        Command::Defects => cli::defects(),
        Command::Mutants {
            paths,
            threads,
            full,
            format,
            max_memory,
        } => cli::mutants(paths, threads, full, format, max_memory.as_deref()),
        Command::Bench {
            what: cli::BenchKind::Scale,
            files,
            format,
            threads: None,
            vram,
            max_memory,
        } if vram == cli::VramArgs::default() => {
            cli::bench_scale(&files, format.unwrap_or_default(), max_memory.as_deref())
        }
        Command::Bench {
            what: cli::BenchKind::Scale,
            ..
        } => {
            eprintln!(
                "error: bench scale runs one case at a time and takes no --threads, --geometry, \
                 --prompt, --iterations, --memory, --op, --peer-process or --paths"
            );
            2
        }
        Command::Bench { files, format, .. } if !files.is_empty() || format.is_some() => {
            eprintln!("error: geometry files and --format apply to `kvgeom bench scale` only");
            2
        }
        Command::Bench {
            what,
            threads,
            vram,
            max_memory,
            ..
        } => cli::bench(what, threads, &vram, max_memory.as_deref()),
        Command::BenchPeer {
            geometry,
            prompt,
            memory,
        } => cli::bench_peer(geometry, prompt, memory),
    };
    ExitCode::from(code)
}
