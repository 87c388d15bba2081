//! What one SGLang case takes, known before anything of its size is
//! allocated or written: every rank's KV regions and state tensors on both
//! engines (kvgeom writes each as an initial image, the driver allocates it
//! as SGLang's pools, and kvgeom reads it back to judge), with kvgeom's own
//! model of the state channels. Expressed as the same
//! [`MemoryEstimate`] and held to the same [`Budget`] as the other
//! connectors' cases. Pure arithmetic in 128 bits: an absurd geometry is
//! refused in microseconds.

use super::batch::{prepare, Prepared};
use super::layout::EnginePools;
use super::state::{StatePools, CONV_BYTES, TEMPORAL_BYTES};
use crate::scenario::memory_estimate::{Budget, EngineShare, MemoryEstimate};
use crate::scenario::Case;

/// Copies of every rank's pools a case holds at once: kvgeom's initial
/// images, the driver's pools, and the images kvgeom reads back to judge.
pub const COPIES: u64 = 3;

/// Bytes of kvgeom's model of one state channel (its identity).
const CHANNEL_BYTES: u128 = std::mem::size_of::<super::state::Channel>() as u128;

/// One rank's KV regions: every layer's K and V (or latent) over the pool's
/// pages and the padding page.
fn kv_rank_bytes(pools: &EnginePools) -> u128 {
    let heads = u128::from(pools.heads_per_rank());
    let head_sizes = match pools.kind {
        super::layout::PoolKind::Mla { latent } => u128::from(latent),
        super::layout::PoolKind::Mha {
            k_head_size,
            v_head_size,
            ..
        } => u128::from(k_head_size) + u128::from(v_head_size),
    };
    u128::from(pools.layers)
        * heads
        * head_sizes
        * u128::from(pools.dtype_bytes)
        * u128::from(pools.rows())
}

/// One rank's state tensors (every linear layer's conv and temporal, every
/// slot) and kvgeom's model of their channels.
fn state_rank_bytes(pools: &StatePools) -> u128 {
    let s = &pools.state;
    let f = |v: Option<u32>| u128::from(v.unwrap_or(0));
    let tp = u128::from(pools.attn_tp.max(1));
    let (heads, hd) = (f(s.num_heads), f(s.head_dim));
    // Channels and temporal elements of one layer, before TP (replicated
    // Mamba2 groups counted whole: an upper bound).
    let (channels, temporal) = match s.kind {
        crate::geometry::sglang_state::StateKind::Mamba2 => {
            let st = f(s.ssm_state_size);
            (heads * hd + 2 * f(s.n_groups) * st, heads * hd * st)
        }
        crate::geometry::sglang_state::StateKind::Gdn => {
            let v = f(s.num_v_heads) * f(s.head_v_dim);
            let hk = f(s.head_k_dim);
            (2 * f(s.num_k_heads) * hk + v, v * hk)
        }
        crate::geometry::sglang_state::StateKind::Kda => {
            let k = s.num_k_heads.map_or(heads, u128::from) * s.head_k_dim.map_or(hd, u128::from);
            (heads * hd + 2 * k, heads * hd * hd)
        }
    };
    let window = u128::from(s.conv_kernel.saturating_sub(1));
    let per_slot =
        channels * window * u128::from(CONV_BYTES) + temporal * u128::from(TEMPORAL_BYTES);
    let layers = s.layers.len() as u128;
    (layers * per_slot * u128::from(pools.slots)).div_ceil(tp) + layers * channels * CHANNEL_BYTES
}

/// The bytes `case` takes on SGLang, from its prepared pools: one copy of
/// each rank in the per-rank figures, [`COPIES`] of every rank in
/// [`MemoryEstimate::prepared_bytes`]'s sense (every rank is the driver's).
pub fn estimate(p: &Prepared) -> MemoryEstimate {
    let state = |i: usize| {
        p.state
            .as_ref()
            .map_or(0, |s| state_rank_bytes(if i == 0 { &s.0 } else { &s.1 }))
    };
    let share = |pools: &EnginePools, state: u128| EngineShare {
        rank_bytes: kv_rank_bytes(pools) + state,
        ranks: pools.attn_tp,
        pool: pools.num_pages,
    };
    // Every rank is the driver's: all of them are touched.
    MemoryEstimate::of_ranks(
        share(&p.prefill, state(0)),
        share(&p.decode, state(1)),
        p.prefill.attn_tp,
    )
}

/// A case that does not fit the budget.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{refusal}")]
pub struct CaseOverBudget {
    /// The bytes the case needs ([`COPIES`] of every rank's pools).
    pub need: u64,
    /// The budget in bytes.
    pub budget: u64,
    /// The refusal: the case, the bytes per rank, the budget and what to
    /// raise ([`MemoryEstimate::refusal_of`]).
    pub refusal: String,
}

/// Every case that SGLang's pools can hold fits `budget` ([`COPIES`] of
/// every rank's pools), or the refusal of the first that does not: the
/// case, the bytes per rank, the budget and what to raise. A case kvgeom
/// cannot model at all is left to the run, which reports it.
pub fn cases_fit(cases: &[Case], budget: &Budget) -> Result<(), CaseOverBudget> {
    for (i, case) in cases.iter().enumerate() {
        let Ok(p) = prepare(case, i) else { continue };
        let need = estimate(&p);
        let all = need.every_rank_bytes.saturating_mul(COPIES);
        if all > budget.bytes {
            let extra = all - need.every_rank_bytes;
            return Err(CaseOverBudget {
                need: all,
                budget: budget.bytes,
                refusal: need.refusal_of(
                    case,
                    true,
                    Some((
                        extra,
                        "for SGLang's pools in the driver and the images kvgeom writes and reads back",
                    )),
                    budget,
                ),
            });
        }
    }
    Ok(())
}
