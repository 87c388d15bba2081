//! kvgeom's oracles over an SGLang run. kvgeom's vLLM layout model
//! (`crate::layout`: blocks of one packed K|V content per head, logical vs
//! kernel blocks) does not describe SGLang's pools, so these checks are
//! written here over [`super::layout`]'s model, under the names of the
//! shared oracles ([`crate::oracle`]) and reporting the same
//! [`Violation`]s:
//!
//! - `pairing`: every posted pair moves a prefill byte to the decode byte
//!   of the same identity (layer, K/V/latent, request token, global KV
//!   head, byte);
//! - `coverage`: no decode byte of a transferred token is left untouched;
//! - `transferred_or_zeroed`: every decode byte of a transferred token holds
//!   prefill's byte for its identity; a row of the last page at or past the
//!   prompt holds prefill's byte or is untouched (SGLang copies whole pages
//!   and never zeroes);
//! - `neighbour_preservation`: every other decode byte (other pages, the
//!   padding page 0) is untouched, and prefill's memory is unchanged;
//! - `no_double_write`: no decode byte is written twice with different
//!   bytes. A byte written again with the same bytes (replicated prefill
//!   ranks each writing the head they share, as SGLang 0.5.23 does) is
//!   counted in [`Judged::redundant_bytes`] and fails nothing.
//!
//! Containment (a descriptor outside registered memory) is the stand-in's
//! refusal, which makes the case crashed (see `super::run`).

use std::collections::BTreeMap;

use super::images::{expected_decode, request_byte, request_token, Expect, Placement};
use super::layout::{locate_in, EnginePools};
use super::result::Write;
use crate::layout::Side;
use crate::oracle::{
    coverage, neighbour_preservation, no_double_write, pairing, transferred_or_zeroed,
};
use crate::oracle::{PairRef, Violation};
use crate::pattern::SENTINEL;

/// Every rank's regions' bytes: `[rank][region]`.
pub type Images = Vec<Vec<Vec<u8>>>;

/// What a completed SGLang run left, as the oracles read it.
pub struct Observed {
    /// Prefill's pools.
    pub prefill: EnginePools,
    /// Decode's pools.
    pub decode: EnginePools,
    /// The request's pages and prompt.
    pub placement: Placement,
    /// Prefill's memory before the run.
    pub prefill_before: Images,
    /// Prefill's memory after it.
    pub prefill_after: Images,
    /// Decode's memory after it (it started as SENTINEL).
    pub decode_after: Images,
    /// Every posted pair between KV regions.
    pub writes: Vec<Write>,
}

/// The oracles' verdict.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Judged {
    /// Every violation.
    pub violations: Vec<Violation>,
    /// Decode bytes written again with the bytes they already received.
    pub redundant_bytes: u64,
    /// Posted pairs that wrote only such bytes again.
    pub redundant_pairs: u64,
    /// The most writes of any one decode byte (1 without redundant writes).
    pub most_writers: u32,
}

/// Offending bytes of one oracle in one region, gathered into one violation.
struct Gather {
    oracle: &'static str,
    side: Side,
    rank: u32,
    region: u32,
    first: u64,
    last: u64,
    count: u64,
    page: u32,
    what: String,
    expected: String,
    found: String,
    pairs: Vec<PairRef>,
}

/// Where one offending byte lies: its side, rank and region, its offset
/// in the region, and the page holding it.
#[derive(Clone, Copy)]
struct ByteAt {
    side: Side,
    rank: u32,
    region: u32,
    offset: u64,
    page: u32,
}

#[derive(Default)]
struct Gathered(BTreeMap<(&'static str, u8, u32, u32), Gather>);

impl Gathered {
    fn add(
        &mut self,
        oracle: &'static str,
        at: ByteAt,
        what: impl FnOnce() -> (String, String, String),
        pair: Option<PairRef>,
    ) {
        let ByteAt {
            side,
            rank,
            region,
            offset,
            page,
        } = at;
        let key = (oracle, u8::from(side == Side::Decode), rank, region);
        match self.0.get_mut(&key) {
            Some(g) => {
                if offset < g.first {
                    g.first = offset;
                    g.page = page;
                }
                g.last = g.last.max(offset);
                g.count += 1;
                if let Some(p) = pair {
                    if g.pairs.len() < 4 && !g.pairs.contains(&p) {
                        g.pairs.push(p);
                    }
                }
            }
            None => {
                let (what, expected, found) = what();
                self.0.insert(
                    key,
                    Gather {
                        oracle,
                        side,
                        rank,
                        region,
                        first: offset,
                        last: offset,
                        count: 1,
                        page,
                        what,
                        expected,
                        found,
                        pairs: pair.into_iter().collect(),
                    },
                );
            }
        }
    }

    fn into_violations(self) -> Vec<Violation> {
        self.0
            .into_values()
            .map(|g| {
                let mut v = Violation::new(g.oracle, g.what)
                    .on(Some(g.side), Some(g.rank))
                    .region(Some(g.region))
                    .block(Some(g.page))
                    .bytes(g.first..g.last + 1, g.count)
                    .expected(g.expected)
                    .found(g.found);
                for p in g.pairs {
                    v = v.pair(p);
                }
                v
            })
            .collect()
    }
}

fn hex(b: u8) -> String {
    format!("{b:#04x}")
}

/// Run every SGLang oracle over `o`.
pub fn judge(o: &Observed) -> Judged {
    let mut g = Gathered::default();
    final_bytes(o, &mut g);
    prefill_unchanged(o, &mut g);
    let (redundant_bytes, redundant_pairs, most_writers) = writes(o, &mut g);
    Judged {
        violations: g.into_violations(),
        redundant_bytes,
        redundant_pairs,
        most_writers,
    }
}

/// coverage, transferred_or_zeroed and decode's neighbour_preservation.
fn final_bytes(o: &Observed, g: &mut Gathered) {
    for rank in 0..o.decode.attn_tp {
        let Some(images) = o.decode_after.get(rank as usize) else {
            continue;
        };
        for region in &o.decode.regions(rank) {
            let Some(image) = images.get(region.index as usize) else {
                continue;
            };
            for (offset, &found) in image.iter().enumerate() {
                let offset = offset as u64;
                let Some((cell, expect)) = expected_decode(&o.decode, &o.placement, region, offset)
                else {
                    continue;
                };
                let (oracle, text, expected) = match expect {
                    Expect::Exact(b) if found == b => continue,
                    Expect::Exact(b) if found == SENTINEL => (
                        coverage::NAME,
                        "a transferred token's byte was never written",
                        hex(b),
                    ),
                    Expect::Exact(b) => (
                        transferred_or_zeroed::NAME,
                        "a transferred token's byte is not prefill's",
                        hex(b),
                    ),
                    Expect::ExactOrSentinel(b) if found == b || found == SENTINEL => continue,
                    Expect::ExactOrSentinel(b) => (
                        transferred_or_zeroed::NAME,
                        "a row of the last page past the prompt holds neither prefill's byte nor its own",
                        format!("{} or untouched {}", hex(b), hex(SENTINEL)),
                    ),
                    Expect::Sentinel if found == SENTINEL => continue,
                    Expect::Sentinel => (
                        neighbour_preservation::NAME,
                        "a decode byte outside the request was written",
                        format!("untouched {}", hex(SENTINEL)),
                    ),
                };
                let at = ByteAt {
                    side: Side::Decode,
                    rank,
                    region: region.index,
                    offset,
                    page: cell.page,
                };
                g.add(
                    oracle,
                    at,
                    || {
                        (
                            format!(
                                "{text}: {} page {} row {} head {} byte {}",
                                region.what(),
                                cell.page,
                                cell.row,
                                cell.head,
                                cell.byte
                            ),
                            expected,
                            hex(found),
                        )
                    },
                    None,
                );
            }
        }
    }
}

/// Prefill's neighbour_preservation: its memory is unchanged.
fn prefill_unchanged(o: &Observed, g: &mut Gathered) {
    for (rank, (before, after)) in o.prefill_before.iter().zip(&o.prefill_after).enumerate() {
        for (region, (b, a)) in before.iter().zip(after).enumerate() {
            for (offset, (&x, &y)) in b.iter().zip(a).enumerate() {
                if x != y {
                    let page = o
                        .prefill
                        .locate(rank as u32, region as u32, offset as u64)
                        .map_or(0, |c| c.page);
                    let at = ByteAt {
                        side: Side::Prefill,
                        rank: rank as u32,
                        region: region as u32,
                        offset: offset as u64,
                        page,
                    };
                    g.add(
                        neighbour_preservation::NAME,
                        at,
                        || {
                            (
                                "prefill's memory changed".into(),
                                format!("its initial {}", hex(x)),
                                hex(y),
                            )
                        },
                        None,
                    );
                }
            }
        }
    }
}

/// A decode byte's first written value and how many pairs wrote it.
type FirstWrite = (u8, u32);

/// pairing and no_double_write over the posted pairs; the redundant
/// bytes and pairs, and the most writes of any one decode byte.
fn writes(o: &Observed, g: &mut Gathered) -> (u64, u64, u32) {
    // Per decode rank and region: the first byte written at each offset,
    // and how many pairs wrote it.
    let mut written: BTreeMap<(u32, u32), Vec<Option<FirstWrite>>> = BTreeMap::new();
    let mut redundant_bytes = 0;
    let mut redundant_pairs = 0;
    let mut most_writers = 1;
    for w in &o.writes {
        let pair = PairRef {
            xfer: w.xfer,
            pair: w.pair,
        };
        let src_regions = o.prefill.regions(w.source.rank);
        let dst_regions = o.decode.regions(w.destination.rank);
        let (Some(sr), Some(dr)) = (
            src_regions.get(w.source.region as usize),
            dst_regions.get(w.destination.region as usize),
        ) else {
            continue;
        };
        let source_image = o
            .prefill_before
            .get(w.source.rank as usize)
            .and_then(|r| r.get(w.source.region as usize));
        let slot = written
            .entry((w.destination.rank, w.destination.region))
            .or_insert_with(|| vec![None; dr.len as usize]);
        let mut again = 0;
        for k in 0..w.len {
            let (s_off, d_off) = (w.source.offset + k, w.destination.offset + k);
            let (Some(sc), Some(dc)) = (
                locate_in(sr, o.prefill.page_size, s_off),
                locate_in(dr, o.decode.page_size, d_off),
            ) else {
                continue;
            };
            let at = ByteAt {
                side: Side::Decode,
                rank: w.destination.rank,
                region: w.destination.region,
                offset: d_off,
                page: dc.page,
            };
            // pairing: the same identity on both ends.
            let st = request_token(&sc, &o.placement.prefill_pages, o.prefill.page_size);
            let dt = request_token(&dc, &o.placement.decode_pages, o.decode.page_size);
            let same = st.is_some()
                && st == dt
                && (sc.layer, sc.part, sc.head, sc.byte) == (dc.layer, dc.part, dc.head, dc.byte);
            if !same {
                g.add(
                    pairing::NAME,
                    at,
                    || {
                        let token = |t: Option<u32>| {
                            t.map_or("no request token".into(), |t| format!("token {t}"))
                        };
                        (
                            format!(
                                "a pair writes prefill-{} {:?} layer {} {} head {} byte {} onto {}",
                                w.source.rank,
                                sc.part,
                                sc.layer,
                                token(st),
                                sc.head,
                                sc.byte,
                                dr.what()
                            ),
                            format!(
                                "{:?} layer {} {} head {} byte {}",
                                dc.part,
                                dc.layer,
                                token(dt),
                                dc.head,
                                dc.byte
                            ),
                            format!(
                                "{:?} layer {} {} head {} byte {}",
                                sc.part,
                                sc.layer,
                                token(st),
                                sc.head,
                                sc.byte
                            ),
                        )
                    },
                    Some(pair),
                );
            }
            // no_double_write: the value this pair moves.
            let value = source_image
                .and_then(|img| img.get(s_off as usize).copied())
                .or_else(|| st.map(|t| request_byte(&sc, t)));
            let Some(value) = value else { continue };
            match slot.get_mut(d_off as usize) {
                Some(s @ None) => *s = Some((value, 1)),
                Some(Some((first, writers))) if *first == value => {
                    again += 1;
                    *writers += 1;
                    most_writers = most_writers.max(*writers);
                }
                Some(Some((first, _))) => {
                    let first = *first;
                    g.add(
                        no_double_write::NAME,
                        at,
                        || {
                            (
                                format!(
                                    "a decode byte of {} is written twice with different bytes",
                                    dr.what()
                                ),
                                format!("one write ({})", hex(first)),
                                format!("a second write of {}", hex(value)),
                            )
                        },
                        Some(pair),
                    );
                }
                None => {}
            }
        }
        redundant_bytes += again;
        if again == w.len && w.len > 0 {
            redundant_pairs += 1;
        }
    }
    (redundant_bytes, redundant_pairs, most_writers)
}

#[cfg(test)]
#[path = "oracle_tests.rs"]
mod tests;
