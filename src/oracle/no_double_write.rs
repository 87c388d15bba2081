//! No double write: no destination byte is written by two posted pairs of
//! the request with different content, across all of its transfers (NIXL
//! accepts overlapping destinations silently, and which write lands last is
//! up to the network).
//!
//! Two pairs that put the same bytes in the same place leave the right KV:
//! that is a cost (the traffic is multiplied), not corruption, and it is
//! counted by [`redundant_writes`] instead (`redundant_writes` in every
//! report). Whether the bytes are the same is read from the sources'
//! memory; a case without it (a trace recorded without memory) cannot tell,
//! so there an overlap stays a violation that says the content is unknown.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::Serialize;

use crate::layout::Side;

use super::input::{OracleInput, OraclePair};
use super::violation::{PairRef, Violation};

/// The oracle's name, as violations and reports carry it.
pub const NAME: &str = "no_double_write";

/// Destination bytes written by two posted pairs.
struct Overlap<'a> {
    side: Option<Side>,
    rank: Option<u32>,
    region: Option<u32>,
    /// The pair that wrote the bytes first in destination order.
    first: &'a OraclePair,
    /// The pair that writes them again.
    second: &'a OraclePair,
    /// Region-relative destination bytes both write.
    bytes: Range<u64>,
}

/// What the two writers of an overlap carry.
#[derive(Debug, PartialEq, Eq)]
enum Content {
    /// The same bytes: a redundant write.
    Identical,
    /// Different bytes; the first difference, at a destination offset.
    Differs { offset: u64, first: u8, second: u8 },
    /// The sources' bytes cannot be read.
    Unknown(Unreadable),
}

/// Why a writer's source bytes cannot be read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum Unreadable {
    #[error("{0}'s source lies in no known region")]
    NoRegion(PairRef),
    #[error("the case carries no memory of {side} rank {rank}")]
    NoMemory { side: Side, rank: u32 },
    #[error("{pair}'s source bytes lie outside {side} rank {rank}'s region {region}")]
    OutsideRegion {
        pair: PairRef,
        side: Side,
        rank: u32,
        region: u32,
    },
}

/// No destination byte is written by two posted pairs with different
/// content (or with content the case cannot show).
pub fn check(input: &OracleInput) -> Vec<Violation> {
    let mut out = Vec::new();
    for o in overlaps(input) {
        let len = o.bytes.end - o.bytes.start;
        let (message, expected) = match content(input, &o) {
            Content::Identical => continue,
            Content::Differs {
                offset,
                first,
                second,
            } => (
                format!(
                    "{len} bytes written by both {} and {} with different content \
                     (at byte {offset}: {first:#04x} and {second:#04x})",
                    o.first.id, o.second.id
                ),
                "one writer per destination byte, or writers of identical bytes",
            ),
            Content::Unknown(why) => (
                format!(
                    "{len} bytes written by both {} and {} (content unknown: {why})",
                    o.first.id, o.second.id
                ),
                "one writer per destination byte",
            ),
        };
        let block = o
            .side
            .and_then(|s| input.case.engine(s, o.rank?))
            .filter(|_| o.region.is_some())
            .map(|layout| (o.bytes.start / layout.unified_page()) as u32);
        out.push(
            Violation::new(NAME, message)
                .on(o.side, o.rank)
                .region(o.region)
                .block(block)
                .bytes(o.bytes.clone(), len)
                .expected(expected)
                .found(format!(
                    "{} and {}",
                    o.first.destination.location, o.second.destination.location
                ))
                .pair(o.first.id)
                .pair(o.second.id),
        );
    }
    out
}

/// The cost of identical rewrites in one case: destination bytes written
/// again with the bytes they already receive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RedundantWrites {
    /// Pairs that rewrite bytes another pair writes, with the same content.
    pub pairs: u64,
    /// Destination bytes written more than once with the same content
    /// (counted once per extra writer).
    pub bytes: u64,
    /// The most pairs writing any one destination byte (1 without
    /// redundant writes): the traffic factor `k` of `k`x redundant writes.
    pub multiplicity: u32,
}

impl RedundantWrites {
    /// No pair rewrote anything.
    pub fn is_none(&self) -> bool {
        self.pairs == 0
    }

    /// The line `explain` prints, when there is anything to say.
    pub fn explain_line(&self) -> Option<String> {
        (!self.is_none()).then(|| {
            format!(
                "redundant writes: {} pairs write {} bytes again with the same content \
                 (a cost, not corruption: up to {}x the traffic for those bytes)",
                self.pairs, self.bytes, self.multiplicity
            )
        })
    }
}

/// The identical rewrites of a case (the overlaps [`check`] lets pass).
pub fn redundant_writes(input: &OracleInput) -> RedundantWrites {
    let mut rewriters = std::collections::BTreeSet::new();
    let mut bytes = 0;
    for o in overlaps(input) {
        if content(input, &o) == Content::Identical {
            rewriters.insert(o.second.id);
            bytes += o.bytes.end - o.bytes.start;
        }
    }
    if rewriters.is_empty() {
        return RedundantWrites::default();
    }
    RedundantWrites {
        pairs: rewriters.len() as u64,
        bytes,
        multiplicity: most_writers(input),
    }
}

type Target = (Option<Side>, Option<u32>, Option<u32>);

/// Posted pairs with a destination, by (side, rank, region); offsets are
/// region-relative (raw addresses outside every region).
fn by_target(input: &OracleInput) -> BTreeMap<Target, Vec<&OraclePair>> {
    let mut by_target: BTreeMap<Target, Vec<&OraclePair>> = BTreeMap::new();
    for p in input.posted_pairs().filter(|p| p.destination.row.len > 0) {
        let l = &p.destination.location;
        by_target
            .entry((l.side, l.rank, l.region))
            .or_default()
            .push(p);
    }
    by_target
}

/// Every overlap of a pair's destination with the furthest-reaching
/// destination before it, in destination order.
fn overlaps(input: &OracleInput) -> Vec<Overlap<'_>> {
    let mut out = Vec::new();
    for ((side, rank, region), mut pairs) in by_target(input) {
        pairs.sort_by_key(|p| {
            (
                p.destination.location.offset,
                p.destination.location.len,
                p.id,
            )
        });
        let mut reach: Option<(u64, &OraclePair)> = None;
        for p in pairs {
            let r = p.destination.location.byte_range();
            if let Some((end, first)) = reach {
                if r.start < end {
                    out.push(Overlap {
                        side,
                        rank,
                        region,
                        first,
                        second: p,
                        bytes: r.start..end.min(r.end),
                    });
                }
            }
            if reach.is_none_or(|(end, _)| r.end > end) {
                reach = Some((r.end, p));
            }
        }
    }
    out
}

/// The most posted pairs covering any one destination byte.
fn most_writers(input: &OracleInput) -> u32 {
    let mut most = 0;
    for pairs in by_target(input).values() {
        let mut edges: Vec<(u64, i64)> = pairs
            .iter()
            .flat_map(|p| {
                let r = p.destination.location.byte_range();
                [(r.start, 1), (r.end, -1)]
            })
            .collect();
        // Ends before starts at one offset: touching ranges do not overlap.
        edges.sort();
        let mut depth = 0i64;
        for (_, step) in edges {
            depth += step;
            most = most.max(depth);
        }
    }
    most.max(1) as u32
}

/// Whether both writers of an overlap carry the same bytes there.
fn content(input: &OracleInput, o: &Overlap) -> Content {
    let first = source_bytes(input, o.first, &o.bytes);
    let second = source_bytes(input, o.second, &o.bytes);
    let (first, second) = match (first, second) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(why), _) | (_, Err(why)) => return Content::Unknown(why),
    };
    match first.iter().zip(second).position(|(a, b)| a != b) {
        None => Content::Identical,
        Some(i) => Content::Differs {
            offset: o.bytes.start + i as u64,
            first: first[i],
            second: second[i],
        },
    }
}

/// The bytes a pair carries to the destination bytes `at` (a part of its
/// own destination), read from its source's memory after the case (a
/// transfer reads its source and never writes it).
fn source_bytes<'a>(
    input: &'a OracleInput,
    p: &OraclePair,
    at: &Range<u64>,
) -> Result<&'a [u8], Unreadable> {
    let s = &p.source.location;
    let (Some(side), Some(rank), Some(region)) = (s.side, s.rank, s.region) else {
        return Err(Unreadable::NoRegion(p.id));
    };
    let images = input
        .memory(side, rank)
        .ok_or(Unreadable::NoMemory { side, rank })?;
    let start = s.offset + (at.start - p.destination.location.offset);
    let end = start + (at.end - at.start);
    images
        .after
        .get(region as usize)
        .and_then(|image| image.get(start as usize..end as usize))
        .ok_or(Unreadable::OutsideRegion {
            pair: p.id,
            side,
            rank,
            region,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::test_case::{only_violation, run, Fault};

    #[test]
    fn disjoint_destinations_pass() {
        let input = run(Fault::None);
        assert_eq!(check(&input), Vec::new());
        assert!(redundant_writes(&input).is_none());
    }

    #[test]
    fn a_pair_issued_twice_is_a_redundant_write_not_a_violation() {
        let input = run(Fault::DoubleWrite);
        assert_eq!(check(&input), Vec::new());
        assert_eq!(
            redundant_writes(&input),
            RedundantWrites {
                pairs: 1,
                bytes: 48,
                multiplicity: 2
            }
        );
    }

    #[test]
    fn a_second_writer_with_other_bytes_is_a_double_write() {
        let (v, at) = only_violation(check, Fault::DoubleWriteOtherSource);
        assert_eq!(at, (Some(Side::Decode), Some(0), Some(0), Some(1)));
        assert_eq!((v.byte_range.clone(), v.bytes), (Some(336..384), 48));
        assert_eq!(
            v.pairs,
            [PairRef { xfer: 0, pair: 1 }, PairRef { xfer: 0, pair: 32 }]
        );
        assert!(
            v.message
                .starts_with("48 bytes written by both xfer 0 pair 1 and xfer 0 pair 32 with different content (at byte 336:"),
            "{}",
            v.message
        );
        assert!(redundant_writes(&run(Fault::DoubleWriteOtherSource)).is_none());
    }

    #[test]
    fn without_the_sources_memory_an_overlap_stays_a_violation_of_unknown_content() {
        let mut input = run(Fault::DoubleWrite);
        input.forget_memory();
        let v = check(&input);
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_eq!(
            v[0].message,
            "48 bytes written by both xfer 0 pair 1 and xfer 0 pair 32 (content unknown: \
             the case carries no memory of prefill rank 0)"
        );
        assert!(redundant_writes(&input).is_none());
    }

    #[test]
    fn partial_overlaps_across_transfers_are_caught() {
        let mut input = run(Fault::None);
        // Rank 1's first pair (region 0, kda_a conv Q shard at bytes 6..12)
        // is widened to start at byte 2, overlapping rank 0's shard 0..6.
        let p = &mut input.pairs[32];
        p.destination.location.offset = 2;
        p.destination.location.len = 10;
        let v = check(&input);
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_eq!(
            (v[0].byte_range.clone(), v[0].local_block),
            (Some(2..6), Some(0))
        );
        assert_eq!(
            v[0].pairs,
            [PairRef { xfer: 0, pair: 16 }, PairRef { xfer: 1, pair: 0 }]
        );
    }
}
