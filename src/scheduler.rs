//! The harness's model of vLLM 0.33.0's scheduler side of a transfer, as its
//! NIXL connector and block manager decide it: how many tokens move, how
//! many blocks each side holds per group, and which decode blocks skip
//! alloc-time zeroing. The connector workers never use it; scenarios,
//! sweeps, traces and benchmarks do.

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
    /// `mainline` or `with-last-token`, as the command line spells it.
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
    /// The prompt length N, in tokens.
    pub prompt_len: u32,
    /// Tokens whose KV is transferred (M).
    pub transferred_tokens: u32,
    /// D's local prefix hit in tokens (a multiple of D's logical block).
    pub prefix_hit: u32,
    /// D's logical blocks per group, prefix-hit blocks included.
    pub decode_blocks: Vec<u32>,
    /// D's blocks per group that the transfer writes: blocks after the prefix hit.
    pub decode_transfer_blocks: Vec<u32>,
    /// Of those, how many skip alloc-time zeroing (the scheduler must not
    /// race the transfer): attention blocks covering tokens below M, and
    /// every mamba slot (mamba managers never zero). The rest (a block held
    /// only for the recomputed last token) is zeroed at allocation.
    pub decode_unzeroed_blocks: Vec<u32>,
    /// P's logical blocks per group.
    pub prefill_blocks: Vec<u32>,
}

/// The request's block counts. Mamba groups hold one running-state slot.
pub fn request_shape(
    geometry: &Geometry,
    prompt_len: u32,
    prefix_hit: u32,
    allocation: DecodeAllocation,
) -> RequestShape {
    let m = geometry.transferred_tokens(prompt_len);
    let decode_tokens = match allocation {
        DecodeAllocation::Mainline => m,
        DecodeAllocation::WithLastToken => prompt_len,
    };
    let d_block = geometry.decode.logical_block;
    let p_block = geometry.prefill.logical_block;
    let hit_blocks = prefix_hit / d_block;
    let mut decode_blocks = Vec::new();
    let mut decode_transfer_blocks = Vec::new();
    let mut decode_unzeroed_blocks = Vec::new();
    let mut prefill_blocks = Vec::new();
    for kind in &geometry.model.groups {
        match kind {
            GroupKind::Attention => {
                let total = decode_tokens.div_ceil(d_block);
                decode_blocks.push(total);
                decode_transfer_blocks.push(total.saturating_sub(hit_blocks));
                decode_unzeroed_blocks
                    .push(m.div_ceil(d_block).min(total).saturating_sub(hit_blocks));
                prefill_blocks.push(m.div_ceil(p_block));
            }
            GroupKind::Mamba => {
                decode_blocks.push(1);
                decode_transfer_blocks.push(1);
                decode_unzeroed_blocks.push(1);
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
        decode_unzeroed_blocks,
        prefill_blocks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::{EngineGeometry, ModelSpec};

    fn hybrid(d_block: u32, p_block: u32) -> Geometry {
        let engine = |tp, logical| EngineGeometry::new(tp, 4, logical);
        Geometry {
            name: "t".into(),
            description: String::new(),
            model: ModelSpec {
                groups: vec![GroupKind::Attention, GroupKind::Mamba],
                ..crate::geometry::fixtures::mla_kda([2, 2, 4], 64)
            },
            prefill: engine(2, p_block),
            decode: engine(1, d_block),
            prompts: None,
            expect_rejection: None,
            stack: crate::geometry::Stack::Vllm,
            handshake: crate::geometry::HandshakeCompat::default(),
            sglang: None,
        }
    }

    #[test]
    fn hybrids_transfer_n_minus_one_tokens() {
        let g = hybrid(12, 8);
        let s = request_shape(&g, 25, 0, DecodeAllocation::Mainline);
        assert_eq!(s.transferred_tokens, 24);
        assert_eq!(
            (s.decode_blocks.clone(), s.prefill_blocks.clone()),
            (vec![2, 1], vec![3, 1])
        );
        assert_eq!(s.decode_unzeroed_blocks, vec![2, 1]);
        // D already holding the block of the recomputed token: that block is zeroed at allocation.
        let s = request_shape(&g, 25, 0, DecodeAllocation::WithLastToken);
        assert_eq!(
            (s.decode_blocks.clone(), s.decode_unzeroed_blocks.clone()),
            (vec![3, 1], vec![2, 1])
        );
        assert_eq!(
            request_shape(&g, 1, 0, DecodeAllocation::Mainline).transferred_tokens,
            1
        );
    }

    #[test]
    fn a_prefix_hit_skips_whole_decode_blocks() {
        let g = hybrid(12, 12);
        let s = request_shape(&g, 40, 24, DecodeAllocation::Mainline);
        assert_eq!(s.decode_blocks, vec![4, 1]);
        assert_eq!(s.decode_transfer_blocks, vec![2, 1]);
        assert_eq!(s.decode_unzeroed_blocks, vec![2, 1]);
    }
}
