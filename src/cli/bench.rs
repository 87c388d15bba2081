//! `kvgeom bench`: the byte-level sweep against vLLM's own harness timings,
//! and the transports' bandwidth.

use std::path::PathBuf;
use std::time::Instant;

use super::{EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::connector::scheduler::DecodeAllocation;
use crate::geometry::Mode;
use crate::scenario::RunOptions;
use crate::sweep::{execute, plan};

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchKind {
    /// The 152 sweep cases (G1-G4) and the 27 KimiLinear-scale cases, with every byte-level oracle.
    Sweep,
    /// 1 GiB in 4096 descriptors host to host: loopback, real NIXL (if available), plain memcpy.
    Transport,
}

/// vLLM's Python harness on a 2-core machine: 2.15 s for the 152 sweep cases.
const VLLM_SWEEP_MS_PER_CASE: f64 = 2150.0 / 152.0;
/// vLLM's Python harness: about 130 ms per KimiLinear-scale case.
const VLLM_KIMI_MS_PER_CASE: f64 = 130.0;

struct Timing {
    cases: usize,
    ms_per_case: f64,
    failed: usize,
}

fn time(files: &[&str], threads: usize, repeats: usize) -> Result<Timing, String> {
    let paths: Vec<PathBuf> = files.iter().map(PathBuf::from).collect();
    let sources = plan::load_sources(&paths).map_err(|e| e.to_string())?;
    let cases = plan::grid(
        &sources,
        &plan::PlanOptions {
            modes: vec![Mode::Pull],
            allocations: Some(vec![DecodeAllocation::WithLastToken]),
            ..plan::PlanOptions::default()
        },
    );
    let mut best = f64::INFINITY;
    let mut failed = 0;
    for _ in 0..repeats {
        let start = Instant::now();
        let reports = execute::run_all(&cases, &RunOptions::default(), Some(threads));
        best = best.min(start.elapsed().as_secs_f64());
        failed = reports.iter().filter(|r| !r.passed()).count();
    }
    Ok(Timing {
        cases: cases.len(),
        ms_per_case: best * 1000.0 / cases.len().max(1) as f64,
        failed,
    })
}

fn bench_sweep(threads: Option<usize>) -> u8 {
    let all =
        threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let sweep = [
        "geometries/g1-mla-kda-ppl3-vs-2.toml",
        "geometries/g2-mla-kda-ppl9-vs-2.toml",
        "geometries/g3-mla-kda-ppl6-vs-1.toml",
        "geometries/g4-mla-kda-remote-larger.toml",
    ];
    let kimi = ["geometries/g6-kimi-linear-scale.toml"];
    println!("byte-level sweep (pull, every oracle), best of 5 runs; vLLM's harness: {VLLM_SWEEP_MS_PER_CASE:.1} ms/case (sweep), {VLLM_KIMI_MS_PER_CASE:.0} ms/case (KimiLinear)");
    println!(
        "{:<26} {:>7} {:>6} {:>11} {:>14}",
        "cases", "threads", "count", "ms/case", "vs vLLM"
    );
    let mut code = EXIT_OK;
    for (label, files, reference) in [
        ("G1-G4 sweep", &sweep[..], VLLM_SWEEP_MS_PER_CASE),
        ("G6 KimiLinear scale", &kimi[..], VLLM_KIMI_MS_PER_CASE),
    ] {
        for t in [1, all] {
            match time(files, t, 5) {
                Ok(timing) => {
                    println!(
                        "{:<26} {:>7} {:>6} {:>11.3} {:>13.0}x",
                        label,
                        t,
                        timing.cases,
                        timing.ms_per_case,
                        reference / timing.ms_per_case
                    );
                    if timing.failed > 0 {
                        eprintln!(
                            "warning: {} cases failed during the benchmark",
                            timing.failed
                        );
                        code = EXIT_FAILED;
                    }
                }
                Err(e) => {
                    eprintln!("error: {e} (run from the project root)");
                    return EXIT_BAD_INPUT;
                }
            }
            if all == 1 {
                break;
            }
        }
    }
    code
}

pub fn bench(kind: BenchKind, threads: Option<usize>) -> u8 {
    match kind {
        BenchKind::Sweep => bench_sweep(threads),
        BenchKind::Transport => {
            match crate::bench::transport_bench(&crate::bench::TransportBenchConfig::default()) {
                Ok(report) => {
                    println!("{report}");
                    EXIT_OK
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    EXIT_BAD_INPUT
                }
            }
        }
    }
}
