//! Where the request's blocks sit among co-resident neighbours: a seeded
//! choice of distinct logical block ids out of each engine's pool.

use crate::geometry::Geometry;
use crate::layout::RequestBlocks;
use crate::scheduler::RequestShape;

/// Logical block ids of the request per group, on both engines, and the pool sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Decode's logical block ids of the request, per KV-cache group.
    pub decode: Vec<Vec<u32>>,
    /// Prefill's logical block ids of the request, per KV-cache group.
    pub prefill: Vec<Vec<u32>>,
    /// Logical blocks of decode's pool.
    pub decode_pool: u32,
    /// Logical blocks of prefill's pool.
    pub prefill_pool: u32,
}

impl Placement {
    /// The request's blocks as the layout model takes them, with decode's
    /// first `prefix_hit` tokens already held.
    pub fn request_blocks(&self, geometry: &Geometry, prefix_hit: u32) -> RequestBlocks {
        RequestBlocks::with_prefix_hit(
            &geometry.model,
            geometry.decode.logical_block,
            self.decode.clone(),
            self.prefill.clone(),
            prefix_hit,
        )
    }
}

/// Why the request does not fit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{engine}.num_logical_blocks = {pool} cannot hold the request's {needed} logical blocks at \
     {prompt_len} tokens; raise {engine}.num_logical_blocks to at least {needed}, leave it out to \
     size the pool from the request, or run shorter prompts"
)]
pub struct PlacementError {
    /// The prompt length that does not fit.
    pub prompt_len: u32,
    pub engine: &'static str,
    pub pool: u32,
    pub needed: u32,
}

/// A small deterministic generator (splitmix64).
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// The pool: the request's blocks plus about half as many neighbours (at least 8 blocks).
pub(crate) fn pool_size(fixed: Option<u32>, needed: u32) -> u32 {
    fixed.unwrap_or((needed + needed.div_ceil(2) + 2).max(8))
}

/// Pick `needed` distinct ids out of `pool` in a seeded order.
fn pick(rng: &mut SplitMix, pool: u32, needed: u32) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..pool).collect();
    for i in 0..needed as usize {
        let j = i + rng.below((ids.len() - i) as u64) as usize;
        ids.swap(i, j);
    }
    ids.truncate(needed as usize);
    ids
}

fn split(ids: Vec<u32>, counts: &[u32]) -> Vec<Vec<u32>> {
    let mut rest = ids.into_iter();
    counts
        .iter()
        .map(|&n| rest.by_ref().take(n as usize).collect())
        .collect()
}

/// Whether both engines' pools can hold the request (nothing allocated).
pub fn check_pools(geometry: &Geometry, shape: &RequestShape) -> Result<(), PlacementError> {
    let needed = |blocks: &[u32]| blocks.iter().fold(0u32, |a, &b| a.saturating_add(b));
    for (engine, fixed, needed) in [
        (
            "decode",
            geometry.decode.num_logical_blocks,
            needed(&shape.decode_blocks),
        ),
        (
            "prefill",
            geometry.prefill.num_logical_blocks,
            needed(&shape.prefill_blocks),
        ),
    ] {
        let pool = pool_size(fixed, needed);
        if needed > pool {
            return Err(PlacementError {
                prompt_len: shape.prompt_len,
                engine,
                pool,
                needed,
            });
        }
    }
    Ok(())
}

/// Place the request's blocks on both engines.
pub fn place(
    geometry: &Geometry,
    shape: &RequestShape,
    seed: u64,
) -> Result<Placement, PlacementError> {
    check_pools(geometry, shape)?;
    let mut rng = SplitMix::new(seed ^ 0x6B76_6765_6F6D);
    let d_needed: u32 = shape.decode_blocks.iter().sum();
    let p_needed: u32 = shape.prefill_blocks.iter().sum();
    let decode_pool = pool_size(geometry.decode.num_logical_blocks, d_needed);
    let prefill_pool = pool_size(geometry.prefill.num_logical_blocks, p_needed);
    let decode = split(pick(&mut rng, decode_pool, d_needed), &shape.decode_blocks);
    let prefill = split(
        pick(&mut rng, prefill_pool, p_needed),
        &shape.prefill_blocks,
    );
    Ok(Placement {
        decode,
        prefill,
        decode_pool,
        prefill_pool,
    })
}
