//! Allocating both engines' KV memory and building their connector workers.

use crate::connector::{ConnectorError, KvTensor, Policy, Role, Worker, WorkerConfig};
use crate::geometry::{EngineGeometry, Geometry, Mode};
use crate::layout::Side;
use crate::memory::{AllocError, HostArena};
use crate::nixl::{MemKind, Nixl};

use super::case::Outcome;
use super::error::{AllocationError, VramError};
use super::placement::Placement;
use super::vram::{RankDevice, RankMemory, DEVICE_ORDINAL};

/// One engine rank: its worker and its tensors (one per region).
pub struct Rank {
    pub worker: Worker,
    pub arenas: Vec<HostArena>,
    /// With `--memory vram`: the device tensors the connector registered;
    /// `arenas` then hold host images of them.
    pub device: Option<RankDevice>,
}

/// The memory one rank registers: its host arenas, or (with `--memory
/// vram`) device tensors that the host arenas mirror.
pub struct RankTensors {
    pub host: Vec<HostArena>,
    pub device: Option<RankDevice>,
}

impl RankTensors {
    /// Pair each rank's host arenas with its device tensors, if any.
    pub fn per_rank(host: Vec<Vec<HostArena>>, device: Option<Vec<RankDevice>>) -> Vec<Self> {
        let mut device = device.map(Vec::into_iter);
        host.into_iter()
            .map(|host| RankTensors {
                host,
                device: device.as_mut().and_then(Iterator::next),
            })
            .collect()
    }
}

/// Both engines of a case.
pub struct Engines {
    pub prefill: Vec<Rank>,
    pub decode: Vec<Rank>,
}

impl Rank {
    /// The memory this rank's receive post-process runs on.
    pub fn memory(&self) -> RankMemory {
        RankMemory::new(&self.arenas, self.device.as_ref())
    }
}

impl Engines {
    /// Copy every rank's host images up to its device tensors (no-op on host memory).
    pub fn upload_to_devices(&self) -> Result<(), VramError> {
        self.each_device(RankDevice::upload)
    }

    /// Read every rank's device tensors back into its host images (no-op on host memory).
    pub fn download_from_devices(&self) -> Result<(), VramError> {
        self.each_device(RankDevice::download)
    }

    /// Run every arena's pending initial fill (before something that
    /// bypasses the arenas, such as real NIXL, uses their addresses).
    pub fn settle_all(&self) {
        for rank in self.prefill.iter().chain(&self.decode) {
            rank.arenas.iter().for_each(HostArena::settle);
        }
    }

    fn each_device(
        &self,
        f: impl Fn(&RankDevice, &[HostArena]) -> Result<(), VramError>,
    ) -> Result<(), VramError> {
        for rank in self.prefill.iter().chain(&self.decode) {
            if let Some(device) = &rank.device {
                f(device, &rank.arenas)?;
            }
        }
        Ok(())
    }

    pub fn side(&self, side: Side) -> &[Rank] {
        match side {
            Side::Prefill => &self.prefill,
            Side::Decode => &self.decode,
        }
    }

    pub fn side_mut(&mut self, side: Side) -> &mut [Rank] {
        match side {
            Side::Prefill => &mut self.prefill,
            Side::Decode => &mut self.decode,
        }
    }

    /// Region bases per rank of one side.
    pub fn bases(&self, side: Side) -> Vec<Vec<u64>> {
        self.side(side)
            .iter()
            .map(|r| match &r.device {
                Some(d) => d.tensors().iter().map(|&(base, _)| base).collect(),
                None => r.arenas.iter().map(HostArena::base).collect(),
            })
            .collect()
    }
}

/// Host arenas of every rank, `(prefill, decode)`: `[rank][region]`.
pub type BothSides = (Vec<Vec<HostArena>>, Vec<Vec<HostArena>>);

/// Host arenas of one rank: one per layer slot, `pool x unified page` bytes.
pub fn allocate(
    geometry: &Geometry,
    engine: &EngineGeometry,
    pool: u32,
) -> Result<Vec<HostArena>, AllocError> {
    let len = u64::from(pool).saturating_mul(engine.unified_page_bytes(&geometry.model));
    (0..geometry.model.layer_slots)
        .map(|_| HostArena::try_new(len))
        .collect()
}

/// Host arenas of every rank of both engines, `(prefill, decode)`, sized
/// for the placement's pools.
pub fn allocate_ranks(
    geometry: &Geometry,
    placement: &Placement,
) -> Result<BothSides, AllocationError> {
    allocate_ranks_touched(geometry, placement, None)
}

/// [`allocate_ranks`], where the prefill ranks outside `touched_prefill`
/// (when given) get [`HostArena::unbacked`] arenas: addresses and sizes to
/// register, and no memory.
pub fn allocate_ranks_touched(
    geometry: &Geometry,
    placement: &Placement,
    touched_prefill: Option<&[u32]>,
) -> Result<BothSides, AllocationError> {
    let side = |side: Side,
                engine: &EngineGeometry,
                pool: u32,
                touched: Option<&[u32]>|
     -> Result<Vec<Vec<HostArena>>, AllocationError> {
        (0..engine.tp_size)
            .map(|rank| {
                if touched.is_some_and(|t| !t.contains(&rank)) {
                    let len =
                        u64::from(pool).saturating_mul(engine.unified_page_bytes(&geometry.model));
                    return Ok((0..geometry.model.layer_slots)
                        .map(|_| HostArena::unbacked(len))
                        .collect());
                }
                allocate(geometry, engine, pool).map_err(|source| AllocationError {
                    side,
                    rank,
                    source,
                })
            })
            .collect()
    };
    Ok((
        side(
            Side::Prefill,
            &geometry.prefill,
            placement.prefill_pool,
            touched_prefill,
        )?,
        side(Side::Decode, &geometry.decode, placement.decode_pool, None)?,
    ))
}

/// Every rank's arenas as [`HostArena::unbacked`] addresses and sizes, for
/// planning over a transport that moves no bytes (`DryRun`).
pub fn unbacked_ranks(geometry: &Geometry, placement: &Placement) -> BothSides {
    let side = |engine: &EngineGeometry, pool: u32| -> Vec<Vec<HostArena>> {
        let len = u64::from(pool).saturating_mul(engine.unified_page_bytes(&geometry.model));
        (0..engine.tp_size)
            .map(|_| {
                (0..geometry.model.layer_slots)
                    .map(|_| HostArena::unbacked(len))
                    .collect()
            })
            .collect()
    };
    (
        side(&geometry.prefill, placement.prefill_pool),
        side(&geometry.decode, placement.decode_pool),
    )
}

/// Configure and register every rank of one side.
#[allow(clippy::too_many_arguments)]
pub fn register_side(
    nixl: &mut dyn Nixl,
    geometry: &Geometry,
    side: Side,
    mode: Mode,
    pool: u32,
    arenas_per_rank: Vec<Vec<HostArena>>,
    policy: Policy,
) -> Result<Vec<Rank>, Outcome> {
    let ranks = RankTensors::per_rank(arenas_per_rank, None);
    register_side_on(nixl, geometry, side, mode, pool, ranks, policy, None)
}

/// [`register_side`] where a rank may keep its tensors on a device (its
/// device buffers are registered as VRAM instead of its host arenas), with
/// the platform's memory type given (`None`: the type of each rank's own
/// memory).
#[allow(clippy::too_many_arguments)]
pub fn register_side_on(
    nixl: &mut dyn Nixl,
    geometry: &Geometry,
    side: Side,
    mode: Mode,
    pool: u32,
    ranks_memory: Vec<RankTensors>,
    policy: Policy,
    platform: Option<MemKind>,
) -> Result<Vec<Rank>, Outcome> {
    let engine = match side {
        Side::Prefill => &geometry.prefill,
        Side::Decode => &geometry.decode,
    };
    let mut ranks = Vec::new();
    for (
        rank,
        RankTensors {
            host: arenas,
            device,
        },
    ) in ranks_memory.into_iter().enumerate()
    {
        let mem = match device {
            Some(_) => MemKind::Vram,
            None => MemKind::Dram,
        };
        let cfg = WorkerConfig {
            engine_id: side.as_str().to_string(),
            agent_name: side.agent_name(rank as u32),
            model: geometry.model.clone(),
            engine: engine.clone(),
            num_logical_blocks: pool,
            tp_rank: rank as u32,
            role: Role::new(mode, side == Side::Decode),
            mem,
            platform_mem: platform.unwrap_or(mem),
            device: DEVICE_ORDINAL,
            policy,
            compat_factors: Some(
                geometry
                    .handshake
                    .of(side.engine())
                    .factors(&geometry.model),
            ),
            enforce_compat: geometry.handshake.enforce,
        };
        let tensors: Vec<KvTensor> = match &device {
            Some(d) => d
                .tensors()
                .into_iter()
                .map(|(base, len)| KvTensor { base, len })
                .collect(),
            None => arenas
                .iter()
                .map(|a| KvTensor {
                    base: a.base(),
                    len: a.len(),
                })
                .collect(),
        };
        let worker = Worker::register(nixl, cfg, &tensors).map_err(|e| match e {
            // The connector refuses the tensors where vLLM's registration raises.
            ConnectorError::Registration(why) => Outcome::Crashed {
                side,
                message: format!("{side} rank {rank}: {why}"),
            },
            other => Outcome::Error {
                message: format!("registering {side} rank {rank}: {other}"),
            },
        })?;
        ranks.push(Rank {
            worker,
            arenas,
            device,
        });
    }
    Ok(ranks)
}
