//! The scheduler side of a transfer, as vLLM 0.33.0's NIXL connector and
//! block manager decide it: how many tokens move, how many blocks each side
//! holds per group, and which decode blocks skip alloc-time zeroing.

use serde::{Deserialize, Serialize};

use crate::geometry::{Geometry, GroupKind};

/// How many attention blocks D holds when the READ starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum DecodeAllocation {
    /// `ceil(M / B_D)`: the load-time allocation of the mainline scheduler.
    Mainline,
    /// `ceil(N / B_D)`: D already holds the block of the recomputed last
    /// prompt token (the model of vLLM's own geometry tests).
    WithLastToken,
}

impl DecodeAllocation {
    pub fn as_str(self) -> &'static str {
        match self {
            DecodeAllocation::Mainline => "mainline",
            DecodeAllocation::WithLastToken => "with-last-token",
        }
    }
}

/// Block counts of one request on both engines.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RequestShape {
    pub prompt_len: u32,
    /// Tokens whose KV is transferred (M).
    pub transferred_tokens: u32,
    /// D's local prefix hit in tokens (a multiple of D's logical block).
    pub prefix_hit: u32,
    /// D's logical blocks per group, prefix-hit blocks included.
    pub decode_blocks: Vec<u32>,
    /// D's blocks per group that the transfer writes (and that therefore
    /// skip alloc-time zeroing): attention blocks after the prefix hit.
    pub decode_transfer_blocks: Vec<u32>,
    /// P's logical blocks per group.
    pub prefill_blocks: Vec<u32>,
}

/// Tokens loaded from P for a prompt of `prompt_len` tokens: hybrid models
/// stop one short so D recomputes the last token (and the SSM state advances
/// from h(N-1)).
pub fn transferred_tokens(geometry: &Geometry, prompt_len: u32) -> u32 {
    if geometry.model.has_mamba() && prompt_len > 1 {
        prompt_len - 1
    } else {
        prompt_len
    }
}

/// The request's block counts. Mamba groups hold one running-state slot.
pub fn request_shape(
    geometry: &Geometry,
    prompt_len: u32,
    prefix_hit: u32,
    allocation: DecodeAllocation,
) -> RequestShape {
    let m = transferred_tokens(geometry, prompt_len);
    let decode_tokens = match allocation {
        DecodeAllocation::Mainline => m,
        DecodeAllocation::WithLastToken => prompt_len,
    };
    let d_block = geometry.decode.logical_block;
    let p_block = geometry.prefill.logical_block;
    let hit_blocks = prefix_hit / d_block;
    let mut decode_blocks = Vec::new();
    let mut decode_transfer_blocks = Vec::new();
    let mut prefill_blocks = Vec::new();
    for kind in &geometry.model.groups {
        match kind {
            GroupKind::Attention => {
                let total = decode_tokens.div_ceil(d_block);
                decode_blocks.push(total);
                decode_transfer_blocks.push(total.saturating_sub(hit_blocks));
                prefill_blocks.push(m.div_ceil(p_block));
            }
            GroupKind::Mamba => {
                decode_blocks.push(1);
                decode_transfer_blocks.push(1);
                prefill_blocks.push(1);
            }
        }
    }
    RequestShape {
        prompt_len,
        transferred_tokens: m,
        prefix_hit,
        decode_blocks,
        decode_transfer_blocks,
        prefill_blocks,
    }
}
