//! Pairing: both ends of a pair have the same length, kind and region, and
//! every byte moves to the same coordinate: same group, request-relative
//! tokens, global heads and content bytes (attention), or same group,
//! sub-region and global state slice (mamba).

use crate::layout::{AttentionSpan, CaseLayout, Location, LocationKind, SpanShape};

use super::input::{OracleInput, OraclePair};
use super::violation::Violation;

/// The oracle's name, as violations and reports carry it.
pub const NAME: &str = "pairing";

/// Every pair joins equal lengths holding the same tokens (token-aligned).
pub fn check(input: &OracleInput) -> Vec<Violation> {
    input
        .pairs
        .iter()
        .filter_map(|p| check_pair(&input.case, p))
        .collect()
}

/// The part of pairing that needs no layout: both ends of every pair have
/// the same length (for traces whose source side cannot be modelled).
pub fn check_lengths(input: &OracleInput) -> Vec<Violation> {
    input
        .pairs
        .iter()
        .filter_map(|p| length_mismatch(p).map(|problem| violation(p, vec![problem])))
        .collect()
}

fn length_mismatch(pair: &OraclePair) -> Option<String> {
    let (dst, src) = (&pair.destination, &pair.source);
    (dst.row.len != src.row.len).then(|| {
        format!(
            "lengths differ: destination {} bytes, source {} bytes",
            dst.row.len, src.row.len
        )
    })
}

fn check_pair(case: &CaseLayout, pair: &OraclePair) -> Option<Violation> {
    let mut problems: Vec<String> = length_mismatch(pair).into_iter().collect();
    let (d, s) = (&pair.destination.location, &pair.source.location);
    match (&d.kind, &s.kind) {
        (LocationKind::Attention(da), LocationKind::Attention(sa)) => {
            if d.region != s.region {
                problems.push(format!("regions differ: {:?} vs {:?}", d.region, s.region));
            }
            if problems.is_empty() {
                if let Some(p) = attention_mismatch(case, d, da, s, sa) {
                    problems.push(p);
                }
            }
        }
        (LocationKind::Mamba(dm), LocationKind::Mamba(sm)) => {
            if d.region != s.region {
                problems.push(format!("regions differ: {:?} vs {:?}", d.region, s.region));
            }
            if dm.group != sm.group {
                problems.push(format!("mamba groups differ: {} vs {}", dm.group, sm.group));
            }
            if dm.touches_padding() || sm.touches_padding() {
                problems.push("a mamba end covers page padding".to_string());
            }
            if dm.pieces != sm.pieces {
                problems.push("mamba sub-regions or global state slices differ".to_string());
            }
        }
        (LocationKind::Attention(_), LocationKind::Mamba(_))
        | (LocationKind::Mamba(_), LocationKind::Attention(_)) => {
            problems.push(format!(
                "pair kind mismatch: destination {}, source {}",
                d.kind.name(),
                s.kind.name()
            ));
        }
        // Anything else lies outside the request's blocks: containment reports it.
        _ => {}
    }
    if problems.is_empty() {
        return None;
    }
    Some(violation(pair, problems))
}

fn violation(pair: &OraclePair, problems: Vec<String>) -> Violation {
    let (d, s) = (&pair.destination.location, &pair.source.location);
    Violation::new(
        NAME,
        format!("{} {}: {}", pair.op.as_str(), pair.id, problems.join("; ")),
    )
    .on(d.side, d.rank)
    .region(d.region)
    .block(d.logical_block)
    .bytes(d.byte_range(), d.len)
    .expected(s.to_string())
    .found(d.to_string())
    .pair(pair.id)
}

fn attention_mismatch(
    case: &CaseLayout,
    d: &Location,
    da: &AttentionSpan,
    s: &Location,
    sa: &AttentionSpan,
) -> Option<String> {
    if da.group != sa.group {
        return Some(format!(
            "attention groups differ: {} vs {}",
            da.group, sa.group
        ));
    }
    if da.shape == SpanShape::Rect && sa.shape == SpanShape::Rect {
        return if da.tokens != sa.tokens {
            Some(format!(
                "token misalignment: destination holds tokens {:?} but receives tokens {:?}",
                da.tokens, sa.tokens
            ))
        } else if da.heads != sa.heads {
            Some(format!(
                "head mismatch: destination holds heads {:?} but receives heads {:?}",
                da.heads, sa.heads
            ))
        } else if da.content != sa.content {
            Some(format!(
                "content mismatch: destination bytes {:?} of each head, source {:?}",
                da.content, sa.content
            ))
        } else if da.order != sa.order {
            Some(format!(
                "cell order differs: destination {:?}, source {:?}",
                da.order, sa.order
            ))
        } else {
            None
        };
    }
    // Not both rectangles: compare cell by cell.
    let (dp, sp) = (cell_pieces(case, d, da), cell_pieces(case, s, sa));
    match dp.iter().zip(&sp).position(|(a, b)| a != b) {
        None if dp.len() == sp.len() => None,
        Some(i) => Some(format!(
            "byte mapping differs at piece {i}: destination (token, head, byte, len) {:?}, source {:?}",
            dp[i], sp[i]
        )),
        None => Some("byte mapping differs in length".to_string()),
    }
}

/// `(token, global head, first content byte, bytes)` pieces of an attention range, in address order.
fn cell_pieces(
    case: &CaseLayout,
    loc: &Location,
    span: &AttentionSpan,
) -> Vec<(u32, u32, u64, u64)> {
    let (Some(side), Some(rank)) = (loc.side, loc.rank) else {
        return Vec::new();
    };
    let Some(layout) = case.engine(side, rank) else {
        return Vec::new();
    };
    let view = layout.transfer_view();
    let c = layout.bytes_per_head_token();
    let first_token = span.block_position * layout.logical_block();
    let in_block = loc.offset % layout.unified_page();
    let mut offset = layout.dense_offset(in_block).unwrap_or(in_block);
    let mut left = loc.len;
    let mut out = Vec::new();
    while left > 0 {
        let (t, h, byte) = layout.byte_cell(view, offset);
        let n = (c - byte).min(left);
        out.push((first_token + t, layout.global_head(h), byte, n));
        offset += n;
        left -= n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::{
        AttentionSpec, EngineGeometry, Geometry, GroupKind, KvLayout, Mode, ModelSpec,
    };
    use crate::layout::{RequestBlocks, Side};
    use crate::nixl::recording::ResolvedPair;
    use crate::nixl::{AgentId, DescRow, XferOp};
    use crate::oracle::test_case::{run, Fault};
    use crate::oracle::PairRef;

    #[test]
    fn aligned_pairs_pass() {
        assert_eq!(check(&run(Fault::None)), Vec::new());
    }

    #[test]
    fn swapped_prefill_kernel_blocks_are_a_token_misalignment() {
        let v = check(&run(Fault::MisalignTokens));
        assert_eq!(v.len(), 2, "{v:#?}");
        assert_eq!(v[0].pairs, [PairRef { xfer: 0, pair: 0 }]);
        assert_eq!(
            (v[0].side, v[0].region, v[0].local_block),
            (Some(Side::Decode), Some(0), Some(1))
        );
        assert_eq!(
            v[0].message,
            "READ xfer 0 pair 0: token misalignment: destination holds tokens 0..4 but receives tokens 4..8"
        );
        assert_eq!(
            v[1].message,
            "READ xfer 0 pair 1: token misalignment: destination holds tokens 4..8 but receives tokens 0..4"
        );
        assert_eq!(
            v[0].expected.as_deref(),
            Some("prefill-0 region 0 [0xf0, +48) block 2 attention g0 tokens 4..8 heads 0..1 content 0..12 TokenMajor")
        );
    }

    #[test]
    fn length_and_kind_mismatches_are_caught() {
        let mut input = run(Fault::None);
        // Pair 16 reads prefill rank 0's 6-byte shard of region 0's kda_a conv Q.
        input.pairs[0].source = input.pairs[16].source.clone();
        let v = check(&input);
        assert_eq!(v.len(), 1);
        assert_eq!(
            v[0].message,
            "READ xfer 0 pair 0: lengths differ: destination 48 bytes, source 6 bytes; pair kind mismatch: destination attention, source mamba"
        );
    }

    #[test]
    fn a_mamba_shard_from_the_wrong_rank_is_caught() {
        let mut input = run(Fault::None);
        // Pair 32 is rank 1's kda_a conv Q shard of region 0 (global bytes 6..12);
        // pair 16 reads rank 0's (global bytes 0..6).
        assert_eq!(input.pairs[32].id, PairRef { xfer: 1, pair: 0 });
        input.pairs[32].source = input.pairs[16].source.clone();
        let v = check(&input);
        assert_eq!(v.len(), 1);
        assert_eq!(
            v[0].message,
            "READ xfer 1 pair 0: mamba sub-regions or global state slices differ"
        );
        assert_eq!(
            v[0].found.as_deref(),
            Some("decode-0 region 0 [0x6, +6) block 0 mamba g1 slot#0 conv0[6, 12)")
        );
        assert_eq!(
            v[0].expected.as_deref(),
            Some("prefill-0 region 0 [0x60, +6) block 1 mamba g1 slot#0 conv0[0, 6)")
        );
    }

    /// A GQA HND engine pair with equal geometry, where one descriptor spans
    /// two kernel pages (not a rectangle) on both sides.
    fn ragged_input(source_shift: u64) -> OracleInput {
        let model = ModelSpec {
            attention: Some(AttentionSpec::Full {
                total_kv_heads: 2,
                head_size: 2,
                dtype_bytes: 2,
            }),
            mamba: None,
            groups: vec![GroupKind::Attention],
            layer_slots: 1,
            state_slots: None,
        };
        let engine = EngineGeometry {
            num_logical_blocks: Some(4),
            layout: KvLayout::Hnd,
            ..EngineGeometry::new(1, 2, 4)
        };
        let geometry = Geometry {
            name: "gqa-hnd".into(),
            description: String::new(),
            model,
            prefill: engine.clone(),
            decode: engine,
            prompts: None,
            expect_rejection: None,
            stack: crate::geometry::Stack::Vllm,
            handshake: crate::geometry::HandshakeCompat::default(),
            sglang: None,
        };
        let blocks = RequestBlocks {
            decode: vec![vec![1]],
            decode_transfer: vec![vec![1]],
            prefill: vec![vec![2]],
        };
        let case = CaseLayout::from_bases(
            geometry,
            Mode::Pull,
            blocks,
            vec![vec![0x1000]],
            4,
            vec![vec![0x8000]],
            4,
        )
        .expect("valid case");
        // Kernel page = 2 tokens x 2 heads x 8 bytes = 32 bytes; block = 64 bytes.
        let local = DescRow {
            addr: 0x1000 + 64 + 16,
            len: 32,
            dev: 0,
        };
        let remote = DescRow {
            addr: 0x8000 + 128 + 16 + source_shift,
            len: 32,
            dev: 0,
        };
        let pair = ResolvedPair {
            xfer: 0,
            pair: 0,
            op: XferOp::Read,
            initiator: AgentId(0),
            remote_agent: "prefill-0".into(),
            local,
            remote,
            local_location: case.classify_named("decode-0", local),
            remote_location: case.classify_named("prefill-0", remote),
            posted: true,
        };
        OracleInput::new(case, 4, 0, vec![pair])
    }

    #[test]
    fn ragged_ranges_compare_byte_by_byte() {
        let input = ragged_input(0);
        let span = input.pairs[0]
            .destination
            .location
            .attention()
            .expect("attention")
            .clone();
        assert_eq!(span.shape, SpanShape::Ragged);
        assert_eq!(check(&input), Vec::new());

        let v = check(&ragged_input(8));
        assert_eq!(v.len(), 1);
        assert_eq!(
            v[0].message,
            "READ xfer 0 pair 0: byte mapping differs at piece 0: destination (token, head, byte, len) (0, 1, 0, 8), source (1, 1, 0, 8)"
        );
    }
}
