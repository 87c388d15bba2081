//! kvgeom's own model of SGLang's KV pools, written from the geometry (not
//! from SGLang's code): per engine rank, the regions in SGLang's
//! `kv_data_ptrs` order (K of layers 0..L-1 then V of layers 0..L-1 for
//! MHA/GQA, one latent region per layer for MLA), each holding
//! `(num_pages + 1) * page_size` token rows (page 0 is SGLang's padding
//! page), and the map between a byte of a region and its identity
//! ([`Cell`]: layer, part, page, token row, global KV head, byte).
//!
//! A rank of attention TP `tp` over `H` KV heads holds `max(1, H / tp)`
//! heads: heads `r * H / tp ..` when `tp <= H`, else the one head
//! `r / (tp / H)` (SGLang PR #30997's replica map: consecutive ranks
//! replicate a head).

use super::error::ModelError;
use crate::geometry::{AttentionSpec, Geometry};
use crate::layout::Side;

/// Which tensor of a layer a region holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// MHA/GQA keys.
    K,
    /// MHA/GQA values.
    V,
    /// MLA's latent (with its rope part), replicated on every rank.
    Latent,
}

impl Part {
    /// The group code of the provenance pattern.
    pub fn code(self) -> u32 {
        match self {
            Part::K => 0,
            Part::V => 1,
            Part::Latent => 2,
        }
    }
}

/// The model as SGLang's pools hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// `MHATokenToKVPool`: K and V buffers per layer.
    Mha {
        /// The model's KV heads.
        total_heads: u32,
        /// Elements per head per token of K.
        k_head_size: u32,
        /// Elements per head per token of V (`v_head_dim`, K's when unset).
        v_head_size: u32,
    },
    /// `MLATokenToKVPool`: one latent buffer per layer.
    Mla {
        /// Elements of the latent (plus rope) per token.
        latent: u32,
    },
}

/// One engine's pools: the model, its attention TP, pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnginePools {
    /// Which engine.
    pub side: Side,
    /// The model's pools.
    pub kind: PoolKind,
    /// Layers.
    pub layers: u32,
    /// Bytes per element.
    pub dtype_bytes: u32,
    /// Attention TP: the ranks modelled.
    pub attn_tp: u32,
    /// Tokens per page.
    pub page_size: u32,
    /// Pages of the pool, SGLang's padding page 0 not counted.
    pub num_pages: u32,
}

/// One region of one rank, as SGLang registers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionModel {
    /// Position in `kv_data_ptrs`.
    pub index: u32,
    /// Its layer.
    pub layer: u32,
    /// K, V or the latent.
    pub part: Part,
    /// The whole buffer, page 0 included.
    pub len: u64,
    /// One page of it.
    pub item_len: u64,
    /// One token row (every head the rank holds).
    pub row_bytes: u64,
    /// One head of one token.
    pub head_bytes: u64,
    /// The global KV heads of the row, in order (`[0]` for MLA).
    pub heads: Vec<u32>,
}

impl RegionModel {
    /// As the driver names it: `K layer l`, `V layer l`, `layer l`.
    pub fn what(&self) -> String {
        match self.part {
            Part::K => format!("K layer {}", self.layer),
            Part::V => format!("V layer {}", self.layer),
            Part::Latent => format!("layer {}", self.layer),
        }
    }
}

/// The identity of one byte of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cell {
    /// The layer.
    pub layer: u32,
    /// K, V or latent.
    pub part: Part,
    /// The pool's page id (0: the padding page).
    pub page: u32,
    /// The token row inside the page.
    pub row: u32,
    /// The global KV head (0 for MLA).
    pub head: u32,
    /// The byte inside the head's row.
    pub byte: u64,
}

/// Pages of the pool when the geometry does not set `num_pages`: the
/// request's pages twice over and four more, so neighbours surround it.
pub fn default_num_pages(request_pages: u32) -> u32 {
    request_pages * 2 + 4
}

impl EnginePools {
    /// The pools of `side` of an SGLang geometry, `num_pages` when the
    /// file sets none; `Err` names what kvgeom's model cannot hold.
    pub fn of(geometry: &Geometry, side: Side, num_pages: u32) -> Result<Self, ModelError> {
        let engine = match side {
            Side::Prefill => &geometry.prefill,
            Side::Decode => &geometry.decode,
        };
        let v_head = geometry.sglang.as_ref().and_then(|s| s.v_head_size);
        let (kind, dtype_bytes) = match geometry.model.attention {
            Some(AttentionSpec::Mla {
                head_size,
                dtype_bytes,
            }) => (PoolKind::Mla { latent: head_size }, dtype_bytes),
            Some(AttentionSpec::Full {
                total_kv_heads,
                head_size,
                dtype_bytes,
            }) => (
                PoolKind::Mha {
                    total_heads: total_kv_heads,
                    k_head_size: head_size,
                    v_head_size: v_head.unwrap_or(head_size),
                },
                dtype_bytes,
            ),
            None => return Err(ModelError::NoAttention),
        };
        let tp = engine.tp_size;
        if tp == 0 || engine.logical_block == 0 || geometry.model.layer_slots == 0 {
            return Err(ModelError::NotPositive);
        }
        if let PoolKind::Mha { total_heads, .. } = kind {
            let even = if tp <= total_heads {
                total_heads % tp == 0
            } else {
                tp % total_heads == 0
            };
            if total_heads == 0 || !even {
                return Err(ModelError::HeadsSplit {
                    side,
                    tp,
                    heads: total_heads,
                });
            }
        }
        Ok(EnginePools {
            side,
            kind,
            // A hybrid model's linear layers hold state, not KV pages.
            layers: geometry.model.layer_slots
                - geometry
                    .sglang
                    .as_ref()
                    .and_then(|s| s.state.as_ref())
                    .map_or(0, |st| st.layers.len() as u32),
            dtype_bytes,
            attn_tp: tp,
            page_size: engine.logical_block,
            num_pages: engine.num_logical_blocks.unwrap_or(num_pages),
        })
    }

    /// KV heads per rank: `max(1, heads / attn_tp)` (1 for MLA).
    pub fn heads_per_rank(&self) -> u32 {
        match self.kind {
            PoolKind::Mha { total_heads, .. } => (total_heads / self.attn_tp).max(1),
            PoolKind::Mla { .. } => 1,
        }
    }

    /// The global KV heads `rank` holds, in row order.
    pub fn global_heads(&self, rank: u32) -> Vec<u32> {
        match self.kind {
            PoolKind::Mla { .. } => vec![0],
            PoolKind::Mha { total_heads, .. } if self.attn_tp <= total_heads => {
                let per = total_heads / self.attn_tp;
                (rank * per..(rank + 1) * per).collect()
            }
            PoolKind::Mha { total_heads, .. } => vec![rank / (self.attn_tp / total_heads)],
        }
    }

    /// Token rows of every region: the pages and the padding page.
    pub fn rows(&self) -> u64 {
        (u64::from(self.num_pages) + 1) * u64::from(self.page_size)
    }

    /// The regions of `rank`, in SGLang's order.
    pub fn regions(&self, rank: u32) -> Vec<RegionModel> {
        let heads = self.global_heads(rank);
        let dtype = u64::from(self.dtype_bytes);
        let page = u64::from(self.page_size);
        let region = |index: u32, layer: u32, part: Part, head_size: u32| {
            let head_bytes = u64::from(head_size) * dtype;
            let row_bytes = head_bytes * heads.len() as u64;
            RegionModel {
                index,
                layer,
                part,
                len: row_bytes * self.rows(),
                item_len: row_bytes * page,
                row_bytes,
                head_bytes,
                heads: heads.clone(),
            }
        };
        match self.kind {
            PoolKind::Mla { latent } => (0..self.layers)
                .map(|l| region(l, l, Part::Latent, latent))
                .collect(),
            PoolKind::Mha {
                k_head_size,
                v_head_size,
                ..
            } => (0..self.layers)
                .map(|l| region(l, l, Part::K, k_head_size))
                .chain((0..self.layers).map(|l| region(self.layers + l, l, Part::V, v_head_size)))
                .collect(),
        }
    }

    /// The identity of byte `offset` of region `region` of `rank`.
    pub fn locate(&self, rank: u32, region: u32, offset: u64) -> Option<Cell> {
        let regions = self.regions(rank);
        let r = regions.get(region as usize)?;
        locate_in(r, self.page_size, offset)
    }

    /// Where `cell` lies on `rank`: its region and byte offset.
    pub fn offset_of(&self, rank: u32, cell: &Cell) -> Option<(u32, u64)> {
        let regions = self.regions(rank);
        let r = regions
            .iter()
            .find(|r| r.layer == cell.layer && r.part == cell.part)?;
        let h = r.heads.iter().position(|&h| h == cell.head)? as u64;
        if cell.page > self.num_pages || cell.row >= self.page_size || cell.byte >= r.head_bytes {
            return None;
        }
        let token = u64::from(cell.page) * u64::from(self.page_size) + u64::from(cell.row);
        Some((r.index, token * r.row_bytes + h * r.head_bytes + cell.byte))
    }
}

/// [`EnginePools::locate`] in one region already listed.
pub fn locate_in(r: &RegionModel, page_size: u32, offset: u64) -> Option<Cell> {
    if offset >= r.len || r.row_bytes == 0 || r.head_bytes == 0 {
        return None;
    }
    let token = offset / r.row_bytes;
    let in_row = offset % r.row_bytes;
    let head = r.heads[(in_row / r.head_bytes) as usize];
    Some(Cell {
        layer: r.layer,
        part: r.part,
        page: (token / u64::from(page_size)) as u32,
        row: (token % u64::from(page_size)) as u32,
        head,
        byte: in_row % r.head_bytes,
    })
}

#[cfg(test)]
impl EnginePools {
    /// The tests' small MHA pools: `total_heads` heads of 8 K bytes' and
    /// `v_head_size` V bytes' worth of 2-byte values, two layers, pages of
    /// 4 tokens, 6 pages.
    pub(crate) fn small_mha(side: Side, total_heads: u32, attn_tp: u32, v_head_size: u32) -> Self {
        EnginePools {
            side,
            kind: PoolKind::Mha {
                total_heads,
                k_head_size: 8,
                v_head_size,
            },
            layers: 2,
            dtype_bytes: 2,
            attn_tp,
            page_size: 4,
            num_pages: 6,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mha(total: u32, tp: u32, v: u32) -> EnginePools {
        EnginePools::small_mha(Side::Decode, total, tp, v)
    }

    #[test]
    fn regions_are_k_then_v_with_the_padding_page() {
        let p = mha(2, 1, 16);
        let r = p.regions(0);
        let what: Vec<String> = r.iter().map(RegionModel::what).collect();
        assert_eq!(what, ["K layer 0", "K layer 1", "V layer 0", "V layer 1"]);
        assert_eq!((r[0].len, r[0].item_len), (7 * 4 * 32, 4 * 32));
        assert_eq!((r[2].len, r[2].item_len), (7 * 4 * 64, 4 * 64));
    }

    #[test]
    fn replicated_heads_follow_the_fixed_replica_map() {
        let p = mha(4, 8, 8);
        let heads: Vec<u32> = (0..8).map(|r| p.global_heads(r)[0]).collect();
        assert_eq!(heads, [0, 0, 1, 1, 2, 2, 3, 3]);
        assert_eq!(mha(8, 2, 8).global_heads(1), vec![4, 5, 6, 7]);
        assert_eq!(mha(2, 4, 8).heads_per_rank(), 1);
    }

    #[test]
    fn locate_and_offset_of_are_inverse() {
        let p = mha(8, 2, 16);
        for rank in 0..2 {
            for region in p.regions(rank) {
                for offset in (0..region.len).step_by(7) {
                    let cell = p.locate(rank, region.index, offset).expect("inside");
                    assert_eq!(p.offset_of(rank, &cell), Some((region.index, offset)));
                }
                assert_eq!(p.locate(rank, region.index, region.len), None);
            }
        }
        let cell = p.locate(1, 3, 0).expect("inside");
        assert_eq!((cell.layer, cell.part, cell.head), (1, Part::V, 4));
        assert_eq!(p.offset_of(0, &cell), None, "rank 0 does not hold head 4");
    }
}
