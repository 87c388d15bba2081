//! The memory model of one TP rank of one engine: regions of logical blocks,
//! attention pages of kernel blocks in NHD or HND order, and mamba state pages.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::geometry::{AttentionSpec, EngineGeometry, GroupKind, KvLayout, ModelSpec, SubRegion};

use super::location::{CellOrder, MambaPart, MambaPiece};
use super::shape::decompose;
use super::{LayoutError, Side};

/// How the bytes of an attention block are arranged: consecutive units of
/// `unit_tokens` tokens, each a `[token][head][content]` (NHD) or
/// `[head][token][content]` (HND) array over the rank's heads.
///
/// An engine's own view has one unit per kernel block. While a pull with
/// block-size ratio `r > 1` is in flight, a decode kernel page holds `r`
/// sub-pages in the prefill layout: units of the prefill kernel block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PageView {
    /// Tokens per unit.
    pub unit_tokens: u32,
    /// The order of heads and tokens inside a unit.
    pub layout: KvLayout,
}

/// The global KV heads a rank holds: `[first, first + count)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HeadSlice {
    /// The first global head.
    pub first: u32,
    /// Heads held.
    pub count: u32,
}

impl HeadSlice {
    /// The global heads, as a range.
    pub fn range(&self) -> Range<u32> {
        self.first..self.first + self.count
    }
}

/// Where the state of one mamba layer sits inside a rank's page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MambaPage {
    /// Conv sub-projections, contiguous from offset 0.
    pub conv: Vec<SubRegion>,
    /// The SSM temporal state, right after the conv state.
    pub ssm: SubRegion,
    /// Byte of the full (all-rank) state where each conv sub-projection of
    /// this rank starts: `rank x size` when sharded, the held group's start
    /// when Mamba2 groups are replicated.
    #[serde(default)]
    pub conv_global: Vec<u64>,
}

impl MambaPage {
    /// Real state bytes (conv + SSM); the rest of the page is padding.
    pub fn state_bytes(&self) -> u64 {
        self.ssm.offset + self.ssm.size
    }

    /// Every state sub-region in page order, with its part.
    pub fn parts(&self) -> impl Iterator<Item = (MambaPart, SubRegion)> + '_ {
        self.conv
            .iter()
            .enumerate()
            .map(|(j, s)| (MambaPart::Conv(j as u32), *s))
            .chain(std::iter::once((MambaPart::Ssm, self.ssm)))
    }
}

/// A cell-level description of an attention byte range inside one logical
/// block (tokens relative to the block, heads local to the rank).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BlockCells {
    pub tokens: Range<u32>,
    pub heads: Range<u32>,
    pub content: Range<u64>,
    pub order: CellOrder,
    pub rect: bool,
}

/// The memory model of one rank of one engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineLayout {
    side: Side,
    tp_rank: u32,
    tp_size: u32,
    kernel_block: u32,
    logical_block: u32,
    layout: KvLayout,
    unified_page: u64,
    /// Bytes of one kernel page and between consecutive kernel pages.
    kernel_page: u64,
    kernel_stride: u64,
    num_logical_blocks: u32,
    region_bases: Vec<u64>,
    heads: HeadSlice,
    bytes_per_head_token: u64,
    mamba: Option<MambaPage>,
    state_regions: u32,
    receive_view: Option<PageView>,
}

impl EngineLayout {
    /// The layout of rank `tp_rank` of an engine whose regions (one per layer
    /// slot, in slot order) start at `region_bases`, each holding
    /// `num_logical_blocks` unified pages.
    pub fn new(
        side: Side,
        model: &ModelSpec,
        engine: &EngineGeometry,
        tp_rank: u32,
        region_bases: Vec<u64>,
        num_logical_blocks: u32,
    ) -> Result<Self, LayoutError> {
        let tp_size = engine.tp_size;
        if tp_size == 0 {
            return Err(LayoutError::ZeroTpSize { side });
        }
        if tp_rank >= tp_size {
            return Err(LayoutError::RankOutOfRange {
                side,
                rank: tp_rank,
                tp_size,
            });
        }
        let attention = model.attention.as_ref().ok_or(LayoutError::NoAttention)?;
        if engine.kernel_block == 0
            || engine.logical_block == 0
            || engine.logical_block % engine.kernel_block != 0
        {
            return Err(LayoutError::KernelBlock {
                side,
                kernel: engine.kernel_block,
                logical: engine.logical_block,
            });
        }
        if attention.bytes_per_head_token() == 0 {
            return Err(LayoutError::EmptyHead);
        }
        let heads = head_slice(attention, tp_rank, tp_size)?;
        if region_bases.len() != model.layer_slots as usize {
            return Err(LayoutError::RegionCount {
                side,
                got: region_bases.len(),
                expected: model.layer_slots,
            });
        }
        if num_logical_blocks == 0 {
            return Err(LayoutError::NoBlocks { side });
        }
        let unified_page = engine.unified_page_bytes(model);
        let mamba = match (&model.mamba, model.groups.contains(&GroupKind::Mamba)) {
            (Some(spec), true) => {
                let conv = spec.conv_offsets(tp_size);
                let (conv_size, ssm_size) = spec.ssm_sizes(tp_size);
                let page = MambaPage {
                    conv_global: (0..conv.len())
                        .map(|j| spec.conv_global_start(j, tp_size, tp_rank))
                        .collect(),
                    conv,
                    ssm: SubRegion {
                        offset: conv_size,
                        size: ssm_size,
                    },
                };
                if page.state_bytes() > unified_page {
                    return Err(LayoutError::MambaTooLarge {
                        side,
                        state: page.state_bytes(),
                        page: unified_page,
                    });
                }
                Some(page)
            }
            (None, true) => return Err(LayoutError::MissingMambaSpec),
            _ => None,
        };
        let layout = Self {
            side,
            tp_rank,
            tp_size,
            kernel_block: engine.kernel_block,
            logical_block: engine.logical_block,
            layout: engine.layout,
            unified_page,
            kernel_page: engine.kernel_page_bytes(model),
            kernel_stride: engine.kernel_block_stride(model),
            num_logical_blocks,
            region_bases,
            heads,
            bytes_per_head_token: attention.bytes_per_head_token(),
            mamba,
            state_regions: model.state_slot_count(),
            receive_view: None,
        };
        layout.check_regions_disjoint()?;
        Ok(layout)
    }

    fn check_regions_disjoint(&self) -> Result<(), LayoutError> {
        let mut order: Vec<usize> = (0..self.region_bases.len()).collect();
        order.sort_by_key(|&i| self.region_bases[i]);
        for w in order.windows(2) {
            if self.region_bases[w[0]] + self.region_len() > self.region_bases[w[1]] {
                return Err(LayoutError::RegionOverlap {
                    side: self.side,
                    first: w[0] as u32,
                    second: w[1] as u32,
                });
            }
        }
        Ok(())
    }

    /// The same rank with attention pages seen through `view` while a
    /// transfer writes them (sub-pages in the other engine's layout).
    pub fn with_receive_view(mut self, view: PageView) -> Result<Self, LayoutError> {
        if view.unit_tokens == 0 || self.kernel_block % view.unit_tokens != 0 {
            return Err(LayoutError::PageView {
                side: self.side,
                unit_tokens: view.unit_tokens,
                kernel: self.kernel_block,
            });
        }
        self.receive_view = Some(view);
        Ok(self)
    }

    /// The engine.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The TP rank.
    pub fn tp_rank(&self) -> u32 {
        self.tp_rank
    }

    /// The engine's TP size.
    pub fn tp_size(&self) -> u32 {
        self.tp_size
    }

    /// The rank's NIXL agent name, as the scenario creates it.
    pub fn agent_name(&self) -> String {
        self.side.agent_name(self.tp_rank)
    }

    /// Kernel block size, in tokens.
    pub fn kernel_block(&self) -> u32 {
        self.kernel_block
    }

    /// Logical block size, in tokens.
    pub fn logical_block(&self) -> u32 {
        self.logical_block
    }

    /// Kernel blocks per logical block.
    pub fn ppl(&self) -> u32 {
        self.logical_block / self.kernel_block
    }

    /// The order of heads and tokens in a kernel page.
    pub fn kv_layout(&self) -> KvLayout {
        self.layout
    }

    /// Bytes of one logical block of one region (`U`).
    pub fn unified_page(&self) -> u64 {
        self.unified_page
    }

    /// Bytes of one kernel block (`U / ppl`).
    pub fn kernel_page(&self) -> u64 {
        self.kernel_page
    }

    /// Offset inside a logical block as if kernel pages were unpadded, or
    /// `None` when `in_block` is padding between kernel pages.
    pub fn dense_offset(&self, in_block: u64) -> Option<u64> {
        let (page, w) = (in_block / self.kernel_stride, in_block % self.kernel_stride);
        (w < self.kernel_page).then_some(page * self.kernel_page + w)
    }

    /// Whether `[in_block, in_block + len)` of a logical block touches padding
    /// or spans two kernel pages of a padded layout.
    pub fn touches_padding(&self, in_block: u64, len: u64) -> bool {
        if self.kernel_stride == self.kernel_page {
            return false;
        }
        let last = in_block + len.max(1) - 1;
        match (self.dense_offset(in_block), self.dense_offset(last)) {
            (Some(a), Some(b)) => b - a != last - in_block,
            _ => true,
        }
    }

    fn padded_offset(&self, dense: u64) -> u64 {
        (dense / self.kernel_page) * self.kernel_stride + dense % self.kernel_page
    }

    /// Logical blocks in the rank's pool.
    pub fn num_logical_blocks(&self) -> u32 {
        self.num_logical_blocks
    }

    /// Regions (layer slots).
    pub fn num_regions(&self) -> u32 {
        self.region_bases.len() as u32
    }

    /// Regions holding mamba state: regions `0..n` (the layer slots with a
    /// mamba layer); 0 without mamba.
    pub fn state_regions(&self) -> u32 {
        self.state_regions
    }

    /// Base address of each region.
    pub fn region_bases(&self) -> &[u64] {
        &self.region_bases
    }

    /// Bytes of one region: `num_logical_blocks × U`.
    pub fn region_len(&self) -> u64 {
        u64::from(self.num_logical_blocks) * self.unified_page
    }

    /// The global KV heads the rank holds.
    pub fn heads(&self) -> HeadSlice {
        self.heads
    }

    /// Bytes of one head of one token.
    pub fn bytes_per_head_token(&self) -> u64 {
        self.bytes_per_head_token
    }

    /// The layout of a mamba page, if the model has mamba groups.
    pub fn mamba(&self) -> Option<&MambaPage> {
        self.mamba.as_ref()
    }

    /// The engine's own page view: one unit per kernel block, in its layout.
    pub fn own_view(&self) -> PageView {
        PageView {
            unit_tokens: self.kernel_block,
            layout: self.layout,
        }
    }

    /// The view of a decode page while a pull with a block-size ratio is in flight, if any.
    pub fn receive_view(&self) -> Option<PageView> {
        self.receive_view
    }

    /// The view descriptors are classified in: the receive view if any, else the own view.
    pub fn transfer_view(&self) -> PageView {
        self.receive_view.unwrap_or_else(|| self.own_view())
    }

    /// The region holding `[addr, addr + len)` and the offset of `addr` in it,
    /// or `None` when the range is not inside one region.
    pub fn locate(&self, addr: u64, len: u64) -> Option<(u32, u64)> {
        self.region_bases.iter().enumerate().find_map(|(i, &base)| {
            let off = addr.checked_sub(base)?;
            let inside = off
                .checked_add(len)
                .is_some_and(|end| off < self.region_len() && end <= self.region_len());
            inside.then_some((i as u32, off))
        })
    }

    /// The global head of local head `h`.
    pub fn global_head(&self, h: u32) -> u32 {
        self.heads.first + h
    }

    /// Offset inside a logical block of the first content byte of token
    /// `token` (relative to the block) and local head `head`, in `view`.
    pub fn cell_offset(&self, view: PageView, token: u32, head: u32) -> u64 {
        self.padded_offset(self.dense_cell_offset(view, token, head))
    }

    fn dense_cell_offset(&self, view: PageView, token: u32, head: u32) -> u64 {
        let (h_count, c) = (u64::from(self.heads.count), self.bytes_per_head_token);
        let (t, h) = (u64::from(token), u64::from(head));
        match view.layout {
            KvLayout::Nhd => (t * h_count + h) * c,
            KvLayout::Hnd => {
                let ut = u64::from(view.unit_tokens);
                let unit_bytes = ut * h_count * c;
                (t / ut) * unit_bytes + (h * ut + t % ut) * c
            }
        }
    }

    /// The (token, local head, content byte) a dense block offset (see
    /// [`Self::dense_offset`]) holds in `view`.
    pub fn byte_cell(&self, view: PageView, offset: u64) -> (u32, u32, u64) {
        let (h_count, c) = (u64::from(self.heads.count), self.bytes_per_head_token);
        match view.layout {
            KvLayout::Nhd => (
                (offset / (h_count * c)) as u32,
                ((offset / c) % h_count) as u32,
                offset % c,
            ),
            KvLayout::Hnd => {
                let ut = u64::from(view.unit_tokens);
                let unit_bytes = ut * h_count * c;
                let (u, rest) = (offset / unit_bytes, offset % unit_bytes);
                let token = u * ut + (rest / c) % ut;
                (token as u32, (rest / (ut * c)) as u32, offset % c)
            }
        }
    }

    /// Cells touched by `len >= 1` bytes at dense `offset` of a logical block, in `view`.
    pub(crate) fn block_cells(&self, view: PageView, offset: u64, len: u64) -> BlockCells {
        let (h_count, c) = (u64::from(self.heads.count), self.bytes_per_head_token);
        let token_major = h_count == 1 || view.layout == KvLayout::Nhd;
        let cells = if token_major {
            let b = decompose(offset, len, h_count, c);
            BlockCells {
                tokens: b.outer.start as u32..b.outer.end as u32,
                heads: b.middle.start as u32..b.middle.end as u32,
                content: b.inner,
                order: CellOrder::TokenMajor,
                rect: b.rect,
            }
        } else {
            let ut = u64::from(view.unit_tokens);
            let unit_bytes = ut * h_count * c;
            let (u0, u1) = (offset / unit_bytes, (offset + len - 1) / unit_bytes);
            if u0 != u1 {
                BlockCells {
                    tokens: (u0 * ut) as u32..((u1 + 1) * ut) as u32,
                    heads: 0..h_count as u32,
                    content: 0..c,
                    order: CellOrder::HeadMajor,
                    rect: false,
                }
            } else {
                let b = decompose(offset - u0 * unit_bytes, len, ut, c);
                BlockCells {
                    tokens: (u0 * ut + b.middle.start) as u32..(u0 * ut + b.middle.end) as u32,
                    heads: b.outer.start as u32..b.outer.end as u32,
                    content: b.inner,
                    order: CellOrder::HeadMajor,
                    rect: b.rect,
                }
            }
        };
        let order = if cells.tokens.len() <= 1 || cells.heads.len() <= 1 {
            CellOrder::TokenMajor
        } else {
            cells.order
        };
        BlockCells { order, ..cells }
    }

    /// Global byte of the full (all-rank) state for byte `offset` of `part`
    /// on this rank: rank `k` holds bytes `[k × size, (k + 1) × size)`,
    /// except replicated Mamba2 groups, which every rank holding the group
    /// holds at the same global bytes.
    pub fn mamba_global_byte(&self, part: MambaPart, offset: u64) -> u64 {
        let start = self.mamba.as_ref().map_or(0, |m| match part {
            MambaPart::Conv(j) => m.conv_global.get(j as usize).copied().unwrap_or_else(|| {
                u64::from(self.tp_rank) * m.conv.get(j as usize).map_or(0, |s| s.size)
            }),
            MambaPart::Ssm => u64::from(self.tp_rank) * m.ssm.size,
            MambaPart::Padding => 0,
        });
        start + offset
    }

    /// Sub-regions touched by `len` bytes at `offset` of a mamba state page.
    pub fn mamba_pieces(&self, offset: u64, len: u64) -> Vec<MambaPiece> {
        let end = offset + len;
        let mut pieces = Vec::new();
        if let Some(page) = &self.mamba {
            for (part, sub) in page.parts() {
                let (s, e) = (offset.max(sub.offset), end.min(sub.offset + sub.size));
                if s < e {
                    let g = self.mamba_global_byte(part, s - sub.offset);
                    pieces.push(MambaPiece {
                        part,
                        global: g..g + (e - s),
                    });
                }
            }
        }
        let pad_start = self
            .mamba
            .as_ref()
            .map_or(0, MambaPage::state_bytes)
            .max(offset);
        if pad_start < end {
            pieces.push(MambaPiece {
                part: MambaPart::Padding,
                global: pad_start..end,
            });
        }
        pieces
    }
}

/// The global heads rank `rank` of `tp_size` holds.
fn head_slice(
    attention: &AttentionSpec,
    rank: u32,
    tp_size: u32,
) -> Result<HeadSlice, LayoutError> {
    let total = attention.total_kv_heads();
    if attention.is_mla() {
        return Ok(HeadSlice { first: 0, count: 1 });
    }
    let divisible = if tp_size <= total {
        total % tp_size == 0
    } else {
        tp_size % total == 0
    };
    if total == 0 || !divisible {
        return Err(LayoutError::HeadSharding {
            total_heads: total,
            tp_size,
        });
    }
    let count = attention.heads_per_rank(tp_size);
    let first = if tp_size > total {
        rank * total / tp_size
    } else {
        rank * count
    };
    Ok(HeadSlice { first, count })
}
