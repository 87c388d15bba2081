//! `kvgeom bench`: the byte-level sweep against vLLM's own harness timings,
//! the transports' bandwidth, and one KimiLinear-scale request on device
//! memory (`bench vram`, with its hidden `bench-peer` helper process).

use std::path::PathBuf;
use std::time::Instant;

use super::{EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::bench::vram::{
    host_bytes, vram_bench_planned, vram_plan, VramBenchConfig, VramBenchError, PATHS,
};
use crate::bench::TransportBenchConfig;
use crate::geometry::{GeometryError, Mode};
use crate::nixl::XferOp;
use crate::scenario::memory_estimate::{human_bytes, Budget};
use crate::scenario::{MemoryKind, RunOptions};
use crate::scheduler::DecodeAllocation;
use crate::sweep::{execute, plan};

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchKind {
    /// The 152 sweep cases (G1-G4) and the 27 KimiLinear-scale cases, with every byte-level oracle.
    Sweep,
    /// 1 GiB in 4096 descriptors host to host: plain memcpy, loopback, real NIXL (if available).
    Transport,
    /// One KimiLinear-scale request on GPU memory: device copies, loopback, real NIXL.
    Vram,
    /// Lifecycle scenarios (4 requests each) over the geometries directly in geometries/, on one thread: operations per second.
    Lifecycle,
    /// Real-scale cases (bench/scale/, or the geometry files given): peak memory and time against the touched KV bytes and memcpy.
    Scale,
}

/// The transfer direction of `bench vram`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OpArg {
    /// Decode pulls prefill's bytes (the connector's pull).
    Read,
    /// Decode writes the same pairs into prefill.
    Write,
}

/// Options of `kvgeom bench vram`.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct VramArgs {
    /// Geometry of the request (vram only).
    #[arg(long, default_value = "bench/kimi-linear-vram.toml")]
    pub geometry: PathBuf,
    /// Prompt length of the request (vram only).
    #[arg(long, default_value_t = 16384)]
    pub prompt: u32,
    /// Timed iterations per path; the best is reported (vram only).
    #[arg(long, default_value_t = 3)]
    pub iterations: u32,
    /// Where the KV tensors live; `host` runs without a GPU (vram only).
    #[arg(long, value_enum, default_value = "vram")]
    pub memory: MemoryKind,
    #[arg(long, value_enum, default_value = "read")]
    pub op: OpArg,
    /// Also run NIXL with the prefill side in a second process (vram only).
    #[arg(long)]
    pub peer_process: bool,
    /// Paths to run, comma separated (vram and transport only). vram: copy,
    /// copy-per-pair, loopback, nixl, nixl-peer; transport: memcpy, loopback, nixl-ucx.
    #[arg(long, value_delimiter = ',')]
    pub paths: Option<Vec<String>>,
}

impl Default for VramArgs {
    fn default() -> Self {
        let config = VramBenchConfig::default();
        Self {
            geometry: config.geometry,
            prompt: config.prompt_len,
            iterations: config.iterations,
            memory: config.memory,
            op: OpArg::Read,
            peer_process: false,
            paths: None,
        }
    }
}

impl VramArgs {
    /// The options given with values other than their defaults.
    pub fn given(&self) -> Vec<&'static str> {
        let d = VramArgs::default();
        [
            ("--geometry", self.geometry != d.geometry),
            ("--prompt", self.prompt != d.prompt),
            ("--iterations", self.iterations != d.iterations),
            ("--memory", self.memory != d.memory),
            ("--op", self.op != d.op),
            ("--peer-process", self.peer_process != d.peer_process),
            ("--paths", self.paths != d.paths),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }
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

fn time(files: &[&str], threads: usize, repeats: usize) -> Result<Timing, GeometryError> {
    let cases = sweep_cases(files)?;
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

/// State on stderr the host memory a benchmark allocates at its peak
/// (`need`, for `what`), or refuse it (exit 2) when it exceeds `budget`.
fn announce(bench: &str, need: u64, what: &str, budget: &Budget, reduce: &str) -> Result<(), u8> {
    if let Err(message) = budget.check(bench, need, reduce) {
        eprintln!("error: {message}");
        return Err(EXIT_BAD_INPUT);
    }
    eprintln!(
        "{bench}: allocates about {} of host memory at its peak ({what}), within {}",
        human_bytes(need),
        budget.describe()
    );
    Ok(())
}

/// The cases of `files` that `bench sweep` times.
fn sweep_cases(files: &[&str]) -> Result<Vec<crate::scenario::Case>, GeometryError> {
    // The checkout's files; one found nowhere keeps its name for the error.
    let paths: Vec<PathBuf> = files
        .iter()
        .map(|f| super::checkout::checkout_path(f).unwrap_or_else(|_| PathBuf::from(f)))
        .collect();
    let sources = plan::load_sources(&paths)?;
    Ok(plan::grid(
        &sources,
        &plan::PlanOptions {
            modes: vec![Mode::Pull],
            allocations: Some(vec![DecodeAllocation::WithLastToken]),
            ..plan::PlanOptions::default()
        },
    ))
}

fn bench_sweep(threads: Option<usize>, budget: &Budget) -> u8 {
    let all =
        threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let sweep = [
        "geometries/g1-mla-kda-ppl3-vs-2.toml",
        "geometries/g2-mla-kda-ppl9-vs-2.toml",
        "geometries/g3-mla-kda-ppl6-vs-1.toml",
        "geometries/g4-mla-kda-remote-larger.toml",
    ];
    let kimi = ["geometries/g6-kimi-linear-scale.toml"];
    // Cases run in parallel only as far as the budget allows; each must
    // fit alone.
    let mut largest = 0;
    for files in [&sweep[..], &kimi[..]] {
        let cases = match sweep_cases(files) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: {e} (run from the project root)");
                return EXIT_BAD_INPUT;
            }
        };
        if let Err(code) = super::cases_fit(&cases, budget, false) {
            return code;
        }
        largest = cases
            .iter()
            .map(|c| crate::scenario::estimate_memory(c).peak_bytes)
            .fold(largest, u64::max);
    }
    eprintln!(
        "bench sweep: the largest case allocates about {}; cases run in parallel within {}",
        human_bytes(largest),
        budget.describe()
    );
    outln!("byte-level sweep (pull, every oracle), best of 5 runs; vLLM's harness: {VLLM_SWEEP_MS_PER_CASE:.1} ms/case (sweep), {VLLM_KIMI_MS_PER_CASE:.0} ms/case (KimiLinear)");
    outln!(
        "{:<26} {:>7} {:>6} {:>11} {:>14}",
        "cases",
        "threads",
        "count",
        "ms/case",
        "vs vLLM"
    );
    let mut code = EXIT_OK;
    for (label, files, reference) in [
        ("G1-G4 sweep", &sweep[..], VLLM_SWEEP_MS_PER_CASE),
        ("G6 KimiLinear scale", &kimi[..], VLLM_KIMI_MS_PER_CASE),
    ] {
        for t in [1, all] {
            match time(files, t, 5) {
                Ok(timing) => {
                    outln!(
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

/// The command line of `kvgeom bench`.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    #[arg(value_enum, default_value = "sweep")]
    pub what: BenchKind,
    /// Geometry files to measure (scale only; default: bench/scale/).
    pub files: Vec<PathBuf>,
    /// Output of `bench scale`: table or json (scale only).
    #[arg(long, value_enum)]
    pub format: Option<super::ScaleFormat>,
    #[arg(long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub vram: VramArgs,
    /// Memory the benchmark may allocate (e.g. 1.5G; default: half of
    /// the memory available, within an address-space limit); it says
    /// what it will allocate first, and refuses more.
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<String>,
}

/// `kvgeom bench KIND [FILE...]`: geometry files and `--format` are
/// `bench scale`'s, which takes none of the other kinds' options, and
/// `--threads` is `bench sweep`'s (others exit 2).
pub fn bench(args: &BenchArgs) -> u8 {
    let max_memory = args.max_memory.as_deref();
    if args.what == BenchKind::Scale {
        if args.threads.is_some() || args.vram != VramArgs::default() {
            eprintln!(
                "error: bench scale runs one case at a time and takes no --threads, --geometry, \
                 --prompt, --iterations, --memory, --op, --peer-process or --paths"
            );
            return EXIT_BAD_INPUT;
        }
        return super::bench_scale(&args.files, args.format.unwrap_or_default(), max_memory);
    }
    if !args.files.is_empty() || args.format.is_some() {
        eprintln!("error: geometry files and --format apply to `kvgeom bench scale` only");
        return EXIT_BAD_INPUT;
    }
    if args.threads.is_some() && args.what != BenchKind::Sweep {
        eprintln!("error: --threads applies to `kvgeom bench sweep` only");
        return EXIT_BAD_INPUT;
    }
    bench_kind(args.what, args.threads, &args.vram, max_memory)
}

/// `kvgeom bench KIND`. The options of `bench vram` are refused for the
/// other kinds (exit 2), except `--paths`, which `bench transport` takes
/// too, with its own path names.
fn bench_kind(
    kind: BenchKind,
    threads: Option<usize>,
    vram: &VramArgs,
    max_memory: Option<&str>,
) -> u8 {
    let (threads, budget) = match super::threads_and_budget(threads, max_memory) {
        Ok(both) => both,
        Err(code) => return code,
    };
    let vram_only = VramArgs {
        paths: None,
        ..vram.clone()
    };
    match kind {
        BenchKind::Vram => bench_vram(vram, &budget),
        _ if vram_only != VramArgs::default() => {
            let given = vram_only.given();
            eprintln!(
                "error: {}: only `kvgeom bench vram` takes {}",
                given.join(", "),
                if given.len() == 1 { "it" } else { "them" }
            );
            EXIT_BAD_INPUT
        }
        BenchKind::Sweep if vram.paths.is_some() => {
            eprintln!(
                "error: --paths applies to `kvgeom bench vram` and `kvgeom bench transport` only"
            );
            EXIT_BAD_INPUT
        }
        BenchKind::Sweep => bench_sweep(threads, &budget),
        BenchKind::Scale => super::bench_scale(&[], super::ScaleFormat::Table, max_memory),
        BenchKind::Lifecycle => super::bench_lifecycle(),
        BenchKind::Transport => bench_transport(&transport_config(vram.paths.as_deref()), &budget),
    }
}

/// The configuration of `bench transport`: the default one, with only the
/// paths of `--paths` when it is given (checked by the benchmark).
pub fn transport_config(paths: Option<&[String]>) -> TransportBenchConfig {
    let default = TransportBenchConfig::default();
    TransportBenchConfig {
        paths: paths.map_or(default.paths.clone(), <[String]>::to_vec),
        ..default
    }
}

/// `kvgeom bench transport`; an unknown path is bad input (exit 2).
fn bench_transport(config: &TransportBenchConfig, budget: &Budget) -> u8 {
    if let Err(code) = announce(
        "bench transport",
        config.host_bytes(),
        "a source and a destination buffer",
        budget,
        "its buffers have a fixed size",
    ) {
        return code;
    }
    match crate::bench::transport_bench(config) {
        Ok(report) => {
            outln!("{report}");
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}

/// `kvgeom bench vram`.
pub fn bench_vram(args: &VramArgs, budget: &Budget) -> u8 {
    if let Err(code) = super::prompt_option(args.prompt) {
        return code;
    }
    if args.iterations == 0 {
        eprintln!("error: --iterations 0: give at least 1 timed iteration per path");
        return EXIT_BAD_INPUT;
    }
    if let Some(unknown) = args
        .paths
        .iter()
        .flatten()
        .find(|p| !PATHS.contains(&p.as_str()))
    {
        eprintln!(
            "error: --paths {unknown}: unknown path; known: {}",
            PATHS.join(", ")
        );
        return EXIT_BAD_INPUT;
    }
    let peer_exe = if args.peer_process {
        match std::env::current_exe() {
            Ok(exe) => Some(exe),
            Err(e) => {
                eprintln!("error: cannot find this executable to start the peer process: {e}");
                return EXIT_BAD_INPUT;
            }
        }
    } else {
        None
    };
    let mut paths: Vec<String> = args
        .paths
        .clone()
        .unwrap_or_else(|| PATHS.iter().map(|p| p.to_string()).collect());
    if !args.peer_process && args.paths.is_none() {
        paths.retain(|p| p != "nixl-peer");
    }
    let config = VramBenchConfig {
        geometry: args.geometry.clone(),
        prompt_len: args.prompt,
        iterations: args.iterations,
        memory: args.memory,
        op: match args.op {
            OpArg::Read => XferOp::Read,
            OpArg::Write => XferOp::Write,
        },
        peer_exe,
        paths,
    };
    let plan = match vram_plan(&config) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let what = format!(
        "bench vram {} --prompt {}",
        config.geometry.display(),
        config.prompt_len
    );
    if let Err(code) = announce(
        &what,
        host_bytes(&config, &plan),
        "the KV buffers of its paths and their copies to verify",
        budget,
        "use a shorter --prompt or fewer --paths",
    ) {
        return code;
    }
    match vram_bench_planned(&config, &plan) {
        Ok(report) => {
            out!("{report}");
            EXIT_OK
        }
        Err(e @ VramBenchError::Path { .. }) => {
            eprintln!("error: {e}");
            EXIT_FAILED
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}

/// The command line of `kvgeom bench-peer`.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchPeerArgs {
    #[arg(long)]
    pub geometry: PathBuf,
    #[arg(long)]
    pub prompt: u32,
    #[arg(long, value_enum)]
    pub memory: MemoryKind,
}

/// `kvgeom bench-peer` (started by `bench vram --peer-process`): serve the
/// prefill side of the replay over stdin/stdout.
pub fn bench_peer(args: BenchPeerArgs) -> u8 {
    let BenchPeerArgs {
        geometry,
        prompt,
        memory,
    } = args;
    #[cfg(feature = "nixl")]
    {
        crate::bench::peer::serve(&crate::bench::peer::PeerArgs {
            geometry,
            prompt_len: prompt,
            memory,
        })
    }
    #[cfg(not(feature = "nixl"))]
    {
        let _ = (geometry, prompt, memory);
        eprintln!("error: bench-peer needs kvgeom built with `--features nixl`");
        EXIT_BAD_INPUT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::transport::{LOOPBACK, MEMCPY, NIXL_UCX};

    #[test]
    fn transport_runs_the_paths_of_its_option_or_all_of_them() {
        let named = [NIXL_UCX.to_string(), MEMCPY.to_string()];
        let config = transport_config(Some(&named));
        assert_eq!(config.paths, named);
        assert_eq!(
            TransportBenchConfig {
                paths: Vec::new(),
                ..config
            },
            TransportBenchConfig {
                paths: Vec::new(),
                ..TransportBenchConfig::default()
            },
            "--paths changes nothing else"
        );
        assert_eq!(transport_config(None).paths, [MEMCPY, LOOPBACK, NIXL_UCX]);
    }
}
