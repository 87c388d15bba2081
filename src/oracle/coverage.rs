//! Coverage: on every decode rank and region, every (token < M, head) cell
//! of the request's attention transfer blocks is written by some posted pair
//! (the finest granularity), and every byte of each transferred mamba slot's
//! conv and SSM state is written, in every region holding state.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::geometry::GroupKind;
use crate::layout::Side;

use super::input::OracleInput;
use super::intervals::IntervalSet;
use super::memory::RankGroup;
use super::violation::Violation;

/// The oracle's name, as violations and reports carry it.
pub const NAME: &str = "coverage";

/// Every transferred token of every group arrives at decode.
pub fn check(input: &OracleInput) -> Vec<Violation> {
    let mut out = Vec::new();
    for layout in input.case.engines(Side::Decode) {
        let written: Vec<IntervalSet> = (0..layout.num_regions())
            .map(|region| {
                IntervalSet::from_ranges(
                    input
                        .posted_pairs()
                        .map(|p| &p.destination.location)
                        .filter(|l| {
                            l.side == Some(Side::Decode)
                                && l.rank == Some(layout.tp_rank())
                                && l.region == Some(region)
                        })
                        .map(|l| l.byte_range())
                        .collect(),
                )
            })
            .collect();
        for (g, kind) in input.case.model().groups.iter().enumerate() {
            let at = RankGroup {
                input,
                layout,
                group: g as u32,
            };
            match kind {
                GroupKind::Attention => attention(at, &written, &mut out),
                GroupKind::Mamba => mamba(at, &written, &mut out),
            }
        }
    }
    out
}

/// Missing cells of one (region, block).
struct Missing {
    cells: u64,
    tokens: Range<u32>,
    heads: Range<u32>,
    bytes: Range<u64>,
}

fn attention(at: RankGroup<'_>, written: &[IntervalSet], out: &mut Vec<Violation>) {
    let group = at.group;
    let case = &at.input.case;
    let m = at.input.transferred_tokens;
    let b_d = at.layout.logical_block();
    let list = case.group_blocks(Side::Decode, group);
    let capacity = list.len() as u64 * u64::from(b_d);
    if capacity < u64::from(m) {
        out.push(
            Violation::new(
                NAME,
                format!(
                    "attention group {group} has {} decode blocks ({capacity} tokens) for {m} transferred tokens",
                    list.len()
                ),
            )
            .on(Some(Side::Decode), Some(at.layout.tp_rank()))
            .expected(format!("at least {m} tokens of decode blocks"))
            .found(format!("{capacity} tokens")),
        );
    }
    let view = at.layout.transfer_view();
    let c = at.layout.bytes_per_head_token();
    let u = at.layout.unified_page();
    let mut missing: BTreeMap<(u32, u32), Missing> = BTreeMap::new();
    for (pos, &block) in list.iter().enumerate() {
        if !case.is_decode_transfer_block(block) {
            continue;
        }
        let first = pos as u32 * b_d;
        for t in first..(first + b_d).min(m) {
            for (region, set) in written.iter().enumerate() {
                for h in 0..at.layout.heads().count {
                    let start = u64::from(block) * u + at.layout.cell_offset(view, t - first, h);
                    if set.covers(start..start + c) {
                        continue;
                    }
                    let head = at.layout.global_head(h);
                    let e = missing.entry((region as u32, block)).or_insert(Missing {
                        cells: 0,
                        tokens: t..t + 1,
                        heads: head..head + 1,
                        bytes: start..start + c,
                    });
                    e.cells += 1;
                    e.tokens = e.tokens.start.min(t)..e.tokens.end.max(t + 1);
                    e.heads = e.heads.start.min(head)..e.heads.end.max(head + 1);
                    e.bytes = e.bytes.start.min(start)..e.bytes.end.max(start + c);
                }
            }
        }
    }
    for ((region, block), miss) in missing {
        out.push(
            Violation::new(
                NAME,
                format!(
                    "attention group {group}: {} (token, head) cells never written, tokens {:?} heads {:?} (transferred tokens: {m})",
                    miss.cells, miss.tokens, miss.heads
                ),
            )
            .on(Some(Side::Decode), Some(at.layout.tp_rank()))
            .region(Some(region))
            .block(Some(block))
            .bytes(miss.bytes, miss.cells * c)
            .expected("every cell of tokens below M written by a posted pair")
            .found(format!("{} cells unwritten", miss.cells)),
        );
    }
}

fn mamba(at: RankGroup<'_>, written: &[IntervalSet], out: &mut Vec<Violation>) {
    let group = at.group;
    let case = &at.input.case;
    let Some(page) = at.layout.mamba() else {
        return;
    };
    let u = at.layout.unified_page();
    for &block in case.group_blocks(Side::Decode, group) {
        if !case.is_decode_transfer_block(block) {
            continue;
        }
        let start = u64::from(block) * u;
        let state_regions = at.layout.state_regions() as usize;
        for (region, set) in written.iter().enumerate().take(state_regions) {
            let gaps = set.gaps(start..start + page.state_bytes());
            if gaps.is_empty() {
                continue;
            }
            let count: u64 = gaps.iter().map(|g| g.end - g.start).sum();
            let parts: Vec<String> = gaps
                .iter()
                .map(|g| {
                    let pieces = at.layout.mamba_pieces(g.start - start, g.end - g.start);
                    let names: Vec<String> = pieces.iter().map(ToString::to_string).collect();
                    names.join(" ")
                })
                .collect();
            out.push(
                Violation::new(
                    NAME,
                    format!(
                        "mamba group {group}: {count} state bytes never written: {}",
                        parts.join(", ")
                    ),
                )
                .on(Some(Side::Decode), Some(at.layout.tp_rank()))
                .region(Some(region as u32))
                .block(Some(block))
                .bytes(gaps[0].start..gaps[gaps.len() - 1].end, count)
                .expected("the whole conv and SSM state written")
                .found(format!("gaps {gaps:?}")),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::test_case::{only_violation, run, Fault};

    #[test]
    fn every_needed_cell_and_state_byte_written_passes() {
        assert_eq!(check(&run(Fault::None)), Vec::new());
    }

    #[test]
    fn a_missing_attention_pair_leaves_uncovered_tokens() {
        let (v, at) = only_violation(check, Fault::DropAttentionPair);
        assert_eq!(at, (Some(Side::Decode), Some(0), Some(1), Some(3)));
        // Block 3 starts at 3 x 288; tokens 24..28 are its first 4 tokens of 12 bytes.
        assert_eq!((v.byte_range.clone(), v.bytes), (Some(864..912), 48));
        assert_eq!(
            v.message,
            "attention group 0: 4 (token, head) cells never written, tokens 24..28 heads 0..1 (transferred tokens: 28)"
        );
    }

    #[test]
    fn a_missing_state_shard_leaves_uncovered_state_bytes() {
        let v = check(&run(Fault::DropMambaShard));
        assert_eq!(v.len(), 1, "{v:#?}");
        let v = &v[0];
        assert_eq!((v.region, v.local_block), (Some(0), Some(6)));
        // Slot 6, SSM at 48, rank 1's half at +32.
        assert_eq!(
            (v.byte_range.clone(), v.bytes),
            (Some(6 * 288 + 80..6 * 288 + 112), 32)
        );
        assert_eq!(
            v.message,
            "mamba group 2: 32 state bytes never written: ssm[32, 64)"
        );
    }

    #[test]
    fn unposted_transfers_cover_nothing() {
        let mut input = run(Fault::None);
        for p in input.pairs.iter_mut().filter(|p| p.id.xfer == 1) {
            p.posted = false;
        }
        // Rank 1's shards of 4 sub-regions x 2 groups x 2 regions are missing.
        let v = check(&input);
        assert_eq!(v.len(), 4);
        assert_eq!(
            v.iter().map(|v| v.bytes).sum::<u64>(),
            2 * 2 * (6 + 6 + 12 + 32)
        );
    }
}
