//! Containment: every destination byte lies in the request's own decode
//! transfer blocks, every source byte in the request's prefill blocks.

use crate::layout::{Location, LocationKind, Side};

use super::input::{OracleInput, OraclePair};
use super::violation::Violation;

/// The oracle's name, as violations and reports carry it.
pub const NAME: &str = "containment";

/// Every posted pair's destination lies inside the request's blocks.
pub fn check(input: &OracleInput) -> Vec<Violation> {
    let mut out = Vec::new();
    for pair in &input.pairs {
        if let Some(v) = destination(input, pair) {
            out.push(v);
        }
        if let Some(v) = source(pair) {
            out.push(v);
        }
    }
    out
}

fn base(pair: &OraclePair, loc: &Location, message: String) -> Violation {
    Violation::new(NAME, message)
        .on(loc.side, loc.rank)
        .region(loc.region)
        .block(loc.logical_block)
        .bytes(loc.byte_range(), loc.len)
        .found(loc.to_string())
        .pair(pair.id)
}

fn destination(input: &OracleInput, pair: &OraclePair) -> Option<Violation> {
    let loc = &pair.destination.location;
    // Named only for a violation: most pairs are contained.
    let what = || format!("{} {} destination", pair.op.as_str(), pair.id);
    let message = if loc.side != Some(Side::Decode) {
        format!("{} is not decode memory", what())
    } else {
        match &loc.kind {
            LocationKind::Attention(_) | LocationKind::Mamba(_) => {
                let block = loc.logical_block?;
                if input.case.is_decode_transfer_block(block) {
                    return None;
                }
                format!("{} writes decode block {block}, which the request owns but the transfer must not write (prefix hit)", what())
            }
            LocationKind::Unowned => format!("{} writes a block the request does not own", what()),
            LocationKind::CrossesBlocks => {
                format!("{} runs across a logical block boundary", what())
            }
            LocationKind::PagePadding => {
                format!("{} writes the padding between kernel pages", what())
            }
            LocationKind::OutsideRegions => {
                format!("{} is outside every registered region", what())
            }
            LocationKind::UnknownAgent => {
                format!("{} is on an agent this case does not know", what())
            }
        }
    };
    Some(
        base(pair, loc, message)
            .expected("a byte range inside the request's decode transfer blocks"),
    )
}

fn source(pair: &OraclePair) -> Option<Violation> {
    let loc = &pair.source.location;
    let what = || format!("{} {} source", pair.op.as_str(), pair.id);
    let message = if loc.side != Some(Side::Prefill) {
        format!("{} is not prefill memory", what())
    } else {
        match &loc.kind {
            LocationKind::Attention(_) | LocationKind::Mamba(_) => return None,
            LocationKind::Unowned => format!("{} reads a block the request does not own", what()),
            LocationKind::CrossesBlocks => {
                format!("{} runs across a logical block boundary", what())
            }
            LocationKind::PagePadding => {
                format!("{} reads the padding between kernel pages", what())
            }
            LocationKind::OutsideRegions => {
                format!("{} is outside every registered region", what())
            }
            LocationKind::UnknownAgent => {
                format!("{} is on an agent this case does not know", what())
            }
        }
    };
    Some(base(pair, loc, message).expected("a byte range inside the request's prefill blocks"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{CaseLayout, RequestBlocks};
    use crate::oracle::test_case::{only_violation, prefill_bases, run, Fault, DECODE_BASES};
    use crate::oracle::PairRef;

    #[test]
    fn transfers_inside_the_request_blocks_pass() {
        assert_eq!(check(&run(Fault::None)), Vec::new());
    }

    #[test]
    fn a_destination_moved_into_a_neighbour_block_is_caught() {
        let (v, at) = only_violation(check, Fault::ShiftDestination);
        assert_eq!(at, (Some(Side::Decode), Some(0), Some(0), Some(2)));
        assert_eq!((v.byte_range.clone(), v.bytes), (Some(576..624), 48));
        assert_eq!(v.pairs, [PairRef { xfer: 0, pair: 0 }]);
        assert_eq!(
            v.message,
            "READ xfer 0 pair 0 destination writes a block the request does not own"
        );
        assert_eq!(
            v.found.as_deref(),
            Some("decode-0 region 0 [0x240, +48) block 2 unowned block")
        );
    }

    #[test]
    fn a_read_of_a_prefill_block_the_request_does_not_own_is_caught() {
        let (v, at) = only_violation(check, Fault::ReadWrongPrefillBlock);
        assert_eq!(at, (Some(Side::Prefill), Some(0), Some(0), Some(3)));
        assert_eq!((v.byte_range.clone(), v.bytes), (Some(288..336), 48));
        assert_eq!(v.pairs, [PairRef { xfer: 0, pair: 2 }]);
        assert_eq!(
            v.message,
            "READ xfer 0 pair 2 source reads a block the request does not own"
        );
    }

    #[test]
    fn writes_into_prefix_hit_blocks_are_caught() {
        // Same transfer, but decode block 1 is now a prefix hit the transfer must not write.
        let mut input = run(Fault::None);
        let blocks = RequestBlocks {
            decode_transfer: vec![vec![3], vec![0], vec![6]],
            ..input.case.blocks().clone()
        };
        input.case = CaseLayout::from_bases(
            input.geometry().clone(),
            input.mode(),
            blocks,
            vec![DECODE_BASES.to_vec()],
            8,
            (0..2).map(prefill_bases).collect(),
            12,
        )
        .expect("valid case");
        let v = check(&input);
        // Sub-blocks 6..11 of each region land in block 1.
        let hit: Vec<(Option<u32>, usize)> =
            v.iter().map(|v| (v.region, v.pairs[0].pair)).collect();
        let expected: Vec<(Option<u32>, usize)> = (0..6)
            .map(|p| (Some(0), p))
            .chain((8..14).map(|p| (Some(1), p)))
            .collect();
        assert_eq!(hit, expected);
        assert_eq!(
            v[0].message,
            "READ xfer 0 pair 0 destination writes decode block 1, which the request owns but the transfer must not write (prefix hit)"
        );
    }
}
