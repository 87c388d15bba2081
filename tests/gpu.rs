//! GPU checks: device buffers, the receive post-process as GPU work against
//! the host post-process byte for byte, the loopback transport moving VRAM,
//! sweep cases on VRAM (loopback, and real NIXL with feature `nixl`)
//! against the same cases on host memory, and the VRAM benchmark's own
//! byte checks.
//!
//! Needs kvgeom built with `--features cuda` and a CUDA driver with a
//! device; otherwise every case prints `skipped: <reason>` (the driver
//! check itself runs only where no driver is present). Cases run one after
//! another on the main thread, so this file has its own `main`; arguments
//! select cases by name as with libtest:
//! `cargo test --features cuda --test gpu -- post_process`, and
//! `--skip NAME` leaves cases out (what `scripts/gpu-check.sh` runs in two
//! parts). Cases run in the order of what they prove, the sweeps last.

mod support;

use support::harness;

use std::process::ExitCode;

use harness::Verdict;

type Check = fn() -> Verdict;

#[cfg(feature = "cuda")]
mod checks {
    use super::Verdict;
    use std::path::PathBuf;

    use kvgeom::bench::vram::{vram_bench, VramBenchConfig};
    use kvgeom::connector::post_process::{apply_bytes, GroupPostProcess, PageGeometry, PostOp};
    use kvgeom::connector::KvMemory;
    use kvgeom::defects::Defect;
    use kvgeom::geometry::KvLayout;
    use kvgeom::memory::cuda::driver_present;
    use kvgeom::memory::{CudaDevice, CudaError, DeviceArena, HostArena, HostTensors};
    use kvgeom::nixl::{
        DescList, DescRow, DlistTarget, Loopback, MemKind, Nixl, XferOp, XferState,
    };
    use kvgeom::scenario::{DeviceTensors, MemoryKind, RunOptions, TransportKind};
    use kvgeom::sweep::{compare, execute, plan};

    /// Where `geometries/` is: `KVGEOM_ROOT` (set by `scripts/gpu-check.sh
    /// run` for a packed binary), else this checkout.
    fn root() -> PathBuf {
        std::env::var_os("KVGEOM_ROOT")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
    }

    /// The device, or why the check cannot run.
    fn device() -> Result<CudaDevice, Verdict> {
        CudaDevice::open(0).map_err(|e| Verdict::Skipped(e.to_string()))
    }

    macro_rules! ensure {
        ($cond:expr, $($why:tt)+) => {
            if !$cond {
                return Verdict::Failed(format!($($why)+));
            }
        };
    }

    macro_rules! attempt {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(e) => return Verdict::Failed(format!("{}: {e}", stringify!($e))),
            }
        };
    }

    pub fn driver_missing_is_a_typed_error() -> Verdict {
        if driver_present() {
            return Verdict::Skipped("a CUDA driver is present; the other checks use it".into());
        }
        match CudaDevice::open(0) {
            Err(CudaError::DriverMissing) => Verdict::Passed,
            other => Verdict::Failed(format!("expected DriverMissing, got {other:?}")),
        }
    }

    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| 1 + ((i * 7 + usize::from(seed) * 31) % 251) as u8)
            .collect()
    }

    pub fn device_buffers_round_trip() -> Verdict {
        let device = match device() {
            Ok(d) => d,
            Err(v) => return v,
        };
        let a = attempt!(device.alloc(4096));
        ensure!(
            attempt!(a.snapshot()) == vec![0u8; 4096],
            "a new buffer is not zeroed"
        );
        let data = bytes(4096, 1);
        attempt!(a.write(0, &data));
        ensure!(
            attempt!(a.snapshot()) == data,
            "upload then read-back differs"
        );
        attempt!(a.fill(100, 50, 0xAA));
        let mut expected = data.clone();
        expected[100..150].fill(0xAA);
        ensure!(attempt!(a.snapshot()) == expected, "fill of 100+50 differs");
        // Copies between buffers and within one buffer (overlapping: memmove).
        let b = attempt!(device.alloc(4096));
        let mut q = device.queue();
        attempt!(q.copy(&a, 0, &b, 1000, 2000));
        attempt!(q.copy(&a, 10, &a, 20, 100));
        attempt!(q.zero(&b, 0, 10));
        attempt!(q.finish());
        let mut expect_a = expected.clone();
        expect_a.copy_within(10..110, 20);
        let mut expect_b = vec![0u8; 4096];
        expect_b[1000..3000].copy_from_slice(&expected[..2000]);
        ensure!(
            attempt!(a.snapshot()) == expect_a,
            "overlapping copy is not a memmove"
        );
        ensure!(
            attempt!(b.snapshot()) == expect_b,
            "device-to-device copy differs"
        );
        // Out of range is a typed error, nothing is written.
        match a.write(4000, &[1; 200]) {
            Err(CudaError::OutOfRange {
                offset: 4000,
                len: 200,
                size: 4096,
                ..
            }) => {}
            other => return Verdict::Failed(format!("expected OutOfRange, got {other:?}")),
        }
        match device.queue().copy(&a, 4090, &b, 0, 10) {
            Err(CudaError::OutOfRange { .. }) => {}
            other => return Verdict::Failed(format!("expected OutOfRange, got {other:?}")),
        }
        ensure!(
            attempt!(a.snapshot()) == expect_a,
            "a refused write changed bytes"
        );
        ensure!(
            device.alloc(0).unwrap_err() == CudaError::EmptyAllocation,
            "an empty allocation must be refused"
        );
        Verdict::Passed
    }

    fn page(heads: u64, tokens: u64, c: u64, pad: u64, layout: KvLayout) -> PageGeometry {
        let block_len = heads * tokens * c + pad;
        PageGeometry {
            block_len,
            block_stride: block_len + 5,
            tokens,
            heads,
            head_token_bytes: c,
            layout,
        }
    }

    pub fn post_process_on_device_matches_host() -> Verdict {
        let device = match device() {
            Ok(d) => d,
            Err(v) => return v,
        };
        let mut cases = 0;
        for layout in [KvLayout::Hnd, KvLayout::Nhd] {
            for (heads, tokens, c, pad) in
                [(1, 4, 2, 0), (2, 8, 3, 0), (3, 8, 1, 5), (8, 64, 16, 0)]
            {
                for ratio in [1u32, 2, 3, 4] {
                    let g = page(heads, tokens, c, pad, layout);
                    let sub = (tokens / u64::from(ratio)) as u32;
                    let plans = vec![
                        GroupPostProcess {
                            group: 0,
                            block_ids: vec![4, 1, 2],
                            covered_sub_blocks: 0,
                            first_covered_sub_block: 0,
                            ratio,
                            needs_block_ids: true,
                            ops: vec![
                                PostOp::ConvertBlockSize { block: 4, ratio },
                                PostOp::ConvertBlockSize { block: 1, ratio },
                                PostOp::ZeroTokens {
                                    block: 1,
                                    from_token: sub,
                                },
                                PostOp::ZeroBlock { block: 2 },
                                PostOp::ZeroBlock { block: 3 },
                            ],
                        },
                        GroupPostProcess {
                            group: 2,
                            block_ids: vec![5],
                            covered_sub_blocks: 0,
                            first_covered_sub_block: 0,
                            ratio,
                            needs_block_ids: false,
                            ops: vec![PostOp::ZeroTokens {
                                block: 5,
                                from_token: 1,
                            }],
                        },
                    ];
                    let geometries = vec![g; 3];
                    let len = g.block_stride * 7;
                    let images: Vec<Vec<u8>> =
                        (0..3).map(|r| bytes(len as usize, 10 + r as u8)).collect();
                    // Host: byte access.
                    let host: Vec<HostArena> = images
                        .iter()
                        .map(|img| {
                            let a = HostArena::new(len);
                            a.write().copy_from_slice(img);
                            a
                        })
                        .collect();
                    apply_bytes(&plans, &geometries, &mut HostTensors(host.clone()));
                    // Device: the same input, the post-process as GPU work.
                    let arenas: Vec<DeviceArena> = attempt!(images
                        .iter()
                        .map(|img| device.alloc(len).and_then(|a| a.write(0, img).map(|()| a)))
                        .collect::<Result<Vec<_>, _>>());
                    let mut tensors = DeviceTensors::new(arenas.clone());
                    tensors.post_process(&plans, &geometries);
                    if let Some(e) = tensors.error() {
                        return Verdict::Failed(format!("device post-process: {e}"));
                    }
                    for (r, (h, d)) in host.iter().zip(&arenas).enumerate() {
                        let (h, d) = (h.snapshot(), attempt!(d.snapshot()));
                        if let Some(at) = h.iter().zip(&d).position(|(x, y)| x != y) {
                            return Verdict::Failed(format!(
                                "{g:?} ratio {ratio} region {r}: byte {at} is {} on the device, \
                                 {} on the host",
                                d[at], h[at]
                            ));
                        }
                    }
                    cases += 1;
                }
            }
        }
        ensure!(cases == 32, "ran {cases} of 32 geometries");
        Verdict::Passed
    }

    pub fn loopback_moves_device_bytes() -> Verdict {
        moves_device_bytes(
            &mut |arenas| {
                let mut t = Loopback::new();
                for a in arenas {
                    t.attach_device(a.clone());
                }
                Ok(Box::new(t))
            },
            false,
        )
    }

    /// Real NIXL on VRAM at its smallest: two agents, one buffer each,
    /// eight descriptors READ and WRITE with reversed ids. Everything after
    /// this check (the benchmark, the sweeps) needs what it shows.
    #[cfg(feature = "nixl")]
    pub fn nixl_moves_device_bytes() -> Verdict {
        if let Err(e) = kvgeom::nixl::real::RealNixl::new() {
            return Verdict::Skipped(e.to_string());
        }
        moves_device_bytes(
            &mut |arenas| {
                let mut t = kvgeom::nixl::real::RealNixl::new()?;
                for a in arenas {
                    t.attach_device(a.clone());
                }
                Ok(Box::new(t))
            },
            true,
        )
    }

    type MakeTransport<'a> =
        dyn FnMut(&[DeviceArena]) -> Result<Box<dyn Nixl>, kvgeom::nixl::NixlError> + 'a;

    /// Move eight 256-byte device blocks with reversed ids, READ and WRITE,
    /// through the transport `make` builds over the two buffers; `patient`:
    /// the transport completes in the background (poll, within the stall
    /// limit), else the post must finish the copies.
    fn moves_device_bytes(make: &mut MakeTransport<'_>, patient: bool) -> Verdict {
        let device = match device() {
            Ok(d) => d,
            Err(v) => return v,
        };
        let limit = attempt!(kvgeom::time_limits::stall_limit());
        for op in [XferOp::Read, XferOp::Write] {
            let src_bytes = bytes(8 * 256, 3);
            let (pa, da) = (
                attempt!(device.alloc(8 * 256)),
                attempt!(device.alloc(8 * 256)),
            );
            let (initiator_mem, remote_mem) = match op {
                XferOp::Read => (&da, &pa),
                XferOp::Write => (&pa, &da),
            };
            attempt!(pa.write(0, &src_bytes));
            let mut t = attempt!(make(&[pa.clone(), da.clone()]));
            let me = attempt!(t.create_agent("me"));
            let peer = attempt!(t.create_agent("peer"));
            attempt!(t.register_memory(me, &[initiator_mem.region()]));
            attempt!(t.register_memory(peer, &[remote_mem.region()]));
            let md = attempt!(t.local_metadata(peer));
            let name = attempt!(t.add_remote_agent(me, &md));
            let rows = |a: &DeviceArena| {
                DescList::from_rows((0..8).map(|i| DescRow {
                    addr: a.base() + i * 256,
                    len: 256,
                    dev: 0,
                }))
            };
            let l = attempt!(t.prepare_dlist(
                me,
                &DlistTarget::Local,
                MemKind::Vram,
                &rows(initiator_mem)
            ));
            let r = attempt!(t.prepare_dlist(
                me,
                &DlistTarget::Remote(name),
                MemKind::Vram,
                &rows(remote_mem)
            ));
            let local_ids: Vec<u32> = (0..8).collect();
            let remote_ids: Vec<u32> = (0..8).rev().collect();
            let x = attempt!(t.make_xfer(me, op, l, &local_ids, r, &remote_ids, None));
            let mut state = attempt!(t.post_xfer(me, x));
            if !patient {
                ensure!(state == XferState::Done, "post must finish the copies");
            }
            let started = std::time::Instant::now();
            while state != XferState::Done {
                ensure!(
                    started.elapsed() < limit,
                    "{op:?}: not done after {} s",
                    limit.as_secs_f64()
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
                state = attempt!(t.xfer_state(me, x));
            }
            attempt!(t.release_xfer(me, x));
            // Decode block 7 - i holds prefill block i either way.
            let d = attempt!(da.snapshot());
            for i in 0..8usize {
                let j = 7 - i;
                ensure!(
                    d[j * 256..(j + 1) * 256] == src_bytes[i * 256..(i + 1) * 256],
                    "{op:?}: block {j} does not hold source block {i}"
                );
            }
            // A descriptor outside every device buffer is refused at prepare.
            let stray = DescList::from_rows([DescRow {
                addr: pa.base() + 2000,
                len: 100,
                dev: 0,
            }]);
            match t.prepare_dlist(me, &DlistTarget::Local, MemKind::Vram, &stray) {
                Err(kvgeom::nixl::NixlError::NotFound(_)) => {}
                other => return Verdict::Failed(format!("expected NotFound, got {other:?}")),
            }
        }
        Verdict::Passed
    }

    fn sweep_matches_host(transport: TransportKind, prompts: Vec<u32>, defects: bool) -> Verdict {
        if let Err(v) = device() {
            return v;
        }
        // The synthetic geometries (geometries/*.toml): the real-scale pairs
        // under geometries/models/ would not fit the device check's budget.
        let mut files: Vec<PathBuf> = attempt!(std::fs::read_dir(root().join("geometries")))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        files.sort();
        let sources = attempt!(plan::load_sources(&files));
        let mut cases = plan::grid(
            &sources,
            &plan::PlanOptions {
                prompts: Some(prompts.clone()),
                ..plan::PlanOptions::default()
            },
        );
        if defects {
            let g1_to_g4: Vec<_> = sources
                .iter()
                .filter(|s| {
                    ["g1-", "g2-", "g3-", "g4-"]
                        .iter()
                        .any(|p| s.geometry.name.starts_with(p))
                })
                .cloned()
                .collect();
            for d in Defect::ALL {
                cases.extend(plan::grid(
                    &g1_to_g4,
                    &plan::PlanOptions {
                        prompts: Some(prompts.clone()),
                        variant: kvgeom::variant::Variant::Defect(d),
                        ..plan::PlanOptions::default()
                    },
                ));
            }
        }
        let vram = RunOptions {
            transport,
            memory: MemoryKind::Vram,
            policy: None,
            device_platform: false,
        };
        let on_device = execute::run_all(&cases, &vram, None);
        if let Some(r) = on_device
            .iter()
            .find(|r| matches!(r.outcome, kvgeom::scenario::Outcome::Error { .. }))
        {
            return Verdict::Failed(format!(
                "{}: {}",
                r.case.replay_command(),
                r.outcome.describe()
            ));
        }
        let on_host = execute::run_all(&cases, &RunOptions::default(), None);
        let mismatches = compare::compare(&on_device, &on_host);
        match mismatches.first() {
            None => Verdict::Passed,
            Some(m) => Verdict::Failed(format!(
                "{} of {} cases differ; first: {m}",
                mismatches.len(),
                cases.len()
            )),
        }
    }

    pub fn vram_loopback_sweep_matches_host() -> Verdict {
        sweep_matches_host(
            TransportKind::Loopback,
            vec![2, 5, 9, 13, 29, 64, 65, 769],
            true,
        )
    }

    #[cfg(feature = "nixl")]
    pub fn vram_nixl_sweep_matches_host() -> Verdict {
        if let Err(e) = kvgeom::nixl::real::RealNixl::new() {
            return Verdict::Skipped(e.to_string());
        }
        sweep_matches_host(TransportKind::Nixl, vec![5, 29], false)
    }

    pub fn vram_bench_checks_its_bytes() -> Verdict {
        if let Err(v) = device() {
            return v;
        }
        for op in [XferOp::Read, XferOp::Write] {
            let config = VramBenchConfig {
                geometry: root().join("geometries/g6-kimi-linear-scale.toml"),
                prompt_len: 6529,
                iterations: 2,
                memory: MemoryKind::Vram,
                op,
                peer_exe: None,
                paths: ["copy", "copy-per-pair", "loopback"]
                    .iter()
                    .map(|p| p.to_string())
                    .collect(),
            };
            let report = attempt!(vram_bench(&config));
            ensure!(report.results.len() == 3, "{op:?}: {report}");
        }
        Verdict::Passed
    }
}

#[cfg(not(feature = "cuda"))]
mod checks {
    use super::Verdict;

    fn no_cuda() -> Verdict {
        Verdict::Skipped(
            "built without the `cuda` feature (cargo test --features cuda --test gpu)".into(),
        )
    }

    pub fn driver_missing_is_a_typed_error() -> Verdict {
        no_cuda()
    }
    pub fn device_buffers_round_trip() -> Verdict {
        no_cuda()
    }
    pub fn post_process_on_device_matches_host() -> Verdict {
        no_cuda()
    }
    pub fn loopback_moves_device_bytes() -> Verdict {
        no_cuda()
    }
    pub fn vram_loopback_sweep_matches_host() -> Verdict {
        no_cuda()
    }
    pub fn vram_bench_checks_its_bytes() -> Verdict {
        no_cuda()
    }
}

#[cfg(all(feature = "cuda", feature = "nixl"))]
fn nixl_moves_device_bytes() -> Verdict {
    checks::nixl_moves_device_bytes()
}

#[cfg(not(all(feature = "cuda", feature = "nixl")))]
fn nixl_moves_device_bytes() -> Verdict {
    Verdict::Skipped("built without the `cuda` and `nixl` features".into())
}

#[cfg(all(feature = "cuda", feature = "nixl"))]
fn vram_nixl_sweep_matches_host() -> Verdict {
    checks::vram_nixl_sweep_matches_host()
}

#[cfg(not(all(feature = "cuda", feature = "nixl")))]
fn vram_nixl_sweep_matches_host() -> Verdict {
    Verdict::Skipped("built without the `cuda` and `nixl` features".into())
}

fn main() -> ExitCode {
    // In the order of what each proves: the device answers, its buffers
    // hold bytes, the post-process and the loopback work on them, real
    // NIXL moves VRAM at all, the benchmark checks its bytes; then the
    // sweeps, the largest (real NIXL, one case after another) last.
    let cases: [(&str, Check); 8] = [
        (
            "driver_missing_is_a_typed_error",
            checks::driver_missing_is_a_typed_error,
        ),
        (
            "device_buffers_round_trip",
            checks::device_buffers_round_trip,
        ),
        (
            "post_process_on_device_matches_host",
            checks::post_process_on_device_matches_host,
        ),
        (
            "loopback_moves_device_bytes",
            checks::loopback_moves_device_bytes,
        ),
        ("nixl_moves_device_bytes", nixl_moves_device_bytes),
        (
            "vram_bench_checks_its_bytes",
            checks::vram_bench_checks_its_bytes,
        ),
        (
            "vram_loopback_sweep_matches_host",
            checks::vram_loopback_sweep_matches_host,
        ),
        ("vram_nixl_sweep_matches_host", vram_nixl_sweep_matches_host),
    ];
    harness::run(
        cases
            .into_iter()
            .map(|(name, check)| {
                (
                    name.to_string(),
                    Box::new(check) as Box<dyn FnOnce() -> Verdict>,
                )
            })
            .collect(),
    )
}
