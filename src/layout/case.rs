//! All ranks of both engines of one case plus the request's block lists:
//! classifies descriptor rows by agent name.

use serde::{Deserialize, Serialize};

use crate::geometry::{block_size_ratio, Geometry, GroupKind, Mode, ModelSpec};
use crate::nixl::recording::Classify;
use crate::nixl::{AgentId, DescRow};

use super::coordinate::Coordinate;
use super::engine::{EngineLayout, PageView};
use super::location::{AttentionSpan, CellOrder, Location, LocationKind, MambaSpan, SpanShape};
use super::{LayoutError, Side};

/// The request's logical block ids per KV-cache group (group order of the model).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestBlocks {
    /// Decode's blocks, in request order: prefix-hit blocks first.
    pub decode: Vec<Vec<u32>>,
    /// The decode blocks the transfer writes (`decode` minus prefix-hit blocks).
    pub decode_transfer: Vec<Vec<u32>>,
    /// Prefill's blocks, in request order, from the first prompt token.
    pub prefill: Vec<Vec<u32>>,
}

impl RequestBlocks {
    /// Block lists for a decode prefix hit of `hit_tokens`: attention groups
    /// transfer all but their first `hit_tokens / decode_logical_block`
    /// blocks; mamba groups transfer every slot.
    pub fn with_prefix_hit(
        model: &ModelSpec,
        decode_logical_block: u32,
        decode: Vec<Vec<u32>>,
        prefill: Vec<Vec<u32>>,
        hit_tokens: u32,
    ) -> Self {
        let hit_blocks = (hit_tokens / decode_logical_block.max(1)) as usize;
        let decode_transfer = decode
            .iter()
            .enumerate()
            .map(|(g, ids)| match model.groups.get(g) {
                Some(GroupKind::Attention) => ids.iter().skip(hit_blocks).copied().collect(),
                _ => ids.clone(),
            })
            .collect();
        Self {
            decode,
            decode_transfer,
            prefill,
        }
    }
}

/// The request group and list position that own a logical block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    /// The group whose block list holds the block.
    pub group: u32,
    /// The block's position in that list.
    pub position: u32,
}

/// Every rank's layout of both engines of one case, and the request's blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaseLayout {
    geometry: Geometry,
    mode: Mode,
    decode: Vec<EngineLayout>,
    prefill: Vec<EngineLayout>,
    blocks: RequestBlocks,
    decode_owner: Vec<Option<Owner>>,
    prefill_owner: Vec<Option<Owner>>,
    decode_transfer: Vec<bool>,
}

impl CaseLayout {
    /// Builds every rank's layout from region bases (`[rank][region]`) and pool sizes.
    #[allow(clippy::too_many_arguments)]
    pub fn from_bases(
        geometry: Geometry,
        mode: Mode,
        blocks: RequestBlocks,
        decode_bases: Vec<Vec<u64>>,
        decode_num_logical_blocks: u32,
        prefill_bases: Vec<Vec<u64>>,
        prefill_num_logical_blocks: u32,
    ) -> Result<Self, LayoutError> {
        let build = |side, engine, bases: Vec<Vec<u64>>, pool| {
            bases
                .into_iter()
                .enumerate()
                .map(|(rank, b)| {
                    EngineLayout::new(side, &geometry.model, engine, rank as u32, b, pool)
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let decode = build(
            Side::Decode,
            &geometry.decode,
            decode_bases,
            decode_num_logical_blocks,
        )?;
        let prefill = build(
            Side::Prefill,
            &geometry.prefill,
            prefill_bases,
            prefill_num_logical_blocks,
        )?;
        Self::new(geometry, mode, decode, prefill, blocks)
    }

    /// Combines per-rank layouts (index = rank) with the request's blocks.
    ///
    /// In pull mode, when a decode page receives sub-pages in the prefill
    /// layout (block-size ratio `r > 1` or differing layouts, non-MLA), decode
    /// layouts without a receive view get one: prefill kernel units in the
    /// prefill layout.
    pub fn new(
        geometry: Geometry,
        mode: Mode,
        decode: Vec<EngineLayout>,
        prefill: Vec<EngineLayout>,
        blocks: RequestBlocks,
    ) -> Result<Self, LayoutError> {
        for (side, layouts, tp) in [
            (Side::Decode, &decode, geometry.decode.tp_size),
            (Side::Prefill, &prefill, geometry.prefill.tp_size),
        ] {
            if tp == 0 {
                return Err(LayoutError::ZeroTpSize { side });
            }
            if layouts.len() != tp as usize
                || layouts
                    .iter()
                    .enumerate()
                    .any(|(i, l)| l.tp_rank() != i as u32 || l.side() != side)
            {
                return Err(LayoutError::RankCount {
                    side,
                    got: layouts.len(),
                    expected: tp,
                });
            }
        }
        let groups = &geometry.model.groups;
        let decode_owner = owners(
            Side::Decode,
            groups.len(),
            &blocks.decode,
            decode[0].num_logical_blocks(),
        )?;
        let prefill_owner = owners(
            Side::Prefill,
            groups.len(),
            &blocks.prefill,
            prefill[0].num_logical_blocks(),
        )?;
        if blocks.decode_transfer.len() != groups.len() {
            return Err(LayoutError::GroupCount {
                side: Side::Decode,
                got: blocks.decode_transfer.len(),
                expected: groups.len(),
            });
        }
        let mut decode_transfer = vec![false; decode_owner.len()];
        for (g, ids) in blocks.decode_transfer.iter().enumerate() {
            for &b in ids {
                match decode_owner.get(b as usize).copied().flatten() {
                    Some(o) if o.group == g as u32 => decode_transfer[b as usize] = true,
                    _ => return Err(LayoutError::TransferBlockNotOwned { block: b, group: g }),
                }
            }
        }
        let decode = match default_receive_view(&geometry, mode) {
            Some(view) => decode
                .into_iter()
                .map(|l| {
                    if l.receive_view().is_some() {
                        Ok(l)
                    } else {
                        l.with_receive_view(view)
                    }
                })
                .collect::<Result<_, _>>()?,
            None => decode,
        };
        Ok(Self {
            geometry,
            mode,
            decode,
            prefill,
            blocks,
            decode_owner,
            prefill_owner,
            decode_transfer,
        })
    }

    /// The case's geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The model both engines serve.
    pub fn model(&self) -> &ModelSpec {
        &self.geometry.model
    }

    /// Pull or push.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The request's blocks on both engines.
    pub fn blocks(&self) -> &RequestBlocks {
        &self.blocks
    }

    /// Layouts of every rank of `side`, by rank.
    pub fn engines(&self, side: Side) -> &[EngineLayout] {
        match side {
            Side::Decode => &self.decode,
            Side::Prefill => &self.prefill,
        }
    }

    /// The layout of one rank, if it exists.
    pub fn engine(&self, side: Side, rank: u32) -> Option<&EngineLayout> {
        self.engines(side).get(rank as usize)
    }

    /// The request group and position owning logical block `block` on `side`.
    pub fn owner(&self, side: Side, block: u32) -> Option<Owner> {
        let owners = match side {
            Side::Decode => &self.decode_owner,
            Side::Prefill => &self.prefill_owner,
        };
        owners.get(block as usize).copied().flatten()
    }

    /// Whether the transfer may write decode block `block`.
    pub fn is_decode_transfer_block(&self, block: u32) -> bool {
        self.decode_transfer
            .get(block as usize)
            .copied()
            .unwrap_or(false)
    }

    /// The request's block list of `group` on `side`.
    pub fn group_blocks(&self, side: Side, group: u32) -> &[u32] {
        let lists = match side {
            Side::Decode => &self.blocks.decode,
            Side::Prefill => &self.blocks.prefill,
        };
        lists.get(group as usize).map_or(&[], Vec::as_slice)
    }

    /// The kind of group `group`, if the model has it.
    pub fn group_kind(&self, group: u32) -> Option<GroupKind> {
        self.geometry.model.groups.get(group as usize).copied()
    }

    /// Tokens of one logical block on `side`.
    pub fn logical_block(&self, side: Side) -> u32 {
        match side {
            Side::Decode => self.geometry.decode.logical_block,
            Side::Prefill => self.geometry.prefill.logical_block,
        }
    }

    /// Classifies a row of the agent named `agent_name` (`prefill-<rank>` or
    /// `decode-<rank>`) in that rank's transfer view.
    pub fn classify_named(&self, agent_name: &str, row: DescRow) -> Location {
        match Side::parse_agent_name(agent_name) {
            Some((side, rank)) => self.classify_on(side, rank, row),
            None => Location {
                side: None,
                rank: None,
                region: None,
                offset: row.addr,
                len: row.len,
                logical_block: None,
                kind: LocationKind::UnknownAgent,
            },
        }
    }

    /// Classifies a row of rank `rank` of `side` in that rank's transfer view.
    pub fn classify_on(&self, side: Side, rank: u32, row: DescRow) -> Location {
        match self.engine(side, rank) {
            Some(layout) => self.classify_in_view(layout, layout.transfer_view(), row),
            None => Location {
                side: Some(side),
                rank: Some(rank),
                region: None,
                offset: row.addr,
                len: row.len,
                logical_block: None,
                kind: LocationKind::UnknownAgent,
            },
        }
    }

    /// Classifies a row of `layout`'s rank with attention pages seen through `view`.
    pub fn classify_in_view(
        &self,
        layout: &EngineLayout,
        view: PageView,
        row: DescRow,
    ) -> Location {
        let side = layout.side();
        let mut loc = Location {
            side: Some(side),
            rank: Some(layout.tp_rank()),
            region: None,
            offset: row.addr,
            len: row.len,
            logical_block: None,
            kind: LocationKind::OutsideRegions,
        };
        let Some((region, offset)) = layout.locate(row.addr, row.len) else {
            if let Some((region, offset)) = layout.locate(row.addr, 1) {
                loc.region = Some(region);
                loc.offset = offset;
                loc.logical_block = Some((offset / layout.unified_page()) as u32);
            }
            return loc;
        };
        let u = layout.unified_page();
        let block = (offset / u) as u32;
        loc.region = Some(region);
        loc.offset = offset;
        loc.logical_block = Some(block);
        let in_block = offset % u;
        if row.len > 0 && (offset + row.len - 1) / u != u64::from(block) {
            loc.kind = LocationKind::CrossesBlocks;
            return loc;
        }
        let Some(owner) = self.owner(side, block) else {
            loc.kind = LocationKind::Unowned;
            return loc;
        };
        loc.kind = match self.group_kind(owner.group) {
            Some(GroupKind::Attention) if layout.touches_padding(in_block, row.len) => {
                LocationKind::PagePadding
            }
            Some(GroupKind::Attention) => {
                let dense = layout.dense_offset(in_block).unwrap_or(in_block);
                LocationKind::Attention(self.attention_span(layout, view, owner, dense, row.len))
            }
            _ => LocationKind::Mamba(MambaSpan {
                group: owner.group,
                slot_position: owner.position,
                pieces: layout.mamba_pieces(in_block, row.len),
            }),
        };
        loc
    }

    fn attention_span(
        &self,
        layout: &EngineLayout,
        view: PageView,
        owner: Owner,
        in_block: u64,
        len: u64,
    ) -> AttentionSpan {
        let first_token = owner.position * layout.logical_block();
        if len == 0 {
            let (t, h, c) = layout.byte_cell(view, in_block);
            let (t, h) = (first_token + t, layout.global_head(h));
            return AttentionSpan {
                group: owner.group,
                block_position: owner.position,
                tokens: t..t,
                heads: h..h,
                content: c..c,
                order: CellOrder::TokenMajor,
                shape: SpanShape::Rect,
            };
        }
        let cells = layout.block_cells(view, in_block, len);
        AttentionSpan {
            group: owner.group,
            block_position: owner.position,
            tokens: first_token + cells.tokens.start..first_token + cells.tokens.end,
            heads: layout.global_head(cells.heads.start)..layout.global_head(cells.heads.end),
            content: cells.content,
            order: cells.order,
            shape: if cells.rect {
                SpanShape::Rect
            } else {
                SpanShape::Ragged
            },
        }
    }

    /// The coordinate of byte `offset` of `region` on `layout`'s rank, with
    /// attention pages seen through `view`; `None` outside the request's
    /// blocks and in mamba padding.
    pub fn coordinate_at(
        &self,
        layout: &EngineLayout,
        view: PageView,
        region: u32,
        offset: u64,
    ) -> Option<Coordinate> {
        let u = layout.unified_page();
        let block = (offset / u) as u32;
        if block >= layout.num_logical_blocks() {
            return None;
        }
        let owner = self.owner(layout.side(), block)?;
        let in_block = offset % u;
        match self.group_kind(owner.group)? {
            GroupKind::Attention => {
                let (t, h, byte) = layout.byte_cell(view, layout.dense_offset(in_block)?);
                Some(Coordinate::Attention {
                    region,
                    group: owner.group,
                    token: owner.position * layout.logical_block() + t,
                    head: layout.global_head(h),
                    byte,
                })
            }
            GroupKind::Mamba => {
                let (part, sub) = layout
                    .mamba()?
                    .parts()
                    .find(|(_, s)| in_block >= s.offset && in_block < s.offset + s.size)?;
                Some(Coordinate::Mamba {
                    region,
                    group: owner.group,
                    part,
                    byte: layout.mamba_global_byte(part, in_block - sub.offset),
                })
            }
        }
    }
}

impl Classify for CaseLayout {
    type Location = Location;

    fn classify(&self, _initiator: AgentId, agent_name: &str, row: DescRow) -> Location {
        self.classify_named(agent_name, row)
    }
}

/// The receive view decode pages need while a pull writes them, if any.
fn default_receive_view(geometry: &Geometry, _mode: Mode) -> Option<PageView> {
    // Pull reads, and kvgeom's push writes, whole prefill pages into decode
    // sub-pages; either way the page holds prefill's layout until converted.
    if geometry.model.is_mla() {
        return None;
    }
    let (d, p) = (&geometry.decode, &geometry.prefill);
    let r = block_size_ratio(d.kernel_block, p.kernel_block)?;
    (r > 1 || d.layout != p.layout).then_some(PageView {
        unit_tokens: p.kernel_block,
        layout: p.layout,
    })
}

/// Block id -> owning (group, position) over a pool of `pool` blocks.
fn owners(
    side: Side,
    num_groups: usize,
    lists: &[Vec<u32>],
    pool: u32,
) -> Result<Vec<Option<Owner>>, LayoutError> {
    if lists.len() != num_groups {
        return Err(LayoutError::GroupCount {
            side,
            got: lists.len(),
            expected: num_groups,
        });
    }
    let mut out: Vec<Option<Owner>> = vec![None; pool as usize];
    for (g, ids) in lists.iter().enumerate() {
        for (pos, &b) in ids.iter().enumerate() {
            let slot = out.get_mut(b as usize).ok_or(LayoutError::BlockOutOfPool {
                side,
                block: b,
                group: g,
                pool,
            })?;
            if let Some(prev) = slot {
                return Err(LayoutError::DuplicateBlock {
                    side,
                    block: b,
                    first: prev.group as usize,
                    second: g,
                });
            }
            *slot = Some(Owner {
                group: g as u32,
                position: pos as u32,
            });
        }
    }
    Ok(out)
}
