//! `kvgeom bench vram`: the transfers of one pulled request of a
//! KimiLinear-scale geometry ([`RequestPlan`]), moved between KV tensors on
//! CUDA device 0 (or on host memory, which runs anywhere) along each path:
//!
//! - `copy`: one device-to-device copy of the same number of bytes between
//!   two contiguous buffers (the ceiling);
//! - `copy-per-pair`: one device-to-device copy per descriptor pair, queued
//!   on one stream (what any transport must at least do);
//! - `loopback`: the [`Loopback`] transport moving the pairs on the device;
//! - `nixl`: real NIXL agents in this process (feature `nixl`);
//! - `nixl-peer`: real NIXL with the prefill agents and buffers in a second
//!   process (`--peer-process`), the only set-up where UCX may use CUDA IPC.
//!
//! Each path is timed from the first post to the last completion, best of
//! N; its destinations are cleared before every iteration and checked pair
//! by pair after the last one. The report names the `UCX_*` settings the
//! run saw, since the transport UCX picks decides the NIXL figures.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::derive::load_geometry_file as load_geometry;
use crate::geometry::GeometryError;
use crate::layout::Side;
use crate::nixl::{Loopback, MemKind, Nixl, NixlAgentOptions, NixlError, XferOp};
use crate::scenario::MemoryKind;

use super::buffers::{allocate, pattern, BenchMemory, Buffer, BufferError, VerifyError};
use super::replay::{
    connect_in_process, create_agents, prepare_transfers, time_transfers, ReplayError,
};
use super::request_plan::{plan_request, PlanError, RequestPlan};

/// The paths, in report order.
pub const PATHS: [&str; 5] = ["copy", "copy-per-pair", "loopback", "nixl", "nixl-peer"];

/// What to measure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VramBenchConfig {
    pub geometry: PathBuf,
    pub prompt_len: u32,
    pub iterations: u32,
    pub memory: MemoryKind,
    /// READ pulls prefill into decode (the connector's pull); WRITE moves
    /// the same pairs from decode into prefill.
    pub op: XferOp,
    /// The `kvgeom` executable to start as the prefill peer (`nixl-peer`);
    /// `None` skips that path.
    pub peer_exe: Option<PathBuf>,
    /// Paths to run (a subset of [`PATHS`]).
    pub paths: Vec<String>,
}

impl Default for VramBenchConfig {
    /// The shipped KimiLinear-scale geometry, a 16384-token request, READ,
    /// best of 3, every in-process path.
    fn default() -> Self {
        Self {
            geometry: PathBuf::from("bench/kimi-linear-vram.toml"),
            prompt_len: 16384,
            iterations: 3,
            memory: MemoryKind::Vram,
            op: XferOp::Read,
            peer_exe: None,
            paths: PATHS.iter().map(|p| p.to_string()).collect(),
        }
    }
}

/// One measured path.
#[derive(Clone, Debug, PartialEq)]
pub struct PathTiming {
    pub path: String,
    pub best_seconds: f64,
    pub mean_seconds: f64,
    /// Decimal gigabytes (1e9 bytes) of payload per second, best iteration.
    pub gb_per_s: f64,
    /// Descriptor pairs per second, best iteration (0 for `copy`).
    pub pairs_per_s: f64,
}

/// The measurements of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct VramBenchReport {
    pub config: VramBenchConfig,
    pub device: String,
    pub bytes: u64,
    pub pairs: u64,
    pub transfers: usize,
    /// `UCX_*` environment variables in effect.
    pub ucx_env: Vec<(String, String)>,
    /// How the real transport configures its agents (both processes).
    pub nixl_agents: NixlAgentOptions,
    pub results: Vec<PathTiming>,
    pub skipped: Vec<(String, String)>,
}

/// Why the benchmark could not run (a failing path is reported as skipped
/// with its reason only when it cannot run here; wrong bytes are errors).
#[derive(Debug, thiserror::Error)]
pub enum VramBenchError {
    /// No timed iterations asked for.
    #[error("invalid benchmark configuration: iterations must be positive")]
    NoIterations,
    /// A path name that is none of [`PATHS`].
    #[error(
        "invalid benchmark configuration: unknown path {path:?}; known: {}",
        PATHS.join(", ")
    )]
    UnknownPath {
        /// The name as given.
        path: String,
    },
    /// The NIXL agent settings in the environment are unusable.
    #[error("invalid benchmark configuration: {0}")]
    AgentOptions(#[source] NixlError),
    /// The geometry file did not load.
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    /// The request could not be planned.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The KV buffers of the in-process paths could not be allocated or filled.
    #[error(transparent)]
    Memory(BufferError),
    /// `--memory vram` in a build without the `cuda` feature.
    #[cfg(not(feature = "cuda"))]
    #[error("--memory vram needs kvgeom built with `--features cuda` and a CUDA GPU")]
    VramNeedsCuda,
    /// The device did not open or name itself.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Device(crate::memory::CudaError),
    /// A path failed while it ran (wrong bytes included).
    #[error("{path}: {cause}")]
    Path {
        /// The benchmark path (`copy`, `copy-per-pair`, ...).
        path: String,
        /// What failed.
        #[source]
        cause: PathError,
    },
    /// A path's buffers could not be allocated, written, read or copied.
    #[error("{path}: {source}")]
    Buffer {
        /// The benchmark path (`copy`, `copy-per-pair`, ...).
        path: String,
        /// What the buffer refused.
        #[source]
        source: BufferError,
    },
}

/// What failed while one path ran.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The request moves no bytes (`copy` has nothing to time).
    #[error("the request moves no bytes")]
    NoBytes,
    /// `copy`'s destination differs from its source afterwards.
    #[error("the copy does not equal its source")]
    CopyDiffers,
    /// A planned buffer this process should own is missing.
    #[error("buffer {buffer} is not allocated")]
    NotAllocated {
        /// The buffer, by plan number.
        buffer: usize,
    },
    /// Host memory was asked for and a buffer is not host memory.
    #[error("expected host buffers")]
    ExpectedHost,
    /// Device memory was asked for and a buffer is not device memory.
    #[cfg(feature = "cuda")]
    #[error("expected device buffers")]
    ExpectedDevice,
    /// Device memory in a build without the `cuda` feature.
    #[cfg(not(feature = "cuda"))]
    #[error("built without the `cuda` feature")]
    NoCuda,
    /// A device copy failed.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] crate::memory::CudaError),
    /// A buffer could not be cleared, written or read.
    #[error(transparent)]
    Buffer(#[from] BufferError),
    /// The destinations do not hold their sources' bytes.
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// Setting up, posting or waiting for the transfers failed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// The transport refused a call.
    #[error(transparent)]
    Nixl(#[from] NixlError),
    /// The peer process failed.
    #[cfg(feature = "nixl")]
    #[error(transparent)]
    Peer(#[from] super::peer::PeerError),
}

fn path_error(path: &str) -> impl Fn(PathError) -> VramBenchError + '_ {
    move |cause| VramBenchError::Path {
        path: path.into(),
        cause,
    }
}

fn buffer_error(path: &str) -> impl Fn(BufferError) -> VramBenchError + '_ {
    move |source| VramBenchError::Buffer {
        path: path.into(),
        source,
    }
}

fn timing(path: &str, bytes: u64, pairs: u64, times: &[Duration]) -> PathTiming {
    let best = times
        .iter()
        .min()
        .copied()
        .unwrap_or_default()
        .as_secs_f64();
    let mean = times.iter().map(Duration::as_secs_f64).sum::<f64>() / times.len().max(1) as f64;
    let rate = |n: u64| {
        if best > 0.0 {
            n as f64 / best
        } else {
            f64::INFINITY
        }
    };
    PathTiming {
        path: path.into(),
        best_seconds: best,
        mean_seconds: mean,
        gb_per_s: rate(bytes) / 1e9,
        pairs_per_s: rate(pairs),
    }
}

fn wants(config: &VramBenchConfig, path: &str) -> bool {
    config.paths.iter().any(|p| p == path)
}

/// The kind of NIXL memory the buffers are.
fn mem_kind(kind: MemoryKind) -> MemKind {
    match kind {
        MemoryKind::Host => MemKind::Dram,
        MemoryKind::Vram => MemKind::Vram,
    }
}

/// The side whose buffers are destinations under `op`.
fn destination(op: XferOp) -> Side {
    match op {
        XferOp::Read => Side::Decode,
        XferOp::Write => Side::Prefill,
    }
}

fn source(op: XferOp) -> Side {
    match op {
        XferOp::Read => Side::Prefill,
        XferOp::Write => Side::Decode,
    }
}

/// Run the benchmark.
pub fn vram_bench(config: &VramBenchConfig) -> Result<VramBenchReport, VramBenchError> {
    if config.iterations == 0 {
        return Err(VramBenchError::NoIterations);
    }
    if let Some(unknown) = config.paths.iter().find(|p| !PATHS.contains(&p.as_str())) {
        return Err(VramBenchError::UnknownPath {
            path: unknown.clone(),
        });
    }
    let plan = vram_plan(config)?;
    vram_bench_planned(config, &plan)
}

/// The request `bench vram` replays (planned over addresses only: nothing
/// of the request's size is allocated).
pub fn vram_plan(config: &VramBenchConfig) -> Result<RequestPlan, VramBenchError> {
    let geometry = load_geometry(&config.geometry)?;
    Ok(plan_request(&geometry, config.prompt_len)?)
}

/// Host memory `bench vram` allocates at its peak for `plan`: the largest
/// of its paths (they run one after the other). `copy`: a source and a
/// destination of the plan's bytes and, to compare them, a copy of each
/// (on device memory, the copies only); the in-process paths: every KV
/// buffer of both sides and a copy of each destination buffer to verify
/// it; `nixl-peer`: decode's buffers and their copies (prefill's are the
/// peer process's). The plan's own rows ([`RequestPlan::held_bytes`]) are
/// held throughout, on top.
pub fn host_bytes(config: &VramBenchConfig, plan: &RequestPlan) -> u64 {
    let host = config.memory == MemoryKind::Host;
    let wants = |p: &str| wants(config, p);
    let side_bytes = |side: Side| -> u64 {
        plan.buffers
            .iter()
            .filter(|b| b.side == side)
            .fold(0u64, |a, b| a.saturating_add(b.len))
    };
    let destination = match config.op {
        XferOp::Read => Side::Decode,
        XferOp::Write => Side::Prefill,
    };
    let own = |bytes: u64| if host { bytes } else { 0 };
    let mut peak = 0u64;
    if wants("copy") {
        let bytes = plan.bytes();
        peak = peak.max(own(bytes.saturating_mul(2)).saturating_add(bytes.saturating_mul(2)));
    }
    if ["copy-per-pair", "loopback", "nixl"]
        .iter()
        .any(|p| wants(p))
    {
        let all = side_bytes(Side::Prefill).saturating_add(side_bytes(Side::Decode));
        peak = peak.max(own(all).saturating_add(side_bytes(destination)));
    }
    if wants("nixl-peer") {
        let decode = side_bytes(Side::Decode);
        peak = peak.max(own(decode).saturating_add(decode));
    }
    peak.saturating_add(plan.held_bytes())
}

/// [`vram_bench`] of a request already planned ([`vram_plan`]).
pub fn vram_bench_planned(
    config: &VramBenchConfig,
    plan: &RequestPlan,
) -> Result<VramBenchReport, VramBenchError> {
    let mut report = VramBenchReport {
        config: config.clone(),
        device: device_name(config.memory)?,
        bytes: plan.bytes(),
        pairs: plan.pairs(),
        transfers: plan.xfers.len(),
        ucx_env: std::env::vars()
            .filter(|(k, _)| k.starts_with("UCX_"))
            .collect(),
        nixl_agents: NixlAgentOptions::from_env().map_err(VramBenchError::AgentOptions)?,
        results: Vec::new(),
        skipped: Vec::new(),
    };
    report.ucx_env.sort();
    if wants(config, "copy") {
        report.results.push(copy_path(config, plan)?);
    }
    let needs_local = ["copy-per-pair", "loopback", "nixl"]
        .iter()
        .any(|p| wants(config, p));
    if needs_local {
        let memory = BenchMemory::allocate(plan, config.memory, &[Side::Prefill, Side::Decode])
            .map_err(VramBenchError::Memory)?;
        memory
            .fill(plan, source(config.op))
            .map_err(VramBenchError::Memory)?;
        if wants(config, "copy-per-pair") {
            report.results.push(per_pair_path(config, plan, &memory)?);
        }
        if wants(config, "loopback") {
            let mut lb = Loopback::new();
            for b in memory.buffers.iter().flatten() {
                match b {
                    Buffer::Host(a) => lb.attach(a.clone()),
                    #[cfg(feature = "cuda")]
                    Buffer::Device(a) => lb.attach_device(a.clone()),
                }
            }
            report
                .results
                .push(in_process(config, plan, &memory, &mut lb, "loopback")?);
        }
        if wants(config, "nixl") {
            nixl_in_process(config, plan, &memory, &mut report)?;
        }
    }
    if wants(config, "nixl-peer") {
        nixl_peer(config, plan, &mut report)?;
    }
    Ok(report)
}

#[cfg(feature = "cuda")]
fn device_name(kind: MemoryKind) -> Result<String, VramBenchError> {
    match kind {
        MemoryKind::Host => Ok("host memory".into()),
        MemoryKind::Vram => {
            let d = crate::memory::CudaDevice::open(crate::scenario::vram::DEVICE_ORDINAL)
                .map_err(VramBenchError::Device)?;
            let name = d.name().map_err(VramBenchError::Device)?;
            Ok(format!(
                "CUDA device {} ({name}; driver {})",
                d.ordinal(),
                crate::memory::cuda_driver::loaded_library_text()
            ))
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn device_name(kind: MemoryKind) -> Result<String, VramBenchError> {
    match kind {
        MemoryKind::Host => Ok("host memory".into()),
        MemoryKind::Vram => Err(VramBenchError::VramNeedsCuda),
    }
}

/// The pattern key of the `copy` path's source (no plan buffer has it).
const COPY_SOURCE: usize = 0xC0FFEE;

/// One contiguous copy of the plan's byte count.
fn copy_path(config: &VramBenchConfig, plan: &RequestPlan) -> Result<PathTiming, VramBenchError> {
    let fail = path_error("copy");
    let buffer_fail = buffer_error("copy");
    let bytes = plan.bytes();
    if bytes == 0 {
        return Err(fail(PathError::NoBytes));
    }
    let src = allocate(config.memory, bytes).map_err(&buffer_fail)?;
    let dst = allocate(config.memory, bytes).map_err(&buffer_fail)?;
    src.write(0, &pattern(COPY_SOURCE, 0, bytes))
        .map_err(&buffer_fail)?;
    let mut times = Vec::new();
    for _ in 0..config.iterations {
        dst.clear().map_err(&buffer_fail)?;
        times.push(copy_once(&src, &dst).map_err(&buffer_fail)?);
    }
    if src.snapshot().map_err(&buffer_fail)? != dst.snapshot().map_err(&buffer_fail)? {
        return Err(fail(PathError::CopyDiffers));
    }
    Ok(timing("copy", bytes, 0, &times))
}

fn copy_once(src: &Buffer, dst: &Buffer) -> Result<Duration, BufferError> {
    match (src, dst) {
        (Buffer::Host(s), Buffer::Host(d)) => {
            let (s, mut d) = (s.read(), d.write());
            let start = std::time::Instant::now();
            d.copy_from_slice(&s);
            Ok(start.elapsed())
        }
        #[cfg(feature = "cuda")]
        (Buffer::Device(s), Buffer::Device(d)) => {
            let start = std::time::Instant::now();
            let mut queue = s.device().queue();
            queue
                .copy(s, 0, d, 0, s.len())
                .and_then(|()| queue.finish())?;
            Ok(start.elapsed())
        }
        #[cfg(feature = "cuda")]
        _ => Err(BufferError::MixedKinds),
    }
}

/// One copy per descriptor pair, in plan order.
fn per_pair_path(
    config: &VramBenchConfig,
    plan: &RequestPlan,
    memory: &BenchMemory,
) -> Result<PathTiming, VramBenchError> {
    let fail = path_error("copy-per-pair");
    let pairs: Vec<_> = plan
        .xfers
        .iter()
        .flat_map(|x| x.pairs())
        .map(|(local, remote)| match config.op {
            XferOp::Read => (remote, local),
            XferOp::Write => (local, remote),
        })
        .collect();
    let buffer = |i: usize| {
        memory.buffers[i]
            .as_ref()
            .ok_or_else(|| fail(PathError::NotAllocated { buffer: i }))
    };
    let mut times = Vec::new();
    for _ in 0..config.iterations {
        memory
            .clear(plan, destination(config.op))
            .map_err(|e| fail(e.into()))?;
        let start = std::time::Instant::now();
        match memory.kind {
            MemoryKind::Host => {
                for &(src, dst) in &pairs {
                    let (Some(s), Some(d)) =
                        (buffer(src.buffer)?.as_host(), buffer(dst.buffer)?.as_host())
                    else {
                        return Err(fail(PathError::ExpectedHost));
                    };
                    let (s, mut d) = (s.read(), d.write());
                    let (so, doff, len) =
                        (src.offset as usize, dst.offset as usize, src.len as usize);
                    d[doff..doff + len].copy_from_slice(&s[so..so + len]);
                }
            }
            #[cfg(feature = "cuda")]
            MemoryKind::Vram => {
                let mut queue = None;
                for &(src, dst) in &pairs {
                    let (Some(s), Some(d)) = (
                        buffer(src.buffer)?.as_device(),
                        buffer(dst.buffer)?.as_device(),
                    ) else {
                        return Err(fail(PathError::ExpectedDevice));
                    };
                    let q = queue.get_or_insert_with(|| s.device().queue());
                    q.copy(s, src.offset, d, dst.offset, src.len)
                        .map_err(|e| fail(e.into()))?;
                }
                if let Some(q) = queue {
                    q.finish().map_err(|e| fail(e.into()))?;
                }
            }
            #[cfg(not(feature = "cuda"))]
            MemoryKind::Vram => return Err(fail(PathError::NoCuda)),
        }
        times.push(start.elapsed());
    }
    memory.verify(plan, config.op).map_err(|e| fail(e.into()))?;
    Ok(timing("copy-per-pair", plan.bytes(), plan.pairs(), &times))
}

/// Both sides' agents in this process on transport `t`.
fn in_process<T: Nixl>(
    config: &VramBenchConfig,
    plan: &RequestPlan,
    memory: &BenchMemory,
    t: &mut T,
    path: &str,
) -> Result<PathTiming, VramBenchError> {
    let fail = path_error(path);
    let agents = create_agents(t, plan, memory, &[Side::Prefill, Side::Decode])
        .map_err(|e| fail(e.into()))?;
    connect_in_process(t, &agents).map_err(|e| fail(e.into()))?;
    let address = |i: usize| {
        memory
            .buffers
            .get(i)
            .and_then(|b| b.as_ref())
            .map(Buffer::base)
    };
    let xfers = prepare_transfers(
        t,
        plan,
        &agents,
        &address,
        mem_kind(config.memory),
        crate::scenario::vram::DEVICE_ORDINAL,
        config.op,
    )
    .map_err(|e| fail(e.into()))?;
    let dst = destination(config.op);
    let times = time_transfers(t, &xfers, config.iterations, &mut || {
        memory.clear(plan, dst).map_err(PathError::from)
    })
    .map_err(&fail)?;
    for (agent, xfer) in xfers {
        t.release_xfer(agent, xfer).map_err(|e| fail(e.into()))?;
    }
    memory.verify(plan, config.op).map_err(|e| fail(e.into()))?;
    Ok(timing(path, plan.bytes(), plan.pairs(), &times))
}

#[cfg(feature = "nixl")]
fn nixl_in_process(
    config: &VramBenchConfig,
    plan: &RequestPlan,
    memory: &BenchMemory,
    report: &mut VramBenchReport,
) -> Result<(), VramBenchError> {
    use crate::nixl::real::RealNixl;
    let mut nixl = match RealNixl::new() {
        Ok(n) => n,
        Err(e) => {
            report.skipped.push(("nixl".into(), e.to_string()));
            return Ok(());
        }
    };
    for b in memory.buffers.iter().flatten() {
        super::peer::attach(&mut nixl, b);
    }
    let result = in_process(config, plan, memory, &mut nixl, "nixl")?;
    report.results.push(result);
    Ok(())
}

#[cfg(not(feature = "nixl"))]
fn nixl_in_process(
    _config: &VramBenchConfig,
    _plan: &RequestPlan,
    _memory: &BenchMemory,
    report: &mut VramBenchReport,
) -> Result<(), VramBenchError> {
    report.skipped.push((
        "nixl".into(),
        "built without the `nixl` cargo feature".into(),
    ));
    Ok(())
}

#[cfg(feature = "nixl")]
fn nixl_peer(
    config: &VramBenchConfig,
    plan: &RequestPlan,
    report: &mut VramBenchReport,
) -> Result<(), VramBenchError> {
    use super::peer::{attach, hex, Peer, PeerArgs};
    use crate::nixl::real::RealNixl;
    let Some(exe) = &config.peer_exe else {
        report.skipped.push((
            "nixl-peer".into(),
            "no peer process asked for (--peer-process)".into(),
        ));
        return Ok(());
    };
    let fail = path_error("nixl-peer");
    let mut nixl = match RealNixl::new() {
        Ok(n) => n,
        Err(e) => {
            report.skipped.push(("nixl-peer".into(), e.to_string()));
            return Ok(());
        }
    };
    let memory =
        BenchMemory::allocate(plan, config.memory, &[Side::Decode]).map_err(|e| fail(e.into()))?;
    if config.op == XferOp::Write {
        memory
            .fill(plan, Side::Decode)
            .map_err(|e| fail(e.into()))?;
    }
    let args = PeerArgs {
        geometry: config.geometry.clone(),
        prompt_len: config.prompt_len,
        memory: config.memory,
    };
    let mut peer = Peer::spawn(exe, &args, plan).map_err(|e| fail(e.into()))?;
    for b in memory.buffers.iter().flatten() {
        attach(&mut nixl, b);
    }
    let agents =
        create_agents(&mut nixl, plan, &memory, &[Side::Decode]).map_err(|e| fail(e.into()))?;
    for (_, md) in &peer.metadata {
        for &agent in agents.values() {
            nixl.add_remote_agent(agent, md)
                .map_err(|e| fail(e.into()))?;
        }
    }
    for &agent in agents.values() {
        let md = nixl.local_metadata(agent).map_err(|e| fail(e.into()))?;
        peer.ask(&format!("load {}", hex(&md)))
            .map_err(|e| fail(e.into()))?;
    }
    let remote = peer.addresses.clone();
    let address = |i: usize| match memory.buffers.get(i).and_then(|b| b.as_ref()) {
        Some(b) => Some(b.base()),
        None => remote.iter().find(|(n, _)| *n == i).map(|&(_, a)| a),
    };
    let xfers = prepare_transfers(
        &mut nixl,
        plan,
        &agents,
        &address,
        mem_kind(config.memory),
        crate::scenario::vram::DEVICE_ORDINAL,
        config.op,
    )
    .map_err(|e| fail(e.into()))?;
    let times = {
        let mut clear = || -> Result<(), PathError> {
            match config.op {
                XferOp::Read => Ok(memory.clear(plan, Side::Decode)?),
                XferOp::Write => Ok(peer.ask("clear")?),
            }
        };
        time_transfers(&mut nixl, &xfers, config.iterations, &mut clear).map_err(&fail)?
    };
    match config.op {
        XferOp::Read => memory
            .verify(plan, XferOp::Read)
            .map_err(|e| fail(e.into()))?,
        XferOp::Write => peer.ask("verify write").map_err(|e| fail(e.into()))?,
    }
    // Our agents go first, so that none reaches for a peer already gone.
    drop(nixl);
    peer.stop();
    report
        .results
        .push(timing("nixl-peer", plan.bytes(), plan.pairs(), &times));
    Ok(())
}

#[cfg(not(feature = "nixl"))]
fn nixl_peer(
    _config: &VramBenchConfig,
    _plan: &RequestPlan,
    report: &mut VramBenchReport,
) -> Result<(), VramBenchError> {
    report.skipped.push((
        "nixl-peer".into(),
        "built without the `nixl` cargo feature".into(),
    ));
    Ok(())
}

impl fmt::Display for VramBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(
            f,
            "{} of one {}-token request of {} ({}): {} bytes in {} descriptor pairs, {} transfers; \
             {}, best of {}",
            c.op.as_str(),
            c.prompt_len,
            c.geometry.display(),
            self.device,
            self.bytes,
            self.pairs,
            self.transfers,
            match c.peer_exe {
                Some(_) => "prefill in a peer process for nixl-peer",
                None => "one process",
            },
            c.iterations
        )?;
        if self.ucx_env.is_empty() {
            writeln!(f, "UCX settings: none (UCX defaults)")?;
        } else {
            let env: Vec<String> = self
                .ucx_env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            writeln!(f, "UCX settings: {}", env.join(" "))?;
        }
        writeln!(f, "NIXL agents: {}", self.nixl_agents)?;
        writeln!(
            f,
            "{:<14} {:>10} {:>10} {:>10} {:>13} {:>9}",
            "path", "best s", "mean s", "GB/s", "pairs/s", "vs copy"
        )?;
        let baseline = self
            .results
            .iter()
            .find(|r| r.path == "copy")
            .map(|r| r.gb_per_s);
        for r in &self.results {
            let relative = match baseline {
                Some(b) if b > 0.0 => format!("{:.1}%", 100.0 * r.gb_per_s / b),
                _ => "-".into(),
            };
            writeln!(
                f,
                "{:<14} {:>10.4} {:>10.4} {:>10.2} {:>13.0} {:>9}",
                r.path, r.best_seconds, r.mean_seconds, r.gb_per_s, r.pairs_per_s, relative
            )?;
        }
        for (path, why) in &self.skipped {
            writeln!(f, "{path}: skipped: {why}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(paths: &[&str]) -> VramBenchConfig {
        VramBenchConfig {
            geometry: PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/geometries/g6-kimi-linear-scale.toml"
            )),
            prompt_len: 1537,
            iterations: 2,
            memory: MemoryKind::Host,
            op: XferOp::Read,
            peer_exe: None,
            paths: paths.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn host_paths_move_and_check_the_request_bytes() {
        for op in [XferOp::Read, XferOp::Write] {
            let config = VramBenchConfig {
                op,
                ..small(&["copy", "copy-per-pair", "loopback"])
            };
            let report = vram_bench(&config).unwrap();
            let paths: Vec<&str> = report.results.iter().map(|r| r.path.as_str()).collect();
            assert_eq!(paths, ["copy", "copy-per-pair", "loopback"]);
            assert_eq!(report.device, "host memory");
            assert!(report.bytes > 0 && report.pairs > 0);
            let table = report.to_string();
            assert!(
                table.starts_with(&format!(
                    "{} of one 1537-token request of {} (host memory): {} bytes in {} \
                     descriptor pairs, {} transfers; one process, best of 2\n",
                    op.as_str(),
                    config.geometry.display(),
                    report.bytes,
                    report.pairs,
                    report.transfers
                )),
                "{table}"
            );
        }
    }

    #[test]
    fn bad_configurations_are_named() {
        let e = vram_bench(&VramBenchConfig {
            iterations: 0,
            ..small(&["copy"])
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid benchmark configuration: iterations must be positive"
        );
        let e = vram_bench(&small(&["teleport"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid benchmark configuration: unknown path \"teleport\"; known: copy, \
             copy-per-pair, loopback, nixl, nixl-peer"
        );
    }
}
