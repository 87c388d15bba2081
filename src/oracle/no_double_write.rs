//! No double write: no destination byte is written by two posted pairs of
//! the request, across all of its transfers (NIXL accepts overlapping
//! destinations silently).

use std::collections::BTreeMap;

use crate::layout::Side;

use super::input::{OracleInput, OraclePair};
use super::violation::Violation;

/// The oracle's name, as violations and reports carry it.
pub const NAME: &str = "no_double_write";

/// No destination byte is written by two posted pairs.
pub fn check(input: &OracleInput) -> Vec<Violation> {
    // Destination ranges by (side, rank, region); offsets are region-relative
    // (raw addresses outside every region).
    type Key = (Option<Side>, Option<u32>, Option<u32>);
    let mut by_target: BTreeMap<Key, Vec<&OraclePair>> = BTreeMap::new();
    for p in input.posted_pairs().filter(|p| p.destination.row.len > 0) {
        let l = &p.destination.location;
        by_target
            .entry((l.side, l.rank, l.region))
            .or_default()
            .push(p);
    }
    let mut out = Vec::new();
    for ((side, rank, region), mut pairs) in by_target {
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
                    let overlap = r.start..end.min(r.end);
                    let block = side
                        .and_then(|s| input.case.engine(s, rank?))
                        .filter(|_| region.is_some())
                        .map(|layout| (overlap.start / layout.unified_page()) as u32);
                    out.push(
                        Violation::new(
                            NAME,
                            format!(
                                "{} bytes written by both {} and {}",
                                overlap.end - overlap.start,
                                first.id,
                                p.id
                            ),
                        )
                        .on(side, rank)
                        .region(region)
                        .block(block)
                        .bytes(overlap.clone(), overlap.end - overlap.start)
                        .expected("one writer per destination byte")
                        .found(format!(
                            "{} and {}",
                            first.destination.location, p.destination.location
                        ))
                        .pair(first.id)
                        .pair(p.id),
                    );
                }
            }
            if reach.is_none_or(|(end, _)| r.end > end) {
                reach = Some((r.end, p));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::test_case::{only_violation, run, Fault};
    use crate::oracle::PairRef;

    #[test]
    fn disjoint_destinations_pass() {
        assert_eq!(check(&run(Fault::None)), Vec::new());
    }

    #[test]
    fn a_pair_issued_twice_is_a_double_write() {
        let (v, at) = only_violation(check, Fault::DoubleWrite);
        assert_eq!(at, (Some(Side::Decode), Some(0), Some(0), Some(1)));
        assert_eq!((v.byte_range.clone(), v.bytes), (Some(336..384), 48));
        assert_eq!(
            v.pairs,
            [PairRef { xfer: 0, pair: 1 }, PairRef { xfer: 0, pair: 32 }]
        );
        assert_eq!(
            v.message,
            "48 bytes written by both xfer 0 pair 1 and xfer 0 pair 32"
        );
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
