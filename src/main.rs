//! The `kvgeom` command line: its subcommands and the dispatch to each
//! one's function in `kvgeom::internals::cli`, which takes the
//! subcommand's arguments whole.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use kvgeom::internals::cli;

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

#[derive(Subcommand)]
enum ReportCommand {
    /// Join the JSON or JUnit reports of every shard of one sweep (`sweep
    /// --shard K/N --format json|junit`) into the report, and exit status,
    /// of a single run.
    Merge(cli::ReportMergeArgs),
}

#[derive(Subcommand)]
enum Command {
    /// Run every case of geometry files (or folders) through the connector and the oracles.
    Sweep(Box<cli::SweepArgs>),
    /// Run one case and show the plan, every pair and, per local block, what was
    /// transferred, zeroed and left stale.
    Explain(Box<cli::ExplainArgs>),
    /// Print a geometry's descriptor lists as tables (what the snapshots hold).
    Layout(cli::LayoutArgs),
    /// Derive one engine's geometry (or a P/D pair's geometry file) from a
    /// model's HF config, TP and attention backend, as vLLM 0.33.0 runs it.
    Derive(Box<cli::DeriveArgs>),
    /// Run the descriptor-level oracles on traces recorded from vLLM.
    CheckTrace(cli::CheckTraceArgs),
    /// Rebuild traced vLLM cases with kvgeom's connector and compare lists and transfers.
    DiffTrace(cli::DiffTraceArgs),
    /// Work with sweep reports.
    Report {
        #[command(subcommand)]
        what: ReportCommand,
    },
    /// Run the live sweep on several vLLM releases (one --vllm-python each)
    /// and print outcomes per geometry, mode and release.
    Matrix(Box<cli::MatrixArgs>),
    /// Many requests at once on one P/D pair: lifecycle scenarios through
    /// the chosen connector (`--connector`, kvgeom's by default), judged by
    /// the lifecycle oracles; `--replay` prints one as a timeline.
    Lifecycle(Box<cli::LifecycleArgs>),
    /// List the known connector defects and the lifecycle variants.
    Defects,
    /// Run the sweep once per defect and report whether the oracles catch each.
    Mutants(cli::MutantsArgs),
    /// Benchmarks: the byte-level sweep, the transports, one request on GPU memory.
    Bench(Box<cli::BenchArgs>),
    /// The prefill side of `bench vram --peer-process` (started by it).
    #[command(hide = true)]
    BenchPeer(cli::BenchPeerArgs),
}

fn main() -> ExitCode {
    let args = Cli::parse();
    // The docs test checks that every documented command line parses.
    if std::env::var_os("KVGEOM_PARSE_ONLY").is_some_and(|v| v == "1") {
        return ExitCode::SUCCESS;
    }
    let code = match args.command {
        Command::Sweep(args) => cli::sweep(*args),
        Command::Explain(args) => cli::explain(*args),
        Command::Layout(args) => cli::layout(&args),
        Command::Derive(args) => cli::derive(&args),
        Command::CheckTrace(args) => cli::check_trace(&args),
        Command::DiffTrace(args) => cli::diff_trace(&args),
        Command::Report {
            what: ReportCommand::Merge(args),
        } => cli::report_merge(&args),
        Command::Matrix(args) => cli::matrix(*args),
        Command::Lifecycle(args) => cli::lifecycle(*args),
        Command::Defects => cli::defects(),
        Command::Mutants(args) => cli::mutants(args),
        Command::Bench(args) => cli::bench(&args),
        Command::BenchPeer(args) => cli::bench_peer(args),
    };
    ExitCode::from(code)
}
