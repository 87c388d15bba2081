//! Provenance patterns: every byte of the request's prefill KV encodes its
//! TP-independent [`Coordinate`], so a misplaced byte is caught, not only a
//! missing one. Other blocks carry a "foreign" pattern, decode memory starts
//! as [`SENTINEL`].
//!
//! No pattern byte is ever 0 (the value the receive post-process zeroes
//! with) or [`SENTINEL`].

use crate::layout::{CaseLayout, Coordinate, EngineLayout, MambaPart, Side};
use crate::memory::HostArena;
use std::sync::Arc;

/// The byte decode memory is filled with before a transfer: a byte still
/// equal to it afterwards was never written.
pub const SENTINEL: u8 = 0xAA;

const TAG_ATTENTION: u64 = 0x6174_746e_0000_0001;
const TAG_MAMBA: u64 = 0x6d61_6d62_0000_0002;
const TAG_FOREIGN: u64 = 0x666f_7265_0000_0003;

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Byte values a hash byte maps to: everything but 0 and [`SENTINEL`].
const REMAP: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = match i as u8 {
            0 => 1,
            SENTINEL => SENTINEL + 1,
            v => v,
        };
        i += 1;
    }
    t
};

/// One hash gives the pattern of 8 consecutive bytes.
fn word(seed: u64, index: u64) -> u64 {
    mix(seed ^ index.wrapping_mul(0xd6e8_feb8_6659_fd93))
}

fn finish(seed: u64, byte: u64) -> u8 {
    REMAP[(word(seed, byte / 8) >> ((byte % 8) * 8)) as u8 as usize]
}

/// High bit set in each byte of `x` that is zero (exact, no false positives).
fn zero_bytes(x: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    !(((x & LOW7) + LOW7) | x) & !LOW7
}

/// [`REMAP`] applied to each byte of `x` at once: 0 and [`SENTINEL`] bytes
/// get 1 added (neither is 0xFF, so nothing carries).
fn remap_word(x: u64) -> u64 {
    let hits = zero_bytes(x) | zero_bytes(x ^ u64::from_ne_bytes([SENTINEL; 8]));
    x + (hits >> 7)
}

/// `out[i] = finish(seed, first + i)`, one hash per 8 bytes, whole words at once.
fn fill_from(seed: u64, first: u64, out: &mut [u8]) {
    let head = ((8 - first % 8) % 8).min(out.len() as u64) as usize;
    for (i, b) in out[..head].iter_mut().enumerate() {
        *b = finish(seed, first + i as u64);
    }
    let first_word = (first + head as u64) / 8;
    let len = out.len();
    let mut words = out[head..].chunks_exact_mut(8);
    for (k, chunk) in words.by_ref().enumerate() {
        let w = remap_word(word(seed, first_word + k as u64));
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    let tail = words.into_remainder();
    let tail_start = first + (len - tail.len()) as u64;
    for (i, b) in tail.iter_mut().enumerate() {
        *b = finish(seed, tail_start + i as u64);
    }
}

fn attention_seed(region: u32, group: u32, token: u32, head: u32) -> u64 {
    let key =
        u64::from(region) << 48 ^ u64::from(group) << 40 ^ u64::from(head) << 32 ^ u64::from(token);
    mix(TAG_ATTENTION ^ key.wrapping_mul(0x9fb2_1c65_1e98_df25))
}

fn part_code(part: MambaPart) -> u64 {
    match part {
        MambaPart::Conv(j) => u64::from(j),
        MambaPart::Ssm => 0xffff_fffe,
        MambaPart::Padding => 0xffff_ffff,
    }
}

fn mamba_seed(region: u32, group: u32, part: MambaPart) -> u64 {
    let h = mix(TAG_MAMBA ^ u64::from(region));
    mix(h ^ (u64::from(group) << 32 | part_code(part)))
}

fn foreign_seed(side: Side, rank: u32, region: u32) -> u64 {
    let side = match side {
        Side::Prefill => 1u64,
        Side::Decode => 2u64,
    };
    mix(mix(TAG_FOREIGN ^ (side << 32 | u64::from(rank))) ^ u64::from(region))
}

/// The provenance byte of a coordinate: what prefill holds there, and so
/// what decode must hold there after the transfer.
pub fn pattern_byte(coordinate: &Coordinate) -> u8 {
    match *coordinate {
        Coordinate::Attention {
            region,
            group,
            token,
            head,
            byte,
        } => finish(attention_seed(region, group, token, head), byte),
        Coordinate::Mamba {
            region,
            group,
            part,
            byte,
        } => finish(mamba_seed(region, group, part), byte),
    }
}

/// Fills `out` with the provenance bytes of one (token, head) cell's content,
/// starting at content byte `first_byte`.
pub fn attention_cell_pattern(
    region: u32,
    group: u32,
    token: u32,
    head: u32,
    first_byte: u64,
    out: &mut [u8],
) {
    fill_from(attention_seed(region, group, token, head), first_byte, out);
}

/// Fills `out` with the provenance bytes of a mamba sub-region, from global byte `first_byte`.
pub fn mamba_pattern(region: u32, group: u32, part: MambaPart, first_byte: u64, out: &mut [u8]) {
    fill_from(mamba_seed(region, group, part), first_byte, out);
}

/// The byte a block that is not the request's holds at `offset` of `region`
/// of rank `rank` of `side` (distinct per rank, region and offset).
/// Unlike provenance bytes, foreign bytes may be any value (0 included):
/// they only have to differ from what belongs elsewhere.
pub fn foreign_byte(side: Side, rank: u32, region: u32, offset: u64) -> u8 {
    (word(foreign_seed(side, rank, region), offset / 8) >> ((offset % 8) * 8)) as u8
}

fn foreign_fill(side: Side, rank: u32, region: u32, first_offset: u64, out: &mut [u8]) {
    let seed = foreign_seed(side, rank, region);
    // Head up to a word boundary, whole words, then the tail.
    let head = ((8 - first_offset % 8) % 8).min(out.len() as u64) as usize;
    for (i, b) in out[..head].iter_mut().enumerate() {
        *b = foreign_byte(side, rank, region, first_offset + i as u64);
    }
    let first_word = (first_offset + head as u64) / 8;
    let len = out.len();
    let mut words = out[head..].chunks_exact_mut(8);
    for (k, chunk) in words.by_ref().enumerate() {
        chunk.copy_from_slice(&word(seed, first_word + k as u64).to_le_bytes());
    }
    let tail = words.into_remainder();
    let tail_start = first_offset + (len - tail.len()) as u64;
    for (i, b) in tail.iter_mut().enumerate() {
        *b = foreign_byte(side, rank, region, tail_start + i as u64);
    }
}

/// How decode memory starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeFill {
    /// Every byte is [`SENTINEL`].
    Sentinel,
    /// The request's blocks are [`SENTINEL`]; every other block (a
    /// co-resident neighbour) carries the foreign pattern of its rank.
    SentinelWithNeighbours,
}

/// Why a memory image cannot be filled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FillError {
    /// The layout has no such rank on that side.
    #[error("{side} rank {rank} does not exist in this case")]
    UnknownRank {
        /// The engine.
        side: Side,
        /// The TP rank asked for.
        rank: u32,
    },
    /// The rank has no such region (layer slot).
    #[error("{side} rank {rank} region {region} does not exist")]
    UnknownRegion {
        /// The engine.
        side: Side,
        /// The TP rank.
        rank: u32,
        /// The region index asked for.
        region: u32,
    },
    /// A region's image is not the length the layout gives it.
    #[error(
        "{side} rank {rank} region {region} image has {got} bytes, the layout needs {expected}"
    )]
    ImageSize {
        /// The engine.
        side: Side,
        /// The TP rank.
        rank: u32,
        /// The region index.
        region: u32,
        /// The image's length in bytes.
        got: u64,
        /// The region's length in the layout, in bytes.
        expected: u64,
    },
    /// A block asked for is not in the region, or the page given is not one unified page.
    #[error(
        "{side} rank {rank} region {region}: block {block} with a page of {page} bytes is not a \
         block of the layout"
    )]
    BlockOutside {
        /// The engine.
        side: Side,
        /// The TP rank.
        rank: u32,
        /// The region index.
        region: u32,
        /// The block asked for.
        block: u32,
        /// The page's length in bytes.
        page: u64,
    },
    /// A rank has a different number of region images than the layout has regions.
    #[error("{side} rank {rank} has {got} region images, the layout has {expected} regions")]
    RegionCount {
        /// The engine.
        side: Side,
        /// The TP rank.
        rank: u32,
        /// Region images given.
        got: usize,
        /// Regions in the layout.
        expected: u32,
    },
}

fn checked_layout(
    case: &CaseLayout,
    side: Side,
    rank: u32,
    region: u32,
    len: usize,
) -> Result<&EngineLayout, FillError> {
    let layout = case
        .engine(side, rank)
        .ok_or(FillError::UnknownRank { side, rank })?;
    if region >= layout.num_regions() {
        return Err(FillError::UnknownRegion { side, rank, region });
    }
    if len as u64 != layout.region_len() {
        return Err(FillError::ImageSize {
            side,
            rank,
            region,
            got: len as u64,
            expected: layout.region_len(),
        });
    }
    Ok(layout)
}

/// Fills one prefill region: the request's attention blocks and mamba state
/// with provenance bytes (in the rank's own layout), everything else
/// (other blocks, mamba padding) with the rank's foreign pattern.
pub fn fill_prefill_region(
    case: &CaseLayout,
    rank: u32,
    region: u32,
    bytes: &mut [u8],
) -> Result<(), FillError> {
    InitialFill::prefill(rank).fill_region(case, region, bytes)
}

/// Whether the request's provenance bytes cover every byte of `block`'s
/// page (an attention block whose cells fill the whole unified page).
fn provenance_covers_page(case: &CaseLayout, layout: &EngineLayout, block: u32) -> bool {
    let Some(owner) = case.owner(layout.side(), block) else {
        return false;
    };
    let cells = u64::from(layout.logical_block())
        * u64::from(layout.heads().count)
        * layout.bytes_per_head_token();
    case.group_kind(owner.group) == Some(crate::geometry::GroupKind::Attention)
        && cells == layout.unified_page()
}

/// Writes the provenance bytes of `block` (if the request owns it) into `page`.
fn write_request_block(
    case: &CaseLayout,
    layout: &EngineLayout,
    region: u32,
    block: u32,
    page: &mut [u8],
) {
    let Some(owner) = case.owner(layout.side(), block) else {
        return;
    };
    match case.group_kind(owner.group) {
        Some(crate::geometry::GroupKind::Attention) => {
            let view = layout.own_view();
            let c = layout.bytes_per_head_token() as usize;
            let first_token = owner.position * layout.logical_block();
            for t in 0..layout.logical_block() {
                for h in 0..layout.heads().count {
                    let off = layout.cell_offset(view, t, h) as usize;
                    let head = layout.global_head(h);
                    attention_cell_pattern(
                        region,
                        owner.group,
                        first_token + t,
                        head,
                        0,
                        &mut page[off..off + c],
                    );
                }
            }
        }
        Some(crate::geometry::GroupKind::Mamba) => {
            let Some(mamba) = layout.mamba() else { return };
            for (part, sub) in mamba.parts() {
                let (s, e) = (sub.offset as usize, (sub.offset + sub.size) as usize);
                let first = layout.mamba_global_byte(part, 0);
                mamba_pattern(region, owner.group, part, first, &mut page[s..e]);
            }
        }
        None => {}
    }
}

/// Fills one decode region per `fill`.
pub fn fill_decode_region(
    case: &CaseLayout,
    rank: u32,
    region: u32,
    bytes: &mut [u8],
    fill: DecodeFill,
) -> Result<(), FillError> {
    InitialFill::decode(rank, fill, Vec::new()).fill_region(case, region, bytes)
}

/// How one rank's memory starts before a case's transfers: what the
/// harness writes there, recomputable block by block, so an oracle can
/// compare a block with its initial bytes without a copy of the memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitialFill {
    /// The engine.
    pub side: Side,
    /// The TP rank.
    pub rank: u32,
    /// How decode memory starts (ignored on prefill).
    pub decode: DecodeFill,
    /// Decode blocks the scheduler zeroes when it allocates them (sorted).
    pub zeroed_blocks: Vec<u32>,
}

impl InitialFill {
    /// Prefill: the request's blocks carry provenance, the rest the rank's
    /// foreign pattern.
    pub fn prefill(rank: u32) -> Self {
        Self {
            side: Side::Prefill,
            rank,
            decode: DecodeFill::Sentinel,
            zeroed_blocks: Vec::new(),
        }
    }

    /// Decode per `fill`, then `zeroed_blocks` (allocation-time zeroing) zero.
    pub fn decode(rank: u32, fill: DecodeFill, mut zeroed_blocks: Vec<u32>) -> Self {
        zeroed_blocks.sort_unstable();
        zeroed_blocks.dedup();
        Self {
            side: Side::Decode,
            rank,
            decode: fill,
            zeroed_blocks,
        }
    }

    /// Writes the initial bytes of logical block `block` of `region` into
    /// `page` (one unified page).
    pub fn fill_block(
        &self,
        case: &CaseLayout,
        region: u32,
        block: u32,
        page: &mut [u8],
    ) -> Result<(), FillError> {
        let layout = self.layout(case, region)?;
        let u = layout.unified_page();
        if page.len() as u64 != u || block >= layout.num_logical_blocks() {
            return Err(FillError::BlockOutside {
                side: self.side,
                rank: self.rank,
                region,
                block,
                page: page.len() as u64,
            });
        }
        self.write_block(case, layout, region, block, page);
        Ok(())
    }

    /// Writes every block of `region` into `bytes` (the whole region image).
    pub fn fill_region(
        &self,
        case: &CaseLayout,
        region: u32,
        bytes: &mut [u8],
    ) -> Result<(), FillError> {
        let layout = checked_layout(case, self.side, self.rank, region, bytes.len())?;
        self.write_region(case, layout, region, bytes);
        Ok(())
    }

    /// Defers the fill of every arena of the rank (`arenas[region]`) to its
    /// first access ([`HostArena::defer_fill`]): an arena nothing reads or
    /// writes is never filled, and its pages are never touched.
    pub fn defer_to_arenas(
        &self,
        case: &Arc<CaseLayout>,
        arenas: &[HostArena],
    ) -> Result<(), FillError> {
        check_region_count(case, self.side, self.rank, arenas.len())?;
        for (region, arena) in arenas.iter().enumerate() {
            let region = region as u32;
            checked_layout(case, self.side, self.rank, region, arena.len() as usize)?;
            let (fill, case) = (self.clone(), Arc::clone(case));
            arena.defer_fill(move |bytes| {
                if let Some(layout) = case.engine(fill.side, fill.rank) {
                    fill.write_region(&case, layout, region, bytes);
                }
            });
        }
        Ok(())
    }

    fn write_region(
        &self,
        case: &CaseLayout,
        layout: &EngineLayout,
        region: u32,
        bytes: &mut [u8],
    ) {
        let u = layout.unified_page() as usize;
        for (block, page) in bytes.chunks_exact_mut(u).enumerate() {
            self.write_block(case, layout, region, block as u32, page);
        }
    }

    fn layout<'a>(&self, case: &'a CaseLayout, region: u32) -> Result<&'a EngineLayout, FillError> {
        let (side, rank) = (self.side, self.rank);
        let layout = case
            .engine(side, rank)
            .ok_or(FillError::UnknownRank { side, rank })?;
        if region >= layout.num_regions() {
            return Err(FillError::UnknownRegion { side, rank, region });
        }
        Ok(layout)
    }

    fn write_block(
        &self,
        case: &CaseLayout,
        layout: &EngineLayout,
        region: u32,
        block: u32,
        page: &mut [u8],
    ) {
        let first_byte = u64::from(block) * layout.unified_page();
        let owned = case.owner(self.side, block).is_some();
        match self.side {
            Side::Prefill => {
                // The foreign pattern fills what the request's bytes leave.
                if !provenance_covers_page(case, layout, block) {
                    foreign_fill(self.side, self.rank, region, first_byte, page);
                }
                write_request_block(case, layout, region, block, page);
            }
            Side::Decode if self.zeroed_blocks.binary_search(&block).is_ok() => page.fill(0),
            Side::Decode if !owned && self.decode == DecodeFill::SentinelWithNeighbours => {
                foreign_fill(self.side, self.rank, region, first_byte, page)
            }
            Side::Decode => page.fill(SENTINEL),
        }
    }
}

/// Fills every region image of a prefill rank (`images[region]`).
pub fn fill_prefill_rank(
    case: &CaseLayout,
    rank: u32,
    images: &mut [Vec<u8>],
) -> Result<(), FillError> {
    check_region_count(case, Side::Prefill, rank, images.len())?;
    images
        .iter_mut()
        .enumerate()
        .try_for_each(|(i, img)| fill_prefill_region(case, rank, i as u32, img))
}

/// Fills every region image of a decode rank (`images[region]`).
pub fn fill_decode_rank(
    case: &CaseLayout,
    rank: u32,
    images: &mut [Vec<u8>],
    fill: DecodeFill,
) -> Result<(), FillError> {
    check_region_count(case, Side::Decode, rank, images.len())?;
    images
        .iter_mut()
        .enumerate()
        .try_for_each(|(i, img)| fill_decode_region(case, rank, i as u32, img, fill))
}

/// Fills the host arenas of a prefill rank (`arenas[region]`).
pub fn fill_prefill_arenas(
    case: &CaseLayout,
    rank: u32,
    arenas: &[HostArena],
) -> Result<(), FillError> {
    check_region_count(case, Side::Prefill, rank, arenas.len())?;
    arenas
        .iter()
        .enumerate()
        .try_for_each(|(i, a)| fill_prefill_region(case, rank, i as u32, &mut a.write()))
}

/// Fills the host arenas of a decode rank (`arenas[region]`).
pub fn fill_decode_arenas(
    case: &CaseLayout,
    rank: u32,
    arenas: &[HostArena],
    fill: DecodeFill,
) -> Result<(), FillError> {
    check_region_count(case, Side::Decode, rank, arenas.len())?;
    arenas
        .iter()
        .enumerate()
        .try_for_each(|(i, a)| fill_decode_region(case, rank, i as u32, &mut a.write(), fill))
}

fn check_region_count(
    case: &CaseLayout,
    side: Side,
    rank: u32,
    got: usize,
) -> Result<(), FillError> {
    let layout = case
        .engine(side, rank)
        .ok_or(FillError::UnknownRank { side, rank })?;
    if got != layout.num_regions() as usize {
        return Err(FillError::RegionCount {
            side,
            rank,
            got,
            expected: layout.num_regions(),
        });
    }
    Ok(())
}

/// What prefill held for the coordinate that byte `offset` of `region` of
/// decode rank `rank` holds once post-processed (decode's own layout);
/// `None` outside the request's blocks and in mamba padding.
pub fn expected_decode_byte(case: &CaseLayout, rank: u32, region: u32, offset: u64) -> Option<u8> {
    let layout = case.engine(Side::Decode, rank)?;
    if region >= layout.num_regions() {
        return None;
    }
    case.coordinate_at(layout, layout.own_view(), region, offset)
        .map(|c| pattern_byte(&c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::KvLayout;
    use crate::layout::classifier_tests::{attention_blocks, case, engine, gqa};

    #[test]
    fn the_word_remap_is_the_byte_remap() {
        let mut words = vec![0u64, u64::MAX, u64::from_ne_bytes([SENTINEL; 8])];
        words.push(u64::from_le_bytes([
            0, SENTINEL, 1, 0xAB, 0xFF, 0x7F, 0x80, 0,
        ]));
        words.extend((0..10_000).map(|i| word(7, i)));
        for x in words {
            let by_byte = x.to_le_bytes().map(|b| REMAP[b as usize]);
            assert_eq!(remap_word(x).to_le_bytes(), by_byte, "{x:#018x}");
        }
    }

    #[test]
    fn a_fill_from_any_offset_matches_the_bytes_one_by_one() {
        for first in 0..17u64 {
            for len in [0usize, 1, 5, 8, 9, 23, 64] {
                let mut out = vec![0u8; len];
                fill_from(42, first, &mut out);
                let want: Vec<u8> = (0..len as u64).map(|i| finish(42, first + i)).collect();
                assert_eq!(out, want, "first {first}, len {len}");
            }
        }
    }

    #[test]
    fn pattern_bytes_avoid_zero_and_sentinel_and_depend_on_every_field() {
        let mut seen = [false; 256];
        for token in 0..64 {
            for byte in 0..64 {
                let c = Coordinate::Attention {
                    region: 1,
                    group: 0,
                    token,
                    head: 2,
                    byte,
                };
                seen[pattern_byte(&c) as usize] = true;
            }
        }
        assert!(!seen[0] && !seen[SENTINEL as usize]);
        assert_eq!(seen.iter().filter(|&&s| s).count(), 254);

        let base = Coordinate::Attention {
            region: 0,
            group: 0,
            token: 5,
            head: 1,
            byte: 3,
        };
        let variants = [
            Coordinate::Attention {
                region: 1,
                group: 0,
                token: 5,
                head: 1,
                byte: 3,
            },
            Coordinate::Attention {
                region: 0,
                group: 1,
                token: 5,
                head: 1,
                byte: 3,
            },
            Coordinate::Attention {
                region: 0,
                group: 0,
                token: 6,
                head: 1,
                byte: 3,
            },
            Coordinate::Attention {
                region: 0,
                group: 0,
                token: 5,
                head: 0,
                byte: 3,
            },
        ];
        // A single byte can collide by chance; a 16-byte run cannot plausibly.
        let run = |c: Coordinate| -> Vec<u8> {
            (0..16)
                .map(|b| match c {
                    Coordinate::Attention {
                        region,
                        group,
                        token,
                        head,
                        ..
                    } => pattern_byte(&Coordinate::Attention {
                        region,
                        group,
                        token,
                        head,
                        byte: b,
                    }),
                    Coordinate::Mamba { .. } => unreachable!(),
                })
                .collect()
        };
        for v in variants {
            assert_ne!(run(base), run(v), "{v:?}");
        }
        let mut cell = [0u8; 16];
        attention_cell_pattern(0, 0, 5, 1, 0, &mut cell);
        assert_eq!(cell.to_vec(), run(base));
    }

    #[test]
    fn mamba_and_foreign_patterns_differ_by_part_and_rank() {
        let mut conv = [0u8; 32];
        let mut ssm = [0u8; 32];
        mamba_pattern(0, 1, MambaPart::Conv(0), 0, &mut conv);
        mamba_pattern(0, 1, MambaPart::Ssm, 0, &mut ssm);
        assert_ne!(conv, ssm);
        assert_eq!(
            conv[7],
            pattern_byte(&Coordinate::Mamba {
                region: 0,
                group: 1,
                part: MambaPart::Conv(0),
                byte: 7
            })
        );
        let f0: Vec<u8> = (0..32)
            .map(|o| foreign_byte(Side::Prefill, 0, 0, o))
            .collect();
        let f1: Vec<u8> = (0..32)
            .map(|o| foreign_byte(Side::Prefill, 1, 0, o))
            .collect();
        assert_ne!(f0, f1);
        assert!(f0.iter().all(|&b| b != 0 && b != SENTINEL));
    }

    #[test]
    fn provenance_survives_a_head_sliced_copy() {
        // Decode TP2 <- prefill TP1, HND: copy each rank's head slice of every
        // prefill kernel page; every decode byte then equals its expected byte.
        let c = case(
            gqa(4, false),
            engine(2, 4, 8, KvLayout::Hnd),
            engine(1, 4, 8, KvLayout::Hnd),
            attention_blocks(vec![1, 3], vec![2, 5]),
        );
        let p = c.engine(Side::Prefill, 0).expect("rank 0");
        let mut p_mem = vec![vec![0u8; p.region_len() as usize]];
        fill_prefill_rank(&c, 0, &mut p_mem).expect("fill");
        for rank in 0..2u32 {
            let d = c.engine(Side::Decode, rank).expect("rank");
            let mut d_mem = vec![0u8; d.region_len() as usize];
            for (&db, &pb) in [1u64, 3].iter().zip(&[2u64, 5]) {
                for k in 0..2u64 {
                    let src = (pb * 256 + k * 128 + u64::from(rank) * 64) as usize;
                    let dst = (db * 128 + k * 64) as usize;
                    d_mem[dst..dst + 64].copy_from_slice(&p_mem[0][src..src + 64]);
                }
            }
            for offset in [128u64, 3 * 128] {
                for i in 0..128 {
                    let expected =
                        expected_decode_byte(&c, rank, 0, offset + i).expect("request byte");
                    assert_eq!(
                        d_mem[(offset + i) as usize],
                        expected,
                        "rank {rank} offset {}",
                        offset + i
                    );
                }
            }
            assert_eq!(expected_decode_byte(&c, rank, 0, 0), None);
        }
    }
}
