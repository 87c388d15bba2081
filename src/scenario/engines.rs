//! Allocating both engines' KV memory and building their connector workers.

use crate::connector::{KvTensor, Worker, WorkerConfig};
use crate::defects::Defect;
use crate::geometry::{EngineGeometry, Geometry, Mode};
use crate::layout::Side;
use crate::memory::HostArena;
use crate::nixl::{MemKind, Nixl};

use super::case::Outcome;

/// One engine rank: its worker and its tensors (one per region).
pub struct Rank {
    pub worker: Worker,
    pub arenas: Vec<HostArena>,
}

/// Both engines of a case.
pub struct Engines {
    pub prefill: Vec<Rank>,
    pub decode: Vec<Rank>,
}

impl Engines {
    pub fn side(&self, side: Side) -> &[Rank] {
        match side {
            Side::Prefill => &self.prefill,
            Side::Decode => &self.decode,
        }
    }

    /// Region bases per rank of one side.
    pub fn bases(&self, side: Side) -> Vec<Vec<u64>> {
        self.side(side)
            .iter()
            .map(|r| r.arenas.iter().map(HostArena::base).collect())
            .collect()
    }
}

/// Host arenas of one rank: one per layer slot, `pool x unified page` bytes.
pub fn allocate(geometry: &Geometry, engine: &EngineGeometry, pool: u32) -> Vec<HostArena> {
    let len = u64::from(pool) * engine.unified_page_bytes(&geometry.model);
    (0..geometry.model.layer_slots)
        .map(|_| HostArena::new(len))
        .collect()
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
    defect: Option<Defect>,
) -> Result<Vec<Rank>, Outcome> {
    let engine = match side {
        Side::Prefill => &geometry.prefill,
        Side::Decode => &geometry.decode,
    };
    let mut ranks = Vec::new();
    for (rank, arenas) in arenas_per_rank.into_iter().enumerate() {
        let cfg = WorkerConfig {
            engine_id: side.as_str().to_string(),
            agent_name: side.agent_name(rank as u32),
            model: geometry.model.clone(),
            engine: engine.clone(),
            num_logical_blocks: pool,
            tp_rank: rank as u32,
            mode,
            is_decode: side == Side::Decode,
            mem: MemKind::Dram,
            platform_mem: MemKind::Dram,
            device: 0,
            defect,
        };
        let tensors: Vec<KvTensor> = arenas
            .iter()
            .map(|a| KvTensor {
                base: a.base(),
                len: a.len(),
            })
            .collect();
        let worker = Worker::register(nixl, cfg, &tensors).map_err(|e| Outcome::Error {
            message: format!("registering {side} rank {rank}: {e}"),
        })?;
        ranks.push(Rank { worker, arenas });
    }
    Ok(ranks)
}
