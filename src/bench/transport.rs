//! Host-to-host transfer throughput: the same bytes moved as one prepared
//! transfer of many descriptors through [`Loopback`], through real NIXL
//! (`nixl::RealNixl`, feature `nixl`, when its runtime loads)
//! and by one plain memcpy, best of N iterations each. The paths are
//! [`PATHS`]; a configuration names the ones to run.
//!
//! Remote descriptors are paired in reverse order (local block `i` with
//! remote block `n - 1 - i`) so that NIXL cannot merge neighbouring
//! descriptors into one: every descriptor is moved on its own. Every path's
//! result is checked byte for byte.

use std::fmt;
use std::time::{Duration, Instant};

use crate::memory::HostArena;
use crate::nixl::{
    DescList, DlistTarget, Loopback, MemKind, MemRegion, Nixl, NixlAgentOptions, NixlError,
    StridedRun, XferOp, XferState,
};

/// What to move and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportBenchConfig {
    /// Bytes per transfer (split evenly over the descriptors).
    pub total_bytes: u64,
    pub descriptors: u64,
    /// Timed repetitions per path; the best one is reported.
    pub iterations: u32,
    pub op: XferOp,
    /// Paths to run, a subset of [`PATHS`]; results keep [`PATHS`]' order.
    /// `nixl-ucx` is reported skipped, with the reason, where real NIXL
    /// cannot run (no `nixl` feature, no runtime).
    pub paths: Vec<String>,
}

impl TransportBenchConfig {
    /// Host memory the benchmark allocates: a source and a destination of
    /// [`total_bytes`](Self::total_bytes) each.
    pub fn host_bytes(&self) -> u64 {
        self.total_bytes.saturating_mul(2)
    }
}

impl Default for TransportBenchConfig {
    /// 1 GiB in 4096 descriptors of 256 KiB, WRITE, best of 5, every path.
    fn default() -> Self {
        Self {
            total_bytes: 1 << 30,
            descriptors: 4096,
            iterations: 5,
            op: XferOp::Write,
            paths: PATHS.iter().map(|p| p.to_string()).collect(),
        }
    }
}

/// One measured path.
#[derive(Clone, Debug, PartialEq)]
pub struct PathResult {
    pub path: String,
    /// Wall time of the fastest iteration (post to completion).
    pub best_seconds: f64,
    /// Decimal gigabytes (1e9 bytes) per second in the fastest iteration.
    pub gb_per_s: f64,
}

/// The measurements of one [`transport_bench`] run.
#[derive(Clone, Debug, PartialEq)]
pub struct TransportBenchReport {
    pub config: TransportBenchConfig,
    /// Bytes per descriptor.
    pub descriptor_bytes: u64,
    /// memcpy first, then each transport.
    pub results: Vec<PathResult>,
    /// Paths not measured: (path, reason).
    pub skipped: Vec<(String, String)>,
    /// The real transport's agent settings, when it ran.
    pub nixl_agents: Option<NixlAgentOptions>,
}

impl TransportBenchReport {
    pub fn result(&self, path: &str) -> Option<&PathResult> {
        self.results.iter().find(|r| r.path == path)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("invalid benchmark configuration: {0}")]
    InvalidConfig(String),
    /// A path name that is none of [`PATHS`].
    #[error(
        "invalid benchmark configuration: unknown path {path:?}; known: {}",
        PATHS.join(", ")
    )]
    UnknownPath {
        /// The name as given.
        path: String,
    },
    /// A configuration that names no path.
    #[error("invalid benchmark configuration: no path to run; known: {}", PATHS.join(", "))]
    NoPaths,
    /// The source or destination buffer could not be allocated.
    #[error("allocating the benchmark's buffers: {0}")]
    Memory(#[from] crate::memory::AllocError),
    #[error("{path}: {source}")]
    Transport {
        path: String,
        #[source]
        source: NixlError,
    },
    #[error("{path}: wrong bytes after the transfer, first in destination block {block}")]
    WrongBytes { path: String, block: u64 },
    #[error("{path}: transfer not done after {seconds} s")]
    Stalled { path: String, seconds: u64 },
}

/// Give up on a transfer that takes longer than this.
const STALL_LIMIT: Duration = Duration::from_secs(300);

pub const MEMCPY: &str = "memcpy";
pub const LOOPBACK: &str = "loopback";
pub const NIXL_UCX: &str = "nixl-ucx";

/// The paths, in report order.
pub const PATHS: [&str; 3] = [MEMCPY, LOOPBACK, NIXL_UCX];

/// Source and destination of every path.
struct Buffers {
    src: HostArena,
    dst: HostArena,
    block: u64,
    blocks: u64,
}

impl Buffers {
    fn new(config: &TransportBenchConfig, block: u64) -> Result<Self, BenchError> {
        let src = HostArena::try_new(config.total_bytes)?;
        for (i, chunk) in src.write().chunks_mut(8).enumerate() {
            let word = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        let dst = HostArena::try_new(config.total_bytes)?;
        Ok(Self {
            src,
            dst,
            block,
            blocks: config.descriptors,
        })
    }

    fn clear_dst(&self) {
        self.dst.write().fill(0);
    }

    /// Destination block `n - 1 - i` holds source block `i`.
    fn check_reversed(&self, path: &str) -> Result<(), BenchError> {
        let (src, dst) = (self.src.read(), self.dst.read());
        let block = self.block as usize;
        for i in 0..self.blocks as usize {
            let j = self.blocks as usize - 1 - i;
            if src[i * block..(i + 1) * block] != dst[j * block..(j + 1) * block] {
                return Err(BenchError::WrongBytes {
                    path: path.into(),
                    block: j as u64,
                });
            }
        }
        Ok(())
    }

    fn list(&self, arena: &HostArena) -> DescList {
        DescList::from_runs([StridedRun {
            addr: arena.base(),
            len: self.block,
            dev: 0,
            stride: self.block,
            count: self.blocks,
        }])
    }

    fn region(arena: &HostArena) -> MemRegion {
        MemRegion {
            addr: arena.base(),
            len: arena.len(),
            mem: MemKind::Dram,
            dev: 0,
        }
    }
}

fn result(path: &str, bytes: u64, best: Duration) -> PathResult {
    let seconds = best.as_secs_f64();
    PathResult {
        path: path.to_string(),
        best_seconds: seconds,
        gb_per_s: if seconds > 0.0 {
            bytes as f64 / seconds / 1e9
        } else {
            f64::INFINITY
        },
    }
}

fn memcpy_path(buffers: &Buffers, iterations: u32) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..iterations {
        let src = buffers.src.read();
        let mut dst = buffers.dst.write();
        let start = Instant::now();
        dst.copy_from_slice(&src);
        best = best.min(start.elapsed());
    }
    best
}

/// Two agents, the source's and the destination's, one prepared transfer of
/// every block (reversed), posted `iterations` times.
fn transfer_path<T: Nixl>(
    t: &mut T,
    path: &str,
    buffers: &Buffers,
    config: &TransportBenchConfig,
) -> Result<Duration, BenchError> {
    let fail = |source| BenchError::Transport {
        path: path.into(),
        source,
    };
    let src_agent = t.create_agent("bench-source").map_err(fail)?;
    let dst_agent = t.create_agent("bench-destination").map_err(fail)?;
    t.register_memory(src_agent, &[Buffers::region(&buffers.src)])
        .map_err(fail)?;
    t.register_memory(dst_agent, &[Buffers::region(&buffers.dst)])
        .map_err(fail)?;
    let src_md = t.local_metadata(src_agent).map_err(fail)?;
    let dst_md = t.local_metadata(dst_agent).map_err(fail)?;
    let dst_name = t.add_remote_agent(src_agent, &dst_md).map_err(fail)?;
    let src_name = t.add_remote_agent(dst_agent, &src_md).map_err(fail)?;
    // WRITE pushes from the source agent, READ pulls into the destination
    // agent; either way source block i lands in destination block n - 1 - i.
    let (initiator, local, remote, peer) = match config.op {
        XferOp::Write => (src_agent, &buffers.src, &buffers.dst, dst_name),
        XferOp::Read => (dst_agent, &buffers.dst, &buffers.src, src_name),
    };
    let n = u32::try_from(buffers.blocks)
        .map_err(|_| BenchError::InvalidConfig("too many descriptors".into()))?;
    let forward: Vec<u32> = (0..n).collect();
    let reversed: Vec<u32> = (0..n).rev().collect();
    let (local_ids, remote_ids) = match config.op {
        XferOp::Write => (&forward, &reversed),
        XferOp::Read => (&reversed, &forward),
    };
    let lh = t
        .prepare_dlist(
            initiator,
            &DlistTarget::Local,
            MemKind::Dram,
            &buffers.list(local),
        )
        .map_err(fail)?;
    let rh = t
        .prepare_dlist(
            initiator,
            &DlistTarget::Remote(peer),
            MemKind::Dram,
            &buffers.list(remote),
        )
        .map_err(fail)?;
    let xfer = t
        .make_xfer(initiator, config.op, lh, local_ids, rh, remote_ids, None)
        .map_err(fail)?;
    let mut best = Duration::MAX;
    for _ in 0..config.iterations {
        let start = Instant::now();
        let mut state = t.post_xfer(initiator, xfer).map_err(fail)?;
        while state != XferState::Done {
            if start.elapsed() > STALL_LIMIT {
                return Err(BenchError::Stalled {
                    path: path.into(),
                    seconds: STALL_LIMIT.as_secs(),
                });
            }
            state = t.xfer_state(initiator, xfer).map_err(fail)?;
        }
        best = best.min(start.elapsed());
    }
    t.release_xfer(initiator, xfer).map_err(fail)?;
    Ok(best)
}

fn check_config(config: &TransportBenchConfig) -> Result<u64, BenchError> {
    if let Some(unknown) = config.paths.iter().find(|p| !PATHS.contains(&p.as_str())) {
        return Err(BenchError::UnknownPath {
            path: unknown.clone(),
        });
    }
    if config.paths.is_empty() {
        return Err(BenchError::NoPaths);
    }
    let bad = |why: String| Err(BenchError::InvalidConfig(why));
    if config.descriptors == 0 || config.total_bytes == 0 || config.iterations == 0 {
        return bad("bytes, descriptors and iterations must all be positive".into());
    }
    if config.total_bytes % config.descriptors != 0 {
        return bad(format!(
            "{} bytes do not split evenly into {} descriptors",
            config.total_bytes, config.descriptors
        ));
    }
    if config.descriptors > i32::MAX as u64 {
        return bad(format!(
            "{} descriptors exceed NIXL's index range",
            config.descriptors
        ));
    }
    if usize::try_from(config.total_bytes).is_err() {
        return bad(format!(
            "{} bytes exceed the address space",
            config.total_bytes
        ));
    }
    Ok(config.total_bytes / config.descriptors)
}

/// Measure the paths `config.paths` names: memcpy, the loopback transport
/// and real NIXL over UCX (feature `nixl`, runtime present). Checks the
/// configuration first, then allocates two buffers of `config.total_bytes`.
pub fn transport_bench(config: &TransportBenchConfig) -> Result<TransportBenchReport, BenchError> {
    let block = check_config(config)?;
    let wants = |path: &str| config.paths.iter().any(|p| p == path);
    let buffers = Buffers::new(config, block)?;
    let bytes = config.total_bytes;
    let mut report = TransportBenchReport {
        config: config.clone(),
        descriptor_bytes: block,
        results: Vec::new(),
        skipped: Vec::new(),
        nixl_agents: None,
    };

    if wants(MEMCPY) {
        // memcpy copies the blocks in place, so check it against the source.
        let best = memcpy_path(&buffers, config.iterations);
        if *buffers.src.read() != *buffers.dst.read() {
            return Err(BenchError::WrongBytes {
                path: MEMCPY.into(),
                block: 0,
            });
        }
        report.results.push(result(MEMCPY, bytes, best));
    }

    if wants(LOOPBACK) {
        buffers.clear_dst();
        let mut loopback = Loopback::new();
        loopback.attach(buffers.src.clone());
        loopback.attach(buffers.dst.clone());
        let best = transfer_path(&mut loopback, LOOPBACK, &buffers, config)?;
        buffers.check_reversed(LOOPBACK)?;
        report.results.push(result(LOOPBACK, bytes, best));
    }

    if wants(NIXL_UCX) {
        real_nixl_path(&buffers, config, &mut report)?;
    }
    Ok(report)
}

#[cfg(feature = "nixl")]
fn real_nixl_path(
    buffers: &Buffers,
    config: &TransportBenchConfig,
    report: &mut TransportBenchReport,
) -> Result<(), BenchError> {
    use crate::nixl::real::RealNixl;
    let mut nixl = match RealNixl::new() {
        Ok(nixl) => nixl,
        Err(NixlError::RuntimeUnavailable(reason)) => {
            report.skipped.push((NIXL_UCX.into(), reason));
            return Ok(());
        }
        Err(source) => {
            return Err(BenchError::Transport {
                path: NIXL_UCX.into(),
                source,
            })
        }
    };
    report.nixl_agents = Some(nixl.options());
    buffers.clear_dst();
    nixl.attach(buffers.src.clone());
    nixl.attach(buffers.dst.clone());
    let best = transfer_path(&mut nixl, NIXL_UCX, buffers, config)?;
    drop(nixl);
    buffers.check_reversed(NIXL_UCX)?;
    report
        .results
        .push(result(NIXL_UCX, config.total_bytes, best));
    Ok(())
}

#[cfg(not(feature = "nixl"))]
fn real_nixl_path(
    _buffers: &Buffers,
    _config: &TransportBenchConfig,
    report: &mut TransportBenchReport,
) -> Result<(), BenchError> {
    report.skipped.push((
        NIXL_UCX.into(),
        "built without the `nixl` cargo feature".into(),
    ));
    Ok(())
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        let digits = format!("{value:.2}");
        let digits = digits.trim_end_matches('0').trim_end_matches('.');
        format!("{digits} {}", UNITS[unit])
    }
}

impl fmt::Display for TransportBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        writeln!(
            f,
            "{} of {} ({} bytes) in {} descriptors of {}, host to host, best of {}",
            c.op.as_str(),
            human_bytes(c.total_bytes),
            c.total_bytes,
            c.descriptors,
            human_bytes(self.descriptor_bytes),
            c.iterations
        )?;
        writeln!(
            f,
            "{:<10} {:>10} {:>9} {:>10}",
            "path", "seconds", "GB/s", "vs memcpy"
        )?;
        let baseline = self.result(MEMCPY).map(|r| r.gb_per_s);
        for r in &self.results {
            let relative = match baseline {
                Some(b) if b > 0.0 => format!("{:.0}%", 100.0 * r.gb_per_s / b),
                _ => "-".into(),
            };
            writeln!(
                f,
                "{:<10} {:>10.4} {:>9.2} {:>10}",
                r.path, r.best_seconds, r.gb_per_s, relative
            )?;
        }
        if let Some(options) = &self.nixl_agents {
            writeln!(f, "{NIXL_UCX} agents: {options}")?;
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

    fn small(op: XferOp) -> TransportBenchConfig {
        TransportBenchConfig {
            total_bytes: 64 * 1024,
            descriptors: 16,
            iterations: 2,
            op,
            paths: vec![MEMCPY.into(), LOOPBACK.into()],
        }
    }

    #[test]
    fn measures_memcpy_and_loopback_and_checks_their_bytes() {
        for op in [XferOp::Write, XferOp::Read] {
            let report = transport_bench(&small(op)).unwrap();
            assert_eq!(report.descriptor_bytes, 4096);
            let paths: Vec<&str> = report.results.iter().map(|r| r.path.as_str()).collect();
            assert_eq!(paths, [MEMCPY, LOOPBACK]);
            assert!(report.skipped.is_empty());
            let table = report.to_string();
            assert!(
                table.starts_with(&format!(
                    "{} of 64 KiB (65536 bytes) in 16 descriptors of 4 KiB, host to host, best of 2\n",
                    op.as_str()
                )),
                "{table}"
            );
            assert_eq!(table.lines().count(), 4, "{table}");
        }
    }

    #[test]
    fn only_the_named_paths_run() {
        for (paths, expected) in [
            (&[LOOPBACK][..], &[LOOPBACK][..]),
            (&[MEMCPY], &[MEMCPY]),
            // Report order is PATHS' order, whatever the order asked.
            (&[LOOPBACK, MEMCPY], &[MEMCPY, LOOPBACK]),
        ] {
            let config = TransportBenchConfig {
                paths: paths.iter().map(|p| p.to_string()).collect(),
                ..small(XferOp::Write)
            };
            let report = transport_bench(&config).unwrap();
            let ran: Vec<&str> = report.results.iter().map(|r| r.path.as_str()).collect();
            assert_eq!(ran, expected, "asked for {paths:?}");
            assert!(report.skipped.is_empty(), "{:?}", report.skipped);
        }
        // Real NIXL asked for: measured, or skipped with its reason, never dropped.
        let report = transport_bench(&TransportBenchConfig {
            paths: vec![NIXL_UCX.into()],
            ..small(XferOp::Write)
        })
        .unwrap();
        let named: Vec<&str> = report
            .results
            .iter()
            .map(|r| r.path.as_str())
            .chain(report.skipped.iter().map(|(p, _)| p.as_str()))
            .collect();
        assert_eq!(named, [NIXL_UCX]);
        // Without memcpy there is no baseline to compare with.
        let table = transport_bench(&TransportBenchConfig {
            paths: vec![LOOPBACK.into()],
            ..small(XferOp::Read)
        })
        .unwrap()
        .to_string();
        let row = table.lines().nth(2).unwrap();
        assert!(row.starts_with(LOOPBACK) && row.ends_with(" -"), "{table}");
    }

    #[test]
    fn unknown_and_missing_paths_are_refused_before_allocating() {
        let e = transport_bench(&TransportBenchConfig {
            paths: vec![LOOPBACK.into(), "copy".into()],
            // Far more than this machine could allocate: refused first.
            total_bytes: 1 << 60,
            ..small(XferOp::Write)
        })
        .unwrap_err();
        assert!(
            matches!(&e, BenchError::UnknownPath { path } if path == "copy"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "invalid benchmark configuration: unknown path \"copy\"; known: memcpy, loopback, \
             nixl-ucx"
        );
        let e = transport_bench(&TransportBenchConfig {
            paths: Vec::new(),
            ..small(XferOp::Write)
        })
        .unwrap_err();
        assert!(matches!(e, BenchError::NoPaths), "{e:?}");
    }

    #[test]
    fn rejects_configurations_that_cannot_be_split() {
        for config in [
            TransportBenchConfig {
                descriptors: 0,
                ..small(XferOp::Write)
            },
            TransportBenchConfig {
                total_bytes: 1000,
                descriptors: 3,
                ..small(XferOp::Write)
            },
            TransportBenchConfig {
                iterations: 0,
                ..small(XferOp::Write)
            },
        ] {
            let e = transport_bench(&config).unwrap_err();
            assert!(matches!(e, BenchError::InvalidConfig(_)), "{e}");
        }
    }

    #[test]
    fn byte_counts_print_in_binary_units() {
        assert_eq!(human_bytes(1 << 30), "1 GiB");
        assert_eq!(human_bytes(262_144), "256 KiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(1_000_000), "976.56 KiB");
        assert_eq!(human_bytes(100), "100 B");
    }
}
