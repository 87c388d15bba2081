//! `kvgeom bench scale`: real-scale cases against the physical limit of
//! this machine. For each case, one at a time: its peak resident memory
//! (as the kernel counts it) against the KV bytes of the ranks its
//! transfers touch, and its time against one memcpy pass over those same
//! bytes (at the memcpy bandwidth measured here). Both are goals, reported
//! as met or missed; a case that fails its oracles fails the benchmark.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::geometry::{GeometryError, Mode};
use crate::scenario::memory_estimate::{estimate, human_bytes};
use crate::scenario::RunOptions;
use crate::scheduler::DecodeAllocation;
use crate::sweep::plan;
use crate::under_test::run_case;

/// Peak resident memory a case may take, as a multiple of the KV bytes of
/// the ranks it touches.
pub const PEAK_GOAL: f64 = 1.25;
/// Time a case may take, as a multiple of one memcpy pass over those bytes.
pub const TIME_GOAL: f64 = 4.0;

/// The geometry files `bench scale` runs when given none.
pub const DEFAULT_FILES: [&str; 2] = [
    "bench/scale/falcon-h1-7b-p4-d2-flashinfer.toml",
    "bench/scale/deepseek-v3-p8-d2-16k.toml",
];

/// The JSON report's schema (docs/report-format.md).
pub const SCHEMA: &str = "kvgeom-bench-scale/1";

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum ScaleBenchError {
    /// A geometry file could not be read or is invalid.
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    /// The files hold no case.
    #[error("the geometry files give no pull case to measure")]
    NoCases,
}

/// One measured case.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleCase {
    /// The geometry's name.
    pub geometry: String,
    /// The prompt length N.
    pub prompt_len: u32,
    /// Prefill ranks the case's transfers touch, of the prefill TP size.
    pub prefill_ranks_touched: u32,
    /// The prefill engine's TP size.
    pub prefill_tp: u32,
    /// Decode ranks touched (all of them).
    pub decode_ranks: u32,
    /// KV bytes (the arenas) of the touched ranks.
    pub touched_kv_bytes: u64,
    /// Peak resident bytes above the level before the case, or `None` where
    /// the kernel's counters cannot be read.
    pub peak_bytes: Option<u64>,
    /// Wall time of the case, in seconds.
    pub seconds: f64,
    /// One memcpy pass over `touched_kv_bytes` at the measured bandwidth.
    pub memcpy_seconds: f64,
    /// Whether every oracle passed.
    pub passed: bool,
    /// The case's outcome in words.
    pub outcome: String,
}

impl ScaleCase {
    /// Peak resident memory over the touched KV bytes.
    pub fn peak_ratio(&self) -> Option<f64> {
        self.peak_bytes
            .map(|p| p as f64 / self.touched_kv_bytes.max(1) as f64)
    }

    /// Time over one memcpy pass.
    pub fn time_ratio(&self) -> f64 {
        self.seconds / self.memcpy_seconds.max(f64::MIN_POSITIVE)
    }

    /// Whether both goals are met (`None` when the peak is not measured).
    pub fn goals_met(&self) -> Option<bool> {
        Some(self.peak_ratio()? <= PEAK_GOAL && self.time_ratio() <= TIME_GOAL)
    }
}

/// Every measured case and the memcpy bandwidth they are compared with.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleReport {
    /// Always [`SCHEMA`].
    pub schema: &'static str,
    /// Memcpy bandwidth measured here, bytes per second (best of 3 passes).
    pub memcpy_bytes_per_second: f64,
    /// The goals: peak at most `peak_goal` x the touched KV bytes, time at
    /// most `time_goal` x one memcpy pass.
    pub peak_goal: f64,
    /// See `peak_goal`.
    pub time_goal: f64,
    /// The cases, in run order.
    pub cases: Vec<ScaleCase>,
}

impl ScaleReport {
    /// Whether every case passed its oracles.
    pub fn all_passed(&self) -> bool {
        self.cases.iter().all(|c| c.passed)
    }
}

/// Run every pull case (mainline allocation) of `files`, one at a time.
pub fn scale_bench(files: &[PathBuf]) -> Result<ScaleReport, ScaleBenchError> {
    let cases = scale_cases(files)?;
    let bandwidth = memcpy_bandwidth();
    let mut out = Vec::new();
    for case in &cases {
        let need = estimate(case);
        let start = Instant::now();
        let (report, peak) = peak_of(|| run_case(case, &RunOptions::default()));
        let seconds = start.elapsed().as_secs_f64();
        let g = &case.geometry;
        out.push(ScaleCase {
            geometry: case.geometry_name().to_string(),
            prompt_len: case.prompt_len,
            prefill_ranks_touched: need.prefill_ranks,
            prefill_tp: g.prefill.tp_size,
            decode_ranks: need.decode_ranks,
            touched_kv_bytes: need.arena_bytes,
            peak_bytes: peak,
            seconds,
            memcpy_seconds: need.arena_bytes as f64 / bandwidth,
            passed: report.passed(),
            outcome: report.outcome.describe(),
        });
    }
    Ok(ScaleReport {
        schema: SCHEMA,
        memcpy_bytes_per_second: bandwidth,
        peak_goal: PEAK_GOAL,
        time_goal: TIME_GOAL,
        cases: out,
    })
}

/// The cases `bench scale` runs on `files`: every pull case, mainline
/// allocation.
pub fn scale_cases(files: &[PathBuf]) -> Result<Vec<crate::scenario::Case>, ScaleBenchError> {
    let sources = plan::load_sources(files)?;
    let cases = plan::grid(
        &sources,
        &plan::PlanOptions {
            modes: vec![Mode::Pull],
            allocations: Some(vec![DecodeAllocation::Mainline]),
            ..plan::PlanOptions::default()
        },
    );
    if cases.is_empty() {
        return Err(ScaleBenchError::NoCases);
    }
    Ok(cases)
}

/// Bytes the memcpy measurement allocates: two buffers of 256 MiB.
pub const MEMCPY_BYTES: u64 = 2 * (256 << 20);

/// Memcpy bandwidth between two 256 MiB buffers, best of 3 passes (the
/// buffers are touched first, so page faults are not timed).
fn memcpy_bandwidth() -> f64 {
    const LEN: usize = (MEMCPY_BYTES / 2) as usize;
    let src = vec![0x5au8; LEN];
    let mut dst = vec![0xa5u8; LEN];
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        dst.copy_from_slice(&src);
        best = best.min(start.elapsed());
        std::hint::black_box(&mut dst);
    }
    LEN as f64 / best.as_secs_f64().max(1e-9)
}

/// A field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Runs `f`, with the peak resident bytes above the level before it (the
/// kernel's peak mark is reset first), or `None` off Linux. The memory
/// estimate's test measures with it too.
pub fn peak_of<T>(f: impl FnOnce() -> T) -> (T, Option<u64>) {
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let base = status_bytes("VmRSS:");
    let value = f();
    let peak = match (reset, base, status_bytes("VmHWM:")) {
        (true, Some(base), Some(peak)) => Some(peak.saturating_sub(base)),
        _ => None,
    };
    (value, peak)
}

impl fmt::Display for ScaleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "real-scale cases, one at a time (pull, mainline allocation, every oracle); memcpy \
             here: {:.1} GB/s; goals: peak <= {PEAK_GOAL}x the touched ranks' KV bytes, time <= \
             {TIME_GOAL}x one memcpy pass over them",
            self.memcpy_bytes_per_second / 1e9
        )?;
        writeln!(
            f,
            "{:<40} {:>6} {:>9} {:>10} {:>10} {:>6} {:>9} {:>9} {:>6}  verdict",
            "geometry", "N", "ranks P/D", "KV bytes", "peak", "xKV", "seconds", "memcpy", "xcopy"
        )?;
        for c in &self.cases {
            let (peak, ratio) = match (c.peak_bytes, c.peak_ratio()) {
                (Some(p), Some(r)) => (human_bytes(p), format!("{r:.2}")),
                _ => ("n/a".into(), "n/a".into()),
            };
            let verdict = match (c.passed, c.goals_met()) {
                (false, _) => format!("FAILED: {}", c.outcome),
                (true, Some(true)) => "goals met".into(),
                (true, Some(false)) => "goal missed".into(),
                (true, None) => "peak not measured".into(),
            };
            writeln!(
                f,
                "{:<40} {:>6} {:>9} {:>10} {:>10} {:>6} {:>9.2} {:>9.3} {:>6.1}  {verdict}",
                c.geometry,
                c.prompt_len,
                format!(
                    "{}of{}/{}",
                    c.prefill_ranks_touched, c.prefill_tp, c.decode_ranks
                ),
                human_bytes(c.touched_kv_bytes),
                peak,
                ratio,
                c.seconds,
                c.memcpy_seconds,
                c.time_ratio()
            )?;
        }
        Ok(())
    }
}
