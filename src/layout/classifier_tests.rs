//! Classifier tests on GQA HND geometries: head slices in both TP
//! directions, replicated heads, r = 2 sub-pages, mamba shards, and the
//! edges of blocks and regions.

use crate::geometry::{
    AttentionSpec, EngineGeometry, Geometry, GroupKind, KvLayout, Mode, ModelSpec,
};
use crate::nixl::DescRow;

use super::*;

const D_BASE: u64 = 0x10_0000;
const P_BASE: u64 = 0x80_0000;
const RANK_STRIDE: u64 = 0x1_0000;

pub(crate) fn gqa(total_kv_heads: u32, mamba: bool) -> ModelSpec {
    ModelSpec {
        // 8 bytes per head per token (K and V of 2 fp16 values).
        attention: Some(AttentionSpec::Full {
            total_kv_heads,
            head_size: 2,
            dtype_bytes: 2,
        }),
        mamba: mamba
            .then(|| crate::geometry::fixtures::mla_kda([2, 2, 4], 64).mamba)
            .flatten(),
        groups: if mamba {
            vec![GroupKind::Attention, GroupKind::Mamba]
        } else {
            vec![GroupKind::Attention]
        },
        layer_slots: 1,
        state_slots: None,
    }
}

pub(crate) fn engine(
    tp_size: u32,
    kernel_block: u32,
    logical_block: u32,
    layout: KvLayout,
) -> EngineGeometry {
    EngineGeometry {
        num_logical_blocks: Some(8),
        layout,
        ..EngineGeometry::new(tp_size, kernel_block, logical_block)
    }
}

pub(crate) fn case(
    model: ModelSpec,
    decode: EngineGeometry,
    prefill: EngineGeometry,
    blocks: RequestBlocks,
) -> CaseLayout {
    let bases = |base: u64, tp: u32| {
        (0..u64::from(tp))
            .map(|r| vec![base + r * RANK_STRIDE])
            .collect()
    };
    let (d_tp, p_tp) = (decode.tp_size, prefill.tp_size);
    let geometry = Geometry {
        name: "test".into(),
        description: String::new(),
        model,
        prefill,
        decode,
        prompts: None,
        expect_rejection: None,
        stack: crate::geometry::Stack::Vllm,
        handshake: crate::geometry::HandshakeCompat::default(),
        sglang: None,
    };
    CaseLayout::from_bases(
        geometry,
        Mode::Pull,
        blocks,
        bases(D_BASE, d_tp),
        8,
        bases(P_BASE, p_tp),
        8,
    )
    .expect("valid case")
}

pub(crate) fn attention_blocks(decode: Vec<u32>, prefill: Vec<u32>) -> RequestBlocks {
    RequestBlocks {
        decode: vec![decode.clone()],
        decode_transfer: vec![decode],
        prefill: vec![prefill],
    }
}

fn row(addr: u64, len: u64) -> DescRow {
    DescRow { addr, len, dev: 0 }
}

fn span(
    loc: &Location,
) -> (
    std::ops::Range<u32>,
    std::ops::Range<u32>,
    std::ops::Range<u64>,
    CellOrder,
    SpanShape,
) {
    let a = loc
        .attention()
        .unwrap_or_else(|| panic!("not attention: {loc}"));
    (
        a.tokens.clone(),
        a.heads.clone(),
        a.content.clone(),
        a.order,
        a.shape,
    )
}

#[test]
fn decode_tp2_reads_a_head_slice_of_a_prefill_tp1_hnd_page() {
    // 4 heads. Prefill TP1: kernel page 4 tokens x 4 heads x 8 B = 128 B, page 256 B.
    // Decode TP2: 2 heads per rank, kernel page 64 B, page 128 B.
    let c = case(
        gqa(4, false),
        engine(2, 4, 8, KvLayout::Hnd),
        engine(1, 4, 8, KvLayout::Hnd),
        attention_blocks(vec![1], vec![2]),
    );
    let d1 = c.engine(Side::Decode, 1).expect("rank 1");
    assert_eq!(
        (d1.heads(), d1.kernel_page(), d1.unified_page()),
        (HeadSlice { first: 2, count: 2 }, 64, 128)
    );

    // Decode rank 1, block 1, second kernel page: tokens 4..8 of heads 2..3.
    let dst = c.classify_named("decode-1", row(D_BASE + RANK_STRIDE + 128 + 64, 64));
    assert_eq!(
        (
            dst.side,
            dst.rank,
            dst.region,
            dst.offset,
            dst.logical_block
        ),
        (Some(Side::Decode), Some(1), Some(0), 192, Some(1))
    );
    assert_eq!(
        span(&dst),
        (4..8, 2..4, 0..8, CellOrder::HeadMajor, SpanShape::Rect)
    );

    // Prefill block 2, second kernel page, head slot 1 (heads 2..3): the matching source.
    let src = c.classify_named("prefill-0", row(P_BASE + 2 * 256 + 128 + 64, 64));
    assert_eq!(
        span(&src),
        (4..8, 2..4, 0..8, CellOrder::HeadMajor, SpanShape::Rect)
    );

    // Slot 0 of the same page holds heads 0..1: a different rectangle.
    let wrong = c.classify_named("prefill-0", row(P_BASE + 2 * 256 + 128, 64));
    assert_eq!(
        span(&wrong),
        (4..8, 0..2, 0..8, CellOrder::HeadMajor, SpanShape::Rect)
    );

    // One head of one token, partial content: a single cell.
    let cell = c.classify_named("prefill-0", row(P_BASE + 2 * 256 + 3 * 32 + 8 + 2, 4));
    assert_eq!(
        span(&cell),
        (1..2, 3..4, 2..6, CellOrder::TokenMajor, SpanShape::Rect)
    );
}

#[test]
fn a_prefill_tp2_page_lands_in_a_head_slot_of_a_decode_tp1_page() {
    let c = case(
        gqa(4, false),
        engine(1, 4, 8, KvLayout::Hnd),
        engine(2, 4, 8, KvLayout::Hnd),
        attention_blocks(vec![3], vec![1]),
    );
    // Prefill rank 1's whole first kernel page of block 1: tokens 0..4, heads 2..3.
    let src = c.classify_named("prefill-1", row(P_BASE + RANK_STRIDE + 128, 64));
    assert_eq!(
        span(&src),
        (0..4, 2..4, 0..8, CellOrder::HeadMajor, SpanShape::Rect)
    );
    // Decode block 3, first kernel page, head slot 1.
    let dst = c.classify_named("decode-0", row(D_BASE + 3 * 256 + 64, 64));
    assert_eq!(
        span(&dst),
        (0..4, 2..4, 0..8, CellOrder::HeadMajor, SpanShape::Rect)
    );

    // In an NHD decode page the same 64 bytes are tokens 2..3 of all 4 heads.
    let nhd = case(
        gqa(4, false),
        engine(1, 4, 8, KvLayout::Nhd),
        engine(2, 4, 8, KvLayout::Nhd),
        attention_blocks(vec![3], vec![1]),
    );
    let dst = nhd.classify_in_view(
        nhd.engine(Side::Decode, 0).expect("rank 0"),
        nhd.engine(Side::Decode, 0).expect("rank 0").own_view(),
        row(D_BASE + 3 * 256 + 64, 64),
    );
    assert_eq!(
        span(&dst),
        (2..4, 0..4, 0..8, CellOrder::TokenMajor, SpanShape::Rect)
    );
}

#[test]
fn heads_are_replicated_when_tp_exceeds_the_head_count() {
    let c = case(
        gqa(2, false),
        engine(4, 4, 8, KvLayout::Hnd),
        engine(1, 4, 8, KvLayout::Hnd),
        attention_blocks(vec![1], vec![1]),
    );
    let heads: Vec<HeadSlice> = c
        .engines(Side::Decode)
        .iter()
        .map(EngineLayout::heads)
        .collect();
    let firsts: Vec<u32> = heads.iter().map(|h| h.first).collect();
    assert_eq!(firsts, [0, 0, 1, 1]);
    assert!(heads.iter().all(|h| h.count == 1));
    let dst = c.classify_named("decode-3", row(D_BASE + 3 * RANK_STRIDE + 64, 32));
    assert_eq!(
        span(&dst),
        (0..4, 1..2, 0..8, CellOrder::TokenMajor, SpanShape::Rect)
    );
}

#[test]
fn with_ratio_two_a_decode_page_receives_prefill_sub_pages() {
    // Decode kernel 8, prefill kernel 4, 2 heads, both HND: each 128-byte decode
    // kernel page receives two 64-byte prefill pages (heads outer, 4 tokens inner).
    let c = case(
        gqa(2, false),
        engine(1, 8, 8, KvLayout::Hnd),
        engine(1, 4, 4, KvLayout::Hnd),
        attention_blocks(vec![1], vec![5, 6]),
    );
    let d = c.engine(Side::Decode, 0).expect("rank 0");
    assert_eq!(
        d.receive_view(),
        Some(PageView {
            unit_tokens: 4,
            layout: KvLayout::Hnd
        })
    );
    let sub = row(D_BASE + 128 + 64, 64);
    let during = c.classify_named("decode-0", sub);
    assert_eq!(
        span(&during),
        (4..8, 0..2, 0..8, CellOrder::HeadMajor, SpanShape::Rect)
    );
    let src = c.classify_named("prefill-0", row(P_BASE + 6 * 64, 64));
    assert_eq!(
        span(&src),
        (4..8, 0..2, 0..8, CellOrder::HeadMajor, SpanShape::Rect)
    );
    // After the post-process the same bytes are head 1 of all 8 tokens.
    let after = c.classify_in_view(d, d.own_view(), sub);
    assert_eq!(
        span(&after),
        (0..8, 1..2, 0..8, CellOrder::TokenMajor, SpanShape::Rect)
    );
    // A range across both sub-pages is not a rectangle in the receive view.
    let across = c.classify_named("decode-0", row(D_BASE + 128 + 32, 64));
    assert_eq!(
        span(&across),
        (0..8, 0..2, 0..8, CellOrder::HeadMajor, SpanShape::Ragged)
    );

    // Prefill NHD into decode HND: the sub-pages arrive token-major.
    let mixed = case(
        gqa(2, false),
        engine(1, 8, 8, KvLayout::Hnd),
        engine(1, 4, 4, KvLayout::Nhd),
        attention_blocks(vec![1], vec![5, 6]),
    );
    let during = mixed.classify_named("decode-0", sub);
    assert_eq!(
        span(&during),
        (4..8, 0..2, 0..8, CellOrder::TokenMajor, SpanShape::Rect)
    );
}

#[test]
fn mla_keeps_the_own_view_and_push_receives_like_pull() {
    let mut mla = gqa(1, false);
    mla.attention = Some(AttentionSpec::Mla {
        head_size: 4,
        dtype_bytes: 2,
    });
    let c = case(
        mla,
        engine(1, 8, 8, KvLayout::Hnd),
        engine(1, 4, 4, KvLayout::Hnd),
        attention_blocks(vec![1], vec![2, 3]),
    );
    assert_eq!(
        c.engine(Side::Decode, 0).expect("rank 0").receive_view(),
        None
    );
    // 8 bytes per token: the second half of decode block 1 holds tokens 4..8.
    let during = c.classify_named("decode-0", row(D_BASE + 64 + 32, 32));
    assert_eq!(
        span(&during),
        (4..8, 0..1, 0..8, CellOrder::TokenMajor, SpanShape::Rect)
    );

    // Push: prefill writes decode pages in decode's own layout.
    let pull = case(
        gqa(2, false),
        engine(1, 8, 8, KvLayout::Hnd),
        engine(1, 4, 4, KvLayout::Hnd),
        attention_blocks(vec![1], vec![5, 6]),
    );
    let push = CaseLayout::new(
        pull.geometry().clone(),
        Mode::Push,
        pull.engines(Side::Decode)
            .iter()
            .map(|l| {
                EngineLayout::new(
                    Side::Decode,
                    pull.model(),
                    &pull.geometry().decode,
                    l.tp_rank(),
                    l.region_bases().to_vec(),
                    8,
                )
            })
            .collect::<Result<_, _>>()
            .expect("layouts"),
        pull.engines(Side::Prefill).to_vec(),
        pull.blocks().clone(),
    )
    .expect("valid case");
    // kvgeom's push writes whole prefill pages into decode sub-pages, so
    // decode sees them exactly as a pull would receive them.
    assert_eq!(
        push.engine(Side::Decode, 0).expect("rank 0").receive_view(),
        pull.engine(Side::Decode, 0).expect("rank 0").receive_view(),
    );
    let r = row(D_BASE + 128 + 64, 64);
    assert_eq!(
        span(&push.classify_named("decode-0", r)),
        span(&pull.classify_named("decode-0", r))
    );
}

#[test]
fn mamba_shards_map_to_the_same_global_slice_in_both_tp_directions() {
    // State: conv Q|K|V = 12|12|24 B and SSM 64 B at TP1; half of each at TP2.
    // Decode TP2 <- prefill TP1 (pull, tp_ratio 2).
    let blocks = RequestBlocks {
        decode: vec![vec![1], vec![4]],
        decode_transfer: vec![vec![1], vec![4]],
        prefill: vec![vec![0], vec![2]],
    };
    let c = case(
        gqa(4, true),
        engine(2, 4, 8, KvLayout::Hnd),
        engine(1, 4, 8, KvLayout::Hnd),
        blocks.clone(),
    );
    let (d_page, p_page) = (128u64, 256u64);
    let d = c.classify_named("decode-1", row(D_BASE + RANK_STRIDE + 4 * d_page, 6));
    let p = c.classify_named("prefill-0", row(P_BASE + 2 * p_page + 6, 6));
    let (dm, pm) = (d.mamba().expect("mamba"), p.mamba().expect("mamba"));
    assert_eq!((dm.group, dm.slot_position), (1, 0));
    assert_eq!(
        dm.pieces,
        [MambaPiece {
            part: MambaPart::Conv(0),
            global: 6..12
        }]
    );
    assert_eq!(pm.pieces, dm.pieces);
    let d_ssm = c.classify_named("decode-1", row(D_BASE + RANK_STRIDE + 4 * d_page + 24, 32));
    let p_ssm = c.classify_named("prefill-0", row(P_BASE + 2 * p_page + 48 + 32, 32));
    assert_eq!(
        d_ssm.mamba().expect("mamba").pieces,
        [MambaPiece {
            part: MambaPart::Ssm,
            global: 32..64
        }]
    );
    assert_eq!(
        p_ssm.mamba().expect("mamba").pieces,
        d_ssm.mamba().expect("mamba").pieces
    );

    // Decode TP1 <- prefill TP2: rank 1's V shard lands at V + 12 of decode's page.
    let c = case(
        gqa(4, true),
        engine(1, 4, 8, KvLayout::Hnd),
        engine(2, 4, 8, KvLayout::Hnd),
        blocks,
    );
    let d = c.classify_named("decode-0", row(D_BASE + 4 * p_page + 24 + 12, 12));
    let p = c.classify_named("prefill-1", row(P_BASE + RANK_STRIDE + 2 * d_page + 12, 12));
    assert_eq!(
        d.mamba().expect("mamba").pieces,
        [MambaPiece {
            part: MambaPart::Conv(2),
            global: 12..24
        }]
    );
    assert_eq!(
        p.mamba().expect("mamba").pieces,
        d.mamba().expect("mamba").pieces
    );

    // A whole decode page: every part, then padding.
    let whole = c.classify_named("decode-0", row(D_BASE + 4 * p_page, p_page));
    let parts: Vec<MambaPart> = whole
        .mamba()
        .expect("mamba")
        .pieces
        .iter()
        .map(|p| p.part)
        .collect();
    assert_eq!(
        parts,
        [
            MambaPart::Conv(0),
            MambaPart::Conv(1),
            MambaPart::Conv(2),
            MambaPart::Ssm,
            MambaPart::Padding
        ]
    );
    assert!(whole.mamba().expect("mamba").touches_padding());
}

#[test]
fn ranges_outside_the_request_blocks_are_named() {
    let c = case(
        gqa(4, false),
        engine(1, 4, 8, KvLayout::Hnd),
        engine(1, 4, 8, KvLayout::Hnd),
        attention_blocks(vec![1], vec![2]),
    );
    let kind = |name: &str, addr, len| c.classify_named(name, row(addr, len)).kind;
    assert_eq!(
        kind("decode-0", D_BASE + 2 * 256, 16),
        LocationKind::Unowned
    );
    assert_eq!(
        kind("decode-0", D_BASE + 256 + 250, 16),
        LocationKind::CrossesBlocks
    );
    assert_eq!(
        kind("decode-0", D_BASE - 16, 16),
        LocationKind::OutsideRegions
    );
    assert_eq!(
        kind("decode-0", D_BASE + 8 * 256 - 8, 16),
        LocationKind::OutsideRegions
    );
    assert_eq!(kind("decode-1", D_BASE, 16), LocationKind::UnknownAgent);
    assert_eq!(kind("remote-agent", D_BASE, 16), LocationKind::UnknownAgent);
    let past_end = c.classify_named("decode-0", row(D_BASE + 8 * 256 - 8, 16));
    assert_eq!(
        (past_end.region, past_end.offset, past_end.logical_block),
        (Some(0), 8 * 256 - 8, Some(7))
    );
}

#[test]
fn bad_inputs_are_typed_errors() {
    let geometry = |model, d, p| Geometry {
        name: "bad".into(),
        description: String::new(),
        model,
        prefill: p,
        decode: d,
        prompts: None,
        expect_rejection: None,
        stack: crate::geometry::Stack::Vllm,
        handshake: crate::geometry::HandshakeCompat::default(),
        sglang: None,
    };
    let hnd = |tp, k, b| engine(tp, k, b, KvLayout::Hnd);
    let build = |g: Geometry, blocks: RequestBlocks, d_regions: usize| {
        let (d_tp, p_tp) = (g.decode.tp_size, g.prefill.tp_size);
        CaseLayout::from_bases(
            g,
            Mode::Pull,
            blocks,
            (0..d_tp)
                .map(|r| {
                    (0..d_regions as u64)
                        .map(|i| D_BASE + u64::from(r) * RANK_STRIDE + i * 0x8000)
                        .collect()
                })
                .collect(),
            8,
            (0..p_tp)
                .map(|r| vec![P_BASE + u64::from(r) * RANK_STRIDE])
                .collect(),
            8,
        )
    };
    let ok_blocks = attention_blocks(vec![1], vec![1]);
    assert_eq!(
        build(
            geometry(gqa(4, false), hnd(1, 4, 8), hnd(1, 4, 8)),
            attention_blocks(vec![1, 1], vec![1]),
            1
        ),
        Err(LayoutError::DuplicateBlock {
            side: Side::Decode,
            block: 1,
            first: 0,
            second: 0
        })
    );
    assert_eq!(
        build(
            geometry(gqa(4, false), hnd(1, 4, 8), hnd(1, 4, 8)),
            attention_blocks(vec![9], vec![1]),
            1
        ),
        Err(LayoutError::BlockOutOfPool {
            side: Side::Decode,
            block: 9,
            group: 0,
            pool: 8
        })
    );
    assert_eq!(
        build(
            geometry(gqa(4, false), hnd(1, 4, 8), hnd(1, 4, 8)),
            ok_blocks.clone(),
            2
        ),
        Err(LayoutError::RegionCount {
            side: Side::Decode,
            got: 2,
            expected: 1
        })
    );
    assert_eq!(
        build(
            geometry(gqa(4, false), hnd(1, 3, 8), hnd(1, 4, 8)),
            ok_blocks.clone(),
            1
        ),
        Err(LayoutError::KernelBlock {
            side: Side::Decode,
            kernel: 3,
            logical: 8
        })
    );
    assert_eq!(
        build(
            geometry(gqa(6, false), hnd(4, 4, 8), hnd(1, 4, 8)),
            ok_blocks.clone(),
            1
        ),
        Err(LayoutError::HeadSharding {
            total_heads: 6,
            tp_size: 4
        })
    );
    // The 112-byte TP1 mamba state does not fit a 2-token page of 4 heads x 8 B.
    let mamba_blocks = RequestBlocks {
        decode: vec![vec![1], vec![2]],
        decode_transfer: vec![vec![1], vec![2]],
        prefill: vec![vec![1], vec![2]],
    };
    assert_eq!(
        build(
            geometry(gqa(4, true), hnd(1, 2, 2), hnd(1, 4, 8)),
            mamba_blocks,
            1
        ),
        Err(LayoutError::MambaTooLarge {
            side: Side::Decode,
            state: 112,
            page: 64
        })
    );
    assert_eq!(
        build(
            geometry(gqa(4, false), hnd(0, 4, 8), hnd(1, 4, 8)),
            ok_blocks.clone(),
            1
        ),
        Err(LayoutError::ZeroTpSize { side: Side::Decode })
    );
    assert_eq!(
        build(
            geometry(gqa(4, false), hnd(1, 4, 0), hnd(1, 4, 8)),
            ok_blocks.clone(),
            1
        ),
        Err(LayoutError::KernelBlock {
            side: Side::Decode,
            kernel: 4,
            logical: 0
        })
    );
    let mut transfer = ok_blocks.clone();
    transfer.decode_transfer = vec![vec![2]];
    assert_eq!(
        build(
            geometry(gqa(4, false), hnd(1, 4, 8), hnd(1, 4, 8)),
            transfer,
            1
        ),
        Err(LayoutError::TransferBlockNotOwned { block: 2, group: 0 })
    );
}
