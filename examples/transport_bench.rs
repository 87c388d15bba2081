//! Host-to-host transfer throughput: memcpy, the loopback transport and
//! (with `--features nixl` and the NIXL runtime) real NIXL over UCX.
//!
//! ```text
//! cargo run --release --example transport_bench
//! scripts/install-nixl-runtime.sh && source .nixl-runtime/env.sh
//! cargo run --release --features nixl --example transport_bench -- --op read
//! ```

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use kvgeom::bench::transport::{NIXL_UCX, PATHS};
use kvgeom::bench::{transport_bench, TransportBenchConfig};
use kvgeom::nixl::XferOp;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Op {
    Read,
    Write,
}

/// Move the same bytes through each transport and report GB/s.
#[derive(Debug, Parser)]
struct Args {
    /// Bytes per transfer.
    #[arg(long, default_value_t = 1 << 30)]
    bytes: u64,
    /// Descriptors per transfer (the bytes split evenly).
    #[arg(long, default_value_t = 4096)]
    descriptors: u64,
    /// Timed iterations per path; the best is reported.
    #[arg(long, default_value_t = 5)]
    iterations: u32,
    #[arg(long, value_enum, default_value_t = Op::Write)]
    op: Op,
    /// Skip real NIXL even when it is available.
    #[arg(long)]
    no_nixl: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = TransportBenchConfig {
        total_bytes: args.bytes,
        descriptors: args.descriptors,
        iterations: args.iterations,
        op: match args.op {
            Op::Read => XferOp::Read,
            Op::Write => XferOp::Write,
        },
        paths: PATHS
            .iter()
            .filter(|&&p| !(args.no_nixl && p == NIXL_UCX))
            .map(|p| p.to_string())
            .collect(),
    };
    match transport_bench(&config) {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("transport bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}
