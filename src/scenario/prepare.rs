//! A case's memory prepared whole before a connector kvgeom does not run in
//! process touches it (vLLM's driver reads these images): the same shape,
//! placement, allocation, provenance pattern, neighbours and alloc-time
//! zeroing as kvgeom's own run of the case (`run.rs`), every rank filled.

use crate::layout::{CaseLayout, RequestBlocks};
use crate::memory::HostArena;
use crate::pattern::{self, DecodeFill};
use crate::scheduler::RequestShape;

use super::case::{Case, Outcome};
use super::engines::allocate_ranks;
use super::placement::Placement;
use super::run::{computed_blocks, shape_and_place, zero_decode_at_allocation};

/// A case's memory as kvgeom's scenario prepares it.
pub struct PreparedMemory {
    /// The harness's model of both engines' memory.
    pub layout: CaseLayout,
    /// The request's shape.
    pub shape: RequestShape,
    /// Its blocks on each engine.
    pub placement: Placement,
    /// The request's blocks per group, and those the transfer fills.
    pub blocks: RequestBlocks,
    /// Decode's prefix-hit blocks per group.
    pub computed_blocks: Vec<u32>,
    /// Arena bases `[rank][region]` per side: prefill, decode.
    pub bases: [Vec<Vec<u64>>; 2],
    /// Initial images `[rank][region]` per side.
    pub before: [Vec<Vec<Vec<u8>>>; 2],
}

/// Shape, placement, allocation, provenance pattern, neighbours and
/// alloc-time zeroing of every rank of `case`.
pub fn prepare_memory(case: &Case) -> Result<PreparedMemory, Outcome> {
    let (shape, placement) = shape_and_place(case)?;
    prepare_placed_memory(case, shape, placement)
}

/// [`prepare_memory`] for a request already placed: the blocks a connector
/// under test said the request holds on each engine.
pub fn prepare_placed_memory(
    case: &Case,
    shape: RequestShape,
    placement: Placement,
) -> Result<PreparedMemory, Outcome> {
    let geometry = &case.geometry;
    let (p_arenas, d_arenas) = allocate_ranks(geometry, &placement).map_err(Outcome::error)?;
    let bases = |a: &[Vec<HostArena>]| -> Vec<Vec<u64>> {
        a.iter()
            .map(|r| r.iter().map(HostArena::base).collect())
            .collect()
    };
    let blocks = placement.request_blocks(geometry, case.prefix_hit);
    let layout = CaseLayout::from_bases(
        (**geometry).clone(),
        case.mode,
        blocks.clone(),
        bases(&d_arenas),
        placement.decode_pool,
        bases(&p_arenas),
        placement.prefill_pool,
    )
    .map_err(|e| Outcome::Error {
        message: format!("layout model: {e}"),
    })?;
    for (rank, arenas) in p_arenas.iter().enumerate() {
        pattern::fill_prefill_arenas(&layout, rank as u32, arenas).map_err(|e| Outcome::Error {
            message: e.to_string(),
        })?;
    }
    for (rank, arenas) in d_arenas.iter().enumerate() {
        pattern::fill_decode_arenas(
            &layout,
            rank as u32,
            arenas,
            DecodeFill::SentinelWithNeighbours,
        )
        .map_err(|e| Outcome::Error {
            message: e.to_string(),
        })?;
    }
    let decode: Vec<&[HostArena]> = d_arenas.iter().map(Vec::as_slice).collect();
    zero_decode_at_allocation(&decode, geometry, &shape, &placement);
    let images = |a: &[Vec<HostArena>]| -> Vec<Vec<Vec<u8>>> {
        a.iter()
            .map(|r| r.iter().map(HostArena::snapshot).collect())
            .collect()
    };
    let computed_blocks = computed_blocks(&blocks);
    Ok(PreparedMemory {
        layout,
        computed_blocks,
        bases: [bases(&p_arenas), bases(&d_arenas)],
        before: [images(&p_arenas), images(&d_arenas)],
        shape,
        placement,
        blocks,
    })
}
