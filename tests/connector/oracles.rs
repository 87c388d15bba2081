//! Each oracle passes on a real connector run and fails when that run is
//! corrupted in one place: one pair moved, swapped, dropped or duplicated,
//! one zeroing skipped, one neighbour byte changed.

use std::sync::Arc;

use kvgeom::connector::post_process::PostOp;
use kvgeom::geometry::{load_geometry, Mode};
use kvgeom::layout::Side;
use kvgeom::oracle::{self, MemoryImages, OracleInput};
use kvgeom::pattern::SENTINEL;
use kvgeom::scenario::{Case, CaseRun, RunOptions};
use kvgeom::scheduler::DecodeAllocation;
use kvgeom::under_test::run_case_detailed;

/// G5 (kernel 8 vs 4, ppl 3 vs 2, P TP2 -> D TP1) at N = 29: both zeroing
/// regimes, multi-read, mamba shards.
fn real_run() -> CaseRun {
    let geometry = load_geometry(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/geometries/g5-mla-kda-mixed-kernel.toml"
    ))
    .unwrap();
    let case = Case {
        geometry: Arc::new(geometry),
        file: None,
        prompt_len: 29,
        prefix_hit: 0,
        mode: Mode::Pull,
        allocation: DecodeAllocation::WithLastToken,
        seed: 3,
        variant: kvgeom::variant::Variant::KVGEOM,
    };
    let run = run_case_detailed(&case, &RunOptions::default());
    assert!(
        run.report.passed(),
        "{:?} {:?}",
        run.report.outcome,
        run.report.violations.first()
    );
    run
}

fn input(run: &CaseRun) -> OracleInput {
    run.oracle_input.clone().expect("the case ran its oracles")
}

fn names(v: &[oracle::Violation]) -> Vec<&'static str> {
    let mut n: Vec<_> = v.iter().map(|x| x.oracle).collect();
    n.dedup();
    n
}

/// Re-classify pair `i`'s destination after moving it to `addr`.
fn move_destination(input: &mut OracleInput, i: usize, addr: u64) {
    let pair = &mut input.pairs[i];
    pair.destination.row.addr = addr;
    pair.destination.location = input
        .case
        .classify_on(Side::Decode, 0, pair.destination.row);
}

#[test]
fn the_real_connector_passes_every_oracle() {
    let run = real_run();
    assert!(oracle::run_all(&input(&run)).is_empty());
}

#[test]
fn containment_fails_when_a_pair_writes_a_neighbour_block() {
    let run = real_run();
    let mut bad = input(&run);
    let page = bad.case.engine(Side::Decode, 0).unwrap().unified_page();
    // Move the first attention pair into the block after it (not the request's).
    let blocks = &bad.case.blocks().decode[0];
    let block = (bad.pairs[0].destination.location.offset / page) as u32;
    let neighbour = (0..bad
        .case
        .engine(Side::Decode, 0)
        .unwrap()
        .num_logical_blocks())
        .find(|b| !bad.case.blocks().decode.iter().flatten().any(|x| x == b))
        .unwrap();
    assert!(blocks.contains(&block));
    let row = bad.pairs[0].destination.row;
    let addr = row.addr - u64::from(block) * page + u64::from(neighbour) * page;
    move_destination(&mut bad, 0, addr);
    let v = oracle::containment::check(&bad);
    assert_eq!(v.len(), 1, "{v:#?}");
    assert!(v[0]
        .message
        .contains("writes a block the request does not own"));
}

#[test]
fn pairing_fails_when_two_sources_are_swapped() {
    let run = real_run();
    let mut bad = input(&run);
    let (a, b) = (bad.pairs[0].source.clone(), bad.pairs[1].source.clone());
    bad.pairs[0].source = b;
    bad.pairs[1].source = a;
    let v = oracle::pairing::check(&bad);
    assert_eq!(v.len(), 2, "{v:#?}");
    assert!(v.iter().all(|x| x.message.contains("token misalignment")));
}

#[test]
fn coverage_fails_when_one_pair_is_dropped() {
    let run = real_run();
    let mut bad = input(&run);
    bad.pairs.remove(0);
    assert_eq!(names(&oracle::coverage::check(&bad)), ["coverage"]);
}

#[test]
fn a_pair_posted_twice_is_a_redundant_write_and_another_source_a_double_write() {
    let run = real_run();
    assert!(oracle::no_double_write::redundant_writes(&input(&run)).is_none());
    // The same bytes to the same place: a cost, not a violation.
    let mut again = input(&run);
    let twice = again.pairs[3].clone();
    again.pairs.push(twice);
    assert_eq!(oracle::no_double_write::check(&again), Vec::new());
    let cost = oracle::no_double_write::redundant_writes(&again);
    assert_eq!((cost.pairs, cost.multiplicity), (1, 2), "{cost:?}");
    assert_eq!(cost.bytes, again.pairs[3].destination.row.len);
    // Another pair's source into the same place: different bytes.
    let mut bad = input(&run);
    let mut other = bad.pairs[3].clone();
    other.source = bad.pairs[4].source.clone();
    bad.pairs.push(other);
    let v = oracle::no_double_write::check(&bad);
    assert_eq!(v.len(), 1, "{v:#?}");
    assert!(v[0].message.contains("with different content"), "{v:#?}");
}

#[test]
fn transferred_or_zeroed_fails_when_one_zeroing_is_skipped() {
    let run = real_run();
    let mut bad = input(&run);
    // The post-process zeroed whole kernel blocks; put the sentinel back in one.
    let (_, plans) = &run.post_process[0];
    let block = plans[0]
        .ops
        .iter()
        .find_map(|op| match op {
            PostOp::ZeroBlock { block } => Some(*block),
            _ => None,
        })
        .expect("this case zeroes whole blocks");
    let kernel_page = bad.case.engine(Side::Decode, 0).unwrap().kernel_page() as usize;
    let images = bad.memory(Side::Decode, 0).unwrap().clone();
    let mut after = images.after.clone();
    after[0][block as usize * kernel_page..(block as usize + 1) * kernel_page].fill(SENTINEL);
    bad.set_memory(
        Side::Decode,
        0,
        MemoryImages {
            before: images.before,
            after,
        },
    );
    let v = oracle::transferred_or_zeroed::check(&bad);
    assert_eq!(names(&v), ["transferred_or_zeroed"], "{v:#?}");
    assert_eq!(v.iter().map(|x| x.bytes).sum::<u64>(), kernel_page as u64);
}

#[test]
fn neighbour_preservation_fails_when_a_neighbour_byte_changes() {
    let run = real_run();
    let mut bad = input(&run);
    let layout = bad.case.engine(Side::Decode, 0).unwrap().clone();
    let neighbour = (0..layout.num_logical_blocks())
        .find(|b| !bad.case.blocks().decode.iter().flatten().any(|x| x == b))
        .unwrap();
    let images = bad.memory(Side::Decode, 0).unwrap().clone();
    let mut after = images.after.clone();
    after[1][neighbour as usize * layout.unified_page() as usize + 7] ^= 0xFF;
    bad.set_memory(
        Side::Decode,
        0,
        MemoryImages {
            before: images.before,
            after,
        },
    );
    let v = oracle::neighbour_preservation::check(&bad);
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(
        (v[0].region, v[0].local_block, v[0].bytes),
        (Some(1), Some(neighbour), 1)
    );
}
