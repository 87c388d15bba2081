//! The receive post-process on D: for attention caches only, the block-size
//! conversion when remote pages were smaller (head-major layouts), then the
//! zeroing of everything the transfer did not write: the token tail of the
//! last partially covered local block and every whole block after it, and,
//! when the transfer's pairs start past the list's head (pairing from the
//! last token), the token head of the first covered block and every whole
//! block before it.

use serde::Serialize;

use super::policy::ReceiveZeroing;
use super::registration::Registration;
use crate::geometry::{GroupKind, KvLayout, ModelSpec};
use crate::memory::HostTensors;

/// One operation on every attention cache of the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum PostOp {
    /// Reorder a kernel block received as `ratio` remote sub-pages
    /// (each `[head][token][content]`) into the local `[head][token][content]`.
    ConvertBlockSize {
        /// Local kernel block id.
        block: u32,
        /// Remote sub-pages per local kernel block.
        ratio: u32,
    },
    /// Zero tokens `from_token..` of a kernel block (all heads).
    ZeroTokens {
        /// Local kernel block id.
        block: u32,
        /// First zeroed token, relative to the block.
        from_token: u32,
    },
    /// Zero tokens `..to_token` of a kernel block (all heads).
    ZeroTokensBefore {
        /// Local kernel block id.
        block: u32,
        /// First token kept, relative to the block.
        to_token: u32,
    },
    /// Zero a whole kernel block.
    ZeroBlock {
        /// Local kernel block id.
        block: u32,
    },
}

/// The post-process of one attention group of one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GroupPostProcess {
    /// The group's index in the model's group list.
    pub group: usize,
    /// The request's local kernel block ids of this group.
    pub block_ids: Vec<u32>,
    /// Remote-granularity sub-blocks the transfer wrote: the end of the
    /// covered range.
    pub covered_sub_blocks: u64,
    /// The first covered sub-block (0 unless the pairs start past the
    /// list's head, as pairing from the last token can).
    #[serde(skip_serializing_if = "is_zero")]
    pub first_covered_sub_block: u64,
    /// Local kernel block / remote kernel block (1: no conversion).
    pub ratio: u32,
    /// Whether block ids had to be uploaded (conversion or stale blocks).
    pub needs_block_ids: bool,
    /// The operations, in the order they run.
    pub ops: Vec<PostOp>,
}

/// Inputs of the post-process for one finished request.
pub struct PostProcessInput<'a> {
    /// The model's KV-cache groups, in order.
    pub groups: &'a [GroupKind],
    /// The attention is MLA (one latent head, replicated across ranks).
    pub is_mla: bool,
    /// How each kernel page orders heads and tokens.
    pub layout: KvLayout,
    /// Local kernel / remote kernel.
    pub ratio: u32,
    /// Local and remote ppl differ.
    pub hetero_ppl: bool,
    /// Local kernel ids per group.
    pub local_kernel_ids: &'a [Vec<u32>],
    /// Remote-granularity block count per group: the full (untrimmed)
    /// kernel-expanded remote list length.
    pub remote_counts: &'a [usize],
    /// Local kernel block size, in tokens.
    pub kernel_block: u32,
    /// Kernel blocks per region of the local pool.
    pub num_kernel_blocks: u64,
    /// Which stale and clipped bytes are zeroed.
    pub zeroing: ReceiveZeroing,
    /// Per group, the range of remote-granularity sub-blocks the transfer
    /// covered, when the planning recorded it (pairing from the last
    /// token); `None` derives `0..min(local x ratio, remote count)`.
    pub covered_ranges: Option<&'a [std::ops::Range<u64>]>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What vLLM 0.33.0's `get_transfer_results` + `post_process_device_kv_on_receive` do.
pub fn plan(input: &PostProcessInput<'_>) -> Vec<GroupPostProcess> {
    let r = input.ratio;
    let triggered = if input.zeroing == ReceiveZeroing::RatioOnly {
        r > 1
    } else {
        r > 1 || input.hetero_ppl
    };
    if !triggered {
        return Vec::new();
    }
    let convert = asks_for_conversion(input.is_mla, r) && input.layout.is_block_contiguous();
    let mut out = Vec::new();
    for (g, kind) in input.groups.iter().enumerate() {
        let ids = &input.local_kernel_ids[g];
        if *kind != GroupKind::Attention || ids.is_empty() {
            continue;
        }
        let (first_covered, covered) = match input.covered_ranges {
            Some(ranges) => {
                let range = ranges.get(g).cloned().unwrap_or(0..0);
                (range.start, range.end)
            }
            None => (
                0,
                (ids.len() as u64 * u64::from(r)).min(input.remote_counts[g] as u64),
            ),
        };
        let (covered_blocks, sub_in_last) = (covered / u64::from(r), covered % u64::from(r));
        let first_stale = (covered_blocks + u64::from(sub_in_last > 0)) as usize;
        let (head_blocks, sub_in_head) = (
            (first_covered / u64::from(r)) as usize,
            first_covered % u64::from(r),
        );
        let has_stale = head_blocks > 0 || first_stale < ids.len();
        let mut ops = Vec::new();
        if convert {
            ops.extend(
                ids.iter()
                    .map(|&block| PostOp::ConvertBlockSize { block, ratio: r }),
            );
        }
        let tail = |ops: &mut Vec<PostOp>| {
            if sub_in_last > 0 {
                ops.push(PostOp::ZeroTokens {
                    block: ids[covered_blocks as usize],
                    from_token: sub_in_last as u32 * (input.kernel_block / r),
                });
            }
        };
        match input.zeroing {
            ReceiveZeroing::Skipped => {}
            ReceiveZeroing::TwoPath => {
                // Path A: ratio tail, non-MLA only, last covered block only.
                if r > 1 && !input.is_mla {
                    tail(&mut ops);
                }
                // Path B: whole kernel blocks past the count in local kernel units.
                if input.hetero_ppl {
                    let kept = ids.len().min(input.remote_counts[g]);
                    ops.extend(ids[kept..].iter().map(|&block| PostOp::ZeroBlock { block }));
                }
            }
            ReceiveZeroing::Unified | ReceiveZeroing::RatioOnly | ReceiveZeroing::InclusiveEnd => {
                tail(&mut ops);
                if sub_in_head > 0 {
                    ops.push(PostOp::ZeroTokensBefore {
                        block: ids[head_blocks],
                        to_token: sub_in_head as u32 * (input.kernel_block / r),
                    });
                }
                if has_stale {
                    ops.extend(
                        ids[..head_blocks.min(ids.len())]
                            .iter()
                            .chain(&ids[first_stale.min(ids.len())..])
                            .map(|&block| PostOp::ZeroBlock { block }),
                    );
                    let past_end = ids[ids.len() - 1] + 1;
                    if input.zeroing == ReceiveZeroing::InclusiveEnd
                        && u64::from(past_end) < input.num_kernel_blocks
                    {
                        ops.push(PostOp::ZeroBlock { block: past_end });
                    }
                }
            }
        }
        out.push(GroupPostProcess {
            group: g,
            block_ids: ids.clone(),
            covered_sub_blocks: covered,
            first_covered_sub_block: first_covered,
            ratio: r,
            needs_block_ids: convert || has_stale,
            ops,
        });
    }
    out
}

/// Whether the post-process call asks for the block-size conversion: vLLM
/// passes `convert` for a non-MLA model with smaller remote kernel blocks
/// (the conversion itself then runs only on head-major pages).
pub fn asks_for_conversion(is_mla: bool, ratio: u32) -> bool {
    !is_mla && ratio > 1
}

/// The byte ranges `(region, offset, len)` the planned operations zero on
/// one worker, in the order they run; every operation runs on every
/// attention cache, one per region.
pub fn zeroed_ranges(
    plans: &[GroupPostProcess],
    geometries: &[PageGeometry],
) -> Vec<(usize, u64, u64)> {
    let mut out = Vec::new();
    for op in plans.iter().flat_map(|p| &p.ops) {
        for (region, g) in geometries.iter().enumerate() {
            match *op {
                PostOp::ZeroBlock { block } => {
                    out.push((region, u64::from(block) * g.block_stride, g.block_len));
                }
                PostOp::ZeroTokens { block, from_token } => out.extend(
                    g.token_tail_ranges(block, u64::from(from_token))
                        .into_iter()
                        .map(|(offset, len)| (region, offset, len)),
                ),
                PostOp::ZeroTokensBefore { block, to_token } => out.extend(
                    g.token_head_ranges(block, u64::from(to_token))
                        .into_iter()
                        .map(|(offset, len)| (region, offset, len)),
                ),
                PostOp::ConvertBlockSize { .. } => {}
            }
        }
    }
    out
}

/// Byte geometry of one attention kernel page on this worker.
#[derive(Clone, Copy, Debug)]
pub struct PageGeometry {
    /// Bytes of one kernel block.
    pub block_len: u64,
    /// Bytes between consecutive kernel blocks.
    pub block_stride: u64,
    /// Tokens in one kernel block.
    pub tokens: u64,
    /// KV heads on this rank.
    pub heads: u64,
    /// Bytes of one head of one token.
    pub head_token_bytes: u64,
    /// How the page orders heads and tokens.
    pub layout: KvLayout,
}

impl PageGeometry {
    /// The page geometry of one region, from its block length and the model's head layout.
    pub fn new(
        model: &ModelSpec,
        reg: &Registration,
        tp_size: u32,
        layout: KvLayout,
        region: usize,
    ) -> Self {
        let attention = model.attention.as_ref();
        Self {
            block_len: reg.regions[region].block_len,
            block_stride: reg.regions[region].block_stride,
            tokens: u64::from(reg.kernel_block),
            heads: attention.map_or(1, |a| u64::from(a.heads_per_rank(tp_size))),
            head_token_bytes: attention.map_or(0, |a| a.bytes_per_head_token()),
            layout: if model.is_mla() {
                KvLayout::Hnd
            } else {
                layout
            },
        }
    }

    /// Byte ranges (offset from the region base) holding tokens `from..` of `block`.
    pub fn token_tail_ranges(&self, block: u32, from: u64) -> Vec<(u64, u64)> {
        let start = u64::from(block) * self.block_stride;
        let c = self.head_token_bytes;
        match self.layout {
            KvLayout::Nhd => {
                let row = self.heads * c;
                vec![(start + from * row, (self.tokens - from) * row)]
            }
            KvLayout::Hnd => (0..self.heads)
                .map(|h| {
                    (
                        start + h * self.tokens * c + from * c,
                        (self.tokens - from) * c,
                    )
                })
                .collect(),
        }
    }

    /// Byte ranges (offset from the region base) holding tokens `..to` of `block`.
    pub fn token_head_ranges(&self, block: u32, to: u64) -> Vec<(u64, u64)> {
        let start = u64::from(block) * self.block_stride;
        let c = self.head_token_bytes;
        match self.layout {
            KvLayout::Nhd => vec![(start, to * self.heads * c)],
            KvLayout::Hnd => (0..self.heads)
                .map(|h| (start + h * self.tokens * c, to * c))
                .collect(),
        }
    }
}

/// Reorder a head-major page received as `ratio` sub-pages.
pub fn convert_block_size(page: &[u8], geometry: &PageGeometry, ratio: u64) -> Vec<u8> {
    let (heads, n, c) = (geometry.heads, geometry.tokens, geometry.head_token_bytes);
    let sub_tokens = n / ratio;
    let mut out = vec![0u8; page.len()];
    for j in 0..ratio {
        for h in 0..heads {
            let src = ((j * heads + h) * sub_tokens * c) as usize;
            let dst = ((h * n + j * sub_tokens) * c) as usize;
            let len = (sub_tokens * c) as usize;
            out[dst..dst + len].copy_from_slice(&page[src..src + len]);
        }
    }
    out
}

/// Byte access to one worker's KV tensors (one per region), used by the
/// connector's receive post-process. Host tensors implement it here; the
/// harness implements it for CUDA device tensors (`scenario::DeviceTensors`,
/// feature `cuda`).
pub trait KvMemory {
    /// Copy `len` bytes at `offset` of tensor `region`.
    fn read(&self, region: usize, offset: u64, len: u64) -> Vec<u8>;
    /// Write `bytes` at `offset` of tensor `region`.
    fn write(&mut self, region: usize, offset: u64, bytes: &[u8]);
    /// Zero `len` bytes at `offset` of tensor `region`.
    fn zero(&mut self, region: usize, offset: u64, len: u64);

    /// Run a planned receive post-process over these tensors. The default
    /// goes through `read`/`write`/`zero`; device memory overrides it to
    /// run the whole post-process as ordered GPU work.
    fn post_process(&mut self, plans: &[GroupPostProcess], geometries: &[PageGeometry]) {
        apply_bytes(plans, geometries, self);
    }
}

impl KvMemory for HostTensors {
    fn read(&self, region: usize, offset: u64, len: u64) -> Vec<u8> {
        let bytes = self.0[region].read();
        bytes[offset as usize..(offset + len) as usize].to_vec()
    }

    fn write(&mut self, region: usize, offset: u64, data: &[u8]) {
        let mut bytes = self.0[region].write();
        bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    }

    fn zero(&mut self, region: usize, offset: u64, len: u64) {
        let mut bytes = self.0[region].write();
        bytes[offset as usize..(offset + len) as usize].fill(0);
    }
}

/// Apply the planned operations to every attention cache (every region).
/// The memory decides how ([`KvMemory::post_process`]): host tensors byte
/// range by byte range ([`apply_bytes`]), device tensors as GPU work.
pub fn apply(plans: &[GroupPostProcess], geometries: &[PageGeometry], memory: &mut dyn KvMemory) {
    memory.post_process(plans, geometries);
}

/// Apply the planned operations through byte access: read, convert and
/// write back each page, zero each range.
pub fn apply_bytes<M: KvMemory + ?Sized>(
    plans: &[GroupPostProcess],
    geometries: &[PageGeometry],
    memory: &mut M,
) {
    for plan in plans {
        for op in &plan.ops {
            for (region, g) in geometries.iter().enumerate() {
                match *op {
                    PostOp::ConvertBlockSize { block, ratio } => {
                        let offset = u64::from(block) * g.block_stride;
                        let page = memory.read(region, offset, g.block_len);
                        memory.write(
                            region,
                            offset,
                            &convert_block_size(&page, g, u64::from(ratio)),
                        );
                    }
                    PostOp::ZeroTokens { block, from_token } => {
                        for (offset, len) in g.token_tail_ranges(block, u64::from(from_token)) {
                            memory.zero(region, offset, len);
                        }
                    }
                    PostOp::ZeroTokensBefore { block, to_token } => {
                        for (offset, len) in g.token_head_ranges(block, u64::from(to_token)) {
                            memory.zero(region, offset, len);
                        }
                    }
                    PostOp::ZeroBlock { block } => {
                        memory.zero(region, u64::from(block) * g.block_stride, g.block_len);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use GroupKind::{Attention as A, Mamba as M};

    fn input<'a>(
        ids: &'a [Vec<u32>],
        remote: &'a [usize],
        ratio: u32,
        mla: bool,
        zeroing: ReceiveZeroing,
    ) -> PostProcessInput<'a> {
        PostProcessInput {
            groups: &[A, M, M],
            is_mla: mla,
            layout: KvLayout::Hnd,
            ratio,
            hetero_ppl: true,
            local_kernel_ids: ids,
            remote_counts: remote,
            kernel_block: 8,
            num_kernel_blocks: 64,
            zeroing,
            covered_ranges: None,
        }
    }

    #[test]
    fn mixed_regime_n29_zeroes_two_whole_blocks() {
        // D kernel 8 ppl 3, P kernel 4 ppl 2, N = 29: local [3,4,5,9,10,11], 8 remote kernels.
        let ids = vec![vec![3, 4, 5, 9, 10, 11], vec![0], vec![6]];
        let plans = plan(&input(&ids, &[8, 1, 1], 2, true, ReceiveZeroing::Unified));
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].covered_sub_blocks, 8);
        assert_eq!(
            plans[0].ops,
            vec![
                PostOp::ZeroBlock { block: 10 },
                PostOp::ZeroBlock { block: 11 }
            ]
        );
        // The old two-path zeroing leaves both stale (MLA skips path A, path B counts 6 vs 8).
        let old = plan(&input(&ids, &[8, 1, 1], 2, true, ReceiveZeroing::TwoPath));
        assert!(old[0].ops.is_empty());
    }

    #[test]
    fn partial_tail_then_whole_blocks() {
        // r = 2, 3 local kernel blocks, 3 remote sub-blocks: tail of block at position 1, then position 2.
        let ids = vec![vec![7, 8, 9], vec![], vec![]];
        let plans = plan(&input(&ids, &[3, 0, 0], 2, false, ReceiveZeroing::Unified));
        let ops = &plans[0].ops;
        assert_eq!(
            ops.iter()
                .filter(|o| matches!(o, PostOp::ConvertBlockSize { .. }))
                .count(),
            3
        );
        assert!(ops.contains(&PostOp::ZeroTokens {
            block: 8,
            from_token: 4
        }));
        assert!(ops.contains(&PostOp::ZeroBlock { block: 9 }));
    }

    #[test]
    fn a_covered_range_past_the_head_zeroes_both_ends() {
        // r = 2, 4 local kernel blocks (8 sub-blocks), sub-blocks 3..5 covered:
        // block 10 whole, the head of block 11, the tail of block 12, block 13.
        let ids = vec![vec![10, 11, 12, 13], vec![], vec![]];
        let ranges = [3..5, 0..0, 0..0];
        let mut inp = input(&ids, &[8, 0, 0], 2, true, ReceiveZeroing::Unified);
        inp.covered_ranges = Some(&ranges);
        let plans = plan(&inp);
        assert_eq!(
            (
                plans[0].first_covered_sub_block,
                plans[0].covered_sub_blocks
            ),
            (3, 5)
        );
        assert_eq!(
            plans[0].ops,
            vec![
                PostOp::ZeroTokens {
                    block: 12,
                    from_token: 4
                },
                PostOp::ZeroTokensBefore {
                    block: 11,
                    to_token: 4
                },
                PostOp::ZeroBlock { block: 10 },
                PostOp::ZeroBlock { block: 13 },
            ]
        );
        let g = PageGeometry {
            block_len: 16,
            block_stride: 16,
            tokens: 8,
            heads: 2,
            head_token_bytes: 1,
            layout: KvLayout::Hnd,
        };
        assert_eq!(g.token_head_ranges(1, 4), vec![(16, 4), (24, 4)]);
        let nhd = PageGeometry {
            layout: KvLayout::Nhd,
            ..g
        };
        assert_eq!(nhd.token_head_ranges(1, 4), vec![(16, 8)]);
    }

    #[test]
    fn conversion_interleaves_sub_pages_per_head() {
        // 2 heads, 4 tokens, 1 byte per head-token, ratio 2: sub-page j holds [h][2 tokens].
        let g = PageGeometry {
            block_len: 8,
            block_stride: 8,
            tokens: 4,
            heads: 2,
            head_token_bytes: 1,
            layout: KvLayout::Hnd,
        };
        let received = [0, 1, 10, 11, 2, 3, 12, 13];
        assert_eq!(
            convert_block_size(&received, &g, 2),
            vec![0, 1, 2, 3, 10, 11, 12, 13]
        );
    }
}
