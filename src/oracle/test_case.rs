//! A hand-built pull case shared by the oracle tests, with switchable faults.
//!
//! Model: MLA (12 bytes per token) plus two KDA groups (conv Q|K|V of 2|2|4
//! channels x 3 rows x 2 bytes, 64 bytes of SSM state), two layer slots.
//! Decode TP1: kernel 8, logical 24 (ppl 3, page 288 B), 8 blocks.
//! Prefill TP2: kernel 4, logical 8 (ppl 2, page 96 B), 12 blocks.
//! Block-size ratio 2, tp_ratio -2. Prompt 29 tokens, 28 transferred.
//!
//! Decode blocks: attention [1, 3], kda_a [0], kda_b [6].
//! Prefill blocks: attention [2, 4, 6, 8], kda_a [1], kda_b [0].
//! Decode kernel ids [3, 4, 5, 9, 10, 11] become sub-blocks
//! [6, 7, 8, 9, 10, 11, 18, 19] (clipped to prefill's 8 kernel ids
//! [4, 5, 8, 9, 12, 13, 16, 17]); the post-process zeroes kernel ids 10, 11.

use crate::geometry::{EngineGeometry, Geometry, Mode, ModelSpec};
use crate::layout::{CaseLayout, RequestBlocks, Side};
use crate::nixl::{DescList, DescRow, DlistTarget, DryRun, MemKind, Nixl, Recording, XferOp};
use crate::pattern::{fill_decode_rank, fill_prefill_rank, DecodeFill};

use super::input::{MemoryImages, OracleInput};

pub(crate) const DECODE_BASES: [u64; 2] = [0x1_0000, 0x2_0000];
pub(crate) const PROMPT: u32 = 29;
const DECODE_POOL: u32 = 8;
const PREFILL_POOL: u32 = 12;
const DECODE_SUB_BLOCKS: [u64; 8] = [6, 7, 8, 9, 10, 11, 18, 19];
const PREFILL_KERNELS: [u64; 8] = [4, 5, 8, 9, 12, 13, 16, 17];
const SUB_PAGE: u64 = 48;
/// (decode slot, prefill slot) of kda_a and kda_b.
const SLOTS: [(u64, u64); 2] = [(0, 1), (6, 0)];

pub(crate) fn prefill_bases(rank: u32) -> Vec<u64> {
    let r = u64::from(rank) * 0x1_0000;
    vec![0x10_0000 + r, 0x10_8000 + r]
}

/// What to break in the hand-written transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    None,
    /// Pair 0 (region 0, tokens 0..4) writes one block further: into unowned block 2.
    ShiftDestination,
    /// Region 1's kernel block 11 (tokens 40..48) is not zeroed.
    SkipZeroing,
    /// A byte of unowned decode block 2 in region 0 changes after the transfer.
    WriteNeighbourByte,
    /// Pair 1 (region 0, tokens 4..8) is issued twice.
    DoubleWrite,
    /// Pair 1's destination is written again from pair 2's source (tokens 8..12).
    DoubleWriteOtherSource,
    /// Pairs 0 and 1 read each other's prefill kernel block.
    MisalignTokens,
    /// Pair 2 (region 0, tokens 8..12) reads prefill kernel 6, of unowned block 3.
    ReadWrongPrefillBlock,
    /// The pair for region 1, tokens 24..28 is left out.
    DropAttentionPair,
    /// Rank 1 does not send its shard of kda_b's SSM state in region 0.
    DropMambaShard,
    /// No rank sends any mamba state of region 1 (right when region 1
    /// holds no mamba layer: [`run_state_in_region_0_only`]).
    DropRegion1State,
}

pub(crate) fn geometry() -> Geometry {
    geometry_with_state_slots(None)
}

fn geometry_with_state_slots(state_slots: Option<u32>) -> Geometry {
    let model = ModelSpec {
        state_slots,
        ..crate::geometry::fixtures::mla_kda([2, 2, 4], 64)
    };
    let engine = |tp_size, kernel_block, logical_block, pool| EngineGeometry {
        num_logical_blocks: Some(pool),
        ..EngineGeometry::new(tp_size, kernel_block, logical_block)
    };
    Geometry {
        name: "mla-kda-r2".into(),
        description:
            "hand-built MLA + KDA pull, D TP1 kernel 8 / logical 24, P TP2 kernel 4 / logical 8"
                .into(),
        model,
        prefill: engine(2, 4, 8, PREFILL_POOL),
        decode: engine(1, 8, 24, DECODE_POOL),
        prompts: None,
        expect_rejection: None,
        stack: crate::geometry::Stack::Vllm,
        handshake: crate::geometry::HandshakeCompat::default(),
        sglang: None,
    }
}

pub(crate) fn case() -> CaseLayout {
    case_of(geometry())
}

fn case_of(geometry: Geometry) -> CaseLayout {
    let blocks = RequestBlocks {
        decode: vec![vec![1, 3], vec![0], vec![6]],
        decode_transfer: vec![vec![1, 3], vec![0], vec![6]],
        prefill: vec![vec![2, 4, 6, 8], vec![1], vec![0]],
    };
    CaseLayout::from_bases(
        geometry,
        Mode::Pull,
        blocks,
        vec![DECODE_BASES.to_vec()],
        DECODE_POOL,
        (0..2).map(prefill_bases).collect(),
        PREFILL_POOL,
    )
    .expect("the hand-built case is valid")
}

/// The (destination, source) rows each prefill rank's READ moves.
fn plan(case: &CaseLayout, fault: Fault) -> Vec<Vec<(DescRow, DescRow)>> {
    let row = |addr, len| DescRow { addr, len, dev: 0 };
    let decode = case.engine(Side::Decode, 0).expect("rank 0");
    let mut xfers = Vec::new();
    for p in 0..2u32 {
        let prefill = case.engine(Side::Prefill, p).expect("prefill rank");
        let bases = prefill_bases(p);
        let mut pairs = Vec::new();
        if p == 0 {
            for (region, &d_base) in DECODE_BASES.iter().enumerate() {
                for (&sub, &kernel) in DECODE_SUB_BLOCKS.iter().zip(&PREFILL_KERNELS) {
                    pairs.push((
                        row(d_base + sub * SUB_PAGE, SUB_PAGE),
                        row(bases[region] + kernel * SUB_PAGE, SUB_PAGE),
                    ));
                }
            }
        }
        let (d_page, p_page) = (
            decode.mamba().expect("mamba"),
            prefill.mamba().expect("mamba"),
        );
        for (region, &d_base) in DECODE_BASES.iter().enumerate() {
            if fault == Fault::DropRegion1State && region == 1 {
                continue;
            }
            for &(d_slot, p_slot) in &SLOTS {
                for ((_, d_sub), (_, p_sub)) in d_page.parts().zip(p_page.parts()) {
                    let dst = d_base
                        + d_slot * decode.unified_page()
                        + d_sub.offset
                        + u64::from(p) * p_sub.size;
                    let src = bases[region] + p_slot * prefill.unified_page() + p_sub.offset;
                    pairs.push((row(dst, p_sub.size), row(src, p_sub.size)));
                }
            }
        }
        xfers.push(pairs);
    }
    match fault {
        Fault::ShiftDestination => xfers[0][0].0.addr += decode.unified_page(),
        Fault::DoubleWrite => {
            let dup = xfers[0][1];
            xfers[0].push(dup);
        }
        Fault::DoubleWriteOtherSource => {
            let dup = (xfers[0][1].0, xfers[0][2].1);
            xfers[0].push(dup);
        }
        Fault::MisalignTokens => {
            let (a, b) = (xfers[0][0].1, xfers[0][1].1);
            xfers[0][0].1 = b;
            xfers[0][1].1 = a;
        }
        Fault::ReadWrongPrefillBlock => xfers[0][2].1.addr = prefill_bases(0)[0] + 6 * SUB_PAGE,
        // Region 1's pairs start at 8; tokens 24..28 are its 7th sub-block.
        Fault::DropAttentionPair => {
            xfers[0].remove(8 + 6);
        }
        // Rank 1's pairs: region 0 kda_a (4), then region 0 kda_b: Q, K, V, SSM.
        Fault::DropMambaShard => {
            xfers[1].remove(7);
        }
        _ => {}
    }
    xfers
}

/// Records the transfers through `Recording<DryRun>`, moves the bytes
/// between memory images, runs the post-process, and returns the oracle input.
pub(crate) fn run(fault: Fault) -> OracleInput {
    run_case(case(), fault)
}

/// [`run`] on the same case with mamba state in region 0 only
/// (`state_slots = 1`: region 1 holds attention layers only).
pub(crate) fn run_state_in_region_0_only(fault: Fault) -> OracleInput {
    run_case(case_of(geometry_with_state_slots(Some(1))), fault)
}

fn run_case(case: CaseLayout, fault: Fault) -> OracleInput {
    let xfers = plan(&case, fault);

    let mut nixl = Recording::new(DryRun::new());
    let d = nixl.create_agent("decode-0").expect("agent");
    for p in 0..2 {
        nixl.create_agent(&format!("prefill-{p}")).expect("agent");
    }
    for (p, pairs) in xfers.iter().enumerate() {
        let local = DescList::from_rows(pairs.iter().map(|x| x.0));
        let remote = DescList::from_rows(pairs.iter().map(|x| x.1));
        let lh = nixl
            .prepare_dlist(d, &DlistTarget::Local, MemKind::Dram, &local)
            .expect("local dlist");
        let target = DlistTarget::Remote(format!("prefill-{p}"));
        let rh = nixl
            .prepare_dlist(d, &target, MemKind::Dram, &remote)
            .expect("remote dlist");
        let ids: Vec<u32> = (0..pairs.len() as u32).collect();
        let x = nixl
            .make_xfer(d, XferOp::Read, lh, &ids, rh, &ids, None)
            .expect("xfer");
        nixl.post_xfer(d, x).expect("post");
    }
    let resolved = nixl.resolve(&case);

    let decode = case.engine(Side::Decode, 0).expect("rank 0").clone();
    let mut d_mem = vec![vec![0u8; decode.region_len() as usize]; 2];
    fill_decode_rank(&case, 0, &mut d_mem, DecodeFill::SentinelWithNeighbours)
        .expect("fill decode");
    let d_before = d_mem.clone();
    let mut p_mem = Vec::new();
    for p in 0..2 {
        let layout = case.engine(Side::Prefill, p).expect("prefill rank");
        let mut images = vec![vec![0u8; layout.region_len() as usize]; 2];
        fill_prefill_rank(&case, p, &mut images).expect("fill prefill");
        p_mem.push(images);
    }

    for (p, pairs) in xfers.iter().enumerate() {
        let prefill = case.engine(Side::Prefill, p as u32).expect("prefill rank");
        for (dst, src) in pairs {
            let (dr, doff) = decode
                .locate(dst.addr, dst.len)
                .expect("destination inside a region");
            let (sr, soff) = prefill
                .locate(src.addr, src.len)
                .expect("source inside a region");
            let bytes = p_mem[p][sr as usize][soff as usize..(soff + src.len) as usize].to_vec();
            d_mem[dr as usize][doff as usize..(doff + dst.len) as usize].copy_from_slice(&bytes);
        }
    }

    // Receive post-process: covered = min(6 x 2, 8) = 8 sub-blocks = 4 kernel
    // blocks, so kernel ids 10 and 11 are zeroed whole (MLA: no conversion).
    let kp = decode.kernel_page() as usize;
    for (region, image) in d_mem.iter_mut().enumerate() {
        for kernel in [10usize, 11] {
            if fault == Fault::SkipZeroing && region == 1 && kernel == 11 {
                continue;
            }
            image[kernel * kp..(kernel + 1) * kp].fill(0);
        }
    }
    if fault == Fault::WriteNeighbourByte {
        let at = 2 * decode.unified_page() as usize + 5;
        d_mem[0][at] = d_mem[0][at].wrapping_add(1);
    }

    let mut input = OracleInput::new(case, PROMPT, 0, resolved);
    input.set_memory(
        Side::Decode,
        0,
        MemoryImages {
            before: d_before.into(),
            after: d_mem.into_iter().map(Into::into).collect(),
        },
    );
    for (p, images) in p_mem.into_iter().enumerate() {
        input.set_memory(
            Side::Prefill,
            p as u32,
            MemoryImages {
                before: images.clone().into(),
                after: images.into_iter().map(Into::into).collect(),
            },
        );
    }
    input
}

/// Where a violation lies: (side, rank, region, local block).
pub(crate) type Place = (Option<Side>, Option<u32>, Option<u32>, Option<u32>);

/// The one violation `check` finds in the case `fault` breaks (the test
/// fails naming them all otherwise), and where it lies: (side, rank,
/// region, local block).
pub(crate) fn only_violation(
    check: fn(&OracleInput) -> Vec<super::violation::Violation>,
    fault: Fault,
) -> (super::violation::Violation, Place) {
    let mut found = check(&run(fault));
    assert_eq!(found.len(), 1, "{fault:?}: {found:#?}");
    let v = found.remove(0);
    let at = (v.side, v.rank, v.region, v.local_block);
    (v, at)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::oracle::{run_all, run_descriptor_level};

    #[test]
    fn the_correct_case_passes_every_oracle() {
        let input = run(Fault::None);
        assert_eq!(input.transferred_tokens, 28);
        assert_eq!(input.pairs.len(), 32 + 16);
        assert!(input.pairs.iter().all(|p| p.posted && p.op == XferOp::Read));
        let violations = run_all(&input);
        assert!(violations.is_empty(), "{violations:#?}");
    }

    #[test]
    fn state_is_needed_only_in_regions_holding_a_mamba_layer() {
        // Region 1 holds no mamba layer: leaving its state out is right.
        let input = run_state_in_region_0_only(Fault::DropRegion1State);
        assert_eq!(input.pairs.len(), 16 + 16);
        let violations = run_all(&input);
        assert!(violations.is_empty(), "{violations:#?}");
        // Where region 1 holds state, the same transfer misses it.
        let oracles: BTreeSet<&str> = run_all(&run(Fault::DropRegion1State))
            .iter()
            .map(|v| v.oracle)
            .collect();
        assert_eq!(
            oracles,
            BTreeSet::from(["coverage", "transferred_or_zeroed"])
        );
        // And region 0's state is still required.
        let oracles: BTreeSet<&str> = run_all(&run_state_in_region_0_only(Fault::DropMambaShard))
            .iter()
            .map(|v| v.oracle)
            .collect();
        assert!(oracles.contains("coverage"), "{oracles:?}");
    }

    #[test]
    fn descriptor_level_oracles_run_without_memory() {
        let full = run(Fault::None);
        let mut input = OracleInput::new(full.case.clone(), PROMPT, 0, Vec::new());
        input.pairs = full.pairs;
        assert_eq!(run_descriptor_level(&input), Vec::new());
        let all = run_all(&input);
        let oracles: Vec<&str> = all.iter().map(|v| v.oracle).collect();
        // Decode rank 0 for both byte-level oracles, then prefill ranks 0 and 1.
        assert_eq!(
            oracles,
            [
                "transferred_or_zeroed",
                "neighbour_preservation",
                "neighbour_preservation",
                "neighbour_preservation"
            ]
        );
        assert_eq!(
            all[0].message,
            "decode rank 0 has no memory images; the byte-level check cannot run"
        );
    }

    /// Which oracles each fault trips when all run: every fault is caught by
    /// its own oracle, and the descriptor-level ones catch all but the
    /// memory-only faults.
    #[test]
    fn each_fault_trips_the_expected_oracles() {
        let cases: [(Fault, &[&str]); 9] = [
            (
                Fault::ShiftDestination,
                &[
                    "containment",
                    "coverage",
                    "neighbour_preservation",
                    "transferred_or_zeroed",
                ],
            ),
            (Fault::SkipZeroing, &["transferred_or_zeroed"]),
            (Fault::WriteNeighbourByte, &["neighbour_preservation"]),
            (Fault::DoubleWrite, &[]),
            (
                Fault::DoubleWriteOtherSource,
                &["no_double_write", "pairing", "transferred_or_zeroed"],
            ),
            (Fault::MisalignTokens, &["pairing", "transferred_or_zeroed"]),
            (
                Fault::ReadWrongPrefillBlock,
                &["containment", "transferred_or_zeroed"],
            ),
            (
                Fault::DropAttentionPair,
                &["coverage", "transferred_or_zeroed"],
            ),
            (
                Fault::DropMambaShard,
                &["coverage", "transferred_or_zeroed"],
            ),
        ];
        for (fault, expected) in cases {
            let got: BTreeSet<&str> = run_all(&run(fault)).iter().map(|v| v.oracle).collect();
            let expected: BTreeSet<&str> = expected.iter().copied().collect();
            assert_eq!(got, expected, "{fault:?}");
        }
    }
}
